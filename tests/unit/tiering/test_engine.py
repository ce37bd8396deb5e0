"""The tiering engine with its real uploader, store and an in-memory object store; Kafka (the
cluster view, the metadata topic) is faked: every published event is applied to the store at
once, as the tailer's read-back would. Covers crash repair by ownership, leadership hand-over,
cancellation, S3 failures mid-upload and copies deleted by another broker."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.errors import StorageError
from sidecar.kafka.checkpoints import (
    EpochEntry,
    decode_kafka_uuid,
    format_leader_epoch_checkpoint,
)
from sidecar.kafka.logdir import LEADER_EPOCH_CHECKPOINT, PartitionScan, scan_partition_dir
from sidecar.metadata.events import (
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.memory import MemoryObjectStore
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering.cluster import ClusterView
from sidecar.tiering.quarantine import Quarantine
from sidecar.tiering.uploader import SegmentUploader
from sidecar.tiering.workers import EngineSettings, TieringEngine

TOPIC = "orders"
ME, OTHER = 1, 2
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


class FakeCluster:
    """The cluster watcher's surface: a view that the test changes."""

    def __init__(self, leader: int, lso: int) -> None:
        self.lso = lso
        #: topics with remote.storage.enable=true: the broker tiers them through the plugin
        self.broker_driven_topics: set[str] = set()
        self.copy_disabled_topics: set[str] = set()
        self.set_leader(leader)

    def set_leader(self, leader: int) -> None:
        self.view = ClusterView(
            broker_id=ME,
            leaders={(TOPIC, 0): leader},
            configs={},
            last_stable_offsets={(TOPIC, 0): self.lso} if leader == ME else {},
            refreshed_at=time.monotonic() + 3600,
            stale_after_s=60,
        )

    def turn_broker_driven(self, topic: str) -> None:
        """remote.storage.enable=true, as a refresh reports it: a new view with new configs."""
        self.broker_driven_topics.add(topic)
        self.view = dataclasses.replace(self.view, configs={**self.view.configs})

    @property
    def broker_id(self) -> int:
        return ME

    def selected(self, topic: str) -> bool:
        return topic == TOPIC and topic not in self.broker_driven_topics

    def broker_driven(self, topic: str) -> bool:
        return topic in self.broker_driven_topics

    def broker_copies(self, topic: str) -> bool:
        return topic in self.broker_driven_topics and topic not in self.copy_disabled_topics


class FakeTailer:
    """Every metadata partition is caught up; ``sync`` is counted."""

    def __init__(self) -> None:
        self.tracked: set[int] = set()
        self.syncs = 0
        self.wants = 0  # partitions passed to want()
        self.unwanted_count = 0

    def caught_up(self, metadata_partition: int) -> bool:
        return True

    def track(self, partitions: Any) -> None:
        self.tracked |= set(partitions)

    def want(self, partitions: Any) -> None:
        wanted = list(partitions)
        self.wants += len(wanted)
        self.tracked |= {mp for _tp, mp in wanted}

    def is_tracked(self, metadata_partition: int) -> bool:
        return True

    async def sync(self, metadata_partition: int) -> None:
        self.syncs += 1


class FakePublisher:
    """Applies each event to the store when published (the read-back of the real one)."""

    def __init__(self, store: RemoteSegmentStore) -> None:
        self.store = store
        self.events: list[tuple[float, RemoteLogMetadata]] = []
        #: called with each event before it is applied; may apply others first
        self.before: Callable[[RemoteLogMetadata], None] = lambda event: None

    async def publish_and_wait(self, event: RemoteLogMetadata) -> tuple[int, int]:
        self.before(event)
        self.events.append((time.monotonic(), event))
        self.store.apply([event])
        await asyncio.sleep(0)
        return 0, len(self.events)


