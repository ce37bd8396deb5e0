"""Executor side: one task's offset range of one segment -> Arrow record batches in exactly the
schema of Spark's Kafka source.

The task's bytes come from ``_segments.SegmentFiles`` (ranged GETs bounded by the offset index,
a time-index seek for a pushed-down lower timestamp bound); batches are CRC-checked and decoded
by ``sidecar.kafka.records`` (aiokafka's compiled decoder). Control batches are never returned;
under read_committed, transactional batches of aborted transactions (from the uploaded
``.txnindex`` files, collected by the planner) are dropped, as Kafka's consumer drops them.

Imports pyarrow and the sidecar's pure modules only: no Spark classes, no asyncio, no Kafka
client. The S3 client is created here, in the worker, never pickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sidecar.spark._options import S3Location
from sidecar.spark._s3 import S3Reader
from sidecar.spark._segments import SegmentFiles, SegmentRef

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ARROW_ROWS_PER_BATCH", "ReadTask", "arrow_schema", "read_task"]

#: rows per Arrow batch handed to Spark
ARROW_ROWS_PER_BATCH = 32_768


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
    """Column lists for the rows of one Arrow batch."""

    __slots__ = ("headers", "keys", "offsets", "timestamp_types", "timestamps", "values")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.headers: list[Any] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def to_batch(self, task: ReadTask, schema: pa.Schema) -> pa.RecordBatch:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.offsets)
        seg = task.segment
        timestamps = pc.multiply(pa.array(self.timestamps, pa.int64()), 1000).cast(
            pa.timestamp("us", tz="UTC")
        )
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
    """NULL for a record without headers (as Spark's Kafka source), else (key, value) pairs."""
    import pyarrow as pa

    keys: list[str] = []
    values: list[bytes | None] = []
    offsets = [0]
    nulls: list[bool] = []
    for headers in rows:
        if headers:
            for k, v in headers:
                keys.append(k)
                values.append(v)
            nulls.append(False)
        else:
            nulls.append(True)
        offsets.append(len(keys))
    kind = _headers_type()
    struct = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())],
        fields=list(kind.value_type),
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), struct, type=kind, mask=pa.array(nulls, pa.bool_())
    )


def _aborted_lookup(task: ReadTask) -> dict[int, list[tuple[int, int]]]:
    found: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in task.aborted:
        found.setdefault(producer_id, []).append((first, last))
    return found


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
        index = files.time_index()
        if index is not None:
            lo = max(lo, index.lookup(min_ts - 1).offset)
    aborted = _aborted_lookup(task) if task.read_committed else {}
    columns = _Columns()
    for header, records in files.batches(lo, hi, verify_crc=task.verify_crc):
        if header.is_control:
            continue
        if min_ts is not None and header.max_timestamp < min_ts:
            continue
        if aborted and header.is_transactional:
            ranges = aborted.get(header.producer_id)
            if ranges and any(f <= header.base_offset <= last for f, last in ranges):
                continue
        first_offset = records[0].offset if records else lo
        last_offset = records[-1].offset if records else lo
        if first_offset < lo or last_offset >= hi:
            records = [r for r in records if lo <= r.offset < hi]
            if not records:
                continue
        offsets, timestamps, _types, keys, values, headers, _control = zip(*records, strict=True)
        columns.offsets += offsets
        columns.timestamps += timestamps
        columns.keys += keys
        columns.values += values
        columns.timestamp_types += [int(header.timestamp_type)] * len(offsets)
        if task.include_headers:
            columns.headers += headers
        if len(columns) >= ARROW_ROWS_PER_BATCH:
            yield columns.to_batch(task, schema)
            columns = _Columns()
    if len(columns):
        yield columns.to_batch(task, schema)
