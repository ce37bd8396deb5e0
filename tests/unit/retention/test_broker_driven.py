"""Remote retention and deletions leave broker-driven topics (remote.storage.enable=true) to
Kafka's RLM: the sidecar publishes no event and deletes nothing for them."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace
from typing import Any

import sidecar.retention.manager as manager_module
from sidecar.config import RetentionConfig
from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.retention.manager import RetentionManager
from sidecar.storage.memory import MemoryObjectStore
from sidecar.tiering.cluster import ClusterView, TopicConfig
from tests.unit.retention.test_safety_and_scrub import (
    TP,
    _metadata,
    _scan,
    finished_copies,
    led_view,
)
from tests.unit.retention.test_topic_deletion import _keys

META = "__remote_log_metadata"


class _Publisher:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def publish_and_wait(self, event: Any) -> tuple[int, int]:
        self.events.append(event)
        return 0, len(self.events)


def _manager(store: RemoteSegmentStore, publisher: _Publisher, *, broker_driven: bool) -> Any:
    view = ClusterView(
        broker_id=1,
        # this broker leads the metadata partition, so it would process the partition's deletion
        leaders={(META, metadata_partition(TP, 2)): 1},
        configs={TP.topic: TopicConfig(remote_storage_enable=broker_driven)},
        last_stable_offsets={},
        refreshed_at=time.monotonic(),
        stale_after_s=60,
    )
    stub: Any = SimpleNamespace

    async def topic_ids() -> dict[str, Any]:
        return {TP.topic: TP.topic_id}

    async def delete(keys: list[str]) -> None:
        return None

    return RetentionManager(
        config=RetentionConfig(scrub_enabled=False),
        views=dict,
        cluster=stub(view=view),
        kafka=stub(topic_ids=topic_ids),
        store=store,
        tailer=stub(caught_up=lambda p: True),
        publisher=publisher,
        uploader=stub(broker_id=1, keys=lambda m: {}, finish_delete=None),
        objects=stub(delete=delete),
        scrubber=stub(),
        metrics=Metrics(),
        metadata_topic=META,
        num_metadata_partitions=2,
    )


async def test_partition_delete_of_a_broker_driven_topic_is_left_to_kafka(tmp_path):
    """Kafka's RLM marked the partition for deletion: the sidecar publishes nothing for it,
    while the same marker on a standalone topic is processed (the control)."""
    store = RemoteSegmentStore(tmp_path / "state")
    try:
        segment = _metadata(0)
        store.apply(
            [
                segment,
                SegmentMetadataUpdate(
                    segment_id=segment.segment_id,
                    broker_id=1,
                    event_timestamp_ms=1,
                    state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                ),
                PartitionDeleteMetadata(
                    topic_id_partition=TP,
                    broker_id=1,
                    event_timestamp_ms=2,
                    state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                ),
            ]
        )
        publisher = _Publisher()
        await _manager(store, publisher, broker_driven=True).run_once()
        assert publisher.events == []
        control = _Publisher()
        await _manager(store, control, broker_driven=False).run_once()
        assert control.events  # the standalone path publishes DELETE_PARTITION_STARTED
    finally:
        store.close()


async def test_a_topic_turned_standalone_again_has_its_deletions_run_here(tmp_path):
    """A topic seen broker-driven and then set to remote.storage.enable=false (Kafka deletes
    its remote data then, and the sidecar tiers it standalone if selected) is no longer left
    to Kafka: a partition deletion of it is processed by this same process, without a
    restart."""
    store = RemoteSegmentStore(tmp_path / "state")
    try:
        segment = _metadata(0)
        store.apply(
            [
                segment,
                SegmentMetadataUpdate(
                    segment_id=segment.segment_id,
                    broker_id=1,
                    event_timestamp_ms=1,
                    state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                ),
            ]
        )
        publisher = _Publisher()
        manager = _manager(store, publisher, broker_driven=True)
        await manager.run_once()  # seen broker-driven
        manager._cluster.view = dataclasses.replace(
            manager._cluster.view, configs={TP.topic: TopicConfig(remote_storage_enable=False)}
        )
        store.apply(
            [
                PartitionDeleteMetadata(
                    topic_id_partition=TP,
                    broker_id=1,
                    event_timestamp_ms=2,
                    state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                )
            ]
        )
        await manager.run_once()
        assert [e.state for e in publisher.events if isinstance(e, PartitionDeleteMetadata)] == [
            RemotePartitionDeleteState.DELETE_PARTITION_STARTED,
            RemotePartitionDeleteState.DELETE_PARTITION_FINISHED,
        ]
    finally:
        store.close()


async def test_retention_stops_between_rounds_once_the_topic_is_the_brokers(tmp_path, monkeypatch):
    """Remote retention deletes in rounds; a topic that turns broker-driven meanwhile (the
    broker's copy call, or a refresh, says so) is Kafka's to expire from the next round on."""
    monkeypatch.setattr(manager_module, "_DELETE_BATCH", 1)
    scan = _scan(tmp_path)  # 4 segments, max timestamps 1000 .. 4000
    assert scan.topic_id is not None
    tp = TopicIdPartition(decode_kafka_uuid(scan.topic_id), "orders", 0)
    store = RemoteSegmentStore(tmp_path / "state")
    try:
        rolled = [s for s in scan.segments if s.end_offset is not None]
        copies = finished_copies(
            store, tp, [(s.base_offset, 1000 * (i + 1), s.size) for i, s in enumerate(rolled)]
        )
        view = led_view(TopicConfig(retention_ms=1, retention_bytes=-1))
        standalone = {"orders"}
        stub: Any = SimpleNamespace

        async def log_start_offsets(partitions: Any) -> dict[tuple[str, int], int]:
            return {p: 0 for p in partitions}

        async def publish_and_wait(event: Any) -> tuple[int, int]:
            store.apply([event])
            if getattr(event, "state", None) is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
                standalone.clear()  # remote.storage.enable=true after the first round
            return 0, 0

        manager = RetentionManager(
            config=RetentionConfig(scrub_enabled=False, topic_deletion=False),
            views=lambda: {scan.path: scan},
            cluster=stub(view=view, selected=lambda topic: topic in standalone),
            kafka=stub(log_start_offsets=log_start_offsets),
            store=store,
            tailer=stub(caught_up=lambda p: True),
            publisher=stub(publish_and_wait=publish_and_wait),
            uploader=stub(broker_id=1, keys=_keys),
            objects=MemoryObjectStore(),
            scrubber=stub(),
            metrics=Metrics(),
            metadata_topic=META,
            num_metadata_partitions=2,
            clock_ms=lambda: 1_000_000,
        )
        summary = await manager.run_once()
        assert summary.deleted == 1
        assert len(store.segments(tp)) == len(copies) - 1
    finally:
        store.close()
