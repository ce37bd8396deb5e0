"""The orphan scrub deletes what the metadata decides on only while the metadata topic keeps
every record (retention.ms and retention.bytes -1): otherwise that part is refused (kept and
reported, a metric and a log line) and staged segments, which no metadata references, are
still removed after their grace period. In-memory bucket, real metadata store."""

from __future__ import annotations

import asyncio
import io
import json
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
from sidecar.storage.ownership import PrefixOwner
from sidecar.tiering.cluster import ClusterView, TopicConfig
from tests.unit.retention.test_safety_and_scrub import (
    LAYOUT,
    MARKER,
    OWNER,
    TP,
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


def _staged_key(base_offset: int) -> str:
    return LAYOUT.staged_key(
        topic=TP.topic,
        topic_id=TP.topic_id,
        partition=TP.partition,
        base_offset=base_offset,
        size=1,
        crc32c=base_offset,
    )


async def _with_staged(objects: MemoryObjectStore) -> tuple[str, tuple[str, str], tuple[str, str]]:
    """A staged segment never adopted, an incomplete upload of another staged segment and one
    of a segment key no metadata mentions: (staged key, (key, upload id) twice)."""
    staged = _staged_key(0)
    await objects.put(staged, b"x")
    staged_upload = _staged_key(10)
    segment_upload = _keys(_metadata(20))[0]
    return (
        staged,
        (staged_upload, await objects.create_multipart_upload(staged_upload)),
        (segment_upload, await objects.create_multipart_upload(segment_upload)),
    )


def _nobody() -> PrefixOwner | None:
    return None


def _scrubber(
    store: RemoteSegmentStore,
    objects: MemoryObjectStore,
    in_scope: Callable[[TopicIdPartition], bool] = lambda tp: True,
    owner: PrefixOwner | Callable[[], PrefixOwner | None] = OWNER,
) -> OrphanScrubber:
    return OrphanScrubber(
        objects=objects,
        store=store,
        layout=LAYOUT,
        owner=owner,
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

    async def test_a_real_scrub_keeps_what_the_metadata_decides(self, tmp_path):
        store, objects, keys = await _orphaned(tmp_path)
        try:
            problem = metadata_retention_problem(META, TopicConfig())
            with capture_logs() as logs:
                report = await _scrubber(store, objects).scrub(unsafe=problem)
            assert sorted(objects.objects) == sorted([*keys, MARKER])
            assert (report.refused, report.orphans) == (problem, [])
            assert sorted(report.withheld) == sorted(keys)
            refused = [e for e in logs if e["event"] == "scrub_refused"]
            assert [e["reason"] for e in refused] == [problem]
        finally:
            store.close()

    @pytest.mark.parametrize("dry_run", [False, True], ids=["real", "dry-run"])
    @pytest.mark.parametrize("reason", ["retention", "history-gap"])
    async def test_staged_segments_go_while_the_rest_is_refused(self, tmp_path, dry_run, reason):
        """Staged segments are judged by age alone, never by metadata: the old ones and their
        old uploads go (or would go) however incomplete the metadata is; orphans by the
        store's view and their uploads stay."""
        store, objects, keys = await _orphaned(tmp_path)
        try:
            staged, staged_upload, segment_upload = await _with_staged(objects)
            unsafe = None
            if reason == "retention":
                unsafe = metadata_retention_problem(META, TopicConfig())
            else:
                store.record_history_gap(3, 500)
            with capture_logs() as logs:
                report = await _scrubber(store, objects).scrub(dry_run=dry_run, unsafe=unsafe)
            assert report.refused is not None
            assert report.orphans == [staged]
            assert report.aborted_uploads == [staged_upload]
            assert sorted(report.withheld) == sorted(keys)
            assert report.withheld_uploads == [segment_upload]
            assert report.to_json()["withheld"] == len(keys)
            left = {*keys, MARKER} if not dry_run else {*keys, MARKER, staged}
            assert set(objects.objects) == left
            uploads = {u.key async for u in objects.list_multipart_uploads(LAYOUT.prefix)}
            expected = {segment_upload[0]} if not dry_run else {staged_upload[0], segment_upload[0]}
            assert uploads == expected
            assert [e["event"] for e in logs if e["event"] == "scrub_refused"] == ["scrub_refused"]
        finally:
            store.close()

    @pytest.mark.parametrize("owner", ["foreign", "unconfirmed"])
    async def test_an_unowned_prefix_keeps_staged_segments_too(self, tmp_path, owner):
        """The ownership check refuses everything, staged segments included."""
        store, objects, keys = await _orphaned(tmp_path)
        try:
            staged, staged_upload, _segment_upload = await _with_staged(objects)
            # unconfirmed: the daemon has not claimed the prefix yet
            who: PrefixOwner | Callable[[], PrefixOwner | None] = (
                PrefixOwner("cluster-b", OWNER.metadata_topic) if owner == "foreign" else _nobody
            )
            with pytest.raises(UnsafeScrubError):
                await _scrubber(store, objects, owner=who).scrub(
                    unsafe=metadata_retention_problem(META, TopicConfig())
                )
            assert set(objects.objects) == {*keys, MARKER, staged}
            uploads = [u.key async for u in objects.list_multipart_uploads(LAYOUT.prefix)]
            assert staged_upload[0] in uploads
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
            with capture_logs() as logs:
                real = await _scrubber(store, objects).scrub()
            assert real.refused is not None
            assert "3 from offset 500" in real.refused
            assert sorted(objects.objects) == sorted([*keys, MARKER])
            assert [e["event"] for e in logs] == ["scrub_refused", "scrub_finished"]
            report = await _scrubber(store, objects).scrub(dry_run=True)
            assert report.refused is not None
            assert "deleted records" in report.refused
            assert report.orphans == []
            assert sorted(report.withheld) == sorted(keys)
        finally:
            store.close()
        with RemoteSegmentStore(tmp_path / "state") as reopened:
            assert reopened.history_gaps() == {3: 500}  # kept until the store is rebuilt

    async def test_a_dry_run_still_reports(self, tmp_path):
        store, objects, keys = await _orphaned(tmp_path)
        try:
            problem = metadata_retention_problem(META, TopicConfig())
            report = await _scrubber(store, objects).scrub(dry_run=True, unsafe=problem)
            assert report.orphans == []
            assert sorted(report.withheld) == sorted(keys)
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
        """Refused as before; the staged segment that went is counted as deleted."""
        store, objects, keys = await _orphaned(tmp_path)
        metrics = Metrics()
        try:
            staged, _staged_upload, _segment_upload = await _with_staged(objects)
            manager = _manager(store, objects, _scrubber(store, objects), metrics, TopicConfig())
            await manager._scrub(asyncio.Event())
            assert self._value(metrics, "scrub_runs_total", outcome="refused") == 1
            assert self._value(metrics, "scrub_runs_total", outcome="ok") == 0
            kind = {"kind": "UnsafeScrubError"}
            assert self._value(metrics, "retention_errors_total", **kind) == 1
            assert self._value(metrics, "scrub_deleted_objects_total") == 1
            assert self._value(metrics, "scrub_aborted_uploads_total") == 1
            assert sorted(objects.objects) == sorted([*keys, MARKER])
            assert staged not in objects.objects
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


class TestCommand:
    """`sidecar scrub` prints what went and what the refusal kept, and exits 1 when refused."""

    @pytest.mark.parametrize(("dry_run", "status"), [(False, 1), (True, 0)])
    def test_a_refused_scrub_prints_both(self, monkeypatch, dry_run, status):
        from sidecar.config import load_config
        from sidecar.retention import _cli
        from sidecar.retention.scrub import ScrubReport

        staged, kept = _staged_key(0), _keys(_metadata(0))[0]
        report = ScrubReport(dry_run=dry_run, refused="retention.ms=1", orphans=[staged])
        report.withheld = [kept]

        async def scrub(config: Any, *, dry_run: bool, state_dir: Any) -> ScrubReport:
            return report

        monkeypatch.setattr(_cli, "_scrub", scrub)
        monkeypatch.setattr(_cli, "_log_to_stderr", lambda config, level: None)
        out = io.StringIO()
        config = load_config(None, environ={})
        assert _cli.scrub_command(config, dry_run=dry_run, as_json=False, out=out) == status
        lines = out.getvalue().splitlines()
        assert lines[0] == "WARNING: refused for all but staged segments: retention.ms=1"
        assert lines[1] == f"{'would delete' if dry_run else 'deleted'} {staged}"
        assert lines[2] == f"kept (refused) {kept}"
        assert lines[3].endswith("; 1 orphans and 0 uploads kept (0.000 s)")
        as_json = io.StringIO()
        assert _cli.scrub_command(config, dry_run=dry_run, as_json=True, out=as_json) == status
        assert json.loads(as_json.getvalue())["withheld_keys"] == [kept]
