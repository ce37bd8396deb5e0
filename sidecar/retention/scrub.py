"""Orphan scrub: objects that no metadata references, and incomplete multipart uploads.

The scrub runs only on a prefix whose ownership marker (:mod:`sidecar.storage.ownership`)
names this cluster and metadata topic; a missing, unreadable or foreign marker refuses it
whole (:class:`UnsafeScrubError`, dry runs included), before anything is listed.

One walk of the bucket under the sidecar's prefix (ListObjectsV2, 1000 keys a page) is compared
with the metadata store:

* a key that parses as a segment object (:class:`~sidecar.storage.keys.KeyLayout`) whose segment
  id the store does not hold in any live state is an **orphan**; it is deleted once its
  ``LastModified`` is older than ``object_grace_s``, never before (a copy's objects appear right
  after its COPY_SEGMENT_STARTED, which another broker's store may not have read yet). The
  candidates are checked against a second snapshot of the store just before deletion;
* a copy left at COPY_SEGMENT_STARTED whose offsets COPY_SEGMENT_FINISHED segments of its
  partition hold is **superseded**, and counts as unreferenced: its copier gave up on it and
  copied those offsets again under another segment id (Kafka's RLM does so after a retriable
  copy failure, keeping the STARTED record and never deleting its objects), so nobody will
  finish it or read it. The same grace period applies to its objects;
* a key whose partition's metadata this store has not fully read (``in_scope`` says no) is
  left alone, whatever it looks like;
* keys that are not the sidecar's (they do not parse) are counted as ``foreign``, never deleted;
* keys that are not this cluster's are counted as ``not_ours``, never deleted: those under a
  nested prefix that holds an ownership marker of its own (another cluster below our prefix,
  e.g. ours is the bucket root), and those of a partition (topic id, partition) that this
  cluster's metadata never mentioned (a segment's objects are written only after its
  COPY_SEGMENT_STARTED, so every object of ours is of a partition the store knows). A
  partition the store dropped because it was deleted (DELETE_PARTITION_FINISHED, or forgotten
  after its topic's deletion) stays known for 30 days
  (:meth:`RemoteSegmentStore.deleted_partitions`): objects a copy wrote after the deletion
  are orphans of ours, deleted after the grace period;
* an incomplete multipart upload older than ``upload_grace_s`` is aborted if its key is one of
  this cluster's segment keys (by the same rules), unless its segment is a copy in flight
  (COPY_SEGMENT_STARTED);
* a staged segment (``<prefix>staging/``, :mod:`sidecar.tiering.eager`) is never referenced by
  metadata: the broker's copy call copies it to the segment's key and removes it. One older
  than ``object_grace_s`` was never adopted (leadership moved, the topic is gone) and is
  deleted as an orphan; an incomplete multipart upload of one is aborted after
  ``upload_grace_s``. A copy call that comes later finds nothing staged and uploads itself.

``dry_run`` reports the same decisions without deleting. Deletes go out 1000 keys a request,
a few requests at a time. The store is read in a worker thread.

The scrub trusts that the metadata topic keeps every record: were an old COPY_SEGMENT_FINISHED
record deleted by the topic's retention, its (live) segment's objects would look unreferenced.
A store that found records deleted before it first read them (a former retention.ms, a
DeleteRecords) says so (:meth:`RemoteSegmentStore.history_gaps`) and the scrub is refused.
The caller checks the topic's ``retention.ms`` and ``retention.bytes`` (DescribeConfigs; both
must be -1) and ``cleanup.policy`` (no compaction), :func:`metadata_retention_problem`, and
passes what is wrong as ``unsafe``. The refusal then covers every decision that reads the
metadata: those orphans and uploads are reported as ``withheld`` (``refused`` says why) and
left alone. Staged segments and their uploads are still removed past their grace periods: they
are judged by their key and age only, and the broker's file stays on its disk until a copy call
finishes, so removing one never loses data whatever the metadata lacks.
"""

from __future__ import annotations

import asyncio
import bisect
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sidecar.errors import SidecarError
from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata, TopicIdPartition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.logging import get_logger
from sidecar.storage.base import DELETE_BATCH_SIZE, MultipartUpload, ObjectStore
from sidecar.storage.keys import KeyLayout, ParsedKey
from sidecar.storage.ownership import (
    PrefixOwner,
    is_marker_key,
    marker_key,
    marker_prefix,
    ownership_problem,
)

if TYPE_CHECKING:
    from sidecar.tiering.cluster import TopicConfig

__all__ = ["OrphanScrubber", "ScrubReport", "UnsafeScrubError", "metadata_retention_problem"]

log = get_logger(__name__)


class UnsafeScrubError(SidecarError):
    """Deleting anything is unsafe: the prefix's ownership marker is missing or another
    cluster's. (A metadata topic that may have lost records withholds only what the metadata
    decides: :attr:`ScrubReport.refused`.)"""


def metadata_retention_problem(topic: str, config: TopicConfig | None) -> str | None:
    """Why the metadata topic cannot be trusted to hold every record, or None when it can
    (``retention.ms`` and ``retention.bytes`` both -1, per DescribeConfigs)."""
    if config is None:
        return f"the configs of the metadata topic {topic!r} are unknown (DescribeConfigs)"
    if config.compacted:
        # Kafka's log cleaner drops records without a key, and no metadata record has one
        return (
            f"the metadata topic {topic!r} has cleanup.policy={config.cleanup_policy}: the log"
            " cleaner drops its records (they have no key); set cleanup.policy=delete with"
            " retention.ms and retention.bytes -1 to allow the scrub to delete"
        )
    wrong = [
        f"{name}={value}"
        for name, value in (
            ("retention.ms", config.retention_ms),
            ("retention.bytes", config.retention_bytes),
        )
        if value != -1
    ]
    if not wrong:
        return None
    return (
        f"the metadata topic {topic!r} has {', '.join(wrong)}: it may have dropped records that"
        " reference live objects; set both to -1 to allow the scrub to delete"
    )


_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_MAX_OFFSET = 2**63 - 1


