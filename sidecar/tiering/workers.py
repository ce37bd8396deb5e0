"""The tiering engine: one worker per partition (sequential), a global limit (parallel).

``TieringEngine.run`` reconciles on every hint (a log-dir change, a cluster refresh, a finished
upload) and at least once a second: for each partition in the log dirs that is selected for
tiering and led by this broker on a fresh cluster view, it makes sure the partition's metadata is
tailed and caught up, then starts a worker if none runs. A worker repairs what a crash left
(a COPY_SEGMENT_STARTED without FINISHED is deleted and redone; a DELETE_SEGMENT_STARTED is
finished), then uploads the planned segments one by one under the global semaphore, and ends
when nothing is left to do. Errors back off per partition with jitter; a corrupt segment is
quarantined (and reported) while the other partitions continue.

On stop, no new segment starts; uploads in flight get ``drain_timeout_s`` to finish, then are
cancelled (the uploader cleans up what it wrote).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sidecar._aio import wait_any
from sidecar.errors import SidecarError
from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.kafka.logdir import PartitionScan
from sidecar.metadata.events import TopicIdPartition
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata.tailer import MetadataTailer
from sidecar.observability.logging import bind_context, get_logger
from sidecar.observability.metrics import Metrics
from sidecar.tiering.cluster import ClusterWatcher
from sidecar.tiering.planner import plan_partition
from sidecar.tiering.uploader import CorruptSegmentError, SegmentUploader

__all__ = ["Quarantine", "TieringEngine"]

log = get_logger(__name__)

_PartitionKey = tuple[str, int]


class Quarantine:
    """Segments that must not be uploaded (corrupt), persisted in the state dir as JSON."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._entries: dict[_PartitionKey, dict[int, str]] = {}
        try:
            raw = json.loads(path.read_text())
            for item in raw.get("segments", []):
                key = (str(item["topic"]), int(item["partition"]))
                self._entries.setdefault(key, {})[int(item["base_offset"])] = str(item["reason"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("quarantine_file_unreadable", path=str(path), error=str(exc))

    def add(self, topic: str, partition: int, base_offset: int, reason: str) -> None:
        self._entries.setdefault((topic, partition), {})[base_offset] = reason
        self._save()

    def offsets(self, topic: str, partition: int) -> frozenset[int]:
        return frozenset(self._entries.get((topic, partition), {}))

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def _save(self) -> None:
        items = [
            {"topic": t, "partition": p, "base_offset": b, "reason": r}
            for (t, p), offsets in sorted(self._entries.items())
            for b, r in sorted(offsets.items())
        ]
        tmp = self._path.with_suffix(".tmp")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"segments": items}, indent=1))
        tmp.replace(self._path)


@dataclass
class _Worker:
    task: asyncio.Task[None]
    failures: int = 0
    retry_at: float = 0.0


@dataclass
class _Lag:
    segments: int = 0
    bytes: int = 0
    oldest_ms: int | None = None


