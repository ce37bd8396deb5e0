"""The tailer's progress check without Kafka (the real broker's case, a paused partition, is in
tests/integration/test_metadata_topic.py): stalls are told from positions that do not move
while the end does, a transaction marker at the end is no stall, and a failed check is
reported without stopping the reading."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError
from structlog.testing import capture_logs

from sidecar.metadata import MetadataTailer, RemoteSegmentStore
from sidecar.metadata import tailer as tailer_module

TOPIC = "__remote_log_metadata"


class _Consumer:
    """What the check asks of aiokafka's consumer: end offsets, assignment, positions."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}
        self.positions: dict[int, int] = {}
        self.failure: KafkaError | None = None

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self.failure is not None:
            raise self.failure
        return {tp: self.ends[tp.partition] for tp in tps}

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in self.ends}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp.partition]


def _tailer(store: RemoteSegmentStore, errors: list[KafkaError]) -> MetadataTailer:
    tailer = MetadataTailer(
        bootstrap_servers="127.0.0.1:9",
        store=store,
        broker_id=1,
        topic=TOPIC,
        num_partitions=3,
        on_error=errors.append,
    )
    tailer._assigned = frozenset({0, 1, 2})
    return tailer


async def test_a_partition_behind_that_does_not_move_is_stalled_until_it_moves(
    tmp_path: Path,
) -> None:
    consumer = _Consumer()
    consumer.ends = {0: 10, 1: 20, 2: 7}
    # 0 caught up; 1 behind; 2 at its end, which is a transaction marker past its last record
    consumer.positions = {0: 10, 1: 12, 2: 7}
    errors: list[KafkaError] = []
    with RemoteSegmentStore(tmp_path) as store, capture_logs() as logs:
        tailer = _tailer(store, errors)
        await tailer._check_progress(consumer)
        assert tailer.stalled == frozenset()  # behind, but not seen still yet
        consumer.ends[1] = 25
        await tailer._check_progress(consumer)
        assert tailer.stalled == frozenset({1})
        assert tailer._checked_ends[1] == 25
        await tailer._check_progress(consumer)
        consumer.positions[1] = 25
        await tailer._check_progress(consumer)
        assert tailer.stalled == frozenset()
    assert [(e["event"], e["metadata_partition"]) for e in logs] == [
        ("metadata_partition_stalled", 1),
        ("metadata_partition_resumed", 1),
    ]
    assert errors == []


async def test_a_failed_check_is_reported_and_the_reading_goes_on(tmp_path: Path) -> None:
    consumer = _Consumer()
    consumer.ends = {0: 10}
    consumer.failure = KafkaTimeoutError("no leader for partition 2")
    errors: list[KafkaError] = []
    with RemoteSegmentStore(tmp_path) as store, capture_logs() as logs:
        tailer = _tailer(store, errors)
        await tailer._check_progress(consumer)
    assert errors == [consumer.failure]
    assert [e["event"] for e in logs] == ["metadata_progress_check_failed"]
    assert tailer.last_error is None  # not a failure of the reading itself


async def test_a_check_that_hangs_does_not_hold_up_the_reading(tmp_path: Path) -> None:
    """A ListOffsets to a partition without a leader waits out the request timeout: the check
    runs beside the reading, which goes on fetching meanwhile."""
    import asyncio

    class _Hanging(_Consumer):
        def __init__(self) -> None:
            super().__init__()
            self.asked = asyncio.Event()
            self.fetches = 0

        async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            self.asked.set()
            await asyncio.Event().wait()  # never answered
            raise AssertionError("unreachable")

        async def getmany(self, **_: object) -> dict:
            self.fetches += 1
            return {}

    consumer = _Hanging()
    consumer.ends = {0: 10, 1: 20, 2: 7}
    with RemoteSegmentStore(tmp_path) as store:
        tailer = _tailer(store, [])
        tailer._start_progress_check(consumer)
        await asyncio.wait_for(consumer.asked.wait(), 10)
        for _ in range(5):
            tailer._start_progress_check(consumer)  # one check at a time: still the first
            await asyncio.wait_for(tailer._step(consumer, asyncio.Event()), 10)
        assert consumer.fetches == 5
        await tailer._stop_progress_check()
        assert tailer._progress_task is None


class _Assigning:
    """What an assignment asks of aiokafka's consumer: seeks, beginnings and ends."""

    def __init__(self, beginning: int, end: int) -> None:
        self.beginning, self.end = beginning, end
        self.seeks: list[tuple[int, int]] = []

    def assign(self, tps: list[TopicPartition]) -> None:
        self.tps = tps

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp.partition, offset))

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.seeks += [(tp.partition, self.beginning) for tp in tps]

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.beginning for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end for tp in tps}


