"""Eager upload of broker-driven segments: a segment's ``.log`` goes to S3 as soon as it is rolled
and committed, before the broker's copy pass asks for it.

For a topic with ``remote.storage.enable=true`` the broker's RLM decides when to copy, and gives
the copy its segment id only then (after its next pass, up to
``remote.log.manager.task.interval.ms`` later, longer when it lags). Until then the data is on
the broker's disk alone. The stager uploads each segment the broker will copy next (this broker
leads the partition; the segment is rolled, ready and below the LSO, and not covered by a
FINISHED copy) to a *staged* key named by its size and CRC-32C
(:meth:`~sidecar.storage.keys.KeyLayout.staged_key`). The broker's copy call
(:class:`~sidecar.tiering.brokercopy.BrokerCopier`) reads and checks the file as always,
computes the same name, and binds the staged bytes to the broker's segment id with a copy inside
the store (CopyObject: no bytes through the sidecar), then writes the indexes and manifest and
removes the staged object. A copy call that finds nothing staged uploads the ``.log`` itself.
A topic with ``remote.log.copy.disable=true`` (KIP-950) is not staged: the broker copies none of
its segments until copying is enabled again. Nothing is staged either when the broker loads
another RemoteStorageManager than this sidecar's plugin (its own configs, DescribeConfigs): that
class copies the segments, and a staged copy would never be adopted.

The two meet in a :class:`StagingLedger`, in process: a copy call claims its segment, so the
stager does not start it (or start it again before the broker's FINISHED reaches the store), and
waits for a staging upload of that segment already in flight rather than uploading the bytes a
second time.

A staged object that is never adopted (leadership moved, the topic was deleted, the broker's
copy found other bytes) is removed by the orphan scrub once it is older than the orphan grace
period; adoption by a copy call after that simply finds nothing and uploads. Staging uploads run
one at a time, so memory and S3 load stay bounded whatever the number of partitions.

The stager passes once a second and on every poke (a roll, a refresh). A pass looks at every
partition every ``full_pass_interval_s`` and on a new picture of the cluster (leaders, topic
configs, freshness); between those, at the partitions something happened to: a dir the
detector's journal names, an LSO that moved, work left over (a plan waiting for the LSO, an
upload to try again, metadata not yet read). A partition's plan is reused while its scan, LSO
and metadata version are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from sidecar._aio import in_segment_thread, wait_any
from sidecar.errors import KeyNotFoundError, SegmentVanishedError, SidecarError
from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.kafka.logdir import PartitionScan, Segment, open_segment_file
from sidecar.metadata.events import TopicIdPartition
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata.tailer import MetadataTailer
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.storage import PartChecksums
from sidecar.storage._crc import crc32c
from sidecar.storage.base import ObjectStore
from sidecar.storage.keys import KeyLayout
from sidecar.tiering.changes import ChangeWatch
from sidecar.tiering.cluster import BrokerTiering, ClusterWatcher
from sidecar.tiering.planner import Plan, plan_partition
from sidecar.tiering.workers import remote_coverage

__all__ = ["EagerStager", "SegmentIdent", "StagingLedger", "file_crc32c"]

log = get_logger(__name__)

#: (topic id, partition, base offset): a segment before the broker names it
SegmentIdent = tuple[uuid.UUID, int, int]
#: (topic id, partition)
_Partition = tuple[uuid.UUID, int]
#: how long a segment a copy call handled stays off the stager's list (the broker's FINISHED
#: reaches the store within a second or two; this only bounds the ledger's memory)
_COPIED_MEMORY_S = 600.0
_READ_BYTES = 1 << 20
#: uploads per partition and pass, before the next partition gets its turn
_PER_PASS = 4
#: partitions a pass looks at between two turns of the event loop
_YIELD_EVERY = 500


def _read_pieces(fd: int, size: int, on_read: Callable[[int, bytes], None]) -> None:
    """(thread) Hand ``on_read(position, data)`` the first ``size`` bytes of an open file, read
    1 MiB at a time; a file shorter than ``size`` is an OSError."""
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(_READ_BYTES, size - offset), offset)
        if not chunk:
            raise OSError(f"file ended at byte {offset} of {size}")
        on_read(offset, chunk)
        offset += len(chunk)


def file_crc32c(fd: int, size: int) -> int:
    """(thread) CRC-32C of the first ``size`` bytes of an open file, read 1 MiB at a time."""
    value = 0

    def add(_position: int, chunk: bytes) -> None:
        nonlocal value
        value = crc32c(chunk, value)

    _read_pieces(fd, size, add)
    return value


class StagingLedger:
    """Which segments a copy call has taken, and which staging uploads are in flight
    (event-loop side; no locks needed)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: copy calls running per segment: the broker may retry a copy (under a new segment id)
        #: while the call it gave up on is still being cancelled here
        self._claimed: dict[SegmentIdent, int] = {}
        self._copied: dict[SegmentIdent, float] = {}
        self._inflight: dict[SegmentIdent, asyncio.Event] = {}
        #: partition → base offset → staged key
        self._staged: dict[_Partition, dict[int, str]] = {}

    def claim(self, ident: SegmentIdent) -> None:
        """A copy call has begun: no staging upload of this segment starts from now on."""
        self._claimed[ident] = self._claimed.get(ident, 0) + 1

    def release(self, ident: SegmentIdent, *, copied: bool) -> None:
        """The copy call ended; a copied segment stays off the stager's list until the store
        covers it (or for a bounded time), a failed one may be staged again once no other
        copy call of it runs."""
        running = self._claimed.pop(ident, 0) - 1
        if running > 0:
            self._claimed[ident] = running
        if copied:
            self._copied.pop(ident, None)  # (re)inserted last: the dict stays in time order
            self._copied[ident] = self._clock()
            self._unstage(ident)
        # here too, not only in the stager's full pass: a stager that is paused (S3 or Kafka
        # down as it sees them) or finds no broker-driven topic never gets there, and the
        # broker's copies go on
        self.prune()

    def note_staged(self, ident: SegmentIdent, key: str) -> None:
        """The segment's ``.log`` is in the bucket under ``key``."""
        self._staged.setdefault(ident[:2], {})[ident[2]] = key

    def staged_key(self, ident: SegmentIdent) -> str | None:
        """Where the segment was staged, if it was (a copy call then tries to adopt it)."""
        return self._staged.get(ident[:2], {}).get(ident[2])

    def forget_except(self, pending: set[SegmentIdent], planned: set[_Partition]) -> None:
        """Segments of a ``planned`` partition that left its plan (covered now) are no longer
        staged as far as a copy call is concerned. Partitions a pass skipped (a stale view,
        metadata not yet read) keep theirs: their staged objects are still good, and
        forgetting them would read every such ``.log`` again to name its staged key."""
        for where in planned:
            staged = self._staged.get(where)
            if staged is None:
                continue
            for base in [b for b in staged if (*where, b) not in pending]:
                del staged[base]
            if not staged:
                del self._staged[where]

    def forget_partitions_except(self, present: set[_Partition]) -> None:
        """Forget the staged segments of partitions no longer in this broker's log dirs."""
        for where in [w for w in self._staged if w not in present]:
            del self._staged[where]

    def _unstage(self, ident: SegmentIdent) -> None:
        staged = self._staged.get(ident[:2])
        if staged is not None:
            staged.pop(ident[2], None)
            if not staged:
                del self._staged[ident[:2]]

    def taken(self, ident: SegmentIdent) -> bool:
        """Whether a copy call has this segment (running, or done recently)."""
        if ident in self._claimed:
            return True
        at = self._copied.get(ident)
        return at is not None and self._clock() - at <= _COPIED_MEMORY_S

    def prune(self) -> None:
        """Drop the copied segments older than the ledger's memory of them (the oldest come
        first: only those are looked at)."""
        now = self._clock()
        while self._copied:
            oldest, at = next(iter(self._copied.items()))
            if now - at <= _COPIED_MEMORY_S:
                break
            del self._copied[oldest]

    def begin(self, ident: SegmentIdent) -> None:
        self._inflight[ident] = asyncio.Event()

    def end(self, ident: SegmentIdent) -> None:
        event = self._inflight.pop(ident, None)
        if event is not None:
            event.set()

    async def settled(self, ident: SegmentIdent) -> None:
        """Wait for a staging upload of this segment that is in flight, if any."""
        event = self._inflight.get(ident)
        if event is not None:
            await event.wait()