class GatedStore(MemoryObjectStore):
    """put_file waits for ``gate`` (a slow upload the test can interrupt)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.uploading = asyncio.Event()

    async def put_file(self, key: str, path: Any, **kwargs: Any) -> Any:
        self.uploading.set()
        await self.gate.wait()
        return await super().put_file(key, path, **kwargs)


class Rig:
    """A partition with three rolled segments and an active one, and an engine for it."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        batches = [
            [build_batch([TestRecord(b"k", b"v" * 100)] * 5) for _ in range(4)] for _ in range(4)
        ]
        path = write_partition(tmp_path / "logs", TOPIC, 0, batches)
        scan = scan_partition_dir(path)
        assert scan is not None
        assert scan.topic_id is not None
        self.scan: PartitionScan = scan
        self.tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), TOPIC, 0)
        self.rolled = [s for s in scan.segments if s.end_offset is not None]
        self.store = RemoteSegmentStore(tmp_path / "state")
        self.objects = GatedStore()
        self.publisher = FakePublisher(self.store)
        self.tailer = FakeTailer()
        self.cluster = FakeCluster(ME, lso=self.rolled[-1].end_offset + 1)
        self.metrics = Metrics()
        self.layout = KeyLayout(prefix="t/")
        self.uploader = SegmentUploader(
            objects=self.objects,
            publisher=self.publisher,  # type: ignore[arg-type]
            layout=self.layout,
            broker_id=ME,
            part_size=5 * 1024 * 1024,
            concurrency=1,
            store=self.store,
            # one wall clock for the engine and the events it publishes, as in the daemon
            **({"clock_ms": settings["clock_ms"]} if "clock_ms" in settings else {}),
        )
        defaults: dict[str, Any] = {
            "backoff_initial_s": 0.01,
            "backoff_max_s": 0.05,
            "wake_interval_s": 0.01,
            "handover_delay_s": 0.0,
            "foreign_copy_grace_s": 60.0,
            "drain_timeout_s": 5.0,
        }
        self.pause: str | None = None
        self.engine = TieringEngine(
            views=lambda: {path: self.scan},
            cluster=self.cluster,  # type: ignore[arg-type]
            store=self.store,
            tailer=self.tailer,  # type: ignore[arg-type]
            uploader=self.uploader,
            quarantine=Quarantine(tmp_path / "state" / "quarantine.json"),
            metrics=self.metrics,
            settings=EngineSettings(**{**defaults, **settings}),
            pause_reason=lambda: self.pause,
        )
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.engine.run(self.stopping))

    async def stop(self) -> None:
        self.stopping.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)

    def count_reconciles(self) -> Callable[[], int]:
        """Count the engine's reconcile calls from now on (a stale view's too); the returned
        function tells how many so far."""
        count = 0
        real = self.engine._reconcile

        def counted(tg: asyncio.TaskGroup) -> None:
            nonlocal count
            count += 1
            real(tg)

        self.engine._reconcile = counted  # type: ignore[method-assign]
        return lambda: count

    async def until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        # generous: a loaded CI machine (two suites at once) took more than 5 s here once
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached"
            await asyncio.sleep(0.01)

    def finished(self) -> list[tuple[int, int]]:
        return [
            (m.start_offset, m.end_offset) for m in self.store.segments(self.tip, states={FINISHED})
        ]

    def all_tiered(self) -> bool:
        return self.finished() == [(s.base_offset, s.end_offset) for s in self.rolled]

    def keys_of(self, metadata: SegmentMetadata) -> set[str]:
        tip = metadata.segment_id.topic_id_partition
        return {
            self.layout.segment_key(
                topic=tip.topic,
                topic_id=tip.topic_id,
                partition=tip.partition,
                base_offset=metadata.start_offset,
                segment_id=metadata.segment_id.id,
                suffix=suffix,
            )
            for suffix in ObjectSuffix
        }

    def expected_objects(self) -> set[str]:
        keys: set[str] = set()
        for m in self.store.segments(self.tip, states={FINISHED}):
            keys |= self.keys_of(m)
        return keys

    def copy_started(
        self, segment_index: int, *, broker: int, stamped_ms: int = 1
    ) -> SegmentMetadata:
        segment = self.rolled[segment_index]
        assert segment.end_offset is not None
        event = SegmentMetadata(
            segment_id=RemoteLogSegmentId(self.tip, uuid.uuid4()),
            start_offset=segment.base_offset,
            end_offset=segment.end_offset,
            broker_id=broker,
            max_timestamp_ms=segment.max_timestamp_ms or 0,
            event_timestamp_ms=stamped_ms,
            segment_leader_epochs=((0, segment.base_offset),),
            segment_size_in_bytes=segment.size,
        )
        self.store.apply([event])
        return event

    def update(
        self, metadata: SegmentMetadata, state: RemoteLogSegmentState, *, broker: int
    ) -> None:
        self.store.apply(
            [
                SegmentMetadataUpdate(
                    segment_id=metadata.segment_id,
                    broker_id=broker,
                    event_timestamp_ms=2,
                    state=state,
                )
            ]
        )

    def states_of(self, metadata: SegmentMetadata) -> list[RemoteLogSegmentState]:
        return [
            e.state
            for _, e in self.publisher.events
            if getattr(e, "segment_id", None) == metadata.segment_id
        ]