async def test_a_new_store_records_that_the_partition_lost_records_before_it_read_them(
    tmp_path: Path,
) -> None:
    """A store reading a metadata partition from its beginning, which is past offset 0 (a
    former retention.ms, DeleteRecords): the events of the deleted records are missing from it
    for good, and it says so (the scrub refuses such a store). From offset 0 it says nothing."""
    for beginning, gaps in ((500, {0: 500}), (0, {})):
        with RemoteSegmentStore(tmp_path / str(beginning)) as store, capture_logs() as logs:
            tailer = MetadataTailer(
                bootstrap_servers="127.0.0.1:9", store=store, broker_id=1, num_partitions=1
            )
            tailer.track([0])
            consumer: Any = _Assigning(beginning, 900)
            await tailer._assign(consumer)
            assert consumer.seeks == [(0, beginning)]
            assert store.history_gaps() == gaps
        warned = [e for e in logs if e["event"] == "metadata_history_incomplete"]
        assert [e["begins_at"] for e in warned] == list(gaps.values())


class _Leaderless(_Assigning):
    """An assignment where some partitions have no reachable leader: a ListOffsets that
    names one of them waits (aiokafka retries until its request timeout) until ``timeout``
    is set, then fails as a whole."""

    def __init__(self, beginning: int, end: int, leaderless: set[int]) -> None:
        super().__init__(beginning, end)
        self.leaderless = leaderless
        self.timeout = asyncio.Event()
        self.timeout.set()
        self.waiting = 0  # ListOffsets waiting for a leader
        self.fetched: list[set[int]] = []
        self.fetching = asyncio.Event()

    async def _check(self, tps: list[TopicPartition]) -> None:
        dead = sorted(tp.partition for tp in tps if tp.partition in self.leaderless)
        if dead:
            self.waiting += 1
            try:
                await self.timeout.wait()
            finally:
                self.waiting -= 1
            raise KafkaTimeoutError(f"no leader for partitions {dead}")

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        await self._check(tps)
        return await super().beginning_offsets(tps)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        await self._check(tps)
        return await super().end_offsets(tps)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= {tp.partition for tp in tps}

    def assign(self, tps: list[TopicPartition]) -> None:
        super().assign(tps)
        self.paused: set[int] = set()  # aiokafka: a new assignment has no paused partition

    async def getmany(self, **_: object) -> dict[TopicPartition, list[Any]]:
        self.fetched.append({tp.partition for tp in self.tps} - self.paused)
        self.fetching.set()
        await asyncio.sleep(0)
        return {}


async def test_a_partition_without_a_leader_does_not_stop_the_reading_of_the_others(
    tmp_path: Path,
) -> None:
    """The bounds of a partition without a reachable leader cannot be read: the other
    partitions are assigned, caught up and fetched all the same; that one is left out of the
    assignment (aiokafka's fetcher asks for metadata back to back while an assigned partition
    has no leader), not caught up, the tailer not healthy, and asked again beside the reading
    until it answers, then read like the others."""
    errors: list[KafkaError] = []
    with RemoteSegmentStore(tmp_path) as store, capture_logs() as logs:
        tailer = MetadataTailer(
            bootstrap_servers="127.0.0.1:9",
            store=store,
            broker_id=1,
            num_partitions=3,
            on_error=errors.append,
            retry_backoff_s=(0.001, 0.001),
        )
        tailer.track([0, 1, 2])
        tailer._state = tailer_module._State.STARTED
        assert tailer.healthy
        consumer: Any = _Leaderless(0, 0, leaderless={1})
        stopping = asyncio.Event()
        await tailer._step(consumer, stopping)
        assert {tp.partition for tp in consumer.tps} == {0, 2}
        assert consumer.fetched == [{0, 2}]
        assert [tailer.caught_up(p) for p in (0, 1, 2)] == [True, False, True]
        failed = [e for e in logs if e["event"] == "metadata_partition_offsets_failed"]
        assert [e["metadata_partitions"] for e in failed] == [[1]]
        assert len(errors) == 1
        assert not tailer.healthy  # a partition cannot be read
        # asked again beside the reading: a question that waits out the request timeout
        # holds up no fetch of the others
        consumer.timeout.clear()
        tailer._consumer = consumer
        tailer._next_progress_check = float("inf")  # not this test's subject
        reading = asyncio.create_task(tailer.run(stopping))
        async with asyncio.timeout(30):
            while not consumer.waiting:
                await asyncio.sleep(0)
            consumer.fetching.clear()
            await consumer.fetching.wait()
            assert consumer.fetched[-1] == {0, 2}
            assert not tailer.healthy
            consumer.leaderless.clear()  # a leader is back
            consumer.timeout.set()
            while not tailer.caught_up(1) or not tailer.healthy:
                await asyncio.sleep(0)
            consumer.fetching.clear()
            await consumer.fetching.wait()
        stopping.set()
        await reading
        assert consumer.fetched[-1] == {0, 1, 2}
        assert [tailer.caught_up(p) for p in (0, 1, 2)] == [True, True, True]
        assert any(e["event"] == "metadata_partition_offsets_answered" for e in logs)
