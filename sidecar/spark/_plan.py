"""Driver side: options + pushed-down filters + the catalog -> the read tasks.

Per selected partition with tiered data:

1. The readable range is the tiered range ``[first, end)`` of its lineage; under read_committed
   it ends at the archive's last stable offset: the first offset of a transaction still open at
   the end of the last tiered segment (from that segment's producer snapshot), as a
   read_committed consumer never reads past the LSO.
2. The start is ``startingTimestamp`` / ``startingOffsetsByTimestamp`` (the first record at or
   after it: segment max timestamps, the time index, then a scan) or ``startingOffsets``; the end
   likewise from ``endingTimestamp`` / ``endingOffsetsByTimestamp`` or ``endingOffsets``
   (exclusive). Offsets outside the archive, and gaps between segments inside the range, are
   :class:`ArchiveDataLossError` with ``failOnDataLoss=true`` and are skipped otherwise.
3. Pushed-down filters narrow the range (offset bounds, partitions, topics) and prune segments
   (a segment whose max timestamp is below a lower timestamp bound is never read).
4. One task per segment range; ``minPartitions`` / ``maxRecordsPerPartition`` split ranges by
   offset (each piece seeks through the offset index).
5. Under read_committed the aborted transactions overlapping each task come from the uploaded
   ``.txnindex`` of every segment from the task's on (metadata says which are empty).

No Spark here; the planner's S3 reads are small ranged GETs of indexes and snapshots.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from sidecar.kafka.indexes import AbortedTxn
from sidecar.spark._catalog import Catalog, PartitionSpans
from sidecar.spark._options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    ReadOptions,
    SparkOptionError,
    TimestampSpec,
)
from sidecar.spark._read import ArchiveDataLossError, ReadTask
from sidecar.spark._s3 import S3Reader
from sidecar.spark._segments import SegmentFiles, SegmentRef, segment_ref
from sidecar.storage.keys import KeyLayout

__all__ = [
    "ArchiveDataLossError",
    "PartitionRange",
    "PushedFilters",
    "offset_for_timestamp",
    "plan_reads",
    "resolve_ranges",
]

_MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True, slots=True)
class PushedFilters:
    """What ``pushFilters`` took from the query; rows outside are never produced."""

    topics: frozenset[str] | None = None
    partitions: frozenset[int] | None = None
    offset_lo: int = 0
    offset_hi: int = _MAX_OFFSET
    """Exclusive."""
    min_timestamp_ms: int | None = None
    """Prunes segments and batches only; Spark still applies the timestamp filter to rows."""

    def narrow_topics(self, topics: Sequence[str]) -> PushedFilters:
        given = frozenset(topics)
        return replace(self, topics=given if self.topics is None else self.topics & given)

    def narrow_partitions(self, partitions: Sequence[int]) -> PushedFilters:
        given = frozenset(partitions)
        merged = given if self.partitions is None else self.partitions & given
        return replace(self, partitions=merged)

    def narrow_offsets(self, lo: int | None = None, hi: int | None = None) -> PushedFilters:
        return replace(
            self,
            offset_lo=self.offset_lo if lo is None else max(self.offset_lo, lo),
            offset_hi=self.offset_hi if hi is None else min(self.offset_hi, hi),
        )

    def narrow_min_timestamp(self, ms: int) -> PushedFilters:
        current = self.min_timestamp_ms
        return replace(self, min_timestamp_ms=ms if current is None else max(current, ms))

    def admits(self, topic: str, partition: int) -> bool:
        return (self.topics is None or topic in self.topics) and (
            self.partitions is None or partition in self.partitions
        )


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """One partition's resolved offsets ``[start, end)`` and the spans that hold them."""

    spans: PartitionSpans
    start: int
    end: int


def _layout(options: ReadOptions) -> KeyLayout:
    return KeyLayout(prefix=options.s3.prefix, hash_prefix=options.s3.hash_prefix)


def _refs(options: ReadOptions, catalog: Catalog, part: PartitionSpans) -> list[SegmentRef]:
    layout = _layout(options)
    return [
        segment_ref(span, layout, catalog.manifests.get(span.segment.segment_id.id))
        for span in part.spans
    ]