class EagerStager:
    """Uploads broker-driven segments of partitions this broker leads on roll (module doc)."""

    def __init__(
        self,
        *,
        objects: ObjectStore,
        layout: KeyLayout,
        views: Callable[[], Mapping[Path, PartitionScan]],
        cluster: ClusterWatcher,
        store: RemoteSegmentStore,
        tailer: MetadataTailer,
        ledger: StagingLedger,
        metrics: Metrics,
        num_metadata_partitions: int,
        part_size: int,
        concurrency: int,
        wake_interval_s: float = 1.0,
        full_pass_interval_s: float = 30.0,
        ready: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._objects = objects
        self._layout = layout
        self._views = views
        self._cluster = cluster
        self._store = store
        self._tailer = tailer
        self._ledger = ledger
        self._metrics = metrics
        self._num_partitions = num_metadata_partitions
        self._part_size = part_size
        self._concurrency = concurrency
        self._wake_interval_s = wake_interval_s
        self._full_pass_interval_s = full_pass_interval_s
        self._ready = ready
        self._monotonic = monotonic
        self._wake = asyncio.Event()
        #: when the next pass walks every partition dir, whatever changed
        self._next_full = 0.0
        #: the log dirs' and the cluster view's changes since the last pass
        self._changes = ChangeWatch()
        #: the broker-driven topics the last pass saw
        self._seen_driven: set[str] = set()
        #: partition dirs the next pass looks at (work left over, an LSO that moved)
        self._dirty: set[Path] = set()
        #: (topic, partition) → its dir, for an LSO that moved
        self._paths: dict[tuple[str, int], Path] = {}
        #: a failed staging upload is not tried again before this time
        self._retry_at: dict[SegmentIdent, float] = {}
        #: the broker's tiering configs last warned about (once per value)
        self._warned_rsm: BrokerTiering | None = None
        #: partition → (scan, LSO, store version, candidates) of its last plan, reused while
        #: none of the three changes: a pass a second over every led partition plans only
        #: those where something happened
        self._plans: dict[TopicIdPartition, tuple[PartitionScan, int, int, tuple[Segment, ...]]]
        self._plans = {}
        #: (topic id as in the dir, topic, partition) → the partition and its metadata
        #: partition, worked out once
        self._tips: dict[tuple[str, str, int], tuple[TopicIdPartition, int]] = {}

    def poke(self) -> None:
        """A hint (a roll, a cluster refresh): look again now."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task. On stop, a staging upload in flight is cancelled at once (it aborts its
        multipart upload): the broker's copy call uploads what was not staged."""
        while not stopping.is_set():
            self._wake.clear()
            if self._ready():
                work = asyncio.ensure_future(self._pass_logged(stopping))
                stop = asyncio.ensure_future(stopping.wait())
                try:
                    await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                    if not work.done():
                        work.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await work
            await wait_any(stopping, self._wake, within=self._wake_interval_s)

    async def _pass_logged(self, stopping: asyncio.Event) -> None:
        try:
            await self._pass(stopping)
        except SidecarError as exc:  # a store query or a refresh failed: next pass
            log.warning("eager_pass_failed", error=str(exc), error_type=type(exc).__name__)

    async def _pass(self, stopping: asyncio.Event) -> None:
        pending: set[SegmentIdent] = set()
        planned: set[_Partition] = set()
        present: set[_Partition] = set()
        configs = self._cluster.view.configs
        # a topic with remote.log.copy.disable=true is never copied again: what was staged for
        # it would only wait for the orphan scrub
        driven = {topic for topic in configs if self._cluster.broker_copies(topic)}
        if driven and self._cluster.broker_runs_plugin is False:
            # the broker copies through another RemoteStorageManager: nothing staged here
            # would ever be adopted
            self._warn_other_rsm(len(driven))
            driven = set()
        # no topic is broker-driven (or none of this broker's): nothing to walk, every second,
        # over every partition dir
        if not driven:
            # no partition dir is walked, every second (ten thousand on a large broker); what
            # was staged stays known, in case the topics come back (a pass over all, then)
            self._seen_driven = driven
            return
        views = self._views()
        changed = self._changes.changed_paths(views)
        now = self._monotonic()
        view = self._cluster.view
        full, lso_moved = self._changes.view_changes(view, view.fresh)
        # a partition whose LSO moved (one looked up by a pass) is looked at again
        self._dirty.update(p for key in lso_moved if (p := self._paths.get(key)) is not None)
        full = full or driven != self._seen_driven
        self._seen_driven = driven
        if full or now >= self._next_full:
            # leaders, configs or freshness changed, or it is time: every partition
            full = True
            self._next_full = now + self._full_pass_interval_s
            self._dirty.clear()
            visits = list(views.items())
        else:
            # only what something happened to: a roll, an LSO that moved, work left over
            targets, self._dirty = changed | self._dirty, set()
            visits = [(path, views[path]) for path in targets if path in views]
        looked = 0
        try:
            for looked, (path, scan) in enumerate(visits):
                if stopping.is_set():
                    return
                if looked % _YIELD_EVERY == _YIELD_EVERY - 1:
                    await asyncio.sleep(0)  # a pass over ten thousand partitions takes ~0.1 s
                if scan.topic_id is None:
                    continue
                tip, meta_partition = self._tip(scan.topic_id, scan.topic, scan.partition)
                present.add((tip.topic_id, tip.partition))
                self._paths[(scan.topic, scan.partition)] = path
                if scan.topic not in driven:
                    continue
                if not self._cluster.view.may_upload(scan.topic, scan.partition):
                    continue  # a new leader or a fresh view again makes a pass over all
                if not self._tailer.wants(tip) or not self._tailer.caught_up(meta_partition):
                    self._dirty.add(path)
                    continue  # its metadata is not (fully) read yet: the engine asks for it
                uploaded = 0
                candidates, settled = await self._candidates(scan, tip)
                planned.add((tip.topic_id, tip.partition))
                if not settled:
                    self._dirty.add(path)  # waiting for the LSO: look again
                for segment in candidates:
                    ident = (tip.topic_id, tip.partition, segment.base_offset)
                    pending.add(ident)
                    if stopping.is_set():
                        return
                    if uploaded < _PER_PASS and await self._stage(tip, segment, ident):
                        uploaded += 1
                    if self._ledger.staged_key(ident) is None and not self._ledger.taken(ident):
                        self._dirty.add(path)  # not staged yet (a retry later, the pass's limit)
        except BaseException:
            # a store query or a refresh failed (or the stop): what was not looked at waits
            # for the next pass
            self._dirty.update(path for path, _ in visits[looked:])
            if full:
                self._next_full = 0.0
            raise
        # what left a planned partition's plan was adopted (covered now); a partition skipped
        # in this pass keeps what it had
        self._ledger.forget_except(pending, planned)
        if not full:
            return
        # one gone from the log dirs is forgotten
        self._ledger.forget_partitions_except(present)
        for ident in [
            i
            for i in self._retry_at
            if (i[:2] in planned and i not in pending) or i[:2] not in present
        ]:
            del self._retry_at[ident]
        for tip in [t for t in self._plans if (t.topic_id, t.partition) not in present]:
            del self._plans[tip]
        for key in [
            k for k, (t, _) in self._tips.items() if (t.topic_id, t.partition) not in present
        ]:
            del self._tips[key]
        self._paths = {k: p for k, p in self._paths.items() if p in views}
        self._ledger.prune()

    def _tip(self, topic_id: str, topic: str, partition: int) -> tuple[TopicIdPartition, int]:
        key = (topic_id, topic, partition)
        known = self._tips.get(key)
        if known is None:
            tip = TopicIdPartition(decode_kafka_uuid(topic_id), topic, partition)
            known = self._tips[key] = (tip, metadata_partition(tip, self._num_partitions))
        return known

    def _warn_other_rsm(self, topics: int) -> None:
        tiering = self._cluster.view.broker_tiering
        if tiering is None or tiering == self._warned_rsm:
            return
        self._warned_rsm = tiering
        log.warning(
            "broker_not_using_plugin",
            broker_id=self._cluster.view.broker_id,
            remote_storage_system_enable=tiering.system_enable,
            rsm_class=tiering.rsm_class,
            broker_driven_topics=topics,
            detail="the broker does not tier through this sidecar's plugin, so its"
            " broker-driven topics are not uploaded ahead; if it should, add the properties"
            " `sidecar broker-config` prints to its server.properties and restart it",
        )

    async def _candidates(
        self, scan: PartitionScan, tip: TopicIdPartition
    ) -> tuple[tuple[Segment, ...], bool]:
        """The segments the broker copies next, as the standalone engine would plan them, and
        whether that plan holds until the scan, the LSO or the partition's metadata changes
        (it is then reused until one does); a plan that waits for the LSO does not."""
        lso = self._cluster.view.lso(scan.topic, scan.partition)
        if lso is None:
            # the periodic refresh asks for the LSOs of standalone partitions only
            lso = await self._cluster.fetch_lso(scan.topic, scan.partition)
            if lso is None:
                return (), False
        version = self._store.partition_version(tip)  # before planning: a change re-plans
        cached = self._plans.get(tip)
        if cached is not None and cached[0] is scan and cached[1:3] == (lso, version):
            return cached[3], True
        plan = await asyncio.to_thread(self._plan, scan, tip, lso)
        if not plan.uploads and plan.waiting_for_lso:
            # not kept: the next pass asks for the LSO again (nothing else refreshes it)
            fresh = await self._cluster.fetch_lso(scan.topic, scan.partition)
            if fresh is not None and fresh != lso:
                plan = await asyncio.to_thread(self._plan, scan, tip, fresh)
            return plan.uploads, False
        self._plans[tip] = (scan, lso, version, plan.uploads)
        return plan.uploads, True

    def _plan(self, scan: PartitionScan, tip: TopicIdPartition, lso: int | None) -> Plan:
        return plan_partition(
            scan,
            lso=lso,
            highest_for_epoch=functools.partial(self._store.highest_offset_for_epoch, tip),
            coverage=remote_coverage(self._store, scan, tip, lso),
            # every candidate: those staged already stay in the plan until the broker copies
            limit=len(scan.segments),
        )

    async def _stage(self, tip: TopicIdPartition, segment: Segment, ident: SegmentIdent) -> bool:
        """Stage one segment; whether an upload was made (or tried)."""
        if self._ledger.staged_key(ident) is not None or self._ledger.taken(ident):
            return False
        if time.monotonic() < self._retry_at.get(ident, 0.0):
            return False
        self._ledger.begin(ident)
        started = time.monotonic()
        try:
            fingerprint = await in_segment_thread(_fingerprint, segment.log_path, self._part_size)
            if fingerprint is None:
                return False  # deleted meanwhile: nothing to stage
            size, crc, mtime_ns, part_crcs = fingerprint
            key = self._layout.staged_key(
                topic=tip.topic,
                topic_id=tip.topic_id,
                partition=tip.partition,
                base_offset=segment.base_offset,
                size=size,
                crc32c=crc,
            )
            try:
                await self._objects.head(key)
                found = True  # staged before a restart
            except KeyNotFoundError:
                found = False
            if not found:
                info = await self._objects.put_file(
                    key,
                    segment.log_path,
                    part_size=self._part_size,
                    concurrency=self._concurrency,
                    part_crcs=part_crcs,
                )
                after = await asyncio.to_thread(_stat, segment.log_path)
                if (
                    info.size != size
                    or (info.crc32c is not None and info.crc32c != crc)
                    or after != (size, mtime_ns)
                ):
                    # the file changed under the upload: these bytes are not the segment's
                    await self._objects.delete([key])
                    return True
                self._metrics.eager_uploads.labels("staged").inc()
        except (SidecarError, OSError) as exc:
            # the copy call uploads it instead; try again after a while
            self._retry_at[ident] = time.monotonic() + 30.0
            self._metrics.eager_uploads.labels("failed").inc()
            log.warning(
                "segment_staging_failed",
                topic=tip.topic,
                partition=tip.partition,
                base_offset=segment.base_offset,
                error=str(exc),
                error_type=type(exc).__name__,
            )
            return True
        else:
            self._ledger.note_staged(ident, key)
            log.debug(
                "segment_staged",
                topic=tip.topic,
                partition=tip.partition,
                base_offset=segment.base_offset,
                bytes=size,
                already=found,
                seconds=round(time.monotonic() - started, 3),
            )
            return True
        finally:
            self._ledger.end(ident)


def _fingerprint(path: Path, part_size: int) -> tuple[int, int, int, tuple[int, ...] | None] | None:
    """(thread) Size, CRC-32C and mtime of a segment's ``.log``, and the CRC-32C of each part
    ``put_file`` cuts it into for ``part_size`` (from the same read, so the upload does not read
    the file again to compute them); None when it is gone."""
    try:
        handle, _ = open_segment_file(path)
    except SegmentVanishedError:
        return None
    with handle:
        stat = os.fstat(handle.fileno())
        parts = PartChecksums(stat.st_size, part_size)
        _read_pieces(handle.fileno(), stat.st_size, parts.feed)
        crc = parts.whole()  # one CRC pass: the whole file's from its parts'
        if crc is None:  # every byte was fed: cannot happen
            raise OSError(f"{path}: not every byte of the file was read")
        after = os.fstat(handle.fileno())
        if (after.st_size, after.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            return None  # still being written: not a rolled segment after all
        return stat.st_size, crc, stat.st_mtime_ns, parts.result()


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns
