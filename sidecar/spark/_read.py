"""Executor side: one task's offset range of one segment -> Arrow record batches in exactly the
schema of Spark's Kafka source.

The task's bytes come from ``_segments.SegmentFiles`` (ranged GETs bounded by the offset index,
a time-index seek for a pushed-down lower timestamp bound, windows with the next GET prefetched);
batches are CRC-checked there. Control batches are skipped from their header; under
read_committed, transactional batches of aborted transactions (from the uploaded ``.txnindex``
files, collected by the planner) are dropped, as Kafka's consumer drops them. The rest are decoded
by aiokafka's compiled ``DefaultRecordBatch`` straight into per-column lists (the hot path: no
per-record tuples, a headers list kept only for records that have headers); the edge batches of
a range and anything the fast path rejects go through ``sidecar.kafka.records``' checked decoder.

A segment that remote retention deleted after the query was planned is data loss, as offsets
deleted under a running query are for Spark's Kafka source: an :class:`ArchiveDataLossError`
with ``failOnDataLoss=true``, else the rows read so far and a warning.

Imports pyarrow and the sidecar's pure modules only: no Spark classes, no asyncio, no Kafka
client. The S3 client is created here, in the worker, never pickled.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.errors import FormatError, KeyNotFoundError, SidecarError
from sidecar.kafka._codecs import inflate
from sidecar.kafka.records import (
    MAX_DECOMPRESSED_BATCH_BYTES,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Buffer,
    Record,
    decode_records,
)
from sidecar.spark._options import S3Location
from sidecar.spark._s3 import S3Reader
from sidecar.spark._segments import RemoteDataError, SegmentFiles, SegmentRef

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ARROW_BYTES_PER_BATCH",
    "ARROW_ROWS_PER_BATCH",
    "ArchiveDataLossError",
    "ReadTask",
    "arrow_schema",
    "read_task",
]

_log = logging.getLogger(__name__)

#: rows per Arrow batch handed to Spark (at least; whole Kafka batches are added)
ARROW_ROWS_PER_BATCH = 65_536
#: key and value bytes per Arrow batch (at least; whole Kafka batches are added): large values
#: end a batch before its rows do, so a batch stays far below the 2 GiB one binary array holds
#: and the Python worker's memory stays bounded
ARROW_BYTES_PER_BATCH = 64 * 1024 * 1024
_CODEC_MASK = 0x07
_ATTRIBUTES_LOW_BYTE = 22  # attributes are bytes 21-22 of a batch, big-endian
_DATA_LOSS_HINT = " (set failOnDataLoss=false to read what the archive holds)"


class ArchiveDataLossError(SidecarError):
    """Requested offsets that the archive does not hold (``failOnDataLoss=true``)."""


@dataclass(frozen=True, slots=True)
class ReadTask:
    """What one Spark task reads: offsets ``[lo, hi)`` of one segment. Picklable."""

    segment: SegmentRef
    lo: int
    hi: int
    s3: S3Location
    include_headers: bool = False
    read_committed: bool = False
    aborted: tuple[tuple[int, int, int], ...] = ()
    """(producer id, first offset, last offset) of aborted transactions that overlap the range."""
    min_timestamp_ms: int | None = None
    """A pushed-down lower bound: batches wholly below it are skipped (Spark re-checks rows)."""
    verify_crc: bool = True
    fail_on_data_loss: bool = True
    """A segment deleted since planning fails the task (else its unread rows are skipped)."""


def arrow_schema(include_headers: bool) -> pa.Schema:
    """``to_arrow_schema(kafka_schema, timezone="UTC")``: what Spark 4.2+ checks for equality."""
    import pyarrow as pa

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _headers_type()))
    return pa.schema(fields)


def _headers_type() -> pa.DataType:
    import pyarrow as pa

    pair = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.list_(pa.field("element", pair))


class _Columns:
    """Column lists for the rows of one Arrow batch, filled batch by batch."""

    __slots__ = (
        "data_bytes",
        "headers",
        "keys",
        "no_timestamp",
        "offsets",
        "timestamp_types",
        "timestamps",
        "values",
    )

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int] = []
        self.headers: list[Any] = []
        self.no_timestamp = False
        """A batch with Kafka's NO_TIMESTAMP (-1), which the decoder reports as None."""
        self.data_bytes = 0
        """Bytes of the keys and values held."""

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, header: BatchHeader, batch: Buffer, include_headers: bool) -> None:
        """Decode ``batch`` (one whole data batch, CRC already checked) into the columns, with
        aiokafka's compiled decoder and no intermediate objects."""
        count = len(self.offsets)
        try:
            records = _decoder()(_bounded(batch, header))
            offsets = self.offsets.append
            timestamps = self.timestamps.append
            keys = self.keys.append
            values = self.values.append
            if include_headers:
                headers = self.headers.append
                for r in records:
                    offsets(r.offset)
                    timestamps(r.timestamp)
                    keys(r.key)
                    values(r.value)
                    headers(r.headers or None)  # no list kept for a record without headers
            else:
                for r in records:
                    offsets(r.offset)
                    timestamps(r.timestamp)
                    keys(r.key)
                    values(r.value)
        except Exception:  # noqa: BLE001 - the checked decoder below raises the typed error
            # anything odd: undo, and let the checked decoder name it
            self.truncate(count)
            self.extend(header, _checked(batch, header), include_headers)
            return
        if header.base_timestamp < 0 or header.max_timestamp < 0:
            self.no_timestamp = True
        self.timestamp_types += [int(header.timestamp_type)] * (len(self.offsets) - count)
        self.data_bytes += _bytes_after(self.keys, count) + _bytes_after(self.values, count)

    def extend(self, header: BatchHeader, records: list[Record], include_headers: bool) -> None:
        """Append already decoded records (the slow path: the edges of a range, errors)."""
        for r in records:
            self.offsets.append(r.offset)
            self.timestamps.append(r.timestamp)
            self.keys.append(r.key)
            self.values.append(r.value)
            if include_headers:
                self.headers.append(r.headers or None)
            self.data_bytes += len(r.key or b"") + len(r.value or b"")
        self.timestamp_types += [int(header.timestamp_type)] * len(records)

    def truncate(self, count: int) -> None:
        del self.offsets[count:]
        del self.timestamps[count:]
        del self.keys[count:]
        del self.values[count:]
        del self.headers[count:]
        del self.timestamp_types[count:]

    def to_batch(self, task: ReadTask, schema: pa.Schema) -> pa.RecordBatch:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.offsets)
        seg = task.segment
        millis = pa.array(self.timestamps, pa.int64())
        if self.no_timestamp:
            millis = millis.fill_null(-1)
        timestamps = pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC"))
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(seg.topic, pa.string()), n),
            pa.repeat(pa.scalar(seg.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            timestamps,
            pa.array(self.timestamp_types, pa.int32()),
        ]
        if task.include_headers:
            arrays.append(_headers_array(self.headers))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _headers_array(rows: list[Any]) -> pa.Array:
    """NULL for a record without headers (as Spark's Kafka source), else (key, value) pairs.
    ``rows`` holds None or each record's (key, value) tuples; pyarrow converts them in C."""
    import pyarrow as pa

    return pa.array(rows, _headers_type())


@functools.cache
def _decoder() -> Callable[[Buffer], Iterable[Any]]:
    from aiokafka.record.default_records import DefaultRecordBatch

    return DefaultRecordBatch  # type: ignore[no-any-return]


def _bounded(batch: Buffer, header: BatchHeader) -> Buffer:
    """The batch as the compiled decoder may take it: as is when its payload provably expands
    to at most the sidecar's batch limit, else inflated here (bounded) with the codec cleared.
    Raises on a decompression bomb; the caller then lets ``decode_records`` name the error."""
    codec = header.attributes & _CODEC_MASK
    if not codec:
        return batch
    view = memoryview(batch)
    inflated = inflate(codec, view[RECORD_BATCH_OVERHEAD:], MAX_DECOMPRESSED_BATCH_BYTES)
    if inflated is None:
        return batch
    plain = bytearray(view[:RECORD_BATCH_OVERHEAD])
    plain[_ATTRIBUTES_LOW_BYTE] &= ~_CODEC_MASK & 0xFF
    plain += inflated
    return plain


def _bytes_after(column: list[bytes | None], start: int) -> int:
    """Bytes of the non-null items of ``column`` from ``start`` on. A slice, not ``islice``:
    ``islice`` steps over the items before ``start`` one by one, which made filling an Arrow
    batch quadratic in its Kafka batches."""
    return sum(map(len, filter(None, column[start:])))


def _checked(batch: Buffer, header: BatchHeader) -> list[Record]:
    """``sidecar.kafka.records``' decoder: typed errors (as RemoteDataError) for bad bytes."""
    try:
        return decode_records(batch, verify_crc=False, position=header.position)
    except FormatError as exc:
        raise RemoteDataError(str(exc)) from exc


def _aborted_lookup(task: ReadTask) -> dict[int, list[tuple[int, int]]]:
    found: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in task.aborted:
        found.setdefault(producer_id, []).append((first, last))
    return found


def _deleted(task: ReadTask, exc: KeyNotFoundError) -> None:
    """A segment object is gone (retention deleted it after planning): data loss."""
    seg = task.segment
    message = (
        f"offsets {task.lo}..{task.hi - 1} of {seg.topic}-{seg.partition}: segment"
        f" {seg.segment_id} is not in the bucket ({exc}); it was deleted after the query was"
        " planned, or s3.prefix / s3.hashPrefix differ from the sidecar's"
    )
    if task.fail_on_data_loss:
        raise ArchiveDataLossError(message + _DATA_LOSS_HINT) from exc
    _log.warning("%s; its unread rows are skipped (failOnDataLoss=false)", message)


def _until_deleted(
    task: ReadTask, batches: Iterator[tuple[BatchHeader, memoryview]]
) -> Iterator[tuple[BatchHeader, memoryview]]:
    try:
        yield from batches
    except KeyNotFoundError as exc:
        _deleted(task, exc)


def read_task(task: ReadTask, reader: S3Reader | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``task`` as Arrow record batches (none for an empty range)."""
    schema = arrow_schema(task.include_headers)
    files = SegmentFiles(reader or S3Reader(task.s3), task.segment)
    lo, hi = task.lo, task.hi
    if lo >= hi:
        return
    min_ts = task.min_timestamp_ms
    if min_ts is not None and task.segment.max_timestamp_ms < min_ts:
        return
    if min_ts is not None:
        # An entry (T, O) says every record up to O has a timestamp <= T (O is the last offset
        # of the batch that raised the maximum to T). Looking up bound - 1 gives T < bound, so
        # no record before O can pass the filter; looking up the bound itself could skip
        # earlier records whose timestamp equals it.
        try:
            index = files.time_index()
        except KeyNotFoundError as exc:
            _deleted(task, exc)
            return
        if index is not None:
            lo = max(lo, index.lookup(min_ts - 1).offset)
        if lo >= hi:
            return  # the first record late enough lies past the range (a later copy's part)
    aborted = _aborted_lookup(task) if task.read_committed else {}
    include_headers = task.include_headers
    columns = _Columns()
    batches = files.raw_batches(lo, hi, verify_crc=task.verify_crc)
    for header, batch in _until_deleted(task, batches):
        if header.is_control:
            continue
        if min_ts is not None and header.max_timestamp < min_ts:
            continue
        if aborted and header.is_transactional:
            ranges = aborted.get(header.producer_id)
            if ranges and any(f <= header.base_offset <= last for f, last in ranges):
                continue
        if header.base_offset < lo or header.last_offset >= hi:
            # an edge of the range: only some of the batch's records are wanted
            records = [r for r in _checked(batch, header) if lo <= r.offset < hi]
            columns.extend(header, records, include_headers)
        else:
            columns.add(header, batch, include_headers)
        if len(columns) >= ARROW_ROWS_PER_BATCH or columns.data_bytes >= ARROW_BYTES_PER_BATCH:
            yield columns.to_batch(task, schema)
            columns = _Columns()
    if len(columns):
        yield columns.to_batch(task, schema)
