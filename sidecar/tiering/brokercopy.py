"""Broker-driven copies: Kafka's RLM calls the plugin's ``copyLogSegmentData`` and
``deleteLogSegmentData``, the plugin forwards them here, and this module does the S3 work.

A copy names the broker's own files (the ``.log``, ``.index``, ``.timeindex``, the ``.txnindex``
if any, the ``<nextBase>.snapshot``) and carries the leader-epoch checkpoint the broker built in
memory. The paths are mapped onto this sidecar's read-only mount of the broker's log dirs
(``broker.path_map``) and must then lie inside one of ``broker.log_dirs``: the socket never makes
the sidecar read, let alone upload, anything else. The segment is opened once, every batch's
CRC-32C is checked, and the objects are written byte-exact with the same keys and manifest as a
standalone upload (:func:`sidecar.tiering.uploader.write_segment_objects`), keyed by the broker's
segment id. No metadata event is published: the broker's RLMM writes COPY_SEGMENT_STARTED and
FINISHED around the call, and DELETE_SEGMENT_* around a delete.

With eager upload (:mod:`sidecar.tiering.eager`) the ``.log`` is usually in the bucket already,
staged under a key named by its size and CRC-32C: the copy computes the CRC of the file it
checked, and a staged object of that name is copied to the segment's key inside the store
instead of uploading the bytes again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from sidecar._aio import SEGMENT_READ_THREADS, acquire_in_thread
from sidecar.brokerapi import (
    FILE_SUFFIXES,
    BrokerCopyRequest,
    BrokerPathError,
    SegmentNotCopyableError,
)
from sidecar.errors import (
    FormatError,
    KeyNotFoundError,
    SegmentVanishedError,
    SidecarError,
    UnreadableFileError,
)
from sidecar.kafka.logdir import open_segment_file
from sidecar.kafka.records import iter_batches
from sidecar.metadata.events import SegmentMetadata
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.storage import PartChecksums
from sidecar.storage.base import ObjectInfo, ObjectStore, abort_uploads_of
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import IndexKind
from sidecar.tiering.eager import StagingLedger, file_crc32c
from sidecar.tiering.uploader import OpenSegment, segment_keys, write_segment_objects

__all__ = ["BrokerCopier"]

log = get_logger(__name__)


class BrokerCopier:
    """Copies and deletes segments on the broker's request; publishes nothing
    (:class:`sidecar.brokerapi.SegmentCopier`)."""

    def __init__(
        self,
        *,
        objects: ObjectStore,
        layout: KeyLayout,
        log_dirs: Sequence[Path],
        path_map: Mapping[str, Path] | None = None,
        part_size: int,
        concurrency: int,
        staging: StagingLedger | None = None,
        metrics: Metrics | None = None,
        on_copy: Callable[[str], None] | None = None,
    ) -> None:
        """``on_copy`` is told the topic of every copy call: proof that the broker tiers it."""
        self._on_copy = on_copy
        self._objects = objects
        self._staging = staging
        self._metrics = metrics
        self._layout = layout
        self._log_dirs = [Path(os.path.realpath(d)) for d in log_dirs]
        # longest prefix first, so a nested mapping wins over its parent
        self._path_map = sorted(
            ((Path(k), Path(v)) for k, v in (path_map or {}).items()),
            key=lambda kv: len(kv[0].parts),
            reverse=True,
        )
        self._part_size = part_size
        self._concurrency = concurrency

    def local_path(self, broker_path: Path, kind: str) -> Path:
        """Where this sidecar reads ``broker_path``: mapped, resolved, inside a log dir, and
        named like a Kafka file of ``kind``; else :class:`BrokerPathError`."""
        if not broker_path.is_absolute():
            raise BrokerPathError(f"{kind} path {str(broker_path)[:200]!r} is not absolute")
        mapped = broker_path
        for prefix, target in self._path_map:
            if broker_path.is_relative_to(prefix):
                mapped = target / broker_path.relative_to(prefix)
                break
        if not mapped.name.endswith(FILE_SUFFIXES[kind]):
            raise BrokerPathError(
                f"{kind} path {str(broker_path)[:200]!r} does not end with {FILE_SUFFIXES[kind]}"
            )
        # resolve symlinks and '..' before the containment check
        real = Path(os.path.realpath(mapped))
        if not any(real.is_relative_to(d) for d in self._log_dirs):
            raise BrokerPathError(
                f"{kind} path {str(broker_path)[:200]!r} maps to {str(real)[:200]!r}, outside the"
                f" broker's log dirs {[str(d) for d in self._log_dirs]} (set broker.path_map when"
                " the sidecar mounts them elsewhere)"
            )
        return real

    async def copy(self, request: BrokerCopyRequest) -> int:
        """Upload the segment's objects (adopting a staged ``.log`` when there is one); returns
        the bytes of its ``.log``."""
        metadata = request.metadata
        tip = metadata.segment_id.topic_id_partition
        if self._on_copy is not None:
            self._on_copy(tip.topic)
        ident = (tip.topic_id, tip.partition, metadata.start_offset)
        started = time.monotonic()
        copied = False
        if self._staging is not None:
            self._staging.claim(ident)  # the stager starts nothing for it from now on
        try:
            if self._staging is not None:
                await self._staging.settled(ident)  # a staging upload of it in flight
            # a cancellation while the thread opens the files closes them when it is done
            opened, crc = await acquire_in_thread(
                functools.partial(self._open, request, self._staging is not None),
                lambda result: result[0].log.close(),
                executor=SEGMENT_READ_THREADS,
            )
            adopted: str | None = None
            try:
                log_info = None
                if crc is not None:
                    adopted, log_info = await self._adopt(metadata, opened, crc)
                await write_segment_objects(
                    self._objects,
                    self._layout,
                    metadata,
                    opened,
                    part_size=self._part_size,
                    concurrency=self._concurrency,
                    log_info=log_info,
                )
            except BaseException:
                opened.log.close()  # the cleanup needs no byte of it (freed if unlinked)
                # what was written under this attempt's keys is of no use to anyone
                await asyncio.shield(self._delete_quietly(metadata))
                raise
            finally:
                await asyncio.to_thread(opened.log.close)
            copied = True
        finally:
            if self._staging is not None:
                self._staging.release(ident, copied=copied)
        if adopted is not None:
            await self._drop_staged(adopted)
        log.info(
            "broker_copy_finished",
            topic=tip.topic,
            partition=tip.partition,
            base_offset=metadata.start_offset,
            segment_id=str(metadata.segment_id.id),
            bytes=opened.size,
            staged=adopted is not None,
            # check and upload, as the broker's copier thread waits for them
            seconds=round(time.monotonic() - started, 4),
        )
        return opened.size

    async def _adopt(
        self, metadata: SegmentMetadata, opened: OpenSegment, crc: int
    ) -> tuple[str | None, ObjectInfo | None]:
        """Copy a staged ``.log`` with this file's size and CRC to the segment's key: (the
        staged key, the copy's info), or (None, None) when nothing is staged."""
        tip = metadata.segment_id.topic_id_partition
        staged = self._layout.staged_key(
            topic=tip.topic,
            topic_id=tip.topic_id,
            partition=tip.partition,
            base_offset=metadata.start_offset,
            size=opened.size,
            crc32c=crc,
        )
        ident = (tip.topic_id, tip.partition, metadata.start_offset)
        known = None if self._staging is None else self._staging.staged_key(ident)
        if known is not None and known != staged:
            self._count("not_staged")  # staged with other bytes than the broker's file
            return None, None
        # not known here may still be staged: by this process before a restart, which the
        # broker's retry can reach before the stager has looked again
        key = segment_keys(self._layout, metadata)[ObjectSuffix.LOG]
        try:
            info = await self._objects.copy(staged, key)
        except KeyNotFoundError:
            self._count("not_staged")
            return None, None
        if info.size != opened.size:
            raise SegmentNotCopyableError(
                f"staged {staged} has {info.size} bytes after the copy, not {opened.size}"
            )
        self._count("adopted")
        return staged, ObjectInfo(key, opened.size, crc, info.etag, None)

    async def _drop_staged(self, key: str) -> None:
        try:
            await self._objects.delete([key])
        except SidecarError as exc:  # the orphan scrub removes it after its grace period
            log.warning("staged_object_not_removed", key=key, error=str(exc))

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.eager_uploads.labels(outcome).inc()

    def _open(self, request: BrokerCopyRequest, with_crc: bool) -> tuple[OpenSegment, int | None]:
        """Map and check the paths (symlinks resolve on disk), then open; with ``with_crc``
        also the CRC-32C of the whole ``.log`` (thread side)."""
        paths = {
            kind: None if path is None else self.local_path(path, kind)
            for kind, path in request.files.items()
        }
        opened, whole = _open(
            paths,
            request.leader_epoch_index,
            request.metadata.segment_size_in_bytes,
            self._part_size,
        )
        if not with_crc or whole is not None:
            return opened, whole if with_crc else None
        try:
            return opened, file_crc32c(opened.log.fileno(), opened.size)
        except BaseException:
            opened.log.close()
            raise

    async def delete(self, metadata: SegmentMetadata) -> None:
        """Delete every object of the segment and abort an unfinished upload of its ``.log``.
        Idempotent: deleting what is gone succeeds."""
        keys = segment_keys(self._layout, metadata)
        await self._objects.delete(list(keys.values()))
        await abort_uploads_of(self._objects, keys[ObjectSuffix.LOG])
        log.info(
            "broker_delete_finished",
            base_offset=metadata.start_offset,
            segment_id=str(metadata.segment_id.id),
        )

    async def _delete_quietly(self, metadata: SegmentMetadata) -> None:
        try:
            await self.delete(metadata)
        except SidecarError as exc:  # the orphan scrub removes what this could not
            log.warning(
                "broker_copy_cleanup_failed",
                segment_id=str(metadata.segment_id.id),
                error=str(exc),
            )


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        handle, _ = open_segment_file(path)
    except SegmentVanishedError as exc:
        raise SegmentNotCopyableError(f"{path} is missing on the sidecar's mount") from exc
    with handle:
        try:
            return handle.read()
        except OSError as exc:  # EIO, a network file system: the bytes may be fine, retry
            raise UnreadableFileError(
                f"cannot read file: {exc.strerror or type(exc).__name__}",
                path=str(path),
                errno=exc.errno,
            ) from exc


def _open(
    paths: Mapping[str, Path | None], leader_epochs: bytes, size: int, part_size: int
) -> tuple[OpenSegment, int | None]:
    """Open the ``.log`` (kept open: the broker may delete it while we upload), check it and read
    the small files (thread side); with the whole ``.log``'s CRC-32C from the check's read. The
    caller closes the returned ``log``."""
    log_path = paths.get("log")
    if log_path is None:
        raise BrokerPathError("a copy request must name the segment's log file")
    try:
        handle, _name = open_segment_file(log_path)
    except SegmentVanishedError as exc:
        raise SegmentNotCopyableError(f"{log_path} is missing on the sidecar's mount") from exc
    try:
        return _checked(handle, log_path, paths, leader_epochs, size, part_size)
    except BaseException:
        handle.close()
        raise


def _checked(
    handle: BinaryIO,
    log_path: Path,
    paths: Mapping[str, Path | None],
    leader_epochs: bytes,
    size: int,
    part_size: int,
) -> tuple[OpenSegment, int | None]:
    """The size the broker's metadata says, every batch's CRC, batches that fill the file; the
    CRC-32Cs of the upload's parts (``part_size``) and of the whole file come from the same read,
    so neither the upload nor the staging lookup reads the file again."""
    stat = os.fstat(handle.fileno())
    if stat.st_size != size:
        raise SegmentNotCopyableError(
            f"{log_path} has {stat.st_size} bytes, the broker's metadata says {size}"
        )
    fd_path = f"/proc/self/fd/{handle.fileno()}"
    end = 0
    crcs = PartChecksums(stat.st_size, part_size)
    try:
        for header in iter_batches(
            Path(fd_path), verify_crc=True, path=str(log_path), on_read=crcs.feed
        ):
            end = header.end_position
    except UnreadableFileError:
        raise  # the disk failed to read, the bytes may be fine: the broker retries the copy
    except FormatError as exc:
        raise SegmentNotCopyableError(f"segment {log_path} is corrupt: {exc}") from exc
    if end != stat.st_size:
        raise SegmentNotCopyableError(
            f"segment {log_path}: batches end at byte {end} of {stat.st_size}"
        )
    files: dict[IndexKind, bytes | None] = {
        IndexKind.OFFSET_INDEX: _read(paths.get("offset_index")) or b"",
        IndexKind.TIME_INDEX: _read(paths.get("time_index")) or b"",
        IndexKind.TXN_INDEX: _read(paths.get("txn_index")),
        IndexKind.PRODUCER_SNAPSHOT: _read(paths.get("producer_snapshot")),
        IndexKind.LEADER_EPOCH_CHECKPOINT: leader_epochs,
    }
    opened = OpenSegment(
        handle, fd_path, files, stat.st_size, stat.st_mtime_ns, crcs.result(), part_size
    )
    return opened, crcs.whole()