def offset_for_timestamp(
    part: PartitionSpans, refs: Sequence[SegmentRef], timestamp_ms: int, reader: S3Reader
) -> int | None:
    """The first offset (Kafka's ``offsetsForTimes``) whose record timestamp is at or after
    ``timestamp_ms`` in the partition's archive, or None."""
    for span, ref in zip(part.spans, refs, strict=True):
        if span.segment.max_timestamp_ms < timestamp_ms:
            continue
        files = SegmentFiles(reader, ref)
        index = files.time_index()
        target = span.start_offset
        if index is not None:  # bound - 1: see _read.read_task
            target = max(target, index.lookup(timestamp_ms - 1).offset)
        if target > span.end_offset:
            # in the segment's tail past the span, which the lineage gave a later copy (a
            # leader change): no record of this span qualifies
            continue
        for header, records in files.batches(target, span.end_offset + 1):
            if header.max_timestamp < timestamp_ms:
                continue
            for record in records:
                if record.timestamp >= timestamp_ms and record.offset >= span.start_offset:
                    return record.offset
    return None


def _timestamp_for(spec: TimestampSpec, topic: str, partition: int, what: str) -> int:
    if spec.everywhere is not None:
        return spec.everywhere
    found = spec.per_partition.get((topic, partition))
    if found is None:
        raise SparkOptionError(f"{what} does not name {topic}-{partition}")
    return found


def _offset_for(spec: OffsetSpec, topic: str, partition: int, key: str) -> int:
    """The offset ``spec`` gives ``topic-partition``. A JSON spec must name every partition
    read, as in Spark's Kafka source: a partition left out (a misspelt topic) is an error,
    not a silent earliest or latest."""
    found = spec.per_partition.get((topic, partition))
    if found is not None:
        return found
    if spec.is_json:
        named = sorted(f"{t}-{p}" for t, p in spec.per_partition)
        raise SparkOptionError(
            f"{key} gives specific offsets, so it must name every partition read:"
            f" {topic}-{partition} is missing (use -2 for earliest, -1 for latest);"
            f" it names {', '.join(named[:20]) or 'none'}"
        )
    return spec.default


def _archive_lso(options: ReadOptions, refs: Sequence[SegmentRef], reader: S3Reader) -> int | None:
    """Under read_committed: the first offset of a transaction open at the archive's end. A
    segment whose producer snapshot is missing or does not parse (Kafka uploads an older
    snapshot that fails its CRC as it is) says nothing: the snapshot of the segment before it
    does, and what follows that segment is past the last stable offset too."""
    if not options.read_committed or not refs:
        return None
    for i in range(len(refs) - 1, -1, -1):
        ongoing = SegmentFiles(reader, refs[i]).ongoing_transactions()
        if ongoing is None:
            continue
        stable = min(ongoing.values()) if ongoing else None
        if i == len(refs) - 1:
            return stable
        cut = refs[i + 1].start_offset
        return cut if stable is None else min(stable, cut)
    return refs[0].start_offset


def _loss(options: ReadOptions, message: str) -> None:
    if options.fail_on_data_loss:
        raise ArchiveDataLossError(
            message + " (set failOnDataLoss=false to read what the archive holds)"
        )


def resolve_ranges(
    options: ReadOptions, catalog: Catalog, reader: S3Reader, pushed: PushedFilters
) -> list[tuple[PartitionRange, list[SegmentRef]]]:
    """Every selected partition's offsets to read, after options and pushed filters."""
    out: list[tuple[PartitionRange, list[SegmentRef]]] = []
    for part in catalog.partitions:
        tp = part.tp
        if not pushed.admits(tp.topic, tp.partition):
            continue
        refs = _refs(options, catalog, part)
        first = part.first_offset
        tiered_end = part.end_offset
        if first is None or tiered_end is None:
            continue
        end_available = tiered_end
        lso = _archive_lso(options, refs, reader)
        if lso is not None:
            end_available = min(end_available, max(first, lso))
        name = f"{tp.topic}-{tp.partition}"
        # start
        if options.starting_timestamp is not None:
            ts = _timestamp_for(options.starting_timestamp, tp.topic, tp.partition, "start")
            found = offset_for_timestamp(part, refs, ts, reader)
            if found is None:
                if options.starting_by_timestamp_strategy == "error":
                    raise SparkOptionError(
                        f"no record of {name} in the archive has a timestamp >= {ts}"
                        " (startingOffsetsByTimestampStrategy=latest starts at the end instead)"
                    )
                found = end_available
            start = found
        else:
            start = _offset_for(options.starting, tp.topic, tp.partition, "startingOffsets")
            if start == EARLIEST:
                start = first
            elif start < first:
                _loss(options, f"offsets {start}..{first - 1} of {name} are not in the archive")
                start = first
        # end
        if options.ending_timestamp is not None:
            ts = _timestamp_for(options.ending_timestamp, tp.topic, tp.partition, "end")
            found = offset_for_timestamp(part, refs, ts, reader)
            end = end_available if found is None else min(found, end_available)
        else:
            end = _offset_for(options.ending, tp.topic, tp.partition, "endingOffsets")
            if end == LATEST:
                end = end_available
            elif end > end_available:
                _loss(
                    options,
                    f"offsets {end_available}..{end - 1} of {name} are not in the archive"
                    f" (it holds {first}..{end_available - 1}"
                    + (" below the last stable offset)" if lso is not None else ")"),
                )
                end = end_available
        if start > end and options.starting_timestamp is None:
            raise SparkOptionError(f"{name}: starting offset {start} is after ending {end}")
        start = max(start, pushed.offset_lo)
        end = min(end, pushed.offset_hi)
        if start >= end:
            continue
        out.append((PartitionRange(part, start, end), refs))
    return out


