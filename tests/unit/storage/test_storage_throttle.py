"""The upload bandwidth cap: the token bucket on fake time (rate, burst, first come first served,
requests larger than the bucket, cancellation), and the backends charging it per part and per PUT
before reading the bytes.

Time only moves when a test calls ``FakeTime.advance``; a sleeper wakes only when the clock has
reached its deadline, so no assertion depends on which of two timers the loop runs first.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sidecar.app import upload_throttle
from sidecar.config import SidecarConfig
from sidecar.observability.metrics import Metrics
from sidecar.storage import MemoryObjectStore
from sidecar.storage._parts import PartReader
from sidecar.storage.throttle import TokenBucket

MiB = 1024 * 1024
NS = "kafka_tiered_sidecar_"


class FakeTime:
    """A clock the test moves, and a sleep that returns once the clock reaches its deadline."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        #: every delay asked for, in the order asked
        self.delays: list[float] = []
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._changed = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + delay, next(self._order), future))
        self._changed.set()
        await future

    @property
    def sleeping(self) -> int:
        """Sleepers still waiting (cancelled ones no longer count)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def until_sleeping(self, count: int) -> None:
        """Wait until ``count`` sleepers wait (an event, set by every new sleeper)."""
        while self.sleeping < count:
            self._changed.clear()
            await self._changed.wait()

    def advance(self, seconds: float) -> None:
        """Move the clock; wake every sleeper whose deadline it reached (to a nanosecond: the
        sums of float clock values are not exact)."""
        self.now += seconds
        while self._sleepers and self._sleepers[0][0] <= self.now + 1e-9:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


def _bucket(time: FakeTime, rate: float = 100, burst: float | None = 100, **kw: Any) -> TokenBucket:
    return TokenBucket(rate, burst=burst, clock=time, sleep=time.sleep, **kw)


async def _acquire_in_order(
    bucket: TokenBucket, time: FakeTime, amounts: list[int]
) -> list[asyncio.Task[float]]:
    """Start one ``acquire`` per amount, each only after the previous one has reserved (it
    either returned or sleeps): the call order is explicit, not up to the scheduler."""
    tasks: list[asyncio.Task[float]] = []
    for amount in amounts:
        sleeping = time.sleeping
        task = asyncio.create_task(bucket.acquire(amount))
        tasks.append(task)
        done = asyncio.ensure_future(time.until_sleeping(sleeping + 1))
        await asyncio.wait({task, done}, return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
    return tasks


class TestTokenBucket:
    async def test_a_full_bucket_lets_its_burst_go_at_once(self) -> None:
        """A new bucket is full: up to ``burst`` bytes go without waiting, the next wait for
        the refill at ``rate``."""
        time = FakeTime()
        bucket = _bucket(time, rate=100, burst=100)
        assert await bucket.acquire(60) == 0.0
        assert await bucket.acquire(40) == 0.0
        (late,) = await _acquire_in_order(bucket, time, [50])
        assert time.delays == pytest.approx([0.5])
        time.advance(0.5)
        assert await late == pytest.approx(0.5)

    async def test_the_bucket_holds_at_most_its_burst(self) -> None:
        """Idle time beyond one bucket's worth is not saved up."""
        time = FakeTime()
        bucket = _bucket(time, rate=100, burst=100)
        await bucket.acquire(100)
        time.advance(60.0)
        assert await bucket.acquire(100) == 0.0
        await _acquire_in_order(bucket, time, [100])
        assert time.delays == pytest.approx([1.0])

    async def test_requests_are_served_in_call_order(self) -> None:
        """Each request waits for every earlier one: a small request made after a large one
        never goes first, and the grants are spaced by the rate."""
        time = FakeTime()
        bucket = _bucket(time, rate=100, burst=100)
        await bucket.acquire(100)  # empty the bucket
        big, small, tiny = await _acquire_in_order(bucket, time, [80, 10, 10])
        assert time.delays == pytest.approx([0.8, 0.9, 1.0])
        time.advance(0.85)
        assert await big == pytest.approx(0.85)
        assert not small.done()
        assert not tiny.done()
        time.advance(0.15)
        assert await small == pytest.approx(1.0)
        assert await tiny == pytest.approx(1.0)

    async def test_a_request_larger_than_the_bucket_goes_when_it_is_full(self) -> None:
        """A part larger than the bucket waits for a full bucket, not forever, and leaves the
        bucket in debt: the next request also waits for the excess, so the average holds."""
        time = FakeTime()
        bucket = _bucket(time, rate=100, burst=100)
        await bucket.acquire(50)
        large, after = await _acquire_in_order(bucket, time, [250, 10])
        # the large one waits for the 50 bytes that make the bucket full; the next one for the
        # large one's 150-byte excess, then its own 10
        assert time.delays == pytest.approx([0.5, 0.5 + 1.5 + 0.1])
        time.advance(0.5)
        assert await large == pytest.approx(0.5)
        time.advance(1.6)
        assert await after == pytest.approx(2.1)

    async def test_a_request_larger_than_a_full_bucket_does_not_wait(self) -> None:
        """Into a full bucket a large request goes at once and the debt falls on the next."""
        time = FakeTime()
        bucket = _bucket(time, rate=100, burst=100)
        assert await bucket.acquire(1000) == 0.0
        await _acquire_in_order(bucket, time, [1])
        assert time.delays == pytest.approx([9.01])

    async def test_the_average_rate_holds_over_a_long_schedule(self) -> None:
        """Whatever the sizes, the bytes granted by any time are at most burst + rate * time."""
        time = FakeTime()
        bucket = _bucket(time, rate=1000, burst=300)
        sizes = [700, 5, 300, 1200, 64, 64, 999, 1, 300, 2500, 40]
        start = time.now
        await _acquire_in_order(bucket, time, sizes)
        # the first went at once, into a full bucket; every other one slept
        grants = [(start, sizes[0])]
        grants += [(start + d, n) for d, n in zip(time.delays, sizes[1:], strict=True)]
        assert [at for at, _ in grants] == sorted(at for at, _ in grants)  # in call order
        excess = max(sizes) - 300
        granted = 0
        for at, size in grants:
            granted += size
            assert granted <= 300 + 1000 * (at - start) + excess + 1e-6

    async def test_a_cancelled_wait_ends_at_once_and_gives_its_bytes_back(self) -> None:
        """A stop during a throttled wait ends the wait without moving time; its bytes go
        back to the bucket, the requests reserved after it keep their times, and a new request
        takes the freed slot."""
        time = FakeTime()
        waits: list[float] = []
        bucket = _bucket(time, rate=100, burst=100, on_wait=waits.append)
        await bucket.acquire(100)
        first, second = await _acquire_in_order(bucket, time, [100, 100])
        assert time.delays == pytest.approx([1.0, 2.0])
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert time.sleeping == 1
        assert waits == [0.0]  # counted, though it waited no fake time
        (newcomer,) = await _acquire_in_order(bucket, time, [100])
        assert time.delays[-1] == pytest.approx(2.0)  # the cancelled one's slot, not a third
        time.advance(2.0)
        assert await second == pytest.approx(2.0)
        assert await newcomer == pytest.approx(2.0)
        assert time.sleeping == 0

    async def test_waits_are_reported(self) -> None:
        """``on_wait`` gets the seconds each throttled request waited; unthrottled ones are
        not reported."""
        time = FakeTime()
        waits: list[float] = []
        bucket = _bucket(time, rate=100, burst=100, on_wait=waits.append)
        await bucket.acquire(100)
        (late,) = await _acquire_in_order(bucket, time, [30])
        time.advance(0.3)
        await late
        assert waits == [pytest.approx(0.3)]

    async def test_the_event_loop_clock_by_default(self) -> None:
        """Without an injected clock the bucket reads the running loop's time (the clock of
        ``asyncio.sleep``); a request within the burst never sleeps."""
        bucket = TokenBucket(1e12)
        assert bucket.burst == 1e12
        assert await bucket.acquire(MiB) == 0.0
        assert await bucket.acquire(0) == 0.0

    @pytest.mark.parametrize(
        ("rate", "burst", "match"),
        [
            pytest.param(0, None, "rate", id="zero-rate"),
            pytest.param(-5, None, "rate", id="negative-rate"),
            pytest.param(float("inf"), None, "rate", id="infinite-rate"),
            pytest.param(100, 0, "burst", id="zero-burst"),
        ],
    )
    def test_invalid_settings(self, rate: float, burst: float | None, match: str) -> None:
        """A bucket that could never grant anything, or grants everything, is refused."""
        with pytest.raises(ValueError, match=match):
            TokenBucket(rate, burst=burst)

    async def test_negative_amount(self) -> None:
        """A negative request is a bug in the caller."""
        with pytest.raises(ValueError, match="negative"):
            await TokenBucket(100).acquire(-1)


