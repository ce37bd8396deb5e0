"""The storage retry policy (on injected sleep, no real time passes) and the in-memory store's
fault injection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.errors import KeyNotFoundError, StorageError
from sidecar.storage import MIN_PART_SIZE, MemoryObjectStore
from sidecar.storage._retry import RetryPolicy, retrying


class FakeSleep:
    """Records requested delays instead of sleeping."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


class Flaky:
    """An operation that fails with the given errors, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, StorageError) and exc.retriable


class TestRetryPolicy:
    def test_delays_double_up_to_the_cap(self) -> None:
        """The cap doubles per retry from the base delay and never exceeds max_delay_s."""
        policy = RetryPolicy(attempts=8, base_delay_s=0.1, max_delay_s=0.5)
        assert [policy.delay(n, 1.0) for n in range(1, 6)] == pytest.approx(
            [0.1, 0.2, 0.4, 0.5, 0.5]
        )

    def test_full_jitter(self) -> None:
        """The delay is the draw times the cap, so a zero draw retries at once."""
        policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0)
        assert policy.delay(3, 0.0) == 0.0
        assert policy.delay(3, 0.25) == pytest.approx(1.0)

    def test_huge_retry_numbers_stay_capped(self) -> None:
        """A very late retry still waits at most max_delay_s (no overflow)."""
        assert RetryPolicy(max_delay_s=2.0).delay(10_000, 0.999) < 2.0

    @pytest.mark.parametrize(
        "kwargs",
        [
            pytest.param({"attempts": 0}, id="no-attempts"),
            pytest.param({"base_delay_s": -1.0}, id="negative-base"),
            pytest.param({"max_delay_s": -1.0}, id="negative-max"),
        ],
    )
    def test_invalid_policy(self, kwargs: dict[str, float]) -> None:
        """Nonsensical policies are refused at construction."""
        with pytest.raises(ValueError, match=r"attempts|negative"):
            RetryPolicy(**kwargs)  # type: ignore[arg-type]


class TestRetrying:
    async def test_retries_transient_errors_then_succeeds(self) -> None:
        """Transient failures are retried after exponential delays until the call succeeds."""
        sleep = FakeSleep()
        op = Flaky(StorageError("a"), StorageError("b"))
        result = await retrying(
            op,
            policy=RetryPolicy(attempts=4, base_delay_s=0.1, max_delay_s=5.0),
            is_transient=_transient,
            what="get",
            sleep=sleep,
            draw=lambda: 0.5,
        )
        assert (result, op.calls) == ("ok", 3)
        assert sleep.delays == pytest.approx([0.05, 0.1])

    async def test_gives_up_after_the_last_attempt(self) -> None:
        """When every attempt fails, the last error propagates unchanged."""
        sleep = FakeSleep()
        errors = [StorageError(str(n)) for n in range(3)]
        op = Flaky(*errors)
        with pytest.raises(StorageError) as info:
            await retrying(
                op,
                policy=RetryPolicy(attempts=3),
                is_transient=_transient,
                what="put",
                sleep=sleep,
            )
        assert info.value is errors[-1]
        assert (op.calls, len(sleep.delays)) == (3, 2)

    async def test_permanent_errors_are_not_retried(self) -> None:
        """An error the classifier calls permanent fails at once, without sleeping."""
        sleep = FakeSleep()
        op = Flaky(KeyNotFoundError("gone"))
        with pytest.raises(KeyNotFoundError):
            await retrying(
                op, policy=RetryPolicy(), is_transient=_transient, what="get", sleep=sleep
            )
        assert (op.calls, sleep.delays) == (1, [])

    async def test_single_attempt_policy(self) -> None:
        """attempts=1 means no retries at all."""
        op = Flaky(StorageError("once"))
        with pytest.raises(StorageError):
            await retrying(
                op,
                policy=RetryPolicy(attempts=1),
                is_transient=_transient,
                what="get",
                sleep=FakeSleep(),
            )
        assert op.calls == 1

    async def test_cancellation_is_not_retried(self) -> None:
        """Cancelling during an attempt cancels the whole call."""
        started = asyncio.Event()
        calls = 0

        async def hang() -> None:
            nonlocal calls
            calls += 1
            started.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(
            retrying(hang, policy=RetryPolicy(), is_transient=lambda e: True, what="get")
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert calls == 1

    async def test_real_sleep_by_default(self) -> None:
        """Without an injected sleep, asyncio.sleep is used (here with zero delays)."""
        op = Flaky(StorageError("a"))
        assert (
            await retrying(
                op,
                policy=RetryPolicy(attempts=2, base_delay_s=0.0),
                is_transient=_transient,
                what="get",
            )
            == "ok"
        )


class TestMemoryFaults:
    async def test_fail_next_fires_once(self) -> None:
        """A queued fault makes exactly the next call of that operation fail."""
        store = MemoryObjectStore()
        await store.put("k", b"v")
        store.fail_next("get", StorageError("injected"))
        with pytest.raises(StorageError, match="injected"):
            await store.get("k")
        assert await store.get("k") == b"v"
        assert await store.head("k")  # other operations were never affected
        assert store.calls["get"] == 2

    async def test_fail_next_times_and_order(self) -> None:
        """Faults queue in order, and ``times`` repeats one."""
        store = MemoryObjectStore()
        first, second = StorageError("first"), StorageError("second")
        store.fail_next("put", first, times=2)
        store.fail_next("put", second)
        for expected in (first, first, second):
            with pytest.raises(StorageError) as info:
                await store.put("k", b"v")
            assert info.value is expected
        await store.put("k", b"v")
        assert store.objects == {"k": b"v"}

    async def test_clear_faults(self) -> None:
        """clear_faults drops faults that have not fired."""
        store = MemoryObjectStore()
        store.fail_next("delete", StorageError("never"))
        store.clear_faults()
        await store.delete(["a"])

    async def test_failed_put_stores_nothing(self) -> None:
        """A put that fails leaves the key absent."""
        store = MemoryObjectStore()
        store.fail_next("put", StorageError("down"))
        with pytest.raises(StorageError):
            await store.put("k", b"v")
        with pytest.raises(KeyNotFoundError):
            await store.head("k")

    @pytest.mark.parametrize("op", ["upload_part", "complete_multipart_upload"])
    async def test_failed_multipart_step_aborts(self, tmp_path: Path, op: str) -> None:
        """A failing part or completion aborts the upload: no object, no incomplete upload."""
        path = tmp_path / "segment.log"
        path.write_bytes(b"x" * (2 * MIN_PART_SIZE + 1))
        store = MemoryObjectStore()
        store.fail_next(op, StorageError("injected"))  # type: ignore[arg-type]
        with pytest.raises(StorageError, match="injected"):
            await store.put_file("k", path, part_size=MIN_PART_SIZE)
        assert store.objects == {}
        assert [u async for u in store.list_multipart_uploads("")] == []
        info = await store.put_file("k", path, part_size=MIN_PART_SIZE)
        assert info.etag is not None
        assert info.etag.endswith("-3")

    async def test_fault_in_listing(self) -> None:
        """A listing fault fires when iteration starts."""
        store = MemoryObjectStore()
        store.fail_next("list", StorageError("injected"))
        with pytest.raises(StorageError):
            [o async for o in store.list("")]

    async def test_invalid_times(self) -> None:
        """A fault must fire at least once."""
        with pytest.raises(ValueError, match="times"):
            MemoryObjectStore().fail_next("get", StorageError("x"), times=0)

    async def test_closed_store(self) -> None:
        """A closed memory store refuses calls, like the S3 store."""
        async with MemoryObjectStore() as store:
            pass
        with pytest.raises(RuntimeError, match="closed"):
            await store.put("k", b"v")
        with pytest.raises(RuntimeError, match="closed"):
            async with store:
                pass
