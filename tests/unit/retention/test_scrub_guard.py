"""The orphan scrub deletes only while the metadata topic keeps every record (retention.ms and
retention.bytes -1): otherwise a real scrub is refused with a typed error, a metric and a log
line, and a dry run still reports. In-memory bucket, real metadata store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from sidecar.config import RetentionConfig
from sidecar.metadata.events import TopicIdPartition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.retention.manager import RetentionManager
from sidecar.retention.scrub import OrphanScrubber, UnsafeScrubError, metadata_retention_problem
from sidecar.storage.memory import MemoryObjectStore
from sidecar.tiering.cluster import ClusterView, TopicConfig
from tests.unit.retention.test_safety_and_scrub import (
    LAYOUT,
    MARKER,
    OWNER,
    _keys,
    _metadata,
    claim,
)

META = "__remote_log_metadata"
FOREVER = TopicConfig(retention_ms=-1, retention_bytes=-1)


class TestProblem:
    def test_forever_is_fine(self):
        assert metadata_retention_problem(META, FOREVER) is None

    @pytest.mark.parametrize(
        ("config", "named"),
        [
            (TopicConfig(retention_ms=604_800_000, retention_bytes=-1), "retention.ms=604800000"),
            (TopicConfig(retention_ms=-1, retention_bytes=10**9), "retention.bytes=1000000000"),
            (None, "unknown"),
            # the log cleaner drops every record without a key: every metadata record
            (TopicConfig(cleanup_policy="compact", retention_ms=-1), "cleanup.policy=compact"),
            (
                TopicConfig(cleanup_policy="delete,compact", retention_ms=-1),
                "cleanup.policy=delete,compact",
            ),
        ],
    )
    def test_anything_else_is_named(self, config, named):
        problem = metadata_retention_problem(META, config)
        assert problem is not None
        assert named in problem
        assert META in problem


async def _orphaned(tmp_path) -> tuple[RemoteSegmentStore, MemoryObjectStore, list[str]]:
    store = RemoteSegmentStore(tmp_path / "state")
    objects = MemoryObjectStore()
    await claim(objects)
    store.apply([_metadata(100)])  # the partition is this cluster's
    keys = _keys(_metadata(0))  # never published: an orphan
    for key in keys:
        await objects.put(key, b"x")
    return store, objects, keys


def _scrubber(
    store: RemoteSegmentStore,
    objects: MemoryObjectStore,
    in_scope: Callable[[TopicIdPartition], bool] = lambda tp: True,
) -> OrphanScrubber:
    return OrphanScrubber(
        objects=objects,
        store=store,
        layout=LAYOUT,
        owner=OWNER,
        object_grace_s=0,
        upload_grace_s=0,
        in_scope=in_scope,
        now=lambda: datetime.now(UTC) + timedelta(days=1),
    )


class TestScrubber:
    async def test_a_stop_during_the_listing_ends_the_scrub_with_nothing_deleted(self, tmp_path):
        """SIGTERM during an hour-long listing does not wait for it: the scrub ends at the
        next key, and deletes nothing (its view of the prefix is partial)."""
        store, objects, keys = await _orphaned(tmp_path)
        try:
            stop = asyncio.Event()

            def in_scope(tp: TopicIdPartition) -> bool:
                stop.set()  # the daemon is asked to stop while the scrub lists the prefix
                return True

            report = await _scrubber(store, objects, in_scope).scrub(stop=stop)
            assert report.stopped
            assert report.objects_listed < len(objects.objects)
            assert report.orphans == []
            assert set(objects.objects) == {*keys, MARKER}
            assert not (await _scrubber(store, objects).scrub()).stopped  # the orphans go
            assert set(objects.objects) == {MARKER}
        finally:
            store.close()

    async def test_a_real_scrub_is_refused_and_deletes_nothing(self, tmp_path):
        store, objects, keys = await _orphaned(tmp_path)
        try:
            problem = metadata_retention_problem(META, TopicConfig())
            with capture_logs() as logs, pytest.raises(UnsafeScrubError, match=r"retention\.ms"):
                await _scrubber(store, objects).scrub(unsafe=problem)
            assert sorted(objects.objects) == sorted([*keys, MARKER])
            refused = [e for e in logs if e["event"] == "scrub_refused"]
            assert [e["reason"] for e in refused] == [problem]
        finally:
            store.close()

    async def test_a_store_missing_deleted_metadata_records_is_refused(self, tmp_path):
        """The metadata topic deleted records before this store first read them (a former
        retention.ms, a DeleteRecords): a live segment's events may be among them, so its
        objects would look unreferenced. Retention -1 now does not make the store whole."""
        store, objects, keys = await _orphaned(tmp_path)
        try:
            store.record_history_gap(3, 500)
            store.record_history_gap(3, 900)  # the first gap found stays
            assert store.history_gaps() == {3: 500}
            with capture_logs() as logs, pytest.raises(UnsafeScrubError, match="3 from offset 500"):
                await _scrubber(store, objects).scrub()
            assert sorted(objects.objects) == sorted([*keys, MARKER])
            assert [e["event"] for e in logs] == ["scrub_refused"]
            report = await _scrubber(store, objects).scrub(dry_run=True)
            assert report.refused is not None
            assert "deleted records" in report.refused
            assert sorted(report.orphans) == sorted(keys)
        finally:
            store.close()
        with RemoteSegmentStore(tmp_path / "state") as reopened:
            assert reopened.history_gaps() == {3: 500}  # kept until the store is rebuilt

    async def test_a_dry_run_still_reports(self, tmp_path):
        store, objects, keys = await _orphaned(tmp_path)
        try:
            problem = metadata_retention_problem(META, TopicConfig())
            report = await _scrubber(store, objects).scrub(dry_run=True, unsafe=problem)
            assert sorted(report.orphans) == sorted(keys)
            assert report.refused == problem
            assert report.to_json()["refused"] == problem
            assert sorted(objects.objects) == sorted([*keys, MARKER])
        finally:
            store.close()


async def _synced(metadata_partition: int) -> None:
    """The tailer's sync: every event published so far is in the store."""


def _manager(store, objects, scrubber, metrics, config: TopicConfig | None) -> RetentionManager:
    configs = {} if config is None else {META: config}
    view = ClusterView(
        broker_id=1,
        leaders={},
        configs=configs,
        last_stable_offsets={},
        refreshed_at=time.monotonic(),
        stale_after_s=60,
    )
    stub: Any = SimpleNamespace
    return RetentionManager(
        config=RetentionConfig(),
        views=dict,
        cluster=stub(view=view),
        kafka=stub(),
        store=store,
        tailer=stub(
            caught_up=lambda p: True,
            healthy=True,
            last_error=None,
            stalled=frozenset(),
            sync=_synced,
        ),
        publisher=stub(),
        uploader=stub(broker_id=1),
        objects=objects,
        scrubber=scrubber,
        metrics=metrics,
        metadata_topic=META,
        num_metadata_partitions=2,
    )


class TestManager:
    """The daemon's periodic scrub reads the metadata topic's configs from the cluster view."""

    def _value(self, metrics: Metrics, name: str, **labels: str) -> float:
        value = metrics.registry.get_sample_value(f"kafka_tiered_sidecar_{name}", labels)
        return 0.0 if value is None else value

    async def test_refused_with_a_metric(self, tmp_path):
        store, objects, keys = await _orphaned(tmp_path)
        metrics = Metrics()
        try:
            manager = _manager(store, objects, _scrubber(store, objects), metrics, TopicConfig())
            await manager._scrub(asyncio.Event())
            assert self._value(metrics, "scrub_runs_total", outcome="refused") == 1
            kind = {"kind": "UnsafeScrubError"}
            assert self._value(metrics, "retention_errors_total", **kind) == 1
            assert self._value(metrics, "scrub_deleted_objects_total") == 0
            assert sorted(objects.objects) == sorted([*keys, MARKER])
        finally:
            store.close()

    async def test_skipped_until_the_configs_are_known_then_deletes(self, tmp_path):
        store, objects, keys = await _orphaned(tmp_path)
        metrics = Metrics()
        try:
            scrubber = _scrubber(store, objects)
            await _manager(store, objects, scrubber, metrics, None)._scrub(asyncio.Event())
            assert self._value(metrics, "scrub_runs_total", outcome="skipped") == 1
            assert set(keys) <= set(objects.objects)
            await _manager(store, objects, scrubber, metrics, FOREVER)._scrub(asyncio.Event())
            assert self._value(metrics, "scrub_runs_total", outcome="ok") == 1
            assert self._value(metrics, "scrub_deleted_objects_total") == 3
            assert list(objects.objects) == [MARKER]
        finally:
            store.close()
