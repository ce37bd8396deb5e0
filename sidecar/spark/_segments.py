"""One remote segment, read with as few and as small GETs as the request allows.

:class:`SegmentRef` is what a Spark task carries (picklable, no clients): the segment's keys,
sizes and, when the planner already had the manifest, the byte ranges of its indexes inside the
``indexes`` object. :class:`SegmentFiles` reads through an :class:`~sidecar.spark._s3.S3Reader`:
the manifest (one small GET, only when an index is needed and the ranges are not known yet),
one index (one ranged GET of exactly its bytes, CRC-32C checked against the manifest), and the
``.log`` bytes covering an offset range: the offset index gives the first batch's position and an
upper bound for the last one's end, so a narrow read is one ranged GET of a few KiB.

Used by the executors (``_read``), by the planner (timestamp lookups, aborted transactions) and
by the audit job. Pure sync; no Spark, no asyncio.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import crc32c

from sidecar.errors import FormatError
from sidecar.kafka.checkpoints import encode_kafka_uuid, parse_producer_snapshot
from sidecar.kafka.indexes import AbortedTxn, OffsetIndex, TimeIndex, TxnIndex
from sidecar.kafka.records import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Buffer,
    Record,
    decode_records,
    iter_batches,
    parse_batch_header,
)
from sidecar.metadata.store import SegmentSpan
from sidecar.spark._s3 import S3Reader
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import MANIFEST_MAX_BYTES, IndexKind, Range, SegmentManifest

__all__ = ["IndexRanges", "RemoteDataError", "SegmentFiles", "SegmentRef", "segment_ref"]

#: most bytes of ``.log`` fetched per GET (bounded memory per task: the window being decoded
#: plus the one being fetched)
WINDOW_BYTES = 8 * 1024 * 1024
#: bytes of the first GET. Smaller first windows (decoding starts sooner) measured no faster on
#: a busy local[2] with ~20 ms GETs of 8 MiB, so a segment up to this size is one GET.
FIRST_WINDOW_BYTES = 8 * 1024 * 1024


class RemoteDataError(FormatError):
    """Archived bytes that do not match their manifest or metadata: a failed CRC, an index that
    points outside its segment, a manifest of another segment."""


@dataclass(frozen=True, slots=True)
class IndexRanges:
    """Where each index sits inside the segment's ``indexes`` object (from its manifest)."""

    key: str
    size: int
    ranges: tuple[tuple[str, int, int, int], ...]
    """(IndexKind value, start, length, crc32c)."""

    def get(self, kind: IndexKind) -> Range | None:
        for name, start, length, crc in self.ranges:
            if name == kind.value:
                return Range(start, length, crc)
        return None

    @classmethod
    def of(cls, manifest: SegmentManifest) -> IndexRanges:
        return cls(
            manifest.indexes.key,
            manifest.indexes.size,
            tuple(
                (kind.value, r.start, r.length, r.crc32c)
                for kind, r in manifest.indexes.ranges.items()
            ),
        )


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """A remote segment as a task needs it; picklable."""

    topic: str
    partition: int
    segment_id: str
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    size: int
    log_key: str
    manifest_key: str
    txn_index_empty: bool
    indexes: IndexRanges | None = None


def segment_ref(
    span: SegmentSpan, layout: KeyLayout, manifest: SegmentManifest | None = None
) -> SegmentRef:
    segment = span.segment
    tp = segment.segment_id.topic_id_partition

    def key(suffix: ObjectSuffix) -> str:
        return layout.segment_key(
            topic=tp.topic,
            topic_id=tp.topic_id,
            partition=tp.partition,
            base_offset=segment.start_offset,
            segment_id=segment.segment_id.id,
            suffix=suffix,
        )

    return SegmentRef(
        topic=tp.topic,
        partition=tp.partition,
        segment_id=encode_kafka_uuid(segment.segment_id.id),
        start_offset=segment.start_offset,
        end_offset=segment.end_offset,
        max_timestamp_ms=segment.max_timestamp_ms,
        size=segment.segment_size_in_bytes,
        log_key=manifest.log.key if manifest is not None else key(ObjectSuffix.LOG),
        manifest_key=key(ObjectSuffix.MANIFEST),
        txn_index_empty=segment.txn_index_empty,
        indexes=IndexRanges.of(manifest) if manifest is not None else None,
    )