class TestEngineTiering:
    """The plain path: every rolled segment below the LSO, in order, once."""

    async def test_tiers_every_rolled_segment_once(self, rig):
        """Three rolled segments get one FINISHED copy each, with their objects and nothing
        else in the bucket."""
        r = rig()
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert set(r.objects.objects) == r.expected_objects()
        assert r.tailer.syncs == 1  # caught up on the metadata before the first upload

    async def test_paused_engine_starts_no_copy(self, rig):
        """While S3 is known to be down (pause reason), nothing is started; on resume it is."""
        r = rig()
        r.pause = "S3 is unreachable"
        reconciles = r.count_reconciles()
        r.start()
        await r.until(lambda: reconciles() >= 3)
        assert r.engine._workers == {}  # no worker was even started
        assert r.publisher.events == []
        r.pause = None
        r.engine.retry_now()
        await r.until(r.all_tiered)
        await r.stop()

    async def test_a_running_worker_starts_no_further_copy_once_paused(self, rig):
        """Kafka becomes unreachable while a worker goes through a backlog: the view still
        says this broker leads (it is not stale yet), but a new leader may start copying
        before it is; the copy in flight finishes, and no further segment starts."""
        r = rig()
        r.objects.gate.clear()  # the first upload waits
        r.start()
        await asyncio.wait_for(r.objects.uploading.wait(), 10)
        r.pause = "Kafka is unreachable"  # what the daemon says once a refresh failed
        r.objects.gate.set()
        await r.until(lambda: len(r.finished()) == 1)
        key = (TOPIC, 0)
        await r.until(lambda: r.engine._workers[key].task.done())
        started = [e for e in r.publisher.events if e[1].state is STARTED]
        assert len(started) == 1
        r.pause = None
        r.engine.retry_now()
        await r.until(r.all_tiered)
        await r.stop()

    async def test_a_pause_while_a_segment_is_opened_is_not_an_upload_error(self, rig, monkeypatch):
        """The pause starts after the worker's own check, while the uploader opens and checks
        the segment: the copy is not started, and that is no failure (no error counted, no
        backoff); it starts once the pause ends."""
        from structlog.testing import capture_logs

        from sidecar.tiering import uploader

        r = rig()
        real_open = uploader._open_segment
        opened = 0

        def open_then_pause(*args: Any, **kwargs: Any) -> Any:
            nonlocal opened
            opened += 1
            if opened == 1:
                r.pause = "S3 is unreachable"
            return real_open(*args, **kwargs)

        monkeypatch.setattr(uploader, "_open_segment", open_then_pause)
        key = (TOPIC, 0)
        with capture_logs() as logs:
            r.start()
            await r.until(lambda: opened == 1 and r.engine._workers[key].task.done())
            assert r.publisher.events == []
            r.pause = None
            r.engine.retry_now()
            await r.until(r.all_tiered)
            await r.stop()
        assert [e["event"] for e in logs if e["event"] == "partition_tiering_failed"] == []
        (family,) = r.metrics.upload_errors.collect()
        errors = {s.labels["kind"]: s.value for s in family.samples if s.name.endswith("_total")}
        assert errors == {}
        assert r.engine._workers[key].failures == 0

    async def test_passes_count_only_on_a_fresh_cluster_view(self, rig):
        """What the readiness check waits for: a pass on a stale view (no refresh answered
        yet) selects no topic and asks for no metadata, so it is not counted."""
        r = rig()
        r.cluster.view = dataclasses.replace(r.cluster.view, refreshed_at=-1e9)
        reconciles = r.count_reconciles()
        r.start()
        await r.until(lambda: reconciles() >= 3)
        assert r.engine.passes == 0
        r.cluster.set_leader(ME)  # a refresh answered
        await r.until(lambda: r.engine.passes > 0)
        await r.stop()

    async def test_handover_delay_before_first_upload(self, rig):
        """A partition just led is not uploaded before the hand-over delay."""
        r = rig(handover_delay_s=0.3)
        started = time.monotonic()
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.publisher.events[0][0] - started >= 0.3


