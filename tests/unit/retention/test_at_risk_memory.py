"""The retention manager's at-risk memory (which segments it already warned about) and the
at-risk gauge follow the partitions and segments in the log dir now: a partition that goes away
(topic deleted, moved to another broker) or a segment the broker deleted is forgotten."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from sidecar.config import RetentionConfig
from sidecar.kafka.logdir import PartitionScan
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.retention.manager import PassSummary, RetentionManager
from sidecar.storage.memory import MemoryObjectStore
from sidecar.tiering.cluster import ClusterView, TopicConfig
from sidecar.tiering.planner import RemoteCoverage
from tests.unit.retention.test_safety_and_scrub import _scan

# nothing of the partition is remote yet
NOTHING_TIERED = RemoteCoverage.of((), floor=0, highest=-1)
# local retention by size just below the partition's size: the oldest segment is at risk
CONFIG = TopicConfig(retention_ms=-1, retention_bytes=1, remote_storage_enable=True)


def _manager(tmp_path: Path, scans: dict[Path, PartitionScan], metrics: Metrics) -> Any:
    view = ClusterView(
        broker_id=1,
        leaders={},
        configs={"orders": CONFIG},
        last_stable_offsets={},
        refreshed_at=time.monotonic(),
        stale_after_s=60,
    )
    stub: Any = SimpleNamespace
    return RetentionManager(
        config=RetentionConfig(at_risk_fraction=1.0),
        views=lambda: scans,
        cluster=stub(view=view, selected=lambda topic: True),
        kafka=stub(),
        store=RemoteSegmentStore(tmp_path / "state"),
        tailer=stub(caught_up=lambda p: True),
        publisher=stub(),
        uploader=stub(broker_id=1),
        objects=MemoryObjectStore(),
        scrubber=stub(),
        metrics=metrics,
        metadata_topic="__remote_log_metadata",
        num_metadata_partitions=2,
    )


def _warn(manager: Any, scan: PartitionScan) -> list[int]:
    with capture_logs() as logs:
        manager._check_at_risk(scan, -1, NOTHING_TIERED, CONFIG, 0, PassSummary(), {})
    return [e["base_offset"] for e in logs if e["event"] == "segment_at_risk"]


def _gauge(metrics: Metrics, topic: str) -> float | None:
    name = "kafka_tiered_sidecar_segments_at_risk"
    return metrics.registry.get_sample_value(name, {"topic": topic})


async def test_warnings_are_forgotten_for_deleted_segments_and_gone_partitions(tmp_path):
    scan = _scan(tmp_path)
    scans = {scan.path: scan}
    metrics = Metrics()
    manager = _manager(tmp_path, scans, metrics)
    try:
        warned = _warn(manager, scan)
        assert warned  # the oldest segments are at risk
        assert _warn(manager, scan) == []  # warned once only
        # the broker deleted the oldest segment: its warning is forgotten, the others kept
        shrunk = dataclasses.replace(scan, segments=scan.segments[1:])
        scans[scan.path] = shrunk
        await manager._retention(PassSummary(), asyncio.Event())
        assert manager._warned_at_risk == {("orders", 0): set(warned) - {warned[0]}}
        assert _gauge(metrics, "orders") == 0  # present, not led here
        # the partition left the log dir (topic deleted or moved away): nothing is kept
        scans.clear()
        await manager._retention(PassSummary(), asyncio.Event())
        assert manager._warned_at_risk == {}
        assert _gauge(metrics, "orders") is None
    finally:
        manager._store.close()
