"""Selective metadata tailing: the cluster-wide duties (topic and partition deletion, the
orphan scrub) run on the elected coordinator only, whichever metadata partitions its broker
leads; the coordinator reads every metadata partition while it holds the role and gives up
those its broker does not need when it loses it."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from sidecar.config import RetentionConfig
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.kafka.logdir import PartitionScan
from sidecar.metadata.errors import MetadataNotTrackedError, MetadataTailError
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.observability.metrics import Metrics
from sidecar.retention._kafka import TopicIdState
from sidecar.retention.manager import RetentionManager
from sidecar.tiering.cluster import ClusterView, TopicConfig
from tests.unit.retention.test_topic_deletion import META, NUM_MP, _World

FOREVER = TopicConfig(retention_ms=-1, retention_bytes=-1)


def _leading_nothing(world: _World) -> None:
    """This broker leads no metadata partition (the rule of the read-everything mode)."""
    world.manager._cluster.view = dataclasses.replace(
        world.manager._cluster.view, leaders={(META, p): 2 for p in range(NUM_MP)}
    )


class TestTopicDeletion:
    async def test_the_coordinator_deletes_whatever_metadata_partitions_it_leads(self, tmp_path):
        world = _World(tmp_path, coordinator=lambda: True, topic_deletion_grace_s=0.0)
        try:
            _leading_nothing(world)
            for topic in ("a", "b", "c"):
                await world.tier(topic, 2)
            world.vanish("a", TopicIdState.ABSENT)
            summary = await world.manager.run_once()
            assert summary.deleted == 2
            assert world.objects_of("a") == set()
        finally:
            world.close()

    async def test_another_sidecar_deletes_nothing_and_judges_no_share(self, tmp_path):
        """Not the coordinator: even leading every metadata partition, it deletes nothing,
        and it does not halt on a share computed over the part of the store it reads."""
        world = _World(tmp_path, coordinator=lambda: False, topic_deletion_grace_s=0.0)
        try:
            for topic in ("a", "b"):
                await world.tier(topic, 2)
            world.vanish("a", TopicIdState.ABSENT)
            world.vanish("b", TopicIdState.ABSENT)  # all of its store: past any share
            with capture_logs() as logs:
                summary = await world.manager.run_once()
            assert summary.deleted == 0
            assert not summary.topic_deletion_halted
            assert world.objects_of("a")
            assert world.objects_of("b")
            assert not [e for e in logs if e["event"] == "topic_deletion_halted"]
        finally:
            world.close()

    async def test_the_role_moving_moves_the_deletion(self, tmp_path):
        holds = [False]
        world = _World(tmp_path, coordinator=lambda: holds[0], topic_deletion_grace_s=0.0)
        try:
            for topic in ("a", "b", "c"):
                await world.tier(topic, 2)
            world.vanish("a", TopicIdState.ABSENT)
            assert (await world.manager.run_once()).deleted == 0
            holds[0] = True
            assert (await world.manager.run_once()).deleted == 2
        finally:
            world.close()


class TestPartitionDeletion:
    async def test_only_the_coordinator_processes_a_marked_partition(self, tmp_path):
        holds = [False]
        world = _World(tmp_path, coordinator=lambda: holds[0])
        try:
            _leading_nothing(world)
            tp = await world.tier("a", 3)
            world.store.apply(
                [
                    PartitionDeleteMetadata(
                        topic_id_partition=tp,
                        broker_id=1,
                        event_timestamp_ms=0,
                        state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                    )
                ]
            )
            assert (await world.manager.run_once()).deleted == 0
            assert world.objects_of("a")
            holds[0] = True
            assert (await world.manager.run_once()).deleted == 3
            assert world.objects_of("a") == set()
            assert world.store.segments(tp) == []
        finally:
            world.close()


class _Tailer:
    healthy = True
    last_error: str | None = None
    stalled: frozenset[int] = frozenset()

    def __init__(self) -> None:
        self.tracked: set[int] = set()
        self.synced: list[int] = []

    async def sync(self, partition: int) -> None:
        if partition not in self.tracked:
            raise MetadataNotTrackedError(f"partition {partition} is not tracked")
        self.synced.append(partition)

    def caught_up(self, partition: int) -> bool:
        return partition in self.tracked

    def track(self, partitions: Any) -> None:
        self.tracked |= set(partitions)

    def untrack(self, partitions: Any) -> None:
        self.tracked -= set(partitions)

    def want_everything(self) -> None:
        self.tracked = set(range(8))

    def narrow(self, keep: Any) -> None:
        self.tracked = {metadata_partition(tp, 8) for tp in keep}


class _Scrubber:
    def __init__(self) -> None:
        self.runs = 0

    async def scrub(self, *, dry_run: bool, unsafe: Any, stop: Any = None) -> Any:
        self.runs += 1
        return SimpleNamespace(
            dry_run=True, orphans=[], aborted_uploads=[], stopped=False, refused=None
        )


def _manager(
    holds: list[bool], tailer: _Tailer, scrubber: _Scrubber, scans: dict[Any, PartitionScan]
) -> RetentionManager:
    """Over a broker leading every metadata partition (which selective tailing ignores)."""
    view = ClusterView(
        broker_id=1,
        leaders={(META, p): 1 for p in range(8)},  # leads every metadata partition
        configs={META: FOREVER},
        last_stable_offsets={},
        refreshed_at=time.monotonic(),
        stale_after_s=3600,
    )
    stub: Any = SimpleNamespace

    async def no_ids() -> dict[str, uuid.UUID]:
        return {}

    async def aclose() -> None:
        return None

    return RetentionManager(
        config=RetentionConfig(enabled=False, scrub_interval_s=0.001),
        views=lambda: scans,
        cluster=stub(view=view, selected=lambda topic: True, tiered=lambda topic: True),
        kafka=stub(topic_ids=no_ids, aclose=aclose),
        store=stub(partitions=list, partition_deletes=dict),
        tailer=tailer,  # type: ignore[arg-type]
        publisher=stub(),
        uploader=stub(broker_id=1),
        objects=stub(),
        scrubber=scrubber,  # type: ignore[arg-type]
        metrics=Metrics(),
        metadata_topic=META,
        num_metadata_partitions=8,
        coordinator=lambda: holds[0],
    )


def _scan(topic_id: uuid.UUID, partition: int) -> PartitionScan:
    return PartitionScan(
        path=Path(f"/logs/orders-{partition}"),
        topic="orders",
        partition=partition,
        topic_id=encode_kafka_uuid(topic_id),
        leader_epochs=(),
        segments=(),
        snapshot_offsets=(),
        transient_files=(),
        unknown_files=(),
    )


class TestRole:
    async def test_reads_all_while_coordinator_then_only_what_its_broker_hosts(self):
        topic_id = uuid.uuid4()
        hosted = {metadata_partition(TopicIdPartition(topic_id, "orders", 0), 8)}
        tailer = _Tailer()
        tailer.track(range(8))  # a store that read everything (an older sidecar's)
        holds = [False]
        scanned = [False]
        clock = [0.0]
        scrubber = _Scrubber()
        manager = _manager(holds, tailer, scrubber, {"p": _scan(topic_id, 0)})
        manager._scanned = lambda: scanned[0]
        manager._monotonic = lambda: clock[0]
        await manager.run_once()
        clock[0] = 31.0
        await manager.run_once()
        assert tailer.tracked == set(range(8))  # what the broker hosts is not known yet
        scanned[0] = True
        clock[0] = 32.0
        await manager.run_once()
        assert tailer.tracked == hosted
        assert scrubber.runs == 0  # one scrub per cluster: not this sidecar's

        holds[0] = True
        await manager.run_once()
        assert tailer.tracked == set(range(8))
        assert scrubber.runs == 1

        # a rebalance revokes the role for a moment: nothing is dropped
        holds[0] = False
        clock[0] = 40.0
        await manager.run_once()
        holds[0] = True
        clock[0] = 45.0
        manager._next_scrub_at = 0.0  # the scrub interval is wall-clock time: due now
        await manager.run_once()
        assert tailer.tracked == set(range(8))

        # the role went elsewhere: past the delay, only what the broker hosts is kept
        holds[0] = False
        clock[0] = 50.0
        await manager.run_once()
        assert tailer.tracked == set(range(8))
        clock[0] = 81.0
        with capture_logs() as logs:
            await manager.run_once()
        assert tailer.tracked == hosted
        assert scrubber.runs == 2
        assert [
            e["partitions"] for e in logs if e["event"] == "metadata_reading_hosted_partitions"
        ] == [1]

    async def test_reading_everything_mode_tracks_all_and_scrubs(self):
        """Without a coordinator (tailing = all), every sidecar reads and scrubs, as before."""
        tailer = _Tailer()
        scrubber = _Scrubber()
        manager = _manager([False], tailer, scrubber, {})
        manager._coordinator = None
        stopping = asyncio.Event()
        stopping.set()
        await manager.run(stopping)  # tracks everything before its first pass
        assert tailer.tracked == set(range(8))
        await manager.run_once()
        assert scrubber.runs == 1
        assert tailer.synced == list(range(8))  # read to the end just before the listing


def _scrubbing(sync: Any) -> tuple[_Scrubber, RetentionManager]:
    """A coordinator whose tailer read every metadata partition once and now reads them to
    their end with ``sync``: its scrubber, and the manager over both."""
    tailer = _Tailer()
    tailer.track(range(8))
    tailer.sync = sync  # type: ignore[method-assign]
    scrubber = _Scrubber()
    return scrubber, _manager([True], tailer, scrubber, {})


class TestScrubOnCurrentMetadata:
    """Caught up once is not current: copies other sidecars made since a tailer stopped
    reading are not in its store, and their objects would look unreferenced."""

    async def test_no_scrub_while_the_tailer_fails_or_a_partition_is_stalled(self):
        for broken in ("failing", "stalled", "sync"):
            tailer = _Tailer()
            tailer.track(range(8))  # caught up once, long ago
            if broken == "failing":
                tailer.healthy = False
                tailer.last_error = "TopicAuthorizationFailedError: __remote_log_metadata"
            elif broken == "stalled":
                tailer.stalled = frozenset({3})
            else:

                async def sync(partition: int) -> None:
                    raise MetadataTailError("cannot read the end offset")

                tailer.sync = sync  # type: ignore[method-assign]
            scrubber = _Scrubber()
            manager = _manager([True], tailer, scrubber, {})
            with capture_logs() as logs:
                await manager.run_once()
            assert scrubber.runs == 0, broken
            assert [e["event"] for e in logs if e["event"].startswith("scrub")] == ["scrub_skipped"]
            assert manager._metrics.scrub_runs.labels("skipped")._value.get() == 1
            # it is tried again at the next pass, and runs once the reading is current
            tailer.healthy, tailer.stalled = True, frozenset()
            tailer.sync = _Tailer.sync.__get__(tailer)  # type: ignore[method-assign]
            await manager.run_once()
            assert scrubber.runs == 1, broken

    async def test_a_sync_that_never_ends_skips_the_scrub(self, monkeypatch):
        monkeypatch.setattr("sidecar.retention.manager._SCRUB_SYNC_S", 0.01)
        never = asyncio.Event()

        async def sync(partition: int) -> None:
            await never.wait()  # its leader does not answer

        scrubber, manager = _scrubbing(sync)
        await manager.run_once()
        assert scrubber.runs == 0

    async def test_a_stop_ends_the_wait_for_the_metadata(self):
        """SIGTERM while the scrub waits for the store to read the metadata topic (the tailer
        stops reading at shutdown): the pass ends at once, with no scrub."""
        stop = asyncio.Event()
        asked = asyncio.Event()

        async def sync(partition: int) -> None:
            asked.set()
            await asyncio.Event().wait()  # never read to its end any more

        scrubber, manager = _scrubbing(sync)
        running = asyncio.create_task(manager.run_once(stop))
        await asked.wait()
        stop.set()
        async with asyncio.timeout(5):  # not the 60 s the wait is allowed
            await running
        assert scrubber.runs == 0
        assert manager._metrics.scrub_runs.labels("skipped")._value.get() == 0

    async def test_a_reading_that_fails_as_the_stop_comes_is_retrieved(self):
        """The metadata reading fails just as the daemon stops: its error is taken (no
        "exception never retrieved" left for the loop), and no scrub runs."""
        stop = asyncio.Event()
        asked = asyncio.Event()

        async def sync(partition: int) -> None:
            asked.set()
            await stop.wait()  # the consumer fails as the daemon stops
            raise MetadataTailError("the broker went away")

        scrubber, manager = _scrubbing(sync)
        loop = asyncio.get_running_loop()
        unretrieved: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
        try:
            running = asyncio.create_task(manager.run_once(stop))
            await asked.wait()
            stop.set()
            await running
            for _ in range(3):
                await asyncio.sleep(0)
            gc.collect()
        finally:
            loop.set_exception_handler(None)
        assert not unretrieved, [c.get("message") for c in unretrieved]
        assert scrubber.runs == 0