class _Journal:
    """Records charges to a bucket and part reads (a part read whole, or its checksum pass
    before it is streamed), in the order they happen."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, bucket: TokenBucket) -> None:
        self.events: list[tuple[str, int]] = []
        acquire, read, checksum = bucket.acquire, PartReader.read, PartReader.checksum

        async def charged(amount: int) -> float:
            self.events.append(("charge", amount))
            return await acquire(amount)

        async def reading(reader: PartReader, offset: int, length: int) -> Any:
            self.events.append(("read", length))
            return await read(reader, offset, length)

        async def checksumming(reader: PartReader, offset: int, length: int) -> int:
            self.events.append(("read", length))
            return await checksum(reader, offset, length)

        monkeypatch.setattr(bucket, "acquire", charged)
        monkeypatch.setattr(PartReader, "read", reading)
        monkeypatch.setattr(PartReader, "checksum", checksumming)


class TestMemoryStoreCharges:
    async def test_each_part_and_put_is_charged_before_it_is_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A multipart upload charges each part before reading it, a small file and a put are
        charged whole: what is charged is what is sent."""
        bucket = TokenBucket(1e12)
        journal = _Journal(monkeypatch, bucket)
        store = MemoryObjectStore(upload_throttle=bucket)
        big, small = tmp_path / "big.log", tmp_path / "small.log"
        big.write_bytes(b"b" * (12 * MiB))
        small.write_bytes(b"s" * 1000)
        await store.put_file("big", big, part_size=5 * MiB)
        await store.put_file("small", small, part_size=5 * MiB)
        await store.put("manifest", b"m" * 10)
        assert journal.events == [
            ("charge", 5 * MiB),
            ("read", 5 * MiB),
            ("charge", 5 * MiB),
            ("read", 5 * MiB),
            ("charge", 2 * MiB),
            ("read", 2 * MiB),
            ("charge", 1000),
            ("read", 1000),
            ("charge", 10),
        ]
        assert len(store.objects["big"]) == 12 * MiB

    async def test_a_stop_while_throttled_leaves_nothing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Cancelled while it waits for its second part, an upload ends at once: no object, no
        open multipart upload, no part read beyond the first, the bytes back in the bucket."""
        time = FakeTime()
        bucket = _bucket(time, rate=MiB, burst=5 * MiB)
        journal = _Journal(monkeypatch, bucket)
        store = MemoryObjectStore(upload_throttle=bucket)
        path = tmp_path / "segment.log"
        path.write_bytes(b"x" * (12 * MiB))
        upload = asyncio.create_task(store.put_file("k", path, part_size=5 * MiB))
        await time.until_sleeping(1)
        upload.cancel()
        with pytest.raises(asyncio.CancelledError):
            await upload
        assert journal.events == [("charge", 5 * MiB), ("read", 5 * MiB), ("charge", 5 * MiB)]
        assert store.objects == {}
        assert [u async for u in store.list_multipart_uploads("")] == []
        # only the first part's 5 MiB were spent: a new 5 MiB request waits for them alone
        (again,) = await _acquire_in_order(bucket, time, [5 * MiB])
        assert time.delays == pytest.approx([5.0, 5.0])
        again.cancel()
        with pytest.raises(asyncio.CancelledError):
            await again


class TestS3StoreCharges:
    async def test_a_put_and_a_single_part_file_are_charged_before_they_are_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The S3 backend charges what it sends, before it reads it (multipart uploads are
        charged per part: tests/integration/test_upload_throttle.py, on SeaweedFS)."""
        from tests.unit.storage.test_storage_s3 import _RecordingServer, _store

        bucket = TokenBucket(1e12)
        journal = _Journal(monkeypatch, bucket)
        path = tmp_path / "segment.log"
        path.write_bytes(b"k" * 70_000)
        async with (
            _RecordingServer() as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", upload_throttle=bucket) as store,
        ):
            await store.put_file("t/0.log", path)
            await store.put("t/0.idx", b"index")
            await store.head("t/0.log")
        assert journal.events == [("charge", 70_000), ("read", 70_000), ("charge", 5)]
        assert [r[2] for r in server.requests] == [70_000, 5, 0]


