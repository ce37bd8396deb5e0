"""Topic deletion needs proof: a topic id answered UNKNOWN_TOPIC_ID when asked by id, at every
pass for the grace period, and a pass that would delete more than a share of the tiered segments
stops. Real metadata store and in-memory bucket; the Kafka answers, the publisher (applying to
the store, as the read-back would) and the clock are stubs."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from sidecar.config import RetentionConfig
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.retention._kafka import TopicIdState
from sidecar.retention.manager import _DELETE_BATCH, SERIES_GRACE_S, RetentionManager
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.memory import MemoryObjectStore
from sidecar.tiering.cluster import ClusterUnavailableError, ClusterView, TopicConfig

META = "__remote_log_metadata"
NUM_MP = 2
LAYOUT = KeyLayout(prefix="p/")
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


def _segment(tp: TopicIdPartition, start: int) -> SegmentMetadata:
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
        start_offset=start,
        end_offset=start + 9,
        broker_id=1,
        max_timestamp_ms=0,
        event_timestamp_ms=0,
        segment_leader_epochs=((0, start),),
        segment_size_in_bytes=10,
    )


def _keys(segment: SegmentMetadata) -> dict[ObjectSuffix, str]:
    tp = segment.segment_id.topic_id_partition
    return {
        suffix: LAYOUT.segment_key(
            topic=tp.topic,
            topic_id=tp.topic_id,
            partition=tp.partition,
            base_offset=segment.start_offset,
            segment_id=segment.segment_id.id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    }


class _Kafka:
    """The all-topics listing and the by-id answers, set by the test."""

    def __init__(self) -> None:
        self.listed: dict[str, uuid.UUID] = {}
        self.by_id: dict[uuid.UUID, TopicIdState] = {}
        self.asked: list[set[uuid.UUID]] = []

    async def topic_ids(self) -> dict[str, uuid.UUID]:
        return dict(self.listed)

    async def topic_id_states(self, ids: Any) -> dict[uuid.UUID, TopicIdState]:
        self.asked.append(set(ids))
        return {i: self.by_id.get(i, TopicIdState.UNKNOWN) for i in ids}

    async def aclose(self) -> None:
        pass


class _World:
    """A store with tiered topics, their objects, and a manager over them."""

    def __init__(self, tmp_path: Any, coordinator: Any = None, **config: Any) -> None:
        self.store = RemoteSegmentStore(tmp_path / "state")
        self.objects = MemoryObjectStore()
        self.kafka = _Kafka()
        self.metrics = Metrics()
        self.now = [1000.0]
        self.topics: dict[str, list[SegmentMetadata]] = {}
        leaders = {(META, p): 1 for p in range(NUM_MP)}  # this broker leads every metadata part.
        view = ClusterView(
            broker_id=1,
            leaders=leaders,
            configs={},
            last_stable_offsets={},
            refreshed_at=time.monotonic(),
            stale_after_s=3600,
        )
        stub: Any = SimpleNamespace
        #: called with each event published, after the store applied it
        self.on_publish: Callable[[Any], None] = lambda event: None

        async def publish_and_wait(event: Any) -> tuple[int, int]:
            self.store.apply([event])
            self.on_publish(event)
            return 0, 0

        self.manager = RetentionManager(
            config=RetentionConfig(
                scrub_enabled=False, **{"topic_deletion_grace_s": 3600.0, **config}
            ),
            views=dict,
            cluster=stub(view=view, selected=lambda topic: True),
            kafka=self.kafka,  # type: ignore[arg-type]
            store=self.store,
            tailer=stub(
                caught_up=lambda p: True,
                track=lambda parts: None,
                want_everything=lambda: None,
                narrow=lambda keep: None,
            ),
            publisher=stub(publish_and_wait=publish_and_wait),
            uploader=stub(broker_id=1, keys=_keys),
            objects=self.objects,
            scrubber=stub(),
            metrics=self.metrics,
            metadata_topic=META,
            num_metadata_partitions=NUM_MP,
            coordinator=coordinator,
            monotonic=lambda: self.now[0],
        )

    async def tier(self, topic: str, segments: int) -> TopicIdPartition:
        tp = TopicIdPartition(uuid.uuid4(), topic, 0)
        metadata = [_segment(tp, 10 * i) for i in range(segments)]
        self.store.apply(metadata)
        self.store.apply(
            [
                SegmentMetadataUpdate(
                    segment_id=m.segment_id, broker_id=1, event_timestamp_ms=0, state=FINISHED
                )
                for m in metadata
            ]
        )
        for m in metadata:
            for key in _keys(m).values():
                await self.objects.put(key, b"x")
        self.topics[topic] = metadata
        self.kafka.listed[topic] = tp.topic_id
        self.kafka.by_id[tp.topic_id] = TopicIdState.PRESENT
        return tp

    def vanish(self, topic: str, answer: TopicIdState) -> uuid.UUID:
        """The topic leaves the all-topics listing; asked by id, the broker says ``answer``."""
        topic_id = self.kafka.listed.pop(topic)
        self.kafka.by_id[topic_id] = answer
        return topic_id

    def objects_of(self, topic: str) -> set[str]:
        return {k for m in self.topics[topic] for k in _keys(m).values()} & set(
            self.objects.objects
        )

    def value(self, name: str, **labels: str) -> float:
        found = self.metrics.registry.get_sample_value(f"kafka_tiered_sidecar_{name}", labels)
        return 0.0 if found is None else found

    def close(self) -> None:
        self.store.close()


class TestProof:
    async def test_only_unknown_topic_id_counts_never_an_authorization_error(self, tmp_path):
        """A topic hidden by a lost Describe ACL is kept however long it stays hidden."""
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0)
        try:
            await world.tier("orders", 3)
            await world.tier("payments", 3)
            hidden = world.vanish("orders", TopicIdState.UNAUTHORIZED)
            with capture_logs() as logs:
                for _ in range(3):
                    world.now[0] += 7 * 86400
                    summary = await world.manager.run_once()
                    assert summary.deleted == 0
            assert len(world.objects_of("orders")) == 9
            assert world.kafka.asked == [{hidden}] * 3  # the candidates only, by id
            warned = [e for e in logs if e["event"] == "topic_deletion_unconfirmed"]
            assert [(e["topic"], e["answer"]) for e in warned] == [("orders", "unauthorized")]
            assert world.value("topic_deletion_unconfirmed_total", reason="unauthorized") == 3
        finally:
            world.close()

    async def test_no_answer_or_another_error_is_no_proof(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0)
        try:
            await world.tier("orders", 2)
            await world.tier("payments", 2)
            world.vanish("orders", TopicIdState.UNKNOWN)
            world.now[0] += 86400
            assert (await world.manager.run_once()).deleted == 0
            assert len(world.objects_of("orders")) == 6
        finally:
            world.close()


class TestGracePeriod:
    async def test_default_is_hours(self):
        assert RetentionConfig().topic_deletion_grace_s >= 3600

    async def test_deleted_only_after_the_grace_period_of_confirmed_absence(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=3600.0, topic_deletion_max_share=1.0)
        try:
            await world.tier("orders", 2)
            await world.tier("payments", 2)
            world.vanish("orders", TopicIdState.ABSENT)
            assert (await world.manager.run_once()).deleted == 0  # first seen gone: t = 0
            world.now[0] += 3599
            assert (await world.manager.run_once()).deleted == 0
            assert len(world.objects_of("orders")) == 6
            world.now[0] += 1
            assert (await world.manager.run_once()).deleted == 2
            assert world.objects_of("orders") == set()
            assert len(world.objects_of("payments")) == 6
            assert (
                world.store.segments(world.topics["orders"][0].segment_id.topic_id_partition) == []
            )
        finally:
            world.close()

    async def test_an_unconfirming_answer_restarts_the_grace_period(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=3600.0, topic_deletion_max_share=1.0)
        try:
            await world.tier("orders", 2)
            await world.tier("payments", 2)
            topic_id = world.vanish("orders", TopicIdState.ABSENT)
            await world.manager.run_once()
            world.now[0] += 3000
            world.kafka.by_id[topic_id] = TopicIdState.UNAUTHORIZED
            await world.manager.run_once()
            world.now[0] += 1000  # 4000 s after the first UNKNOWN_TOPIC_ID
            world.kafka.by_id[topic_id] = TopicIdState.ABSENT
            assert (await world.manager.run_once()).deleted == 0  # the clock starts again
            world.now[0] += 3600
            assert (await world.manager.run_once()).deleted == 2
        finally:
            world.close()

    async def test_a_pass_without_an_answer_restarts_the_grace_period(self, tmp_path):
        """Two UNKNOWN_TOPIC_ID answers a grace period apart, with passes between them that
        got no answer (by id, or no listing at all), are not proof at every pass."""
        world = _World(tmp_path, topic_deletion_grace_s=3600.0, topic_deletion_max_share=1.0)
        try:
            await world.tier("orders", 2)
            await world.tier("payments", 2)
            world.vanish("orders", TopicIdState.ABSENT)
            assert (await world.manager.run_once()).deleted == 0  # first answer: t = 0
            answer, listing = world.kafka.topic_id_states, world.kafka.topic_ids

            async def unavailable(*args: Any) -> Any:
                raise ClusterUnavailableError("Metadata v12 failed")

            for failed, failing in enumerate(("topic_id_states", "topic_ids"), 1):
                setattr(world.kafka, failing, unavailable)
                world.now[0] += 1900
                assert (await world.manager.run_once()).deleted == 0
                errors = world.value("retention_errors_total", kind="ClusterUnavailableError")
                assert errors == failed  # the skipped step is counted
                world.kafka.topic_id_states, world.kafka.topic_ids = answer, listing
                world.now[0] += 1900  # 3800 s after the first answer
                assert (await world.manager.run_once()).deleted == 0  # the clock starts again
            world.now[0] += 3600
            assert (await world.manager.run_once()).deleted == 2
        finally:
            world.close()


class TestSeries:
    """A deleted topic's series leave /metrics a grace period after its partitions left the
    store, so topic churn does not grow every scrape for the daemon's life."""

    async def _deleted_and_forgotten(self, world: _World) -> None:
        await world.tier("orders", 2)
        await world.tier("payments", 2)
        world.metrics.segments_copied.labels("orders").inc(2)
        world.metrics.segments_copied.labels("payments").inc(2)
        world.vanish("orders", TopicIdState.ABSENT)
        assert (await world.manager.run_once()).deleted == 2
        with capture_logs() as logs:
            await world.manager.run_once()  # nothing left of it: the partition is forgotten
        assert [e["event"] for e in logs if e["event"].startswith("deleted_topic")] == [
            "deleted_topic_partition_forgotten"
        ]

    async def test_dropped_after_the_grace(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0)
        try:
            await self._deleted_and_forgotten(world)
            deleted = {"topic": "orders", "reason": "topic_deleted"}
            assert world.value("retention_deleted_segments_total", **deleted) == 2
            world.now[0] += SERIES_GRACE_S - 1
            await world.manager.run_once()
            assert world.value("segments_copied_total", topic="orders") == 2  # still scraped
            world.now[0] += 1
            with capture_logs() as logs:
                await world.manager.run_once()
            assert [e["topic"] for e in logs if e["event"] == "deleted_topic_series_dropped"] == [
                "orders"
            ]
            for name in ("segments_copied_total", "retention_deleted_segments_total"):
                family = world.metrics.registry.get_sample_value
                assert family(f"kafka_tiered_sidecar_{name}", {"topic": "orders"}) is None
                assert family(f"kafka_tiered_sidecar_{name}", deleted) is None
            assert world.value("segments_copied_total", topic="payments") == 2
        finally:
            world.close()

    async def test_kept_when_the_name_is_tiered_again(self, tmp_path):
        """A new topic of the same name within the grace keeps the name's series."""
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0)
        try:
            await self._deleted_and_forgotten(world)
            await world.tier("orders", 1)  # recreated, and tiered again
            world.now[0] += SERIES_GRACE_S
            with capture_logs() as logs:
                await world.manager.run_once()
            assert not [e for e in logs if e["event"] == "deleted_topic_series_dropped"]
            assert world.value("segments_copied_total", topic="orders") == 2
        finally:
            world.close()


