"""An overridden topic's log start offset deletes tiered data only after a DeleteRecords, and a
broker that becomes leader brings along the previous leader's log start, which may lie inside
one of its own segments (replicas roll segments at different offsets): that one is no
DeleteRecords. Real metadata store and log dir; the Kafka answers and the publisher are stubs."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sidecar.config import RetentionConfig, RetentionOverride
from sidecar.kafka.checkpoints import EpochEntry, decode_kafka_uuid, format_leader_epoch_checkpoint
from sidecar.kafka.logdir import PartitionScan, scan_partition_dir
from sidecar.metadata.events import (
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.retention.manager import PassSummary, RetentionManager
from sidecar.storage.memory import MemoryObjectStore
from sidecar.tiering.cluster import ClusterUnavailableError, TopicConfig
from tests.unit.retention.test_safety_and_scrub import _scan, finished_copies, led_view
from tests.unit.retention.test_topic_deletion import _keys


@dataclasses.dataclass
class _Rig:
    manager: RetentionManager
    store: RemoteSegmentStore
    tp: TopicIdPartition
    cluster: Any
    scans: dict[Path, PartitionScan]
    log_start: list[int]
    metrics: Metrics

    async def one_pass(self) -> None:
        await self.manager._retention(PassSummary(), asyncio.Event())

    def remote_starts(self) -> list[int]:
        return [s.start_offset for s in self.store.segments(self.tp)]

    def lead(self, leader: int) -> None:
        self.cluster.view = dataclasses.replace(
            self.cluster.view, leaders={("orders", 0): leader}, refreshed_at=time.monotonic()
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[_Rig]:
    """orders-0: local segments at 0, 5, 10 and 15 (active); [0, 4] and [5, 9] tiered in epoch
    0; an override keeps the tiered data forever; the broker leads it."""
    scan = _scan(tmp_path)
    assert scan.topic_id is not None
    tp = TopicIdPartition(decode_kafka_uuid(scan.topic_id), "orders", 0)
    store = RemoteSegmentStore(tmp_path / "state")
    finished_copies(store, tp, [(0, 1000, 100), (5, 1000, 100)])
    view = led_view(TopicConfig(retention_ms=10_000, retention_bytes=-1))
    stub: Any = SimpleNamespace
    cluster = stub(view=view, selected=lambda topic: True)
    log_start = [0]
    scans = {scan.path: scan}

    async def log_start_offsets(partitions: Any) -> dict[tuple[str, int], int]:
        return {p: log_start[0] for p in partitions}

    async def publish_and_wait(event: Any) -> tuple[int, int]:
        store.apply([event])
        return 0, 0

    metrics = Metrics()
    manager = RetentionManager(
        config=RetentionConfig(
            scrub_enabled=False,
            overrides=[RetentionOverride(topics=["orders"], retention_ms=-1)],
        ),
        views=lambda: scans,
        cluster=cluster,
        kafka=stub(log_start_offsets=log_start_offsets),
        store=store,
        tailer=stub(caught_up=lambda p: True),
        publisher=stub(publish_and_wait=publish_and_wait),
        uploader=stub(broker_id=1, keys=_keys),
        objects=MemoryObjectStore(),
        scrubber=stub(),
        metrics=metrics,
        metadata_topic="__remote_log_metadata",
        num_metadata_partitions=2,
        clock_ms=lambda: 5_000,
    )
    try:
        yield _Rig(manager, store, tp, cluster, scans, log_start, metrics)
    finally:
        store.close()


def _deleted_by_log_start(rig: _Rig) -> float:
    value = rig.metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_retention_deleted_segments_total",
        {"topic": "orders", "reason": "log_start_offset"},
    )
    return value or 0.0


async def test_the_log_start_a_new_leader_brings_along_deletes_nothing(rig: _Rig) -> None:
    # the previous leader's retention left its log start at 7, its own segment boundary but
    # inside this broker's segment [5, 9]
    rig.log_start[0] = 7
    await rig.one_pass()
    assert rig.remote_starts() == [0, 5]
    # a DeleteRecords moves it to 12 while this broker leads: tiered data wholly below goes
    rig.log_start[0] = 12
    await rig.one_pass()
    assert rig.remote_starts() == []
    assert _deleted_by_log_start(rig) == 2


@pytest.mark.parametrize("how", ["led-elsewhere", "new-epoch"])
async def test_leading_again_takes_the_log_start_as_brought_along(rig: _Rig, how: str) -> None:
    await rig.one_pass()  # leader, log start 0
    if how == "led-elsewhere":
        rig.lead(2)
        await rig.one_pass()
        rig.lead(1)
    else:
        # led by another broker in epoch 1 and back here between two passes: the broker's
        # cache shows the epoch the other leader appended in
        path = next(iter(rig.scans))
        (path / "leader-epoch-checkpoint").write_bytes(
            format_leader_epoch_checkpoint([EpochEntry(0, 0), EpochEntry(1, 17)])
        )
        rescanned = scan_partition_dir(path)
        assert rescanned is not None
        rig.scans[path] = rescanned
    rig.log_start[0] = 7  # the other leader's, inside this broker's segment [5, 9]
    await rig.one_pass()
    assert rig.remote_starts() == [0, 5]
    assert _deleted_by_log_start(rig) == 0


async def test_a_failed_listoffsets_counts_as_a_retention_error(rig: _Rig) -> None:
    """Without log start offsets no partition is retained: the pass's skip is counted."""

    async def unavailable(partitions: Any) -> dict[tuple[str, int], int]:
        raise ClusterUnavailableError("ListOffsets (earliest) failed")

    rig.manager._kafka.log_start_offsets = unavailable  # type: ignore[method-assign]
    await rig.one_pass()
    await rig.one_pass()
    value = rig.metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_retention_errors_total", {"kind": "ClusterUnavailableError"}
    )
    assert value == 2