class TestBrokerDriven:
    """A topic with remote.storage.enable=true belongs to the broker's RLM."""

    async def test_broker_driven_topic_is_tailed_but_never_copied_or_repaired(self, rig):
        """Its metadata partition is tailed (reads, Spark, status), but the engine starts no
        copy and leaves the broker's unfinished copy alone: no event, no object."""
        r = rig()
        r.cluster.broker_driven_topics.add(TOPIC)
        r.copy_started(0, broker=ME)  # what the broker's RLM writes before copyLogSegmentData
        r.start()
        await r.until(lambda: bool(r.tailer.tracked))
        # the pass that tracked the partition is the one that would have started its worker
        await r.stop()
        assert r.publisher.events == []
        assert r.objects.objects == {}
        assert r.finished() == []

    async def test_topic_turned_broker_driven_mid_upload_is_handed_over(self, rig):
        """remote.storage.enable=true set while the sidecar uploads: the copy in flight is
        abandoned (deleted, never FINISHED) and nothing more is uploaded, so the broker's first
        copy pass starts from the sidecar's last FINISHED copy."""
        r = rig()
        r.objects.gate.clear()
        r.start()
        await asyncio.wait_for(r.objects.uploading.wait(), 5)
        r.cluster.turn_broker_driven(TOPIC)
        r.engine.poke()
        first = next(e for _, e in r.publisher.events if isinstance(e, SegmentMetadata))
        await r.until(lambda: DELETE_FINISHED in r.states_of(first))
        r.objects.gate.set()
        await r.until(lambda: not r.engine.busy_partitions)  # the abandoned upload ended
        # passes after it: a copy one of them started would be drained by stop(), FINISHED
        reconciles = r.count_reconciles()
        await r.until(lambda: reconciles() >= 3)
        await r.stop()
        assert r.states_of(first) == [STARTED, DELETE_STARTED, DELETE_FINISHED]
        assert r.finished() == []
        assert r.objects.objects == {}
        assert r.metrics.preempted_copies.labels("broker_driven")._value.get() == 1

    async def test_topic_turned_broker_driven_while_started_is_read_back(self, rig):
        """The topic turns broker-driven while the copy's STARTED, already on the topic, is
        being read back: that copy is deleted too, not left STARTED (the sidecar repairs no
        broker-driven partition, so nothing else would)."""
        r = rig()
        publish = r.publisher.publish_and_wait
        reading_back = asyncio.Event()

        async def slow_read_back(event: object) -> None:
            await publish(event)  # the record lands (and is applied)
            if isinstance(event, SegmentMetadata) and not reading_back.is_set():
                reading_back.set()
                await asyncio.Event().wait()  # its read-back does not end

        r.publisher.publish_and_wait = slow_read_back
        r.start()
        await asyncio.wait_for(reading_back.wait(), 5)
        r.cluster.turn_broker_driven(TOPIC)
        r.engine.poke()
        first = next(e for _, e in r.publisher.events if isinstance(e, SegmentMetadata))
        await r.until(lambda: DELETE_FINISHED in r.states_of(first))
        await r.stop()
        assert r.states_of(first) == [STARTED, DELETE_STARTED, DELETE_FINISHED]
        assert list(r.store.unfinished_copies(r.tip)) == []
        assert r.finished() == []

    async def test_crash_repair_spares_a_copy_once_the_topic_is_the_brokers(self, rig):
        """The topic turns broker-driven while a worker reads the partition's metadata before
        its crash repair: a STARTED copy under this broker's id may be the broker's own copy in
        flight, so it is not deleted (the broker would drop its local segment after it)."""
        r = rig()
        brokers_copy = r.copy_started(0, broker=ME)  # what the broker's RLM writes first
        sync = r.tailer.sync

        async def turned_meanwhile(metadata_partition: int) -> None:
            r.cluster.turn_broker_driven(TOPIC)  # the broker's copy call told the watcher
            await sync(metadata_partition)

        r.tailer.sync = turned_meanwhile  # type: ignore[method-assign]
        r.start()
        await r.until(lambda: r.tailer.syncs > 0)
        reconciles = r.count_reconciles()
        await r.until(lambda: reconciles() >= 3 and not r.engine.busy_partitions)
        await r.stop()
        assert r.states_of(brokers_copy) == []
        assert [m.segment_id for m in r.store.unfinished_copies(r.tip)] == [brokers_copy.segment_id]

    async def test_no_repair_once_the_topic_is_the_brokers(self, rig):
        """The topic turns broker-driven while a worker reads the partition's metadata: a
        DELETE_SEGMENT_STARTED under this broker's id may be the broker's own delete in
        flight, and another broker's STARTED copy its RLM's; neither is finished or deleted
        here, even past the grace period."""
        r = rig(foreign_copy_grace_s=0.0)
        brokers_delete = r.copy_started(0, broker=ME)
        r.update(brokers_delete, DELETE_STARTED, broker=ME)
        other_copy = r.copy_started(1, broker=OTHER)
        sync = r.tailer.sync

        async def turned_meanwhile(metadata_partition: int) -> None:
            r.cluster.turn_broker_driven(TOPIC)  # the broker's copy call told the watcher
            await sync(metadata_partition)

        r.tailer.sync = turned_meanwhile  # type: ignore[method-assign]
        r.start()
        await r.until(lambda: r.tailer.syncs > 0)
        reconciles = r.count_reconciles()
        await r.until(lambda: reconciles() >= 3 and not r.engine.busy_partitions)
        await r.stop()
        assert r.publisher.events == []
        assert [m.segment_id for m in r.store.unfinished_deletes(r.tip)] == [
            brokers_delete.segment_id
        ]
        assert [m.segment_id for m in r.store.unfinished_copies(r.tip)] == [other_copy.segment_id]

    async def test_a_broker_driven_topics_copy_lag_is_the_brokers(self, rig):
        """The broker copies the topic: its copy lag counts the rolled segments without a
        FINISHED copy in the store and falls as the broker's copies finish, so the copy-lag
        alerts cover broker-driven topics too. With remote.log.copy.disable nothing will be
        copied: the topic has no copy lag."""
        r = rig(lag_interval_s=0.01)
        r.cluster.turn_broker_driven(TOPIC)
        lag = "kafka_tiered_sidecar_copy_lag_segments"

        def lag_of() -> float | None:
            return r.metrics.registry.get_sample_value(lag, {"topic": TOPIC})

        r.start()
        await r.until(lambda: lag_of() == len(r.rolled))
        r.update(r.copy_started(0, broker=ME), FINISHED, broker=ME)
        await r.until(lambda: lag_of() == len(r.rolled) - 1)
        r.cluster.copy_disabled_topics.add(TOPIC)
        r.cluster.turn_broker_driven(TOPIC)  # a refresh: new configs
        r.engine.poke()
        await r.until(lambda: lag_of() is None)
        await r.stop()
        assert r.publisher.events == []  # the broker's copies: the sidecar published nothing