class TestShareStop:
    async def test_a_pass_past_the_share_deletes_nothing_and_says_so(self, tmp_path):
        """Two of three topics (2/3 of the segments) gone at once, limit 1/2: nothing goes."""
        world = _World(tmp_path, topic_deletion_grace_s=0.0)
        try:
            assert RetentionConfig().topic_deletion_max_share == 0.5
            for topic in ("a", "b", "c"):
                await world.tier(topic, 2)
            world.vanish("a", TopicIdState.ABSENT)
            world.vanish("b", TopicIdState.ABSENT)
            with capture_logs() as logs:
                summary = await world.manager.run_once()
            assert summary.deleted == 0
            assert summary.topic_deletion_halted
            assert len(world.objects_of("a")) == len(world.objects_of("b")) == 6
            halted = [e for e in logs if e["event"] == "topic_deletion_halted"]
            assert len(halted) == 1
            assert halted[0]["log_level"] == "error"
            assert (halted[0]["segments"], halted[0]["tiered_segments"]) == (4, 6)
            assert "topic_deletion_override_share" in halted[0]["detail"]
            assert world.value("topic_deletion_halted_total") == 1
        finally:
            world.close()

    async def test_within_the_share_deletes(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=0.0)
        try:
            for topic in ("a", "b", "c"):
                await world.tier(topic, 2)
            world.vanish("a", TopicIdState.ABSENT)
            summary = await world.manager.run_once()
            assert summary.deleted == 2
            assert not summary.topic_deletion_halted
            assert world.objects_of("a") == set()
            assert world.value("topic_deletion_halted_total") == 0
        finally:
            world.close()

    async def test_the_share_counts_topics_other_sidecars_delete(self, tmp_path):
        """Each sidecar deletes only the partitions of the metadata partitions it leads, yet
        judges the share over every confirmed topic: a mass deletion split across brokers
        still stops."""
        world = _World(tmp_path, topic_deletion_grace_s=0.0)
        try:
            tps = [await world.tier(topic, 2) for topic in ("a", "b", "c", "d")]
            mine = {metadata_partition(tp, NUM_MP) for tp in tps[:1]}
            world.manager._cluster.view = dataclasses.replace(
                world.manager._cluster.view,
                leaders={(META, p): (1 if p in mine else 2) for p in range(NUM_MP)},
            )
            for topic in ("a", "b", "c"):
                world.vanish(topic, TopicIdState.ABSENT)
            summary = await world.manager.run_once()
            assert summary.topic_deletion_halted
            assert summary.deleted == 0
        finally:
            world.close()

    async def test_the_explicit_override_lets_it_through(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_override_share=True)
        try:
            await world.tier("only", 3)
            world.vanish("only", TopicIdState.ABSENT)
            with capture_logs() as logs:
                summary = await world.manager.run_once()
            assert summary.deleted == 3
            assert world.objects_of("only") == set()
            assert [e["event"] for e in logs if "share" in e["event"]] == [
                "topic_deletion_share_overridden"
            ]
        finally:
            world.close()


