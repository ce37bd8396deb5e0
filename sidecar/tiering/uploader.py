"""One segment, start to finish, in commit order:

    COPY_SEGMENT_STARTED (read back) → .log (multipart) → indexes → manifest
    → COPY_SEGMENT_FINISHED (read back)

Before anything is published, the segment's files are opened once and kept open: the broker may
rename them to ``.deleted`` and remove them while we upload, and an open descriptor keeps reading
the same bytes (``/proc/self/fd``). Every record batch's CRC-32C is checked first; a corrupt
segment raises :class:`CorruptSegmentError` and is never uploaded. The ``.log`` is checked again
after the upload (size and mtime unchanged), and every object carries a CRC-32C the store
verifies, so FINISHED is published only for bytes that match the broker's files (invariant 1).
The ``.log`` is closed as soon as its bytes are sent (or the upload failed), before FINISHED and
before any cleanup: the space of a file the broker deleted is freed only when it is closed.

A failure after STARTED and *before FINISHED may have been sent* deletes what was written, the
way Kafka's RLM does (DELETE_SEGMENT_STARTED → delete the objects → DELETE_SEGMENT_FINISHED),
best effort: what a crash leaves behind is repaired at the next start (the engine's crash
repair). A cancellation there (shutdown past the drain deadline, or leadership moved) takes the
same path: the multipart upload is aborted, then the copy is deleted.

Once FINISHED may have been sent, the copy is never abandoned: whatever fails (the producer, the
read-back, a cancellation), the state on the metadata topic decides. The uploader reads the topic
up to its end (``sync``) and looks at the copy: FINISHED means done; still STARTED means FINISHED
did not land, so it is sent again (a few times, then the copy is left STARTED for crash repair,
which re-checks the state too). A cancellation lets that settle first, unless cancelled again.

Leadership is checked (``may_continue``) before STARTED and again before FINISHED: a sidecar
whose broker lost the partition never finishes a copy, so the new leader's copy is the only one.
If another broker deleted the copy as dangling before our FINISHED landed (its
DELETE_SEGMENT_STARTED won), our FINISHED was dropped and the objects we wrote are deleted with
:class:`SegmentCopyPreemptedError`; the planner sees the range uncovered and uploads it again.

The uploader remembers the copies it published COPY_SEGMENT_STARTED for (``started_here``) until
the topic shows them past STARTED (FINISHED, being deleted, gone): the engine's crash repair
deletes at once only such a copy, or one of an earlier run, since a STARTED copy under this
broker's id may also be the broker's own RLM copying a topic just turned broker-driven.

Every delete of a copy re-checks the copy's current state on the topic first (after ``sync``): a
delete of an unfinished copy is skipped when the copy turned out FINISHED, and a delete of a
finished copy when it is already being deleted. That narrows the race with a FINISHED in flight
to the time between the check and the DELETE_SEGMENT_STARTED; the planner, which plans from the
FINISHED coverage of the lineage, fills whatever hole such a race still leaves.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sidecar import __version__
from sidecar._aio import SEGMENT_READ_THREADS, acquire_in_thread
from sidecar.errors import (
    FormatError,
    SegmentVanishedError,
    SidecarError,
    UnreadableFileError,
)
from sidecar.kafka.checkpoints import decode_kafka_uuid, leader_epoch_checkpoint_for_segment
from sidecar.kafka.logdir import PartitionScan, Segment, open_segment_file
from sidecar.kafka.records import iter_batches
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.publisher import MetadataPublisher
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.logging import get_logger
from sidecar.storage import PartChecksums
from sidecar.storage.base import ObjectInfo, ObjectStore, abort_uploads_of
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import IndexKind, ObjectEntry, SegmentManifest, pack_indexes

__all__ = [
    "CopyNotStartedError",
    "CorruptSegmentError",
    "LeadershipLostError",
    "OpenSegment",
    "SegmentChangedError",
    "SegmentCopyPreemptedError",
    "SegmentUploader",
    "UploadIOError",
    "UploadOutcome",
    "segment_keys",
    "write_segment_objects",
]

log = get_logger(__name__)


class CorruptSegmentError(SidecarError):
    """A segment whose batches fail their CRC (or do not parse): quarantined, never uploaded."""


class SegmentChangedError(SidecarError):
    """The ``.log`` changed while it was uploaded (it should be immutable once rolled)."""

    retriable = True


class LeadershipLostError(SidecarError):
    """This broker no longer leads the partition (or cannot tell): the copy is abandoned."""

    retriable = True


class CopyNotStartedError(LeadershipLostError):
    """Before STARTED, ``may_start`` said no (leadership lost, or copies paused): nothing was
    published or uploaded, so the caller may simply look at the partition again."""


class SegmentCopyPreemptedError(SidecarError):
    """Another broker deleted our copy before it was FINISHED (it took it for dangling)."""

    retriable = True


class UploadIOError(SidecarError):
    """A timeout or connection error without an errno reached the upload untranslated: not a
    file call (those carry an errno), so not a read error of the segment; retried like any
    failed dependency."""

    retriable = True


@dataclass(frozen=True, slots=True)
class UploadOutcome:
    """What one successful upload did."""

    metadata: SegmentMetadata
    log_bytes: int
    index_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _OpenSegment:
    """The segment's files, opened once; paths under /proc/self/fd survive the broker's rename."""

    log: BinaryIO
    log_path: str
    index_files: dict[IndexKind, bytes | None]
    size: int
    mtime_ns: int
    #: the ``.log``'s CRC-32C for ``put_file`` with ``crc_part_size`` when it goes in one PUT,
    #: computed by the batch check from the bytes it read (so the upload does not read the file
    #: once more)
    part_crcs: tuple[int, ...] | None = None
    crc_part_size: int = 0


def _read_optional(path: Path | None) -> bytes | None:
    if path is None:
        return None
    handle, _ = open_segment_file(path)
    with handle:
        return handle.read()


def _check_batches(
    fd_path: str, segment: Segment, size: int, part_size: int | None = None
) -> tuple[int, ...] | None:
    """Every batch parses and has a valid CRC-32C, and the batches fill the file exactly.
    With ``part_size``, returns the CRC-32C of each part ``put_file`` cuts the file into
    (``PartChecksums``) from the bytes the walk read, else (or when the walk did not see every
    byte) None: the upload then sends the parts without reading them again (``sendfile``), or
    checks each part it reads against them.

    Only bytes that were read and found bad are corrupt: a read error is not (it is retried),
    nor a file that changed size under the walk (the broker truncated it; it is planned again).
    """
    end = 0
    crcs = None if part_size is None else PartChecksums(size, part_size)
    try:
        for header in iter_batches(
            Path(fd_path),
            verify_crc=True,
            path=str(segment.log_path),
            on_read=None if crcs is None else crcs.feed,
        ):
            end = header.end_position
    except UnreadableFileError:
        raise  # the disk failed to read, the bytes may be fine: retried, never quarantined
    except FormatError as exc:
        _unless_resized(fd_path, segment, size)
        raise CorruptSegmentError(
            f"segment {segment.log_path} is corrupt and will not be uploaded: {exc}"
        ) from exc
    if end != size:
        _unless_resized(fd_path, segment, size)
        raise CorruptSegmentError(
            f"segment {segment.log_path}: batches end at byte {end} of {size}"
        )
    return None if crcs is None else crcs.result()


def _unless_resized(fd_path: str, segment: Segment, size: int) -> None:
    """Raise SegmentChangedError if the open file no longer has ``size`` bytes."""
    try:
        now = Path(fd_path).stat().st_size
    except OSError:
        return
    if now != size:
        raise SegmentChangedError(
            f"segment {segment.log_path} changed size while it was checked ({size} → {now} bytes)"
        )


def _index_files(scan: PartitionScan, segment: Segment) -> dict[IndexKind, bytes | None]:
    """The small files that travel with the segment, byte-exact."""
    if segment.next_base_offset is None or segment.snapshot_path is None:
        raise SegmentVanishedError(f"segment {segment.log_path} is not ready to upload")
    return {
        IndexKind.OFFSET_INDEX: _read_optional(segment.index_path) or b"",
        IndexKind.TIME_INDEX: _read_optional(segment.timeindex_path) or b"",
        IndexKind.TXN_INDEX: _read_optional(segment.txnindex_path),
        IndexKind.PRODUCER_SNAPSHOT: _read_optional(segment.snapshot_path),
        IndexKind.LEADER_EPOCH_CHECKPOINT: leader_epoch_checkpoint_for_segment(
            scan.leader_epochs, segment.next_base_offset
        ),
    }


def _open_segment(
    scan: PartitionScan, segment: Segment, part_size: int | None = None
) -> _OpenSegment:
    """Open and check the segment (thread side), with the part CRC-32Cs for ``part_size``.
    The caller closes the returned ``log``."""
    handle, _name = open_segment_file(segment.log_path)
    try:
        stat = os.fstat(handle.fileno())
        fd_path = f"/proc/self/fd/{handle.fileno()}"
        crcs = _check_batches(fd_path, segment, stat.st_size, part_size)
        files = _index_files(scan, segment)
    except BaseException:
        handle.close()
        raise
    return _OpenSegment(
        handle, fd_path, files, stat.st_size, stat.st_mtime_ns, crcs, part_size or 0
    )


def _check_still_leader(metadata: SegmentMetadata, may_continue: Callable[[], bool]) -> None:
    """Before FINISHED: a copy whose partition moved away during the upload is abandoned."""
    if not may_continue():
        tip = metadata.segment_id.topic_id_partition
        raise LeadershipLostError(
            f"{tip.topic}-{tip.partition}: leadership moved during the upload of segment"
            f" {metadata.start_offset}; the copy is abandoned"
        )


class SegmentUploader:
    """Uploads one segment at a time for a caller that serializes per partition."""

    def __init__(
        self,
        *,
        objects: ObjectStore,
        publisher: MetadataPublisher,
        layout: KeyLayout,
        broker_id: int,
        part_size: int,
        concurrency: int,
        store: RemoteSegmentStore | None = None,
        sync: Callable[[TopicIdPartition], Awaitable[None]] | None = None,
        finish_attempts: int = 4,
        finish_backoff_s: float = 1.0,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        """``sync`` reads a partition's metadata up to the topic's end into ``store`` (bounded
        in time; a SidecarError when it cannot): how a copy's state is re-checked before a
        delete and after a FINISHED whose fate is unknown. ``finish_attempts`` bounds how often
        FINISHED is sent while the topic still shows the copy STARTED."""
        self._objects = objects
        self._store = store
        self._sync = sync
        self._finish_attempts = max(1, finish_attempts)
        self._finish_backoff_s = finish_backoff_s
        self._publisher = publisher
        self._layout = layout
        self._broker_id = broker_id
        self._part_size = part_size
        self._concurrency = concurrency
        self._clock_ms = clock_ms
        #: copies this uploader published COPY_SEGMENT_STARTED for that may still be STARTED
        self._started_here: set[RemoteLogSegmentId] = set()

    @property
    def broker_id(self) -> int:
        """The broker whose copies this uploader publishes."""
        return self._broker_id

    def keys(self, metadata: SegmentMetadata) -> dict[ObjectSuffix, str]:
        """Every object key of a segment, derived from its metadata alone."""
        return segment_keys(self._layout, metadata)

    def started_here(self, segment_id: RemoteLogSegmentId) -> bool:
        """Whether this uploader published the copy's COPY_SEGMENT_STARTED and has not seen it
        leave that state since (a copy that failed, or is still running)."""
        return segment_id in self._started_here

    def forget_started(self, keep: Callable[[RemoteLogSegmentId], bool]) -> None:
        """Forget the copies started here for which ``keep`` says no: the engine's pruning of
        copies no longer STARTED on the topic (a STARTED that never landed, after its cleanup
        failed) or of partitions no longer tiered here. A copy forgotten while still STARTED
        is repaired too, after the grace period of a copy not started here."""
        self._started_here = {i for i in self._started_here if keep(i)}

    async def upload(
        self,
        scan: PartitionScan,
        segment: Segment,
        *,
        may_start: Callable[[], bool] | None = None,
        may_continue: Callable[[], bool] = lambda: True,
        on_late_finish: Callable[[UploadOutcome], None] | None = None,
    ) -> UploadOutcome:
        """Upload ``segment`` of ``scan``'s partition and publish it FINISHED.

        ``may_continue`` says whether this broker still leads the partition; it is asked before
        FINISHED, and before STARTED unless ``may_start`` (which may ask more: that nothing
        pauses copies) is given. ``on_late_finish`` is called when the upload is cancelled
        while FINISHED is on its way and the topic then shows it FINISHED: the copy is tiered
        although this raises ``CancelledError``, so the caller can still count it.
        """
        if scan.topic_id is None:
            raise SegmentVanishedError(f"{scan.path} has no partition.metadata (topic id)")
        if segment.end_offset is None or segment.max_timestamp_ms is None:
            raise SegmentVanishedError(f"{segment.log_path} is the active segment")
        started = time.monotonic()
        tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition)
        opened = await acquire_in_thread(
            functools.partial(_open_segment, scan, segment, self._part_size),
            lambda o: o.log.close(),
            executor=SEGMENT_READ_THREADS,
        )
        try:
            metadata = SegmentMetadata(
                segment_id=RemoteLogSegmentId(tip, uuid.uuid4()),
                start_offset=segment.base_offset,
                end_offset=segment.end_offset,
                broker_id=self._broker_id,
                max_timestamp_ms=segment.max_timestamp_ms,
                event_timestamp_ms=self._clock_ms(),
                segment_leader_epochs=tuple(
                    (e.epoch, e.start_offset) for e in segment.leader_epochs
                ),
                segment_size_in_bytes=opened.size,
                txn_index_empty=segment.txn_index_empty,
            )
            if not (may_continue if may_start is None else may_start)():
                raise CopyNotStartedError(
                    f"{tip.topic}-{tip.partition}: no longer the leader (or not known to be),"
                    f" segment {segment.base_offset} not started"
                )
            try:
                # STARTED may be on the topic as soon as it is sent: a failure or cancellation
                # while it is read back is cleaned up like one during the upload (a STARTED
                # that never landed is left alone by the cleanup's re-check)
                self._started_here.add(metadata.segment_id)
                await self._publisher.publish_and_wait(metadata)
                log.info(
                    "segment_upload_started",
                    base_offset=segment.base_offset,
                    end_offset=segment.end_offset,
                    segment_id=str(metadata.segment_id.id),
                    bytes=opened.size,
                )
                index_bytes = await self._write_objects(metadata, opened)
                # every byte is sent: the broker may delete the file, and its space is
                # freed now rather than after FINISHED's read-back, which waits out outages
                opened.log.close()
                _check_still_leader(metadata, may_continue)
            except BaseException as exc:
                opened.log.close()  # nor does the cleanup need it
                log.warning(
                    "segment_upload_failed",
                    base_offset=segment.base_offset,
                    segment_id=str(metadata.segment_id.id),
                    error=str(exc) or type(exc).__name__,
                    error_type=type(exc).__name__,
                )
                # shield the cleanup from a cancellation that interrupted the upload
                await asyncio.shield(self._abandon(metadata))
                raise

            # From here on FINISHED may be on the topic: the copy is never abandoned.
            def outcome() -> UploadOutcome:
                return UploadOutcome(metadata, opened.size, index_bytes, time.monotonic() - started)

            await self._finish(
                metadata, None if on_late_finish is None else lambda: on_late_finish(outcome())
            )
        finally:
            # never blocks for a regular file, and must run even when cancelled again
            opened.log.close()
        return outcome()

    async def _finish(
        self, metadata: SegmentMetadata, on_settled: Callable[[], None] | None = None
    ) -> None:
        """Publish FINISHED and make sure the topic shows it. A cancellation waits for that to
        settle (FINISHED may already be on its way), unless it is cancelled again; once the
        topic shows FINISHED it calls ``on_settled`` and then raises the cancellation."""
        settle = asyncio.ensure_future(self._publish_finished(metadata))
        try:
            await asyncio.shield(settle)
        except asyncio.CancelledError:
            if not settle.done():
                log.info("segment_finish_settling", segment_id=str(metadata.segment_id.id))
                try:
                    await settle  # a second cancellation cancels the settling too
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - crash repair re-checks the copy
                    log.warning(
                        "segment_finish_unsettled",
                        segment_id=str(metadata.segment_id.id),
                        error=str(exc) or type(exc).__name__,
                    )
            if not settle.cancelled() and settle.exception() is None and on_settled is not None:
                on_settled()  # FINISHED shows (before or after the cancellation came)
            raise

    async def _publish_finished(self, metadata: SegmentMetadata) -> None:
        """Send FINISHED until the topic shows the copy FINISHED (or deleted by another broker).

        A failed publish or read-back does not say whether FINISHED landed: the topic is read up
        to its end and the copy's state decides. STARTED means it did not land: send it again,
        at most ``finish_attempts`` times; then the copy stays STARTED and the error propagates
        (crash repair deletes and redoes a STARTED copy after the same re-check).
        """
        delay = self._finish_backoff_s
        for attempt in range(1, self._finish_attempts + 1):
            try:
                await self._publish_state(metadata, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
            except SidecarError as exc:
                log.warning(
                    "segment_finish_unconfirmed",
                    segment_id=str(metadata.segment_id.id),
                    attempt=attempt,
                    error=str(exc) or type(exc).__name__,
                    error_type=type(exc).__name__,
                )
                try:
                    state = await self.current_state(metadata)
                except SidecarError as read_exc:
                    if attempt == self._finish_attempts:
                        raise
                    log.warning(
                        "segment_state_unreadable",
                        segment_id=str(metadata.segment_id.id),
                        error=str(read_exc) or type(read_exc).__name__,
                    )
                    await asyncio.sleep(delay)
                    delay *= 2
                    continue
                if state is RemoteLogSegmentState.COPY_SEGMENT_STARTED:
                    if attempt == self._finish_attempts:
                        raise
                    await asyncio.sleep(delay)
                    delay *= 2
                    continue
            else:
                state = await self._stored_state(metadata)
            self._started_here.discard(metadata.segment_id)  # FINISHED, or deleted by another
            if state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED:
                return
            await self._preempted(metadata, state)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _preempted(
        self, metadata: SegmentMetadata, state: RemoteLogSegmentState | None
    ) -> None:
        """Another broker's DELETE_SEGMENT_STARTED came before our FINISHED, which the state
        machine dropped: the copy is being deleted, so our objects go too."""
        name = "gone" if state is None else state.name
        log.warning(
            "segment_copy_preempted",
            base_offset=metadata.start_offset,
            segment_id=str(metadata.segment_id.id),
            state=name,
        )
        await asyncio.shield(self._delete_objects_quietly(metadata))
        raise SegmentCopyPreemptedError(
            f"segment {metadata.start_offset} copy {metadata.segment_id.id} was deleted by"
            f" another broker before it finished (now {name}); its objects were removed"
        )

    async def _stored_state(self, metadata: SegmentMetadata) -> RemoteLogSegmentState | None:
        """The copy's state in the local store (None: never seen, or DELETE_SEGMENT_FINISHED).
        Without a store (tools and tests that only upload), the publish is taken as applied."""
        if self._store is None:
            return RemoteLogSegmentState.COPY_SEGMENT_FINISHED
        stored = await asyncio.to_thread(self._store.segment, metadata.segment_id)
        return None if stored is None else stored.state

    async def current_state(self, metadata: SegmentMetadata) -> RemoteLogSegmentState | None:
        """The copy's state on the metadata topic: the store after reading the topic up to its
        end (``sync``). Raises a SidecarError when the topic cannot be read."""
        if self._sync is not None:
            await self._sync(metadata.segment_id.topic_id_partition)
        return await self._stored_state(metadata)

    async def _delete_objects_quietly(self, metadata: SegmentMetadata) -> None:
        try:
            await self._objects.delete(list(self.keys(metadata).values()))
        except SidecarError as exc:  # the orphan scrub removes what this could not
            log.warning(
                "segment_objects_delete_failed",
                segment_id=str(metadata.segment_id.id),
                error=str(exc),
            )

    async def _write_objects(self, metadata: SegmentMetadata, opened: _OpenSegment) -> int:
        return await write_segment_objects(
            self._objects,
            self._layout,
            metadata,
            opened,
            part_size=self._part_size,
            concurrency=self._concurrency,
        )

    async def delete_segment(self, metadata: SegmentMetadata, *, unfinished: bool = False) -> bool:
        """DELETE_SEGMENT_STARTED → delete every object → DELETE_SEGMENT_FINISHED; returns
        whether it deleted.

        The copy's current state is re-checked first (see ``current_state``): an ``unfinished``
        copy must still be COPY_SEGMENT_STARTED, any other still COPY_SEGMENT_FINISHED. A copy
        that another broker already deletes is finished here; one that turned FINISHED meanwhile
        (or is gone) is left alone. ``unfinished``: the copy never finished, so a multipart upload
        of its ``.log`` may still be open (a cancelled or crashed upload): it is aborted before
        FINISHED.
        """
        expected = (
            RemoteLogSegmentState.COPY_SEGMENT_STARTED
            if unfinished
            else RemoteLogSegmentState.COPY_SEGMENT_FINISHED
        )
        state = await self.current_state(metadata)
        if state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            self._started_here.discard(metadata.segment_id)  # no longer a copy to repair
        if state is RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
            await self.finish_delete(metadata, unfinished=unfinished)
            return True
        if state is not expected:
            log.warning(
                "segment_delete_skipped",
                segment_id=str(metadata.segment_id.id),
                start_offset=metadata.start_offset,
                expected=expected.name,
                state="gone" if state is None else state.name,
            )
            return False
        await self._publish_state(metadata, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)
        self._started_here.discard(metadata.segment_id)  # crash repair finishes the delete
        await self.finish_delete(metadata, unfinished=unfinished)
        return True

    async def finish_delete(self, metadata: SegmentMetadata, *, unfinished: bool = False) -> None:
        """Delete the objects of a segment whose deletion STARTED, then publish FINISHED."""
        keys = self.keys(metadata)
        await self._objects.delete(list(keys.values()))
        if unfinished:
            await self._abort_uploads(keys[ObjectSuffix.LOG])
        await self._publish_state(metadata, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED)

    async def _abort_uploads(self, key: str) -> None:
        """Abort the open multipart uploads of ``key``. A cancelled upload cannot abort its own
        upload when the cancellation came before the store answered CreateMultipartUpload (it
        never learnt the id), so the cleanup looks them up by key."""
        for upload_id in await abort_uploads_of(self._objects, key):
            log.info("multipart_upload_aborted", key=key, upload_id=upload_id)

    async def _publish_state(self, metadata: SegmentMetadata, state: RemoteLogSegmentState) -> None:
        await self._publisher.publish_and_wait(
            SegmentMetadataUpdate(
                segment_id=metadata.segment_id,
                broker_id=self._broker_id,
                event_timestamp_ms=self._clock_ms(),
                state=state,
            )
        )

    async def _abandon(self, metadata: SegmentMetadata) -> None:
        try:
            await self.delete_segment(metadata, unfinished=True)
        except Exception as exc:  # noqa: BLE001 - crash repair finishes this at the next start
            log.warning(
                "segment_cleanup_failed",
                segment_id=str(metadata.segment_id.id),
                error=str(exc) or type(exc).__name__,
            )


#: an opened segment, for callers that open the files themselves (the broker-driven copy)
OpenSegment = _OpenSegment


def segment_keys(layout: KeyLayout, metadata: SegmentMetadata) -> dict[ObjectSuffix, str]:
    """Every object key of a segment, derived from its metadata alone."""
    tip = metadata.segment_id.topic_id_partition
    return {
        suffix: layout.segment_key(
            topic=tip.topic,
            topic_id=tip.topic_id,
            partition=tip.partition,
            base_offset=metadata.start_offset,
            segment_id=metadata.segment_id.id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    }


async def write_segment_objects(
    objects: ObjectStore,
    layout: KeyLayout,
    metadata: SegmentMetadata,
    opened: OpenSegment,
    *,
    part_size: int,
    concurrency: int,
    log_info: ObjectInfo | None = None,
) -> int:
    """Write a segment's objects (``.log``, indexes, manifest) and publish nothing: the
    standalone upload wraps this in its metadata events, the broker-driven copy leaves the events
    to the broker's RLMM. ``log_info``: the ``.log`` is in place already (a staged copy), only
    the file's stability is checked. Returns the size of the indexes object."""
    keys = segment_keys(layout, metadata)
    if log_info is None:
        log_info = await objects.put_file(
            keys[ObjectSuffix.LOG],
            opened.log_path,
            part_size=part_size,
            concurrency=concurrency,
            part_crcs=opened.part_crcs if opened.crc_part_size == part_size else None,
        )
    after = await asyncio.to_thread(os.fstat, opened.log.fileno())
    if (
        log_info.size != opened.size
        or after.st_size != opened.size
        or after.st_mtime_ns != opened.mtime_ns
    ):
        raise SegmentChangedError(
            f"{keys[ObjectSuffix.LOG]}: the local .log changed during the upload"
            f" ({opened.size} → {after.st_size} bytes)"
        )
    blob, ranges = pack_indexes(opened.index_files)
    index_info = await objects.put(keys[ObjectSuffix.INDEXES], blob)
    tip = metadata.segment_id.topic_id_partition
    manifest = SegmentManifest(
        topic=tip.topic,
        topic_id=tip.topic_id,
        partition=tip.partition,
        segment_id=metadata.segment_id.id,
        start_offset=metadata.start_offset,
        end_offset=metadata.end_offset,
        max_timestamp_ms=metadata.max_timestamp_ms,
        size_bytes=metadata.segment_size_in_bytes,
        leader_epochs=metadata.segment_leader_epochs,
        txn_index_empty=metadata.txn_index_empty,
        broker_id=metadata.broker_id,
        event_timestamp_ms=metadata.event_timestamp_ms,
        log=ObjectEntry(keys[ObjectSuffix.LOG], log_info.size, log_info.crc32c or 0),
        indexes=ObjectEntry(
            keys[ObjectSuffix.INDEXES], index_info.size, index_info.crc32c or 0, ranges
        ),
        created_by=f"kafka-tiered-sidecar {__version__}",
    )
    await objects.put(keys[ObjectSuffix.MANIFEST], manifest.to_json())
    return index_info.size
