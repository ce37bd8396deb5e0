"""A retention pass reads the store only for partitions whose scan, LSO or store version moved
since the last pass, or whose oldest segment has reached retention.ms since; segments still
expire as time passes. Real metadata store, log dir and in-memory bucket; the Kafka answers and
the publisher (applying to the store, as the read-back would) are stubs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import sidecar.retention.manager as manager_module
from sidecar.config import RetentionConfig
from sidecar.kafka.checkpoints import (
    EpochEntry,
    decode_kafka_uuid,
    format_leader_epoch_checkpoint,
)
from sidecar.kafka.logdir import scan_partition_dir
from sidecar.metadata.events import (
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.retention.manager import PassSummary, RetentionManager
from sidecar.storage.memory import MemoryObjectStore
from sidecar.tiering.cluster import TopicConfig
from tests.unit.retention.test_safety_and_scrub import _scan, finished_copies, led_view
from tests.unit.retention.test_topic_deletion import _keys

RETENTION_MS = 10_000


@pytest.mark.parametrize("checkpoint", ["written", "non-monotonic"])
async def test_unchanged_partitions_are_not_read_again_and_still_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: str
) -> None:
    """The facts are read once; a pass before anything can expire reads nothing; one after
    lists the segments and deletes the expired ones; the deletions make the next pass read.
    A leader-epoch-checkpoint whose entries do not ascend is walked as the broker loads it."""
    scan = _scan(tmp_path)  # 4 segments of 5 records, max timestamps 1000 .. 4000
    if checkpoint == "non-monotonic":
        # the broker drops (2, 5) at load: its epoch cache is (0, 0), (1, 17)
        entries = [EpochEntry(0, 0), EpochEntry(2, 5), EpochEntry(1, 17)]
        (scan.path / "leader-epoch-checkpoint").write_bytes(format_leader_epoch_checkpoint(entries))
        scan = scan_partition_dir(scan.path)
        assert scan is not None
    lineages: list[list[tuple[int, int]]] = []
    planned = manager_module.plan_expiry

    def plan_expiry(segments: Any, facts: Any) -> Any:
        lineages.append(list(facts.lineage))
        return planned(segments, facts)

    monkeypatch.setattr(manager_module, "plan_expiry", plan_expiry)
    assert scan.topic_id is not None
    tp = TopicIdPartition(decode_kafka_uuid(scan.topic_id), "orders", 0)
    store = RemoteSegmentStore(tmp_path / "state")
    rolled = [s for s in scan.segments if s.end_offset is not None]
    finished_copies(
        store, tp, [(s.base_offset, 1000 * (i + 1), s.size) for i, s in enumerate(rolled)]
    )
    view = led_view(TopicConfig(retention_ms=RETENTION_MS, retention_bytes=-1))
    now_ms = [5_000]
    stub: Any = SimpleNamespace

    async def log_start_offsets(partitions: Any) -> dict[tuple[str, int], int]:
        return {p: 0 for p in partitions}

    async def publish_and_wait(event: Any) -> tuple[int, int]:
        store.apply([event])
        return 0, 0

    manager = RetentionManager(
        config=RetentionConfig(scrub_enabled=False),
        views=lambda: {scan.path: scan},
        cluster=stub(view=view, selected=lambda topic: True),
        kafka=stub(log_start_offsets=log_start_offsets),
        store=store,
        tailer=stub(caught_up=lambda p: True),
        publisher=stub(publish_and_wait=publish_and_wait),
        uploader=stub(broker_id=1, keys=_keys),
        objects=MemoryObjectStore(),
        scrubber=stub(),
        metrics=Metrics(),
        metadata_topic="__remote_log_metadata",
        num_metadata_partitions=2,
        clock_ms=lambda: now_ms[0],
    )
    reads = 0
    read = manager._read_store_facts

    def counting(*args: Any) -> Any:
        nonlocal reads
        reads += 1
        return read(*args)

    manager._read_store_facts = counting
    listed = 0
    segments_of = store.segments

    def listing(*args: Any, **kwargs: Any) -> Any:
        nonlocal listed
        listed += 1
        return segments_of(*args, **kwargs)

    store.segments = listing  # type: ignore[method-assign]
    try:

        async def one_pass() -> PassSummary:
            summary = PassSummary()
            await manager._retention(summary, asyncio.Event())
            return summary

        await one_pass()
        assert reads == 1
        assert len(store.segments(tp)) == len(rolled)  # nothing older than 10 s yet
        listed_first = listed
        await one_pass()
        # nothing moved, and the oldest segment is not yet past retention.ms: no store read,
        # no segments held between passes
        assert (reads, listed) == (1, listed_first)
        now_ms[0] = 2000 + RETENTION_MS + 1  # the first two segments are past retention.ms
        await one_pass()
        assert reads == 1  # time alone moved: the segments are listed again and expire
        assert [s.start_offset for s in store.segments(tp)] == [s.base_offset for s in rolled[2:]]
        await one_pass()
        assert reads == 2  # the deletions moved the store's version: read again
        expected = [(0, 0)] if checkpoint == "written" else [(0, 0), (1, 17)]
        assert lineages
        assert all(lineage == expected for lineage in lineages)
    finally:
        store.close()