class TestStopBetweenRounds:
    """SIGTERM during the deletion of a large partition waits for one round of segments, not
    for all of them; what is left is deleted by the next pass."""

    @staticmethod
    def _stop_after_first_round(world: _World) -> asyncio.Event:
        stop = asyncio.Event()

        def on_publish(event: Any) -> None:
            if getattr(event, "state", None) is DELETE_FINISHED:
                stop.set()  # set while the first round is still publishing: it ends whole

        world.on_publish = on_publish
        return stop

    async def test_a_topic_deletion_stops_between_rounds(self, tmp_path):
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_override_share=True)
        try:
            tp = await world.tier("big", _DELETE_BATCH + 44)
            world.vanish("big", TopicIdState.ABSENT)
            stop = self._stop_after_first_round(world)
            with capture_logs() as logs:
                summary = await world.manager.run_once(stop)
            assert summary.deleted == _DELETE_BATCH
            assert len(world.store.segments(tp)) == 44
            assert len(world.objects_of("big")) == 44 * len(ObjectSuffix)
            stopped = [e for e in logs if e["event"] == "remote_segment_deletion_stopped"]
            assert [(e["deleted"], e["left"]) for e in stopped] == [(_DELETE_BATCH, 44)]
            world.on_publish = lambda event: None
            assert (await world.manager.run_once()).deleted == 44
            assert world.objects_of("big") == set()
        finally:
            world.close()

    async def test_a_partition_deletion_stays_started_until_its_last_round(self, tmp_path):
        world = _World(tmp_path)
        try:
            tp = await world.tier("big", _DELETE_BATCH + 1)
            marker = PartitionDeleteMetadata(
                topic_id_partition=tp,
                broker_id=1,
                event_timestamp_ms=0,
                state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
            )
            world.store.apply([marker])
            stop = self._stop_after_first_round(world)
            assert (await world.manager.run_once(stop)).deleted == _DELETE_BATCH
            started = world.store.partition_delete(tp)
            assert started is not None
            assert started.state is RemotePartitionDeleteState.DELETE_PARTITION_STARTED
            assert world.value("remote_partition_deletions_total") == 0
            world.on_publish = lambda event: None
            assert (await world.manager.run_once()).deleted == 1
            assert world.objects_of("big") == set()
            assert world.store.partition_delete(tp) is None  # FINISHED: the marker is gone
            assert world.value("remote_partition_deletions_total") == 1
        finally:
            world.close()