class TestDaemonWiring:
    def test_unlimited_by_default(self) -> None:
        """Without the setting there is no throttle, and the gauge says 0."""
        metrics = Metrics()
        assert upload_throttle(SidecarConfig(), metrics) is None
        assert metrics.registry.get_sample_value(f"{NS}upload_throttle_rate_bytes") == 0

    @pytest.mark.parametrize(
        ("rate", "part_size", "burst"),
        [
            pytest.param(8 * MiB, 16 * MiB, 8 * MiB, id="one-second"),
            pytest.param(100 * MiB, 16 * MiB, 16 * MiB, id="one-part"),
        ],
    )
    async def test_one_bucket_with_the_smaller_of_a_second_and_a_part(
        self, rate: int, part_size: int, burst: int
    ) -> None:
        """The cap builds one bucket whose burst is one second of bytes or one part, whichever
        is smaller; the gauge shows the cap, a log line says it is on, and waits are counted."""
        metrics = Metrics()
        config = SidecarConfig.model_validate(
            {
                "tiering": {"max_upload_bytes_per_second": rate},
                "s3": {"part_size_bytes": part_size},
            }
        )
        with capture_logs() as logs:
            bucket = upload_throttle(config, metrics)
        assert bucket is not None
        assert (bucket.rate, bucket.burst) == (rate, burst)
        assert metrics.registry.get_sample_value(f"{NS}upload_throttle_rate_bytes") == rate
        assert [e for e in logs if e["event"] == "upload_bandwidth_capped"] == [
            {
                "event": "upload_bandwidth_capped",
                "log_level": "info",
                "bytes_per_second": rate,
                "burst_bytes": burst,
                "part_size_bytes": part_size,
            }
        ]
        await bucket.acquire(burst)  # empty: the next request waits 1/100 s of loop time
        waited = await bucket.acquire(rate // 100)
        assert waited > 0
        total = metrics.registry.get_sample_value(f"{NS}upload_throttle_wait_seconds_total")
        assert total == waited
