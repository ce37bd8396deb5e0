"""The tiering engine: one worker per partition (sequential), a global limit (parallel).

``TieringEngine.run`` reconciles on every hint (a log-dir change, a cluster refresh, a finished
upload) and at least once a second: for each partition in the log dirs that is selected for
tiering and led by this broker on a fresh cluster view, it makes sure the partition's metadata is
tailed and caught up, then starts a worker if none runs. Errors back off per partition with
jitter (``retry_now`` cuts the wait short when a dependency is back). A segment file that cannot
be read (EIO, permissions, a network file system's ETIMEDOUT) is retried that way and never
quarantined; a segment whose bytes are corrupt is quarantined by topic id
(:mod:`sidecar.tiering.quarantine`) and planning goes on past it. The quarantine file is re-read
about once a second, so a ``sidecar quarantine clear`` is seen at once: the partition is planned
again and the cleared segment is read and checked anew. A partition whose plan waits longer than
``stall_report_s`` for a rolled segment that is not ready (a missing producer snapshot, an index
that cannot be read) is reported: a log line, its ``last_errors`` entry and a gauge.

A pass looks at the partitions something happened to since the last one: a changed log dir (the
detector's journal), an LSO looked up for one partition, a worker that ended, a due timer (a
backoff, the handover delay, an idle partition's next look), a partition waiting for its
metadata. A new picture of the leaders or configs, a freshness change, pause and resume,
``retry_now``, a quarantine change and the copy lag make a pass over every partition, as does
``full_pass_interval_s`` at the latest.

Leadership changes (kafka-kip405-internals.md §2.6, §3.3):

* Losing a partition (another leader, or a stale cluster view) cancels its worker; the uploader
  abandons the copy in flight (DELETE_SEGMENT_STARTED → delete objects → FINISHED), and it also
  refuses to publish FINISHED once leadership has moved.
* Gaining one (or starting) waits ``handover_delay_s`` before the first upload: the previous
  leader's sidecar learns of the change within its own refresh interval, and stops. Then the
  worker reads the partition's metadata up to its current end (``tailer.sync``), so planning
  starts from the previous leader's last FINISHED copy, as Kafka's ``findHighestRemoteOffset``
  does on the new leader. A segment whose boundaries differ from the previous leader's may
  overlap its last copy; the store resolves that by leader-epoch lineage, as Kafka does.
* Crash repair: this sidecar's own COPY_SEGMENT_STARTED copies are deleted (and redone by
  planning) and this broker's DELETE_SEGMENT_STARTED ones finished, at once. A STARTED copy is
  the sidecar's own when this process started it (the uploader's ``started_here``) or it is
  stamped before this process started (an earlier run's, left by a crash). Any other unfinished
  copy may still be finished or cleaned up by its owner: another broker's, or one under this
  broker's id that the broker's own RLM started (a topic just turned broker-driven, before the
  copy call or the next config refresh says so). The partition waits for it (no upload that
  could duplicate it) for ``foreign_copy_grace_s`` after this broker became the leader (and,
  under this broker's id, after the copy was first seen), then deletes it as dangling. Another
  broker's unfinished deletes are finished after the same grace, without blocking uploads.

On stop, no new segment starts; uploads in flight get ``drain_timeout_s`` to finish, then are
cancelled (the uploader aborts the multipart upload and deletes the copy); that cleanup gets
``cleanup_timeout_s``, after which crash repair at the next start finishes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sidecar._aio import wait_any
from sidecar.errors import SidecarError, UnreadableFileError
from sidecar.kafka.checkpoints import decode_kafka_uuid, load_epoch_cache
from sidecar.kafka.logdir import NotReadyReason, PartitionScan, Segment
from sidecar.metadata.errors import MetadataTailError
from sidecar.metadata.events import RemoteLogSegmentId, SegmentMetadata, TopicIdPartition
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata.tailer import MetadataTailer
from sidecar.observability.logging import bind_context, get_logger
from sidecar.observability.metrics import Metrics
from sidecar.tiering._backoff import partition_backoff
from sidecar.tiering.changes import ChangeWatch
from sidecar.tiering.cluster import ClusterWatcher
from sidecar.tiering.planner import (
    Plan,
    RemoteCoverage,
    find_highest_remote_offset,
    plan_partition,
    segments_behind,
)
from sidecar.tiering.quarantine import (
    Quarantine,
    QuarantineEntry,
    Verdict,
    classify,
    read_error_reason,
)
from sidecar.tiering.uploader import (
    CopyNotStartedError,
    CorruptSegmentError,
    SegmentCopyPreemptedError,
    SegmentUploader,
    UploadIOError,
    UploadOutcome,
)

__all__ = ["MetadataSync", "TieringEngine", "remote_coverage"]

log = get_logger(__name__)

_PartitionKey = tuple[str, int]
#: what copy lag is computed from, per partition: its scan, its id and its last stable offset
_LagInput = tuple[PartitionScan, TopicIdPartition, int | None]
#: a pass over every partition costs CPU in proportion to their number, and at ten thousand
#: partitions pokes come from every roll, refresh and finished upload: the next pass waits at
#: least this many times as long as the last one took, so passes take at most a fifth of the
#: event loop however often the engine is poked (a pass over a few partitions takes well under a
#: millisecond, and waits nothing)
_PASS_SPACING = 4.0
_MIN_SPACING_S = 0.001
#: A STARTED copy under this broker's id stamped this long before the engine was built is an
#: earlier run's (repaired at once); a later one may be the broker's RLM's (see ``_own_copy``)
_EARLIER_RUN_MARGIN_MS = 1_000


class MetadataSync:
    """Reads one user partition's metadata up to the topic's current end, within a time limit
    (Kafka's RLM plans from what its RLMM has read): before planning, and before the uploader
    trusts a copy's state."""

    def __init__(self, tailer: MetadataTailer, *, num_partitions: int, timeout_s: float) -> None:
        self._tailer = tailer
        self._num_partitions = num_partitions
        self._timeout_s = timeout_s

    async def __call__(self, tip: TopicIdPartition) -> None:
        mp = metadata_partition(tip, self._num_partitions)
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._tailer.sync(mp)
        except TimeoutError as exc:
            raise MetadataTailError(
                f"the metadata of {tip.topic}-{tip.partition} (metadata partition {mp}) was not"
                f" read up to its end within {self._timeout_s} s"
            ) from exc


def remote_coverage(
    store: RemoteSegmentStore, scan: PartitionScan, tip: TopicIdPartition, lso: int | None
) -> RemoteCoverage:
    """What of the partition's lineage is remote (store queries: call it off the event loop).

    The lineage is the broker's epoch cache, not the raw checkpoint: the broker drops
    non-monotonic entries when it loads the file, and the store refuses them."""
    epochs = load_epoch_cache(scan.leader_epochs)
    lineage = [(e.epoch, e.start_offset) for e in epochs]
    if lineage and scan.segments:
        # only the local segments' offsets are ever asked (and the first copy's start for
        # the floor): not the partition's whole remote history at every plan
        ranges = store.finished_coverage(tip, lineage, scan.segments[0].base_offset)
    else:
        ranges = [
            (s.start_offset, s.end_offset) for s in store.finished_lineage(tip, lineage or None)
        ]
    active = scan.active_segment
    log_end = max(active.base_offset if active is not None else 0, lso or 0)
    highest = find_highest_remote_offset(
        epochs, log_end, functools.partial(store.highest_offset_for_epoch, tip)
    )
    coverage = RemoteCoverage.of(
        ranges,
        floor=store.remote_floor(tip),
        highest=highest,
    )
    if lineage and lineage[0][1] > coverage.floor:
        # Offsets below the lineage's first epoch are gone from the log: the log start moved
        # (DeleteRecords, retention) and the broker cut its epoch checkpoint to match. A
        # segment holding the new start is served from there, so what it held below is no
        # hole (uploading it again would find the same "hole" again, forever).
        coverage = dataclasses.replace(coverage, floor=lineage[0][1])
    return coverage


@dataclass
class _Worker:
    task: asyncio.Task[None]
    failures: int = 0
    retry_at: float = 0.0  # failure backoff
    preempted: bool = False  # cancelled because leadership moved
    # what the worker was started for; once it found nothing (more) to do, it is started again
    # only when one of them changes (a roll, an LSO move) or at ``idle_until``
    scan: PartitionScan | None = None
    lso: int | None = None
    idle_until: float = 0.0
    #: the store's version of the partition when the worker started, when it started, and
    #: whether it found nothing to do: an idle partition is looked at again at ``idle_until``
    #: only if its metadata changed since, else at ``started + idle_recheck_max_s``
    version: int = 0
    started: float = 0.0
    quiet: bool = False
    #: the quarantine reloads seen when it started: a clear read since (it may have come
    #: while the worker ran, before it set ``idle_until``) starts it again when it ends
    quarantine_reloads: int = 0


@dataclass
class _Stall:
    """A partition whose plan waits for a rolled segment that is not ready."""

    base_offset: int
    reason: NotReadyReason
    problem: str | None
    since: float  # monotonic
    reported: bool = False


#: the reasons a rolled segment can stay not ready (the gauge's label values)
_STALL_REASONS = tuple(
    r for r in NotReadyReason if r not in (NotReadyReason.ACTIVE, NotReadyReason.SNAPSHOT_CORRUPT)
)


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
    cleanup_timeout_s: float = 15.0
    """After the drain deadline, how long cancelled uploads may clean up (abort, delete)."""
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 60.0
    num_metadata_partitions: int = 50
    wake_interval_s: float = 1.0
    lag_interval_s: float = 10.0
    idle_recheck_s: float = 30.0
    """A partition with nothing to upload is planned again when its log dir or LSO changes, or
    after this long if its metadata changed meanwhile (another broker's copy or deletion)."""
    idle_recheck_max_s: float = 300.0
    """... and after this long in any case (a safety net; at least ``idle_recheck_s``)."""
    handover_delay_s: float = 11.0
    """From gaining leadership (or starting) to the first upload of a partition: longer than
    the metadata refresh interval plus a wake-up, so the previous leader's sidecar has stopped."""
    foreign_copy_grace_s: float = 60.0
    """How long another broker's unfinished copy is left to its owner (at least the cluster
    view's ``stale_after_s``: past it, the owner can no longer believe it leads)."""
    catch_up_timeout_s: float = 120.0
    """How long a new leader waits to read the partition's metadata up to its end."""
    stall_report_s: float = 300.0
    """How long a partition may wait for a rolled segment that is not ready before the wait is
    reported (log, ``last_errors``, the ``stalled_partitions`` gauge): a freshly rolled segment
    is ready within moments; one that is not by then (a missing producer snapshot, a file that
    cannot be read) may never be, and nothing after it is tiered meanwhile."""
    full_pass_interval_s: float = 60.0
    """A pass visits the partitions something happened to (a rescan, an LSO move, a timer, a
    worker's end); a pass over every partition comes after a leadership or config change, for
    the copy lag, and at least this often (a safety net)."""
    clock_ms: Callable[[], int] = field(default=lambda: time.time_ns() // 1_000_000)
    monotonic: Callable[[], float] = field(default=time.monotonic)
    """The clock of backoffs, idle looks, handover and grace periods (tests move it);
    ``clock_ms``, the wall clock, dates this run's start against the events' timestamps."""


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
        pause_reason: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._views = views
        self._pause_reason = pause_reason  # e.g. S3 unreachable: start no copy (no churn)
        self._paused: str | None = None
        self._cluster = cluster
        self._store = store
        self._tailer = tailer
        self._uploader = uploader
        self.quarantine = quarantine
        self._metrics = metrics
        self._settings = settings
        self._slots = asyncio.Semaphore(settings.max_concurrent_uploads)
        self._wake = asyncio.Event()
        self._workers: dict[_PartitionKey, _Worker] = {}
        self._repaired: set[_PartitionKey] = set()
        self._led_since: dict[_PartitionKey, float] = {}  # monotonic time leadership was seen
        # copies not this sidecar's, already reported → their partition and when first seen
        self._waiting_for: dict[uuid.UUID, tuple[_PartitionKey, float]] = {}
        # This run's start on the wall clock, which the events' timestamps use: a STARTED
        # copy under this broker's id stamped before it is an earlier run's, left by a crash.
        # Taken here, before the cluster watcher asks for any topic config: a broker's copy
        # stamped earlier is of a topic already broker-driven then, which the first config
        # read shows (so its partition is never repaired). The broker's JVM stamps its events
        # with the same host clock; the margin covers a config read answered by a broker
        # whose metadata lags the change, and a small step of the clock. Misjudged the other
        # way, an earlier run's copy only waits out the grace period before its repair.
        self._started_ms = settings.clock_ms() - _EARLIER_RUN_MARGIN_MS
        self._paths: dict[_PartitionKey, Path] = {}  # partition → its dir, as of the last reconcile
        # the partitions whose copy lag counts (led, handed over, caught up), as of their last
        # visit: the copy-lag update reads these instead of walking every partition
        self._lagging: dict[_PartitionKey, Path] = {}
        #: (topic, partition, topic id) → its TopicIdPartition and metadata partition, computed
        #: when the partition first appears (a pure-Python hash), not on every pass
        self._identities: dict[tuple[str, int, str], tuple[TopicIdPartition, int]] = {}
        self._wanted_at = -1  # the tailer's unwanted_count when every partition was wanted
        #: partition → (scan, LSO, store version, segments behind) of the last lag computation
        self._lag_cache: dict[
            TopicIdPartition, tuple[PartitionScan, int | None, int, list[Segment]]
        ] = {}
        #: what the next pass visits besides the log-dir changes: partitions whose worker ended
        #: or whose LSO moved, and (``_due``) those whose timer (backoff, idle look, handover)
        #: is due; a pass over every partition when ``_walk_all`` or at ``_next_walk_all``
        self._dirty: set[_PartitionKey] = set()
        self._due: list[tuple[float, _PartitionKey]] = []  # a heap of (monotonic time, key)
        self._waiting_catch_up: set[_PartitionKey] = set()  # visited every pass
        self._walk_all = True
        self._next_walk_all = 0.0
        #: the log dirs' and the cluster view's changes since the last pass
        self._changes = ChangeWatch()
        self._stopping = asyncio.Event()
        self._next_lag_at = 0.0
        self._lag_task: asyncio.Task[None] | None = None
        self._next_quarantine_check = 0.0
        #: how many times a changed quarantine file was read (see ``_Worker``)
        self._quarantine_reloads = 0
        self._quarantine_task: asyncio.Task[None] | None = None
        self._lag_topics: set[str] = set()  # topics with copy-lag series
        self.uploaded = 0
        #: passes completed on a fresh cluster view (each such pass has asked the tailer for
        #: the metadata of every partition it looked at: on a stale view no topic is selected)
        self.passes = 0
        #: (topic, partition) → (unix time, message) of the last failure, or of a stall past
        #: ``stall_report_s``; cleared on success
        self.last_errors: dict[_PartitionKey, tuple[float, str]] = {}
        #: partitions whose plan waits for a rolled segment that is not ready
        self._stalls: dict[_PartitionKey, _Stall] = {}
        self._publish_quarantine()  # what the state dir holds, before the first scrape
        self._publish_stalls()

    def poke(self) -> None:
        """A hint that something changed (log dir, cluster, metadata): reconcile soon."""
        self._wake.set()

    def retry_now(self) -> None:
        """A dependency (Kafka, S3) is back: end every partition's backoff and reconcile."""
        for worker in self._workers.values():
            worker.retry_at = 0.0
        self._walk_all = True
        self.poke()

    def _at(self, when: float, key: _PartitionKey) -> None:
        """Visit the partition in the first pass at or after ``when``."""
        heapq.heappush(self._due, (when, key))

    @property
    def busy_partitions(self) -> list[_PartitionKey]:
        return sorted(k for k, w in self._workers.items() if not w.task.done())

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task: reconcile until ``stopping``, then drain in-flight uploads."""
        try:
            async with asyncio.TaskGroup() as tg:
                while not stopping.is_set():
                    self._wake.clear()
                    started = time.monotonic()
                    try:
                        self._reconcile(tg)
                    except SidecarError as exc:
                        log.warning("tiering_reconcile_failed", error=str(exc))
                    spacing = (time.monotonic() - started) * _PASS_SPACING
                    if spacing >= _MIN_SPACING_S:
                        await wait_any(stopping, within=spacing)  # pokes meanwhile stay set
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
        if not pending:
            return
        log.warning("tiering_drain_deadline_passed", cancelled=len(pending))
        for task in pending:
            task.cancel()
        _done, stuck = await asyncio.wait(pending, timeout=self._settings.cleanup_timeout_s)
        if stuck:
            # what they leave (a STARTED or DELETE_STARTED copy) is repaired at the next start
            log.warning("tiering_cleanup_abandoned", uploads=len(stuck))
            for task in stuck:
                task.cancel()
            await asyncio.wait(stuck)

    def _reconcile(self, tg: asyncio.TaskGroup) -> None:
        """One pass: over every partition, or over those something happened to (see
        ``full_pass_interval_s``); at ten thousand partitions a pass over all of them costs
        milliseconds of the event loop, most of it for partitions where nothing changed."""
        view = self._cluster.view
        now = self._settings.monotonic()
        paused = self._pause_reason()
        walk_all = self._walk_all or now >= self._next_walk_all
        if paused != self._paused:
            if paused is not None:
                log.warning("tiering_paused", reason=paused)
            else:
                log.info("tiering_resumed", after=self._paused)
            self._paused = paused
            walk_all = True
        # the view's answers, looked up once per pass and inline per partition (this loop runs
        # over every partition of the broker)
        fresh = view.fresh
        view_changed, lso_moved = self._changes.view_changes(view, fresh)
        if view_changed:
            walk_all = True
        self._dirty.update(lso_moved)
        unwanted = self._tailer.unwanted_count
        rewant = unwanted != self._wanted_at
        if rewant:
            walk_all = True  # the tailer may have dropped a partition: want them all again
        lag_due = now >= self._next_lag_at and (self._lag_task is None or self._lag_task.done())
        if lag_due:  # copy lag costs store queries: not on every wake-up
            self._next_lag_at = now + self._settings.lag_interval_s
        views = self._views()
        changed = self._changes.changed_paths(views)
        due = self._due
        while due and due[0][0] <= now:
            self._dirty.add(heapq.heappop(due)[1])
        if walk_all:
            self._walk_all = False
            self._next_walk_all = now + self._settings.full_pass_interval_s
            self._dirty.clear()
            self._waiting_catch_up.clear()
            items: Iterable[tuple[Path, PartitionScan]] = views.items()
        else:
            for key in self._dirty | self._waiting_catch_up:
                path = self._paths.get(key)
                if path is not None:
                    changed.add(path)
            self._dirty.clear()
            self._waiting_catch_up.clear()
            items = [(path, views[path]) for path in changed if path in views]
        kept: set[_PartitionKey] = set()  # partitions whose per-partition state is kept
        paths: dict[_PartitionKey, Path] = {} if walk_all else self._paths
        identities: dict[tuple[str, int, str], tuple[TopicIdPartition, int]] = (
            {} if walk_all else self._identities
        )
        lagging: dict[_PartitionKey, Path] = {} if walk_all else self._lagging
        #: topic → (selected, broker-driven, the broker copies it)
        choices: dict[str, tuple[bool, bool, bool]] = {}
        me = view.broker_id
        leaders = view.leaders
        for path, scan in items:
            paths[(scan.topic, scan.partition)] = path
            if not walk_all:
                lagging.pop((scan.topic, scan.partition), None)  # counted again below, or not
            if scan.topic_id is None:
                continue
            choice = choices.get(scan.topic)
            if choice is None:
                choice = (
                    self._cluster.selected(scan.topic),
                    self._cluster.broker_driven(scan.topic),
                    self._cluster.broker_copies(scan.topic),
                )
                choices[scan.topic] = choice
            selected, driven, broker_copies = choice
            if not selected and not driven:
                continue
            may_upload = (
                fresh and me is not None and leaders.get((scan.topic, scan.partition)) == me
            )
            if may_upload or not fresh:
                kept.add((scan.topic, scan.partition))
            identity = (scan.topic, scan.partition, scan.topic_id)
            known = self._identities.get(identity)
            if known is None or rewant:
                if known is None:
                    tip = TopicIdPartition(
                        decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition
                    )
                    known = (tip, metadata_partition(tip, self._settings.num_metadata_partitions))
                # followers read their partitions' metadata too, as Kafka's do; asked before
                # the catch-up check below (a partition new to a metadata partition already
                # read is not caught up until its history is read). A partition wanted before
                # stays wanted until the tailer says it may have dropped one.
                self._tailer.want((known,))
            identities[identity] = known
            tip, mp = known
            if not selected:
                # broker-driven: its metadata is tailed for reads, never copied here
                self._handed_to_broker((scan.topic, scan.partition))
                if may_upload and broker_copies and self._tailer.caught_up(mp):
                    # the broker's copy lag, from its FINISHED events in the store: the same
                    # gauges and alerts as a standalone topic's
                    lagging[(scan.topic, scan.partition)] = path
                continue
            key = (scan.topic, scan.partition)
            worker = self._workers.get(key)
            if not may_upload:
                self._lost(key, worker, stale=not fresh)
                continue
            led_since = self._led_since.setdefault(key, now)
            if now < led_since + self._settings.handover_delay_s:
                self._at(led_since + self._settings.handover_delay_s, key)
                continue  # the previous leader's sidecar may not know yet
            if not self._tailer.caught_up(mp):
                self._waiting_catch_up.add(key)
                continue
            lagging[key] = path
            if worker is not None and not worker.task.done():
                continue  # visited again when it ends
            if worker is not None and now < worker.retry_at:
                self._at(worker.retry_at, key)
                continue
            lso = view.lso(scan.topic, scan.partition)
            if (
                worker is not None
                and worker.scan is scan
                and worker.lso == lso
                and worker.quarantine_reloads == self._quarantine_reloads
            ):
                if now < worker.idle_until:
                    self._at(worker.idle_until, key)
                    continue  # it found nothing to do, and nothing changed since
                safety_net = max(self._settings.idle_recheck_s, self._settings.idle_recheck_max_s)
                if (
                    worker.quiet
                    and now < worker.started + safety_net
                    and worker.version == self._store.partition_version(tip)
                ):
                    # nor did its metadata: a plan now would find nothing again (at a thousand
                    # led partitions these looks were most of an idle daemon's work)
                    worker.idle_until = now + self._settings.idle_recheck_s
                    self._at(worker.idle_until, key)
                    continue
            if paused is not None:
                continue  # no new copy while a dependency is known to be down
            failures = worker.failures if worker is not None else 0
            retry_at = worker.retry_at if worker is not None else 0.0
            task = tg.create_task(self._work(key), name=f"tiering {scan.topic}-{scan.partition}")
            self._workers[key] = _Worker(
                task,
                failures,
                retry_at,
                scan=scan,
                lso=lso,
                version=self._store.partition_version(tip),
                started=now,
                quarantine_reloads=self._quarantine_reloads,
            )
        if walk_all:
            self._forget_except(kept)
            self._paths = paths
            self._identities = identities
            self._wanted_at = unwanted
        else:
            gone = [path for path in changed if path not in views]
            if gone:
                self._forget_gone(gone)
        if walk_all:
            self._lagging = lagging
        if lag_due:
            lag_inputs: list[_LagInput] = []
            for path in self._lagging.values():
                current = views.get(path)
                if current is None or current.topic_id is None:
                    continue
                known = self._identities.get((current.topic, current.partition, current.topic_id))
                if known is not None:
                    lso = view.lso(current.topic, current.partition)
                    lag_inputs.append((current, known[0], lso))
            self._lag_task = tg.create_task(self._update_lag(lag_inputs), name="tiering copy lag")
        if now >= self._next_quarantine_check and (
            self._quarantine_task is None or self._quarantine_task.done()
        ):
            self._next_quarantine_check = now + self._settings.wake_interval_s
            self._quarantine_task = tg.create_task(
                self._reload_quarantine(), name="tiering quarantine reload"
            )
        if fresh:
            self.passes += 1

    def _forget_gone(self, gone: list[Path]) -> None:
        """Partition dirs gone since the last pass: their partitions' state is dropped, as a
        pass over every partition drops it (unless the partition is now in another dir)."""
        by_path = {path: key for key, path in self._paths.items()}
        keys = {by_path[path] for path in gone if path in by_path}
        for key in keys:
            del self._paths[key]
            self._lagging.pop(key, None)
            worker = self._workers.get(key)
            if worker is not None and worker.task.done():
                del self._workers[key]
            if key not in self._workers:
                self._repaired.discard(key)
            self.last_errors.pop(key, None)
            self._led_since.pop(key, None)
        self._drop_stalls(keys)
        self._waiting_for = {i: w for i, w in self._waiting_for.items() if w[0] not in keys}

    async def _reload_quarantine(self) -> None:
        """Pick up a ``sidecar quarantine clear`` (it rewrites the file): plan every partition
        again, so a cleared segment is read and checked anew."""
        try:
            changed = await asyncio.to_thread(self.quarantine.refresh)
        except OSError as exc:
            log.warning("quarantine_reload_failed", error=str(exc))
            return
        self._publish_quarantine()
        if not changed:
            return
        log.info("quarantine_reloaded", segments=len(self.quarantine))
        # every partition is planned again, a cleared segment read and checked anew: now, or
        # when its worker (maybe running since before the clear) ends
        self._quarantine_reloads += 1
        self._walk_all = True
        self.poke()

    def _publish_quarantine(self) -> None:
        self._metrics.quarantined_segments.set(len(self.quarantine))
        self._metrics.quarantined_bytes.set(self.quarantine.size_bytes)

    async def _update_lag(self, inputs: list[_LagInput]) -> None:
        """Copy lag from store queries in a worker thread (never on the event loop)."""
        try:
            lag_by_topic = await asyncio.to_thread(self._compute_lag, inputs)
        except SidecarError as exc:
            log.warning("tiering_copy_lag_failed", error=str(exc))
            return
        self._publish_lag(lag_by_topic)

    def _compute_lag(self, inputs: list[_LagInput]) -> dict[str, _Lag]:
        """(thread) Each partition's segments behind, from the store unless neither its scan,
        its LSO nor its metadata changed since the last time (at thousands of led partitions
        the queries of every partition every ``lag_interval_s`` kept a thread busy)."""
        lag_by_topic: dict[str, _Lag] = {}
        known = self._lag_cache
        self._lag_cache = {}
        for scan, tip, lso in inputs:
            version = self._store.partition_version(tip)
            cached = known.get(tip)
            if cached is not None and cached[0] is scan and cached[1:3] == (lso, version):
                behind = cached[3]
            else:
                behind = self._segments_behind(scan, tip, lso)
            self._lag_cache[tip] = (scan, lso, version, behind)
            self._account_lag(lag_by_topic, scan.topic, behind)
        return lag_by_topic

    def _forget_except(self, kept: set[_PartitionKey]) -> None:
        """Drop the state of partitions that left the log dir, are no longer selected, or are
        led by another broker (a fresh view says so), once their worker has ended: the maps
        follow the partitions present now. A stale view forgets nothing (backoffs survive it)."""
        for key in [k for k, w in self._workers.items() if k not in kept and w.task.done()]:
            del self._workers[key]
        for key in [k for k in self.last_errors if k not in kept]:
            del self.last_errors[key]
        self._drop_stalls([k for k in self._stalls if k not in kept])
        running = self._workers.keys()
        self._repaired = {k for k in self._repaired if k in kept or k in running}
        self._led_since = {k: t for k, t in self._led_since.items() if k in kept}
        self._waiting_for = {i: w for i, w in self._waiting_for.items() if w[0] in kept}

        def tiered_here(segment_id: RemoteLogSegmentId) -> bool:
            tip = segment_id.topic_id_partition
            return (tip.topic, tip.partition) in kept or (tip.topic, tip.partition) in running

        self._uploader.forget_started(tiered_here)

    def _handed_to_broker(self, key: _PartitionKey) -> None:
        """A partition this sidecar tiered whose topic turned broker-driven
        (``remote.storage.enable=true``): the broker's RLM copies it from now on, starting after
        the last FINISHED copy it reads. A copy in flight is abandoned (deleted unless FINISHED
        may have been sent), so it cannot land after the broker's first pass has planned past it."""
        if self._led_since.pop(key, None) is None:
            return  # never tiered here since this process started: nothing to hand over
        self._repaired.discard(key)
        self._drop_stalls([key])
        worker = self._workers.get(key)
        running = worker is not None and not worker.task.done() and not worker.preempted
        if worker is not None and running:
            worker.preempted = True
            worker.task.cancel()
            self._metrics.preempted_copies.labels("broker_driven").inc()
        topic, partition = key
        log.info(
            "tiering_handed_to_broker",
            topic=topic,
            partition=partition,
            upload_abandoned=running,
        )

    def _lost(self, key: _PartitionKey, worker: _Worker | None, *, stale: bool) -> None:
        """This broker does not (or cannot tell that it does) lead the partition any more."""
        self._repaired.discard(key)  # catch up and repair again when leadership comes back
        self._led_since.pop(key, None)
        self._drop_stalls([key])  # another broker's sidecar tiers (and reports) it now
        if worker is None or worker.task.done() or worker.preempted:
            return
        worker.preempted = True
        worker.task.cancel()  # the uploader abandons (deletes) the copy in flight
        self._metrics.preempted_copies.labels("cluster_view_stale" if stale else "not_leader").inc()
        topic, partition = key
        log.warning(
            "tiering_leadership_lost",
            topic=topic,
            partition=partition,
            reason="the cluster view is stale" if stale else "another broker leads",
        )

    def _segments_behind(
        self, scan: PartitionScan, tip: TopicIdPartition, lso: int | None
    ) -> list[Segment]:
        """Copy lag: rolled segments past the highest remote offset (a few indexed queries)."""
        return list(
            segments_behind(
                scan,
                lso=lso,
                highest_for_epoch=functools.partial(self._store.highest_offset_for_epoch, tip),
                coverage=remote_coverage(self._store, scan, tip, lso),
            )
        )

    @staticmethod
    def _account_lag(lag: dict[str, _Lag], topic: str, behind: list[Segment]) -> None:
        topic_lag = lag.setdefault(topic, _Lag())
        for segment in behind:
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
        # a topic this broker no longer tiers (deleted, led elsewhere) drops its series
        for topic in self._lag_topics - lag_by_topic.keys():
            for gauge in (
                self._metrics.copy_lag_segments,
                self._metrics.copy_lag_bytes,
                self._metrics.copy_lag_seconds,
            ):
                gauge.remove(topic)
        self._lag_topics = set(lag_by_topic)

    def _scan_for(self, key: _PartitionKey) -> PartitionScan | None:
        """The partition's current scan: one lookup (a walk of every view per worker step would
        be quadratic in the partitions)."""
        path = self._paths.get(key)
        scan = None if path is None else self._views().get(path)
        if scan is None or (scan.topic, scan.partition) != key:
            return None
        return scan

    async def _work(self, key: _PartitionKey) -> None:
        topic, partition = key
        uploaded = self.uploaded
        quiet = False  # it found nothing to do: nothing for the next pass to act on
        with bind_context(topic=topic, partition=partition):
            try:
                waiting = await self._work_partition(key)
                stall = self._stalls.get(key)
                quiet = not waiting and self.uploaded == uploaded and stall is None
                worker = self._workers[key]
                worker.quiet = quiet
                worker.failures = 0
                now = self._settings.monotonic()
                worker.idle_until = now + (
                    self._settings.wake_interval_s if waiting else self._settings.idle_recheck_s
                )
                stalled = self._report_stall(key, stall, now)
                if stalled is not None:
                    self.last_errors[key] = (time.time(), stalled)
                else:
                    self.last_errors.pop(key, None)
                    if stall is not None:  # looked at again when the wait is due to be reported
                        due = stall.since + self._settings.stall_report_s
                        worker.idle_until = min(worker.idle_until, due)
            except SidecarError as exc:
                self._repaired.discard(key)  # catch up and repair what the failure left
                worker = self._workers[key]
                worker.failures += 1
                delay = partition_backoff(
                    worker.failures,
                    initial_s=self._settings.backoff_initial_s,
                    max_s=self._settings.backoff_max_s,
                    retriable=exc.retriable,
                    draw=random.random(),  # noqa: S311 - jitter, not cryptography
                )
                worker.retry_at = self._settings.monotonic() + delay
                self.last_errors[key] = (time.time(), f"{type(exc).__name__}: {exc}")
                self._metrics.upload_errors.labels(type(exc).__name__).inc()
                if isinstance(exc, SegmentCopyPreemptedError):  # its objects are deleted
                    self._metrics.preempted_copies.labels("deleted_by_another_broker").inc()
                if classify(exc) is Verdict.UNREADABLE:
                    # the disk, not the bytes: the same segment is tried again after the wait
                    reason = read_error_reason(exc)
                    self._metrics.segment_read_retries.labels(reason).inc()
                    log.warning(
                        "segment_read_retry",
                        reason=reason,
                        path=getattr(exc, "path", None),
                        error=str(exc),
                        retry_in_s=round(delay, 2),
                        attempt=worker.failures,
                    )
                else:
                    log.warning(
                        "partition_tiering_failed",
                        error=str(exc),
                        error_type=type(exc).__name__,
                        retry_in_s=round(delay, 2),
                        attempt=worker.failures,
                    )
            finally:
                # the next pass visits the partition (to start it again, or to time its next
                # look); an idle partition's periodic look (every idle_recheck_s) finding
                # nothing pokes no pass: at a thousand led partitions those looks alone kept
                # passes running
                self._dirty.add(key)
                if not quiet:
                    self.poke()

    def _may_start(self, key: _PartitionKey) -> bool:
        """:meth:`_may_upload`, and nothing pauses copies (Kafka or S3 known down). A worker
        checks it before each segment, not only when it starts: with its refreshes failing,
        this broker's picture of the leaders ages without being stale yet, while a new leader
        starts copying ``handover_delay_s`` after it sees itself lead; a copy started then
        could be the one the new leader makes."""
        return self._pause_reason() is None and self._may_upload(key)

    def _may_upload(self, key: _PartitionKey) -> bool:
        """The worker was not preempted, the topic is still tiered here (not turned
        broker-driven) and this broker leads the partition on a fresh view."""
        topic, partition = key
        worker = self._workers.get(key)
        preempted = worker is not None and worker.preempted
        return (
            not preempted
            and self._cluster.selected(topic)
            and self._cluster.view.may_upload(topic, partition)
        )

    async def _work_partition(self, key: _PartitionKey) -> bool:
        """Upload the partition's planned segments one by one; returns (with nothing left to do)
        whether it waits for something outside (another broker's copy) to look again soon."""
        topic, partition = key
        while not self._stopping.is_set():
            scan = self._scan_for(key)
            view = self._cluster.view
            if scan is None or scan.topic_id is None or not self._may_upload(key):
                return False
            if not self._may_start(key):
                return True  # paused: looked at again once the pause ends
            tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), topic, partition)
            if key not in self._repaired:
                await self._catch_up(tip)
                await self._repair_own(tip)
                if not self._may_upload(key):
                    return False  # turned broker-driven (or lost) while it was repaired
                self._repaired.add(key)
            if await self._foreign_copy_pending(key, tip):
                return True  # its owner may still finish it: look again soon
            plan = await asyncio.to_thread(self._plan, scan, tip, view.lso(topic, partition))
            if not plan.uploads and plan.waiting_for_lso:
                # the periodic LSO predates the roll: ask Kafka for this partition's LSO now
                lso = await self._cluster.fetch_lso(topic, partition)
                if lso is not None and lso != plan.lso:
                    plan = await asyncio.to_thread(self._plan, scan, tip, lso)
            self._track_stall(key, plan.stalled_on)
            if not plan.uploads:
                return False
            segment = plan.uploads[0]
            async with self._slots:
                if self._stopping.is_set():
                    return False
                try:
                    outcome = await self._uploader.upload(
                        scan,
                        segment,
                        may_start=functools.partial(self._may_start, key),
                        may_continue=functools.partial(self._may_upload, key),
                        on_late_finish=functools.partial(
                            self._tiered, topic, segment, after_cancel=True
                        ),
                    )
                except CopyNotStartedError:
                    # a pause or a leadership move came while the segment was opened and
                    # checked: not a failure, the checks above decide what happens next
                    continue
                except CorruptSegmentError as exc:
                    if classify(exc) is not Verdict.CORRUPT:
                        raise  # not proof of corrupt bytes: retried with backoff
                    await self._quarantine(tip, segment, exc)
                    continue  # plan on: the segments after it still tier
                except OSError as exc:
                    if exc.errno is None and isinstance(exc, TimeoutError | ConnectionError):
                        # a deadline or a connection that a layer below did not translate
                        raise UploadIOError(
                            f"upload of segment {segment.base_offset} failed:"
                            f" {type(exc).__name__}: {exc}"
                        ) from exc
                    # a file call failed while the segment was opened or its .log uploaded:
                    # EIO, EACCES, or ETIMEDOUT and ECONNRESET from a network file system
                    raise UnreadableFileError(
                        f"cannot read file: {exc.strerror or type(exc).__name__}",
                        path=str(segment.log_path),
                        errno=exc.errno,
                    ) from exc
            self._tiered(topic, segment, outcome)
            if segment.base_offset in self.quarantine.offsets(tip.topic_id, partition):
                await self._supersede_quarantine(tip, segment)
        return False

    def _tiered(
        self, topic: str, segment: Segment, outcome: UploadOutcome, *, after_cancel: bool = False
    ) -> None:
        """Count and log a copy that the topic shows FINISHED; ``after_cancel``: its worker was
        cancelled (leadership lost, shutdown) while FINISHED was on its way, and it landed."""
        self.uploaded += 1
        self._metrics.segments_copied.labels(topic).inc()
        if segment.not_ready is NotReadyReason.SNAPSHOT_CORRUPT:
            self._metrics.corrupt_snapshots_tiered.labels(topic).inc()
            log.warning(
                "segment_tiered_with_corrupt_snapshot",
                base_offset=segment.base_offset,
                snapshot=None if segment.snapshot_path is None else str(segment.snapshot_path),
                error=None if segment.problem is None else str(segment.problem),
                detail="uploaded as it is, as Kafka's RLM does: an older snapshot never heals,"
                " and the segment's records would otherwise never be tiered",
            )
        self._metrics.bytes_copied.labels(topic).inc(outcome.log_bytes + outcome.index_bytes)
        self._metrics.upload_seconds.observe(outcome.seconds)
        log.info(
            "segment_tiered",
            base_offset=segment.base_offset,
            end_offset=segment.end_offset,
            segment_id=str(outcome.metadata.segment_id.id),
            bytes=outcome.log_bytes,
            seconds=round(outcome.seconds, 3),
            **({"after_cancel": True} if after_cancel else {}),
        )

    def _track_stall(self, key: _PartitionKey, segment: Segment | None) -> None:
        """Note since when the partition's plan waits for the same not-ready segment."""
        stall = self._stalls.get(key)
        if segment is None or segment.not_ready is None:
            if stall is not None:
                self._end_stall(key, stall)
            return
        problem = None if segment.problem is None else str(segment.problem)
        if stall is not None and stall.base_offset == segment.base_offset:
            if stall.reason is not segment.not_ready:  # the same wait, for another reason now
                stall.reason, stall.problem = segment.not_ready, problem
                self._publish_stalls()
            return
        if stall is not None:
            self._end_stall(key, stall)
        self._stalls[key] = _Stall(
            segment.base_offset, segment.not_ready, problem, self._settings.monotonic()
        )

    def _report_stall(self, key: _PartitionKey, stall: _Stall | None, now: float) -> str | None:
        """The partition's stall, once it has lasted ``stall_report_s``: logged (once), counted
        in the gauge, and returned as the partition's error."""
        if stall is None or now < stall.since + self._settings.stall_report_s:
            return None
        waited = now - stall.since
        if not stall.reported:
            stall.reported = True
            self._publish_stalls()
            log.warning(
                "partition_tiering_stalled",
                base_offset=stall.base_offset,
                reason=stall.reason.name.lower(),
                detail=str(stall.reason),
                error=stall.problem,
                waited_s=round(waited, 1),
                at_risk="no segment from this one on is tiered; their records are lost if"
                " the broker's local retention deletes them first",
            )
        return (
            f"stalled for {round(waited)} s: segment {stall.base_offset} is not ready:"
            f" {stall.reason}" + (f" ({stall.problem})" if stall.problem else "")
        )

    def _end_stall(self, key: _PartitionKey, stall: _Stall) -> None:
        del self._stalls[key]
        if stall.reported:
            self._publish_stalls()
            topic, partition = key
            log.info(
                "partition_tiering_stall_ended",
                topic=topic,
                partition=partition,
                base_offset=stall.base_offset,
            )

    def _drop_stalls(self, keys: Iterable[_PartitionKey]) -> None:
        """Forget the stalls of partitions this engine no longer tiers (not reported as ended)."""
        dropped = [self._stalls.pop(key) for key in keys if key in self._stalls]
        if any(stall.reported for stall in dropped):
            self._publish_stalls()

    def _publish_stalls(self) -> None:
        counts: dict[NotReadyReason, int] = dict.fromkeys(_STALL_REASONS, 0)
        for stall in self._stalls.values():
            if stall.reported:
                counts[stall.reason] = counts.get(stall.reason, 0) + 1
        for reason, count in counts.items():
            self._metrics.stalled_partitions.labels(reason.name.lower()).set(count)

    def _plan(self, scan: PartitionScan, tip: TopicIdPartition, lso: int | None) -> Plan:
        """The partition's next upload, from the FINISHED coverage of its lineage (a thread)."""
        return plan_partition(
            scan,
            lso=lso,
            highest_for_epoch=functools.partial(self._store.highest_offset_for_epoch, tip),
            quarantined=self.quarantine.segments(tip.topic_id, tip.partition),
            coverage=remote_coverage(self._store, scan, tip, lso),
        )

    async def _quarantine(
        self, tip: TopicIdPartition, segment: Segment, exc: CorruptSegmentError
    ) -> None:
        """Quarantine a segment whose bytes are corrupt (by topic id, persisted) and report it:
        its data is only local, and lost once the broker's local retention deletes it."""
        entry = QuarantineEntry(
            topic_id=tip.topic_id,
            topic=tip.topic,
            partition=tip.partition,
            base_offset=segment.base_offset,
            end_offset=segment.end_offset,
            size_bytes=segment.size,
            reason=str(exc),
            since_ms=self._settings.clock_ms(),
        )
        await asyncio.to_thread(self.quarantine.add, entry)
        self._publish_quarantine()
        self._metrics.upload_errors.labels("CorruptSegmentError").inc()
        log.error(
            "segment_quarantined",
            base_offset=segment.base_offset,
            end_offset=segment.end_offset,
            bytes=segment.size,
            error=str(exc),
            at_risk="not tiered: its only copy is local until local retention deletes it;"
            " clear with `sidecar quarantine clear`",
        )

    async def _supersede_quarantine(self, tip: TopicIdPartition, segment: Segment) -> None:
        """A segment was tiered at the base offset of a quarantined one (with another end
        offset or size: rebuilt since, a replica fetched again from the leader): the entry names
        data that no longer exists locally, so it goes, and the gauges with it."""
        try:
            removed = await asyncio.to_thread(
                self.quarantine.clear,
                topic=tip.topic,
                partition=tip.partition,
                base_offset=segment.base_offset,
                topic_id=tip.topic_id,
            )
        except OSError as exc:
            log.warning("quarantine_save_failed", path=str(self.quarantine.path), error=str(exc))
            return
        self._publish_quarantine()
        for entry in removed:
            log.info(
                "quarantine_entry_superseded",
                base_offset=entry.base_offset,
                quarantined_end_offset=entry.end_offset,
                quarantined_bytes=entry.size_bytes,
                end_offset=segment.end_offset,
                bytes=segment.size,
            )

    async def _catch_up(self, tip: TopicIdPartition) -> None:
        """Read the partition's metadata up to its current end (the previous leader's last
        events). A partition the metadata has never mentioned starts its remote log here, so
        its floor is 0: every later hole, even before its first copy, is filled."""
        await MetadataSync(
            self._tailer,
            num_partitions=self._settings.num_metadata_partitions,
            timeout_s=self._settings.catch_up_timeout_s,
        )(tip)
        if not await asyncio.to_thread(self._store.knows, tip):
            await asyncio.to_thread(self._store.raise_remote_floor, tip, 0)

    def _owned(self, metadata: SegmentMetadata) -> bool:
        return metadata.broker_id == self._uploader.broker_id

    def _own_copy(self, metadata: SegmentMetadata) -> bool:
        """A copy under this broker's id that this sidecar started: in this run, or in an
        earlier one (stamped before this run started). Another under this broker's id may be
        the broker's RLM's, copying a topic turned broker-driven that this sidecar still takes
        for standalone (until the copy call or the next config refresh)."""
        return self._owned(metadata) and (
            self._uploader.started_here(metadata.segment_id)
            or metadata.event_timestamp_ms < self._started_ms
        )

    async def _repair_own(self, tip: TopicIdPartition) -> None:
        """Crash repair of this sidecar's copies: redo STARTED copies, finish STARTED deletes.
        A STARTED copy under this broker's id that this sidecar did not start waits out the
        grace period (:meth:`_foreign_copy_pending`). A partition no longer tiered here (its
        topic turned broker-driven while its metadata was read) is repaired no further: under
        this broker's id, a STARTED copy or delete may be the broker's RLM's in flight."""
        key = (tip.topic, tip.partition)
        unfinished = await asyncio.to_thread(self._store.unfinished_copies, tip)
        ids = {m.segment_id for m in unfinished}
        # a copy started here that the topic, read up to its end, does not show STARTED
        # (a STARTED that never landed, whose cleanup failed) needs no repair
        self._uploader.forget_started(lambda i: i.topic_id_partition != tip or i in ids)
        for metadata in unfinished:
            if self._owned(metadata):
                if not self._may_upload(key):
                    return
                if not self._own_copy(metadata):
                    continue  # waits out the grace period, like another broker's
                await self._delete_unfinished(metadata, kind="unfinished_copy")
        for metadata in await asyncio.to_thread(self._store.unfinished_deletes, tip):
            if self._owned(metadata):
                if not self._may_upload(key):
                    return
                await self._finish_delete(metadata, kind="unfinished_delete")

    async def _foreign_copy_pending(self, key: _PartitionKey, tip: TopicIdPartition) -> bool:
        """Whether an unfinished copy that is not this sidecar's (another broker's, or the
        broker's own RLM's) may still be finished by its owner. Past the grace period, its
        leftovers are deleted (copies) or finished (deletes) here, while the partition is still
        tiered here (True once it is not: the worker ends)."""
        now = self._settings.monotonic()
        led_since = self._led_since.get(key, now)
        grace_s = self._settings.foreign_copy_grace_s
        grace_over = now >= led_since + grace_s
        pending = False
        unfinished = await asyncio.to_thread(self._store.unfinished_copies, tip)
        ids = {m.segment_id.id for m in unfinished}
        for gone in [i for i, w in self._waiting_for.items() if w[0] == key and i not in ids]:
            del self._waiting_for[gone]  # finished or deleted by its owner
        for metadata in unfinished:
            if self._own_copy(metadata):
                continue  # ours: repaired above, or in flight in this very worker
            seen = self._waiting_for.get(metadata.segment_id.id)
            over = grace_over
            if self._owned(metadata):
                # the broker's RLM copies under this broker's id: the grace runs from when the
                # copy was first seen, so the copy call or a config refresh can tell first
                over = now >= max(led_since, now if seen is None else seen[1]) + grace_s
            if not over:
                pending = True
                if seen is None:
                    self._waiting_for[metadata.segment_id.id] = (key, now)
                    log.info(
                        "waiting_for_foreign_copy",
                        segment_id=str(metadata.segment_id.id),
                        owner=metadata.broker_id,
                        start_offset=metadata.start_offset,
                        end_offset=metadata.end_offset,
                        grace_s=grace_s,
                        **(
                            {"detail": "under this broker's id, not started by this sidecar"}
                            if self._owned(metadata)
                            else {}
                        ),
                    )
                continue
            if not self._may_upload(key):
                return True
            await self._delete_unfinished(metadata, kind="dangling_copy")
        if grace_over:
            for metadata in await asyncio.to_thread(self._store.unfinished_deletes, tip):
                if not self._owned(metadata):
                    if not self._may_upload(key):
                        return True
                    await self._finish_delete(metadata, kind="dangling_delete")
        return pending

    async def _delete_unfinished(self, metadata: SegmentMetadata, *, kind: str) -> None:
        log.info(
            "repairing_unfinished_copy",
            kind=kind,
            owner=metadata.broker_id,
            segment_id=str(metadata.segment_id.id),
            start_offset=metadata.start_offset,
        )
        deleted = await self._uploader.delete_segment(metadata, unfinished=True)
        self._waiting_for.pop(metadata.segment_id.id, None)
        if deleted:
            self._metrics.repairs.labels(kind).inc()

    async def _finish_delete(self, metadata: SegmentMetadata, *, kind: str) -> None:
        log.info(
            "finishing_unfinished_delete",
            kind=kind,
            owner=metadata.broker_id,
            segment_id=str(metadata.segment_id.id),
        )
        await self._uploader.finish_delete(metadata, unfinished=True)
        self._metrics.repairs.labels(kind).inc()