class SegmentFiles:
    """Reads of one segment's objects; caches the manifest's ranges and parsed indexes."""

    def __init__(self, reader: S3Reader, ref: SegmentRef) -> None:
        self.reader = reader
        self.ref = ref
        self._ranges = ref.indexes
        self._offset_index: OffsetIndex | None = None

    # -- manifest and indexes --------------------------------------------------------------

    def manifest(self) -> SegmentManifest:
        ref = self.ref
        data = self.reader.get(ref.manifest_key, max_bytes=MANIFEST_MAX_BYTES)
        manifest = SegmentManifest.from_json(data, key=ref.manifest_key)
        if (
            encode_kafka_uuid(manifest.segment_id) != ref.segment_id
            or manifest.start_offset != ref.start_offset
            or manifest.end_offset != ref.end_offset
        ):
            raise RemoteDataError(f"manifest {ref.manifest_key} describes another segment")
        return manifest

    def ranges(self) -> IndexRanges:
        if self._ranges is None:
            self._ranges = IndexRanges.of(self.manifest())
        return self._ranges

    def index_bytes(self, kind: IndexKind) -> bytes | None:
        """One index file, byte-exact and CRC-checked (one ranged GET); None when absent."""
        ranges = self.ranges()
        found = ranges.get(kind)
        if found is None:
            return None
        data = self.reader.get_range(ranges.key, found.start, found.length)
        if len(data) != found.length or crc32c.crc32c(data) != found.crc32c:
            raise RemoteDataError(
                f"{kind.value} of segment {self.ref.segment_id} ({ranges.key} bytes"
                f" {found.start}+{found.length}) does not match the CRC-32C of its manifest"
            )
        return data

    def offset_index(self) -> OffsetIndex | None:
        if self._offset_index is None:
            data = self.index_bytes(IndexKind.OFFSET_INDEX)
            if data is None:
                return None
            self._offset_index = OffsetIndex.parse(data, base_offset=self.ref.start_offset)
        return self._offset_index

    def time_index(self) -> TimeIndex | None:
        data = self.index_bytes(IndexKind.TIME_INDEX)
        return None if data is None else TimeIndex.parse(data, base_offset=self.ref.start_offset)

    def aborted_transactions(self) -> list[AbortedTxn]:
        """The segment's ``.txnindex`` entries (none when the metadata says it is empty)."""
        if self.ref.txn_index_empty:
            return []
        data = self.index_bytes(IndexKind.TXN_INDEX)
        if not data:
            return []
        return list(TxnIndex.parse(data, base_offset=self.ref.start_offset))

    def ongoing_transactions(self) -> dict[int, int] | None:
        """Producer id -> first offset of its transaction still open at the segment's end (from
        the producer snapshot uploaded with the segment); None when the snapshot is missing or
        does not parse."""
        data = self.index_bytes(IndexKind.PRODUCER_SNAPSHOT)
        if not data:
            return None
        try:
            return parse_producer_snapshot(data, path=self.ref.log_key).open_transactions()
        except FormatError:
            return None

    # -- the log ---------------------------------------------------------------------------

    def byte_range(self, lo: int, hi: int) -> tuple[int, int]:
        """``[start, end)`` of the ``.log`` bytes holding offsets ``[lo, hi)``: the whole object
        when the range covers the segment, else bounded by the offset index."""
        ref = self.ref
        if lo <= ref.start_offset and hi > ref.end_offset:
            return 0, ref.size
        index = self.offset_index()
        if index is None or not len(index):
            return 0, ref.size
        start = index.lookup(lo).position if lo > ref.start_offset else 0
        end = ref.size
        if hi <= ref.end_offset:
            # the first entry whose offset >= hi - 1 names a batch that holds hi - 1 or ends
            # after it; the entry after that starts past every offset below hi
            offsets = [entry.offset for entry in index]
            at = bisect.bisect_left(offsets, hi - 1)
            if at + 1 < len(offsets):
                end = index[at + 1].position
        if not 0 <= start < end <= ref.size:
            raise RemoteDataError(
                f"offset index of segment {ref.segment_id} gives bytes {start}..{end} outside"
                f" its {ref.size} bytes"
            )
        return start, end

    def read_log(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the ``.log``: one GET (ranged unless it is the whole)."""
        if start == 0 and end == self.ref.size:
            data = self.reader.get(self.ref.log_key)
        else:
            data = self.reader.get_range(self.ref.log_key, start, end - start)
        if len(data) != end - start:
            raise RemoteDataError(
                f"{self.ref.log_key}: got {len(data)} bytes for {start}..{end}; the object is"
                " shorter than its metadata says"
            )
        return data

    def raw_batches(
        self,
        lo: int,
        hi: int,
        *,
        verify_crc: bool = True,
        window: int | None = None,
        first_window: int | None = None,
        prefetch: bool = True,
    ) -> Iterator[tuple[BatchHeader, memoryview]]:
        """The batches that hold offsets in ``[lo, hi)``, in order (control batches too), each
        with a view of its bytes (CRC-checked with ``verify_crc``; valid until the next one).

        A range of up to ``first_window`` bytes is one GET (of the whole object when the range
        covers it). A longer one is read in windows that grow from ``first_window`` to ``window``
        bytes, and with ``prefetch`` the next window's GET runs in a background thread while the
        current one is walked (at most one GET ahead, so memory stays bounded for 1 GiB
        segments). A batch larger than the prefetched bytes gets a GET of its own size. The
        sizes default to ``WINDOW_BYTES`` and ``FIRST_WINDOW_BYTES``."""
        if lo >= hi:
            return
        window = max(1, WINDOW_BYTES if window is None else window)
        first_window = max(1, FIRST_WINDOW_BYTES if first_window is None else first_window)
        start, end = self.byte_range(lo, hi)
        if start >= end:
            return
        fetched = min(end, start + first_window)
        data: Buffer = self.read_log(start, fetched)
        pool = ThreadPoolExecutor(1, "kafka-tiered-get") if prefetch and fetched < end else None
        pending: tuple[Future[bytes], int] | None = None
        size = first_window
        try:
            position = start  # the file position of data[0]
            while True:
                if pool is not None and pending is None and fetched < end:
                    size = min(window, size * 2)
                    upto = min(end, fetched + size)
                    pending = (pool.submit(self.read_log, fetched, upto), upto)
                last = fetched == end
                consumed = position
                view = memoryview(data)
                try:
                    for header in iter_batches(
                        view,
                        origin=position,
                        verify_crc=verify_crc,
                        tolerate_tail=not last,
                        path=self.ref.log_key,
                    ):
                        consumed = header.end_position
                        if header.base_offset >= hi:
                            return
                        if header.last_offset < lo:
                            continue
                        at = header.position - position
                        yield header, view[at : at + header.size]
                except FormatError as exc:
                    raise RemoteDataError(str(exc), path=self.ref.log_key) from exc
                if last:
                    return
                tail = view[consumed - position :]
                need = consumed + RECORD_BATCH_OVERHEAD
                if len(tail) >= RECORD_BATCH_OVERHEAD:
                    try:
                        need = (
                            consumed
                            + parse_batch_header(
                                tail[:RECORD_BATCH_OVERHEAD],
                                position=consumed,
                                path=self.ref.log_key,
                                available=end - consumed,
                            ).size
                        )
                    except FormatError as exc:
                        raise RemoteDataError(str(exc), path=self.ref.log_key) from exc
                if pending is not None:
                    future, upto = pending
                    pending = None
                    more = future.result()
                else:
                    upto = min(end, fetched + window)
                    more = self.read_log(fetched, upto)
                if upto < need:  # a batch larger than the window: fetch the rest of it whole
                    upto = min(end, max(need, upto))
                    more = bytes(more) + self.read_log(fetched + len(more), upto)
                data = bytes(tail) + more if len(tail) else more
                position, fetched = consumed, upto
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def batches(
        self, lo: int, hi: int, *, verify_crc: bool = True, window: int | None = None
    ) -> Iterator[tuple[BatchHeader, list[Record]]]:
        """Decoded batches that hold offsets in ``[lo, hi)``, in order (control batches too);
        read as :meth:`raw_batches` reads them."""
        for header, view in self.raw_batches(
            lo, hi, verify_crc=verify_crc, window=window, first_window=window, prefetch=False
        ):
            try:
                records = decode_records(
                    view, verify_crc=False, path=self.ref.log_key, position=header.position
                )
            except FormatError as exc:
                raise RemoteDataError(str(exc), path=self.ref.log_key) from exc
            yield header, records


def segment_uuid(ref: SegmentRef) -> uuid.UUID:
    from sidecar.kafka.checkpoints import decode_kafka_uuid

    return decode_kafka_uuid(ref.segment_id)