class TestDisabled:
    async def test_retention_disabled_deletes_no_topic_or_partition_data(self, tmp_path):
        """retention.enabled = false: neither a deleted topic's data nor a marked partition's
        goes (the scrub has a switch of its own)."""
        world = _World(
            tmp_path, enabled=False, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0
        )
        try:
            await world.tier("orders", 2)
            payments = await world.tier("payments", 2)
            world.vanish("orders", TopicIdState.ABSENT)
            world.store.apply(
                [
                    PartitionDeleteMetadata(
                        topic_id_partition=payments,
                        broker_id=1,
                        event_timestamp_ms=0,
                        state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                    )
                ]
            )
            for _ in range(2):
                world.now[0] += 10
                summary = await world.manager.run_once()
                assert summary.deleted == 0
            assert len(world.objects_of("orders")) == 6
            assert len(world.objects_of("payments")) == 6
        finally:
            world.close()


class TestRecreatedBrokerDriven:
    async def test_a_standalone_topic_recreated_broker_driven_leaves_the_old_data_to_us(
        self, tmp_path
    ):
        """'orders' (id A, standalone) is deleted and re-created under its name (id B) with
        remote.storage.enable=true. The broker's RLM only knows B: A's tiered data is the
        sidecar's to delete once A is confirmed unknown, and B's stays the broker's."""
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0)
        try:
            await world.tier("orders", 2)
            await world.tier("payments", 2)
            world.vanish("orders", TopicIdState.ABSENT)
            recreated = TopicIdPartition(uuid.uuid4(), "orders", 0)
            world.store.apply([_segment(recreated, 0)])  # the broker's copy of B, in flight
            world.kafka.listed["orders"] = recreated.topic_id
            view = world.manager._cluster.view
            configs = {"orders": TopicConfig(remote_storage_enable=True)}
            world.manager._cluster.view = dataclasses.replace(view, configs=configs)
            for _ in range(2):
                world.now[0] += 10
                await world.manager.run_once()
            assert world.objects_of("orders") == set()
            assert [s.start_offset for s in world.store.segments(recreated)] == [0]
            assert world.manager._broker_driven_ids == {recreated.topic_id}
        finally:
            world.close()

    async def test_a_broker_driven_topic_is_forgotten_once_the_store_holds_none_of_it(
        self, tmp_path
    ):
        """A broker-driven topic's id is remembered while the store holds its partitions (its
        deletion stays Kafka's), and forgotten once the store dropped them: topics created and
        deleted for the daemon's life do not each leave an id behind."""
        world = _World(tmp_path, topic_deletion_grace_s=0.0, topic_deletion_max_share=1.0)
        try:
            events = await world.tier("events", 2)
            view = world.manager._cluster.view
            configs = {"events": TopicConfig(remote_storage_enable=True)}
            world.manager._cluster.view = dataclasses.replace(view, configs=configs)
            await world.manager.run_once()
            assert world.manager._broker_driven_ids == {events.topic_id}
            world.store.apply(  # Kafka deleted the topic's remote data, then the partition
                [
                    SegmentMetadataUpdate(
                        segment_id=m.segment_id, broker_id=1, event_timestamp_ms=0, state=state
                    )
                    for state in (RemoteLogSegmentState.DELETE_SEGMENT_STARTED, DELETE_FINISHED)
                    for m in world.topics["events"]
                ]
                + [
                    PartitionDeleteMetadata(
                        topic_id_partition=events,
                        broker_id=1,
                        event_timestamp_ms=0,
                        state=state,
                    )
                    for state in RemotePartitionDeleteState
                ]
            )
            world.kafka.listed.pop("events")
            world.manager._cluster.view = view
            assert events not in world.store.partitions()
            await world.manager.run_once()
            assert world.manager._broker_driven_ids == set()
        finally:
            world.close()