class TestEngineRepair:
    """Unfinished copies and deletes are repaired by their owner at once, and by another
    broker only after the grace period."""

    async def test_own_unfinished_copy_is_deleted_and_redone(self, rig):
        """A STARTED copy of this broker (a crash) is deleted, its objects and open multipart
        upload removed, and the segment uploaded again."""
        r = rig()
        leftover = r.copy_started(0, broker=ME)
        log_key = next(k for k in r.keys_of(leftover) if k.endswith(".log"))
        await r.objects.put(log_key.replace(".log", ".indexes"), b"partial")
        await r.objects.create_multipart_upload(log_key)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.states_of(leftover) == [DELETE_STARTED, DELETE_FINISHED]
        assert set(r.objects.objects) == r.expected_objects()
        assert [u async for u in r.objects.list_multipart_uploads("t/")] == []

    async def test_foreign_unfinished_copy_blocks_until_grace(self, rig):
        """Another broker's STARTED copy holds the partition back (it may still finish it),
        then, past the grace period, is deleted as dangling and the segment redone."""
        r = rig(foreign_copy_grace_s=0.4)
        leftover = r.copy_started(0, broker=OTHER)
        started = time.monotonic()
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        # nothing before the grace period (a check after a sleep would race it when loaded)
        assert r.publisher.events[0][0] - started >= 0.4
        assert r.states_of(leftover) == [DELETE_STARTED, DELETE_FINISHED]
        assert r.metrics.repairs.labels("dangling_copy")._value.get() == 1

    async def test_foreign_copy_finished_by_its_owner_is_not_uploaded_again(self, rig):
        """When the owner finishes its copy during the wait, tiering continues after it."""
        r = rig(foreign_copy_grace_s=30)
        theirs = r.copy_started(0, broker=OTHER)
        key = (TOPIC, 0)
        r.start()
        # a worker looked at the partition and ended, waiting for the owner
        await r.until(lambda: key in r.engine._workers and r.engine._workers[key].task.done())
        assert r.publisher.events == []
        r.update(theirs, FINISHED, broker=OTHER)
        await r.until(r.all_tiered)
        await r.stop()
        mine = [e for _, e in r.publisher.events if isinstance(e, SegmentMetadata)]
        assert [m.start_offset for m in mine] == [s.base_offset for s in r.rolled[1:]]

    async def test_foreign_unfinished_delete_does_not_block(self, rig):
        """Another broker's DELETE_SEGMENT_STARTED does not hold uploads back."""
        r = rig(foreign_copy_grace_s=30)
        theirs = r.copy_started(0, broker=OTHER)
        r.update(theirs, DELETE_STARTED, broker=OTHER)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.states_of(theirs) == []  # left to its owner within the grace period