def _aborted(refs: Sequence[SegmentRef], at: int, reader: S3Reader) -> list[AbortedTxn]:
    wanted = [ref for ref in refs[at:] if not ref.txn_index_empty]
    if not wanted:
        return []
    with ThreadPoolExecutor(max_workers=4) as pool:
        found = pool.map(lambda ref: SegmentFiles(reader, ref).aborted_transactions(), wanted)
        return [txn for txns in found for txn in txns]


def _split(tasks: list[ReadTask], options: ReadOptions) -> list[ReadTask]:
    limit = options.max_records_per_partition
    if limit is not None:
        pieces: list[ReadTask] = []
        for task in tasks:
            lo = task.lo
            while lo < task.hi:
                hi = min(task.hi, lo + limit)
                pieces.append(replace(task, lo=lo, hi=hi))
                lo = hi
        tasks = pieces
    wanted = options.min_partitions
    if wanted is not None and 0 < len(tasks) < wanted:
        total = sum(t.hi - t.lo for t in tasks)
        pieces = []
        for task in tasks:
            count = max(1, round(wanted * (task.hi - task.lo) / max(total, 1)))
            step = -(-(task.hi - task.lo) // count)
            lo = task.lo
            while lo < task.hi:
                pieces.append(replace(task, lo=lo, hi=min(task.hi, lo + step)))
                lo += step
        tasks = pieces
    return tasks


def plan_reads(
    options: ReadOptions, catalog: Catalog, pushed: PushedFilters, reader: S3Reader
) -> list[ReadTask]:
    """The read tasks of a query, in (topic, partition, offset) order."""
    tasks: list[ReadTask] = []
    for resolved, refs in resolve_ranges(options, catalog, reader, pushed):
        part = resolved.spans
        name = f"{part.tp.topic}-{part.tp.partition}"
        chosen: list[tuple[int, SegmentRef, int, int]] = []
        previous_end: int | None = None
        for i, (span, ref) in enumerate(zip(part.spans, refs, strict=True)):
            lo = max(resolved.start, span.start_offset)
            hi = min(resolved.end, span.end_offset + 1)
            if previous_end is not None and span.start_offset > previous_end + 1:
                gap_lo = max(previous_end + 1, resolved.start)
                gap_hi = min(span.start_offset, resolved.end)
                if gap_lo < gap_hi:
                    _loss(options, f"offsets {gap_lo}..{gap_hi - 1} of {name} are missing")
            previous_end = span.end_offset
            if lo >= hi:
                continue
            minimum = pushed.min_timestamp_ms
            if minimum is not None and span.segment.max_timestamp_ms < minimum:
                continue  # segment pruning by max timestamp
            chosen.append((i, ref, lo, hi))
        if not chosen:
            continue
        aborted: list[AbortedTxn] = []
        if options.read_committed:
            aborted = _aborted(refs, chosen[0][0], reader)
        for _i, ref, lo, hi in chosen:
            overlapping = tuple(
                (t.producer_id, t.first_offset, t.last_offset)
                for t in aborted
                if t.last_offset >= lo and t.first_offset < hi
            )
            tasks.append(
                ReadTask(
                    segment=ref,
                    lo=lo,
                    hi=hi,
                    s3=options.s3,
                    include_headers=options.include_headers,
                    read_committed=options.read_committed,
                    aborted=overlapping,
                    min_timestamp_ms=pushed.min_timestamp_ms,
                    verify_crc=options.verify_crc,
                    fail_on_data_loss=options.fail_on_data_loss,
                )
            )
    return _split(tasks, options)