@dataclass
class ScrubReport:
    """What one scrub found and did (or, with ``dry_run``, would do)."""

    dry_run: bool
    objects_listed: int = 0
    referenced: int = 0
    #: orphans older than the grace period: deleted (or to delete, in a dry run)
    orphans: list[str] = field(default_factory=list)
    #: orphans younger than the grace period, left for a later scrub
    young_orphans: int = 0
    #: staged segments younger than the grace period (the broker's copy may still adopt them)
    staged: int = 0
    #: keys of partitions whose metadata this store has not fully read
    out_of_scope: int = 0
    #: keys that are not segment objects of this layout
    foreign: int = 0
    #: segment-shaped keys of another cluster (nested marker, or a partition never in our
    #: metadata)
    not_ours: int = 0
    uploads_listed: int = 0
    #: (key, upload id) of incomplete multipart uploads aborted (or to abort)
    aborted_uploads: list[tuple[str, str]] = field(default_factory=list)
    young_uploads: int = 0
    #: uploads of copies in flight
    uploads_in_flight: int = 0
    seconds: float = 0.0
    #: the daemon stopped during the listing: nothing was deleted or aborted
    stopped: bool = False
    #: why deleting what the metadata decides is refused (the metadata topic may have lost
    #: records), None when it is not; staged segments are scrubbed all the same
    refused: str | None = None
    #: orphans by the store's view that the refusal keeps (they may be live segments' objects)
    withheld: list[str] = field(default_factory=list)
    #: (key, upload id) of incomplete multipart uploads the refusal keeps
    withheld_uploads: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready summary (keys included)."""
        return {
            "dry_run": self.dry_run,
            "objects_listed": self.objects_listed,
            "referenced": self.referenced,
            "orphans": len(self.orphans),
            "orphan_keys": self.orphans,
            "young_orphans": self.young_orphans,
            "staged": self.staged,
            "out_of_scope": self.out_of_scope,
            "foreign": self.foreign,
            "not_ours": self.not_ours,
            "uploads_listed": self.uploads_listed,
            "aborted_uploads": [{"key": k, "upload_id": u} for k, u in self.aborted_uploads],
            "young_uploads": self.young_uploads,
            "uploads_in_flight": self.uploads_in_flight,
            "seconds": round(self.seconds, 3),
            "refused": self.refused,
            "withheld": len(self.withheld),
            "withheld_keys": self.withheld,
            "withheld_uploads": [{"key": k, "upload_id": u} for k, u in self.withheld_uploads],
        }


def _live_segments(store: RemoteSegmentStore) -> dict[int, RemoteLogSegmentState]:
    """Segment id (its 128-bit integer: at a million segments 82 against 135 MiB with ``UUID``
    keys, ``tests/bench/bench_scrub_memory.py``) → state of every live segment of every
    partition, except copies that a later copy superseded (worker thread)."""
    live: dict[int, RemoteLogSegmentState] = {}
    for tp in store.partitions():
        segments = store.segments(tp)
        covered = _finished_ranges(segments)
        for segment in segments:
            if segment.state is _STARTED and _within(
                covered, segment.start_offset, segment.end_offset
            ):
                continue  # superseded
            live[segment.segment_id.id.int] = segment.state
    return live


def _finished_ranges(segments: Iterable[SegmentMetadata]) -> list[tuple[int, int]]:
    """The offsets that COPY_SEGMENT_FINISHED segments hold, as merged inclusive ranges."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(
        (s.start_offset, s.end_offset) for s in segments if s.state is _FINISHED
    ):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _within(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end] lies inside one of the merged ``ranges``."""
    at = bisect.bisect_right(ranges, (start, _MAX_OFFSET)) - 1
    return at >= 0 and ranges[at][0] <= start and end <= ranges[at][1]


def _older(when: datetime | None, now: datetime, grace_s: float) -> bool:
    """Whether an object or upload is past its grace period (an unknown time never is)."""
    return when is not None and (now - when).total_seconds() >= grace_s


def _known_partitions(store: RemoteSegmentStore) -> set[tuple[uuid.UUID, int]]:
    """(topic id, partition) of every partition the metadata mentions, and of those the store
    dropped lately because they were deleted (worker thread)."""
    return {(tp.topic_id, tp.partition) for tp in store.partitions()} | store.deleted_partitions()


class OrphanScrubber:
    """Compares the bucket with the metadata store and removes what nothing references."""

    def __init__(
        self,
        *,
        objects: ObjectStore,
        store: RemoteSegmentStore,
        layout: KeyLayout,
        owner: PrefixOwner | Callable[[], PrefixOwner | None],
        object_grace_s: float,
        upload_grace_s: float,
        in_scope: Callable[[TopicIdPartition], bool] = lambda tp: True,
        delete_concurrency: int = 4,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._objects = objects
        self._store = store
        self._layout = layout
        self._owner = owner
        self._object_grace_s = object_grace_s
        self._upload_grace_s = upload_grace_s
        self._in_scope = in_scope
        self._concurrency = delete_concurrency
        self._now = now

    async def scrub(
        self,
        *,
        dry_run: bool = False,
        unsafe: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> ScrubReport:
        """One full scrub of the layout's prefix. ``unsafe``: why the metadata topic cannot be
        trusted (:func:`metadata_retention_problem`; the store's own history gaps count too,
        :meth:`RemoteSegmentStore.history_gaps`); the scrub then removes only staged segments
        (and their uploads) past their grace periods, and reports the rest as withheld with
        ``refused`` set, dry run or not. A prefix whose ownership marker is not ours raises
        :class:`UnsafeScrubError`, dry run or not, before anything is listed.
        ``stop`` set during the listing (a listing of a million keys takes minutes) ends the
        scrub there, with nothing deleted: the report says ``stopped``."""
        prefix = self._layout.prefix
        owner = self._owner if isinstance(self._owner, PrefixOwner) else self._owner()
        if owner is None:
            log.warning("scrub_refused", dry_run=dry_run, reason="prefix ownership not confirmed")
            raise UnsafeScrubError(
                "orphan scrub refused: this sidecar has not confirmed yet that it owns the prefix"
            )
        foreign_owner = await ownership_problem(
            self._objects,
            prefix,
            cluster_id=owner.cluster_id,
            metadata_topic=owner.metadata_topic,
        )
        if foreign_owner is not None:
            log.error("scrub_refused", dry_run=dry_run, reason=foreign_owner)
            raise UnsafeScrubError(f"orphan scrub refused: {foreign_owner}")
        gaps = await asyncio.to_thread(self._store.history_gaps)
        if gaps and unsafe is None:
            shown = ", ".join(f"{p} from offset {o}" for p, o in sorted(gaps.items())[:10])
            unsafe = (
                f"the metadata topic deleted records before this store read them (partitions"
                f" {shown}): live segments' events may be missing from it, so their objects"
                " would look unreferenced; the scrub cannot be trusted with this topic"
            )
        if unsafe is not None:
            # staged segments do not depend on the metadata: the scrub goes on for them
            log.error("scrub_refused", dry_run=dry_run, reason=unsafe, staged_only=True)
        started = time.monotonic()
        report = ScrubReport(dry_run=dry_run, refused=unsafe)
        now = self._now()
        live = await asyncio.to_thread(_live_segments, self._store)
        known = await asyncio.to_thread(_known_partitions, self._store)
        own_marker = marker_key(prefix)
        #: nested prefixes with a marker of their own: another cluster's
        others: list[str] = []
        scope: dict[tuple[uuid.UUID, str, int], bool] = {}
        candidates: list[tuple[str, uuid.UUID]] = []
        staged_orphans: list[str] = []
        async for info in self._objects.list(prefix):
            if stop is not None and stop.is_set():
                report.stopped = True
                break
            report.objects_listed += 1
            if is_marker_key(info.key):
                if info.key != own_marker:
                    others.append(marker_prefix(info.key))
                report.foreign += 1
                continue
            if self._layout.parse_staged(info.key) is not None:
                if not _older(info.last_modified, now, self._object_grace_s):
                    report.staged += 1
                else:
                    staged_orphans.append(info.key)
                continue
            parsed = self._layout.parse(info.key)
            if parsed is None:
                report.foreign += 1
                continue
            if parsed.segment_id.int in live:
                report.referenced += 1
                continue
            if not self._ours(parsed, known):
                report.not_ours += 1
                continue
            where = (parsed.topic_id, parsed.topic, parsed.partition)
            ok = scope.get(where)
            if ok is None:
                ok = scope[where] = self._in_scope(
                    TopicIdPartition(parsed.topic_id, parsed.topic, parsed.partition)
                )
            if not ok:
                report.out_of_scope += 1
                continue
            if not _older(info.last_modified, now, self._object_grace_s):
                report.young_orphans += 1
                continue
            candidates.append((info.key, parsed.segment_id))
        if report.stopped:
            report.seconds = time.monotonic() - started
            log.info("scrub_stopped", dry_run=dry_run, objects=report.objects_listed)
            return report
        if others:
            # listed in key order, a nested marker may come after the keys it owns
            kept = [c for c in candidates if not c[0].startswith(tuple(others))]
            report.not_ours += len(candidates) - len(kept)
            candidates = kept
            kept_staged = [k for k in staged_orphans if not k.startswith(tuple(others))]
            report.not_ours += len(staged_orphans) - len(kept_staged)
            staged_orphans = kept_staged
            log.info("scrub_skips_other_owners", prefixes=sorted(others)[:20])
        report.orphans.extend(staged_orphans)
        if unsafe is not None:
            report.withheld = [key for key, _segment_id in candidates]
        elif candidates:
            # a copy may have started while we listed: look at the store once more (the
            # first look dropped first: never both in memory)
            live.clear()
            live = await asyncio.to_thread(_live_segments, self._store)
            for key, segment_id in candidates:
                if segment_id.int in live:
                    report.referenced += 1
                else:
                    report.orphans.append(key)
        uploads = [u async for u in self._objects.list_multipart_uploads(self._layout.prefix)]
        report.uploads_listed = len(uploads)
        doomed: list[MultipartUpload] = []
        for upload in uploads:
            old_enough = _older(upload.initiated, now, self._upload_grace_s)
            if self._layout.parse_staged(upload.key) is not None and not upload.key.startswith(
                tuple(others)
            ):
                if old_enough:
                    doomed.append(upload)
                else:
                    report.young_uploads += 1
                continue
            parsed = self._layout.parse(upload.key)
            if (
                parsed is None
                or not self._ours(parsed, known)
                or upload.key.startswith(tuple(others))
            ):
                report.not_ours += 1
                continue
            if live.get(parsed.segment_id.int) is _STARTED:
                report.uploads_in_flight += 1
                continue
            if not old_enough:
                report.young_uploads += 1
                continue
            if unsafe is not None:
                report.withheld_uploads.append((upload.key, upload.upload_id))
                continue
            doomed.append(upload)
        report.aborted_uploads = [(u.key, u.upload_id) for u in doomed]
        if not dry_run:
            await self._delete(report.orphans)
            for upload in doomed:
                await self._objects.abort_multipart_upload(upload.key, upload.upload_id)
        report.seconds = time.monotonic() - started
        log.info(
            "scrub_finished",
            dry_run=dry_run,
            objects=report.objects_listed,
            referenced=report.referenced,
            orphans=len(report.orphans),
            young_orphans=report.young_orphans,
            staged=report.staged,
            out_of_scope=report.out_of_scope,
            foreign=report.foreign,
            not_ours=report.not_ours,
            uploads=report.uploads_listed,
            aborted_uploads=len(report.aborted_uploads),
            young_uploads=report.young_uploads,
            withheld=len(report.withheld),
            withheld_uploads=len(report.withheld_uploads),
            refused=unsafe is not None,
            seconds=round(report.seconds, 3),
        )
        return report

    @staticmethod
    def _ours(parsed: ParsedKey, known: set[tuple[uuid.UUID, int]]) -> bool:
        """Whether a segment key is of a partition this cluster's metadata mentions."""
        return (parsed.topic_id, parsed.partition) in known

    async def _delete(self, keys: list[str]) -> None:
        if not keys:
            return
        slots = asyncio.Semaphore(self._concurrency)

        async def one(batch: list[str]) -> None:
            async with slots:
                await self._objects.delete(batch)

        # gather, not a TaskGroup: the first StorageError reaches the caller as itself
        await asyncio.gather(
            *(one(keys[i : i + DELETE_BATCH_SIZE]) for i in range(0, len(keys), DELETE_BATCH_SIZE))
        )