class TestEngineFailures:
    """Failures mid-upload leave no FINISHED copy without objects and converge."""

    async def test_s3_failure_mid_upload_is_cleaned_up_and_redone(self, rig):
        """The .log upload fails and so does the cleanup's delete (S3 down): the copy stays
        DELETE_SEGMENT_STARTED; the retry finishes that delete, then uploads the segment."""
        r = rig()
        down = StorageError("S3 down")
        r.objects.fail_next("put_file", down)
        r.objects.fail_next("delete", down)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        first = next(e for _, e in r.publisher.events if isinstance(e, SegmentMetadata))
        assert r.states_of(first) == [STARTED, DELETE_STARTED, DELETE_FINISHED]
        assert r.store.unfinished_copies() == []
        assert r.store.unfinished_deletes() == []
        assert set(r.objects.objects) == r.expected_objects()
        assert r.metrics.upload_errors.labels("StorageError")._value.get() == 1

    async def test_leadership_loss_cancels_the_upload_and_deletes_the_copy(self, rig):
        """Another broker becomes the leader mid-upload: the copy is abandoned
        (DELETE_SEGMENT_STARTED/FINISHED, no object) and nothing more is uploaded."""
        r = rig()
        r.objects.gate.clear()
        r.start()
        await asyncio.wait_for(r.objects.uploading.wait(), 5)
        r.cluster.set_leader(OTHER)
        r.engine.poke()
        first = next(e for _, e in r.publisher.events if isinstance(e, SegmentMetadata))
        await r.until(lambda: DELETE_FINISHED in r.states_of(first))
        r.objects.gate.set()
        await r.until(lambda: not r.engine.busy_partitions)  # the abandoned upload ended
        # passes after it: a copy one of them started would be drained by stop(), FINISHED
        reconciles = r.count_reconciles()
        await r.until(lambda: reconciles() >= 3)
        await r.stop()
        assert r.states_of(first) == [STARTED, DELETE_STARTED, DELETE_FINISHED]
        assert r.finished() == []
        assert r.objects.objects == {}
        assert r.metrics.preempted_copies.labels("not_leader")._value.get() == 1

    async def test_leadership_lost_before_finished_is_not_published(self, rig):
        """A view that changes during the upload (no reconcile in between) stops FINISHED."""
        r = rig(wake_interval_s=60)
        r.objects.gate.clear()
        r.start()
        await asyncio.wait_for(r.objects.uploading.wait(), 5)
        r.cluster.set_leader(OTHER)
        r.objects.gate.set()
        first = next(e for _, e in r.publisher.events if isinstance(e, SegmentMetadata))
        await r.until(lambda: DELETE_FINISHED in r.states_of(first))
        await r.stop()
        assert FINISHED not in r.states_of(first)
        assert r.objects.objects == {}

    async def test_copy_deleted_by_another_broker_removes_its_objects(self, rig):
        """Another broker's DELETE_SEGMENT_STARTED lands before our FINISHED: the FINISHED is
        dropped by the state machine, so our objects are deleted and the segment redone."""
        r = rig()
        preempted: list[SegmentMetadataUpdate] = []

        def before(event: RemoteLogMetadata) -> None:
            finishing = isinstance(event, SegmentMetadataUpdate) and event.state is FINISHED
            if finishing and not preempted:
                preempted.append(event)
                r.store.apply(
                    [
                        SegmentMetadataUpdate(
                            segment_id=event.segment_id,
                            broker_id=OTHER,
                            event_timestamp_ms=3,
                            state=DELETE_STARTED,
                        )
                    ]
                )

        r.publisher.before = before
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.metrics.upload_errors.labels("SegmentCopyPreemptedError")._value.get() == 1
        deleted = r.metrics.preempted_copies.labels("deleted_by_another_broker")
        assert deleted._value.get() == 1
        assert set(r.objects.objects) == r.expected_objects()

    async def test_a_non_monotonic_epoch_checkpoint_tiers_as_the_broker_loads_it(self, rig):
        """A leader-epoch-checkpoint whose entries do not ascend neither stops the engine nor
        the partition: its lineage is the broker's epoch cache (the non-monotonic entry
        dropped, as at the broker's load), and every rolled segment tiers."""
        r = rig()
        entries = [EpochEntry(0, 0), EpochEntry(2, 5), EpochEntry(1, 10)]
        (r.scan.path / LEADER_EPOCH_CHECKPOINT).write_bytes(format_leader_epoch_checkpoint(entries))
        scan = scan_partition_dir(r.scan.path)
        assert scan is not None
        assert scan.leader_epochs == tuple(entries)
        r.scan = scan
        r.start()
        assert r.task is not None
        await r.until(lambda: r.task.done() or r.all_tiered())
        assert not r.task.done()
        await r.stop()
        first = min(r.store.segments(r.tip, states={FINISHED}), key=lambda m: m.start_offset)
        assert first.segment_leader_epochs == ((0, 0), (1, 10))


class TestEngineIdle:
    """A partition with nothing to upload costs nothing until something changes."""

    async def test_a_partition_is_wanted_again_only_when_the_tailer_may_have_dropped_it(self, rig):
        """Passes over every partition (here: every wake-up) do not want a partition the
        tailer already reads; once the tailer says it may have dropped partitions, the next
        pass wants them all again."""
        r = rig(full_pass_interval_s=0.0)
        passes = r.count_reconciles()
        r.start()
        await r.until(r.all_tiered)
        wanted, seen = r.tailer.wants, passes()
        assert wanted >= 1
        await r.until(lambda: passes() >= seen + 20)  # passes over every partition
        assert r.tailer.wants == wanted
        r.tailer.unwanted_count += 1  # a narrowing
        r.engine.poke()
        await r.until(lambda: r.tailer.wants == wanted + 1)
        await r.stop()

    async def test_idle_partition_is_not_planned_in_a_loop(self, rig):
        """Once everything is tiered, wake-ups do not plan the partition again; a new roll
        (a new scan of the partition) does."""
        r = rig()
        calls = 0
        highest = r.store.highest_offset_for_epoch

        def counting(*args: Any) -> int | None:
            nonlocal calls
            calls += 1
            return highest(*args)

        r.store.highest_offset_for_epoch = counting  # type: ignore[method-assign]
        r.start()
        await r.until(r.all_tiered)
        # the last worker finishes and goes idle (it may plan once more in a thread, late on a
        # loaded machine): wait until a window of ten wake-ups sees no call; a planner in a loop
        # never gets there
        async with asyncio.timeout(10):
            while True:
                before = calls
                await asyncio.sleep(0.1)
                if calls == before:
                    break
        calls = 0
        await asyncio.sleep(0.3)  # thirty wake-ups of 10 ms
        assert calls <= 1  # at most the copy-lag gauge, not the planner in a loop
        r.scan = dataclasses.replace(r.scan)  # what the detector does on a change
        r.engine.poke()
        await r.until(lambda: calls >= 1)
        await r.stop()