@dataclass
class EngineSettings:
    """Knobs of the engine (from ``TieringConfig``)."""

    max_concurrent_uploads: int = 2
    drain_timeout_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 60.0
    num_metadata_partitions: int = 50
    wake_interval_s: float = 1.0
    lag_interval_s: float = 10.0
    clock_ms: Callable[[], int] = field(default=lambda: time.time_ns() // 1_000_000)


class TieringEngine:
    """Plans and runs uploads for every partition this broker leads."""

    def __init__(
        self,
        *,
        views: Callable[[], Mapping[Path, PartitionScan]],
        cluster: ClusterWatcher,
        store: RemoteSegmentStore,
        tailer: MetadataTailer,
        uploader: SegmentUploader,
        quarantine: Quarantine,
        metrics: Metrics,
        settings: EngineSettings,
    ) -> None:
        self._views = views
        self._cluster = cluster
        self._store = store
        self._tailer = tailer
        self._uploader = uploader
        self._quarantine = quarantine
        self.quarantine = quarantine
        self._metrics = metrics
        self._settings = settings
        self._slots = asyncio.Semaphore(settings.max_concurrent_uploads)
        self._wake = asyncio.Event()
        self._workers: dict[_PartitionKey, _Worker] = {}
        self._repaired: set[_PartitionKey] = set()
        self._stopping = asyncio.Event()
        self._next_lag_at = 0.0
        self.uploaded = 0
        #: (topic, partition) → (unix time, message) of the last failure; cleared on success
        self.last_errors: dict[_PartitionKey, tuple[float, str]] = {}

    def poke(self) -> None:
        """A hint that something changed (log dir, cluster, metadata): reconcile soon."""
        self._wake.set()

    @property
    def busy_partitions(self) -> list[_PartitionKey]:
        return sorted(k for k, w in self._workers.items() if not w.task.done())

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task: reconcile until ``stopping``, then drain in-flight uploads."""
        try:
            async with asyncio.TaskGroup() as tg:
                while not stopping.is_set():
                    self._wake.clear()
                    try:
                        self._reconcile(tg)
                    except SidecarError as exc:
                        log.warning("tiering_reconcile_failed", error=str(exc))
                    await wait_any(stopping, self._wake, within=self._settings.wake_interval_s)
                self._stopping.set()
                await self._drain()
        finally:
            self._stopping.set()

    async def _drain(self) -> None:
        running = [w.task for w in self._workers.values() if not w.task.done()]
        if not running:
            return
        log.info(
            "tiering_draining", uploads=len(running), deadline_s=self._settings.drain_timeout_s
        )
        _done, pending = await asyncio.wait(running, timeout=self._settings.drain_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("tiering_drain_deadline_passed", cancelled=len(pending))
            await asyncio.wait(pending)

    def _reconcile(self, tg: asyncio.TaskGroup) -> None:
        view = self._cluster.view
        now = time.monotonic()
        lag_by_topic: dict[str, _Lag] | None = None
        if now >= self._next_lag_at:  # copy lag costs store queries: not on every wake-up
            lag_by_topic = {}
            self._next_lag_at = now + self._settings.lag_interval_s
        tracked: set[int] = set()
        for scan in self._views().values():
            if scan.topic_id is None or not self._cluster.selected(scan.topic):
                continue
            tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition)
            mp = metadata_partition(tip, self._settings.num_metadata_partitions)
            tracked.add(mp)
            key = (scan.topic, scan.partition)
            if not view.may_upload(scan.topic, scan.partition):
                self._repaired.discard(key)  # repair again when leadership comes back
                continue
            if not self._tailer.caught_up(mp):
                continue
            if lag_by_topic is not None:
                self._account_lag(lag_by_topic, scan, tip, view.lso(scan.topic, scan.partition))
            worker = self._workers.get(key)
            if worker is not None and not worker.task.done():
                continue
            if worker is not None and now < worker.retry_at:
                continue
            failures = worker.failures if worker is not None else 0
            retry_at = worker.retry_at if worker is not None else 0.0
            task = tg.create_task(self._work(key), name=f"tiering {scan.topic}-{scan.partition}")
            self._workers[key] = _Worker(task, failures, retry_at)
        new = tracked - set(self._tailer.tracked)
        if new:
            self._tailer.track(new)
        if lag_by_topic is not None:
            self._publish_lag(lag_by_topic)

    def _account_lag(
        self, lag: dict[str, _Lag], scan: PartitionScan, tip: TopicIdPartition, lso: int | None
    ) -> None:
        """Copy lag: rolled segments past the highest remote offset (a few indexed queries)."""
        topic_lag = lag.setdefault(scan.topic, _Lag())
        highest = plan_partition(
            scan,
            lso=lso,
            highest_for_epoch=functools.partial(self._store.highest_offset_for_epoch, tip),
            limit=0,
        ).highest_remote_offset
        for segment in scan.segments:
            if segment.end_offset is None or segment.end_offset <= highest:
                continue
            topic_lag.segments += 1
            topic_lag.bytes += segment.size
            if segment.max_timestamp_ms is not None and (
                topic_lag.oldest_ms is None or segment.max_timestamp_ms < topic_lag.oldest_ms
            ):
                topic_lag.oldest_ms = segment.max_timestamp_ms

    def _publish_lag(self, lag_by_topic: dict[str, _Lag]) -> None:
        now_ms = self._settings.clock_ms()
        for topic, lag in lag_by_topic.items():
            self._metrics.copy_lag_segments.labels(topic).set(lag.segments)
            self._metrics.copy_lag_bytes.labels(topic).set(lag.bytes)
            seconds = 0.0 if lag.oldest_ms is None else max(0.0, (now_ms - lag.oldest_ms) / 1000)
            self._metrics.copy_lag_seconds.labels(topic).set(seconds)
        self._metrics.quarantined_segments.set(len(self._quarantine))

    def _scan_for(self, key: _PartitionKey) -> PartitionScan | None:
        for scan in self._views().values():
            if (scan.topic, scan.partition) == key:
                return scan
        return None

    async def _work(self, key: _PartitionKey) -> None:
        topic, partition = key
        with bind_context(topic=topic, partition=partition):
            try:
                await self._work_partition(key)
                self._workers[key].failures = 0
                self.last_errors.pop(key, None)
            except SidecarError as exc:
                worker = self._workers[key]
                worker.failures += 1
                delay = min(
                    self._settings.backoff_max_s,
                    self._settings.backoff_initial_s * 2 ** (worker.failures - 1),
                )
                if not exc.retriable:
                    delay = self._settings.backoff_max_s
                delay *= random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography
                worker.retry_at = time.monotonic() + delay
                self.last_errors[key] = (time.time(), f"{type(exc).__name__}: {exc}")
                self._metrics.upload_errors.labels(type(exc).__name__).inc()
                log.warning(
                    "partition_tiering_failed",
                    error=str(exc),
                    error_type=type(exc).__name__,
                    retry_in_s=round(delay, 2),
                    attempt=worker.failures,
                )
            finally:
                self.poke()

    async def _work_partition(self, key: _PartitionKey) -> None:
        topic, partition = key
        while not self._stopping.is_set():
            scan = self._scan_for(key)
            view = self._cluster.view
            if scan is None or scan.topic_id is None or not view.may_upload(topic, partition):
                return
            tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), topic, partition)
            if key not in self._repaired:
                await self._repair(tip)
                self._repaired.add(key)
            plan = await asyncio.to_thread(
                plan_partition,
                scan,
                lso=view.lso(topic, partition),
                highest_for_epoch=functools.partial(self._store.highest_offset_for_epoch, tip),
                quarantined=self._quarantine.offsets(topic, partition),
            )
            if not plan.uploads:
                return
            segment = plan.uploads[0]
            async with self._slots:
                if self._stopping.is_set():
                    return
                try:
                    outcome = await self._uploader.upload(scan, segment)
                except CorruptSegmentError as exc:
                    self._quarantine.add(topic, partition, segment.base_offset, str(exc))
                    self._metrics.quarantined_segments.set(len(self._quarantine))
                    self._metrics.upload_errors.labels("CorruptSegmentError").inc()
                    log.error(  # noqa: TRY400 - the error text is the report; no traceback needed
                        "segment_quarantined", base_offset=segment.base_offset, error=str(exc)
                    )
                    return
            self.uploaded += 1
            self._metrics.segments_copied.labels(topic).inc()
            self._metrics.bytes_copied.labels(topic).inc(outcome.log_bytes + outcome.index_bytes)
            self._metrics.upload_seconds.observe(outcome.seconds)
            log.info(
                "segment_tiered",
                base_offset=segment.base_offset,
                end_offset=segment.end_offset,
                segment_id=str(outcome.metadata.segment_id.id),
                bytes=outcome.log_bytes,
                seconds=round(outcome.seconds, 3),
            )

    async def _repair(self, tip: TopicIdPartition) -> None:
        """Crash repair for one partition: redo STARTED copies, finish STARTED deletes."""
        for metadata in await asyncio.to_thread(self._store.unfinished_copies, tip):
            log.info(
                "repairing_unfinished_copy",
                segment_id=str(metadata.segment_id.id),
                start_offset=metadata.start_offset,
            )
            await self._uploader.delete_segment(metadata)
            self._metrics.repairs.labels("unfinished_copy").inc()
        for metadata in await asyncio.to_thread(self._store.unfinished_deletes, tip):
            log.info("finishing_unfinished_delete", segment_id=str(metadata.segment_id.id))
            await self._uploader.finish_delete(metadata)
            self._metrics.repairs.labels("unfinished_delete").inc()
