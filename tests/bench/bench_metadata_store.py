"""Benchmark of the local metadata store (sidecar/metadata/store.py): replaying 1,000,000 remote
log metadata events, and reopening the store they produced (design target: restart until ready
<= 5 s, which requires that opening never re-reads the events).

Run from the repository root: ``.venv/bin/python tests/bench/bench_metadata_store.py``
(``--events``/``--partitions`` to scale, ``--dir`` to keep the store). Prints events/s for
``store.apply`` alone and for decode + apply (what the tailer does per record), then the time to
open the existing store and answer the first queries the sidecar makes when it starts.

The synthetic history: user partitions take turns; each turn copies one segment
(COPY_SEGMENT_STARTED then COPY_SEGMENT_FINISHED), every 40th copy of a partition follows a leader
change and re-uploads the previous segment's range extended (a superseded duplicate), and once a
partition holds 300 live segments each turn also deletes its oldest (DELETE_SEGMENT_STARTED then
DELETE_SEGMENT_FINISHED). Each user partition's events sit on its metadata partition (50 of them)
and are applied as the tailer reads them: metadata partition by metadata partition, one store
transaction per fetch of BATCH records, with the consumed offset.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sidecar.metadata import (
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemoteSegmentStore,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
    decode,
    encode,
    metadata_partition,
)

SEGMENT_RECORDS = 1000
LIVE_SEGMENTS = 300
LEADER_CHANGE_EVERY = 40
#: records per store transaction: the tailer applies each fetch (at most 5000 records, its
#: ``max_batch_records`` default) in one transaction; override with BENCH_BATCH
BATCH = int(os.environ.get("BENCH_BATCH", "5000"))


@dataclass
class _Partition:
    tp: TopicIdPartition
    epoch: int = 0
    next_offset: int = 0
    copies: int = 0
    live: deque[RemoteLogSegmentId] = field(default_factory=deque)
    last: SegmentMetadata | None = None


def _copy(part: _Partition, start: int, end: int, epochs: tuple[tuple[int, int], ...]):
    segment_id = RemoteLogSegmentId(part.tp, uuid.uuid4())
    started = SegmentMetadata(
        segment_id=segment_id,
        start_offset=start,
        end_offset=end,
        broker_id=1,
        max_timestamp_ms=1_700_000_000_000 + end,
        event_timestamp_ms=1_700_000_000_000 + end,
        segment_leader_epochs=epochs,
        segment_size_in_bytes=1 << 20,
    )
    finished = _update(segment_id, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    part.live.append(segment_id)
    part.last = started
    return started, finished


def _update(segment_id: RemoteLogSegmentId, state: RemoteLogSegmentState) -> SegmentMetadataUpdate:
    return SegmentMetadataUpdate(
        segment_id=segment_id, broker_id=1, event_timestamp_ms=1_700_000_000_000, state=state
    )


def _partition_history(parts: list[_Partition], total: int) -> Iterator[RemoteLogMetadata]:
    """``total`` events of ``parts``, which take turns, as described in the module docstring."""
    produced = 0
    while produced < total:
        for part in parts:
            events: list[RemoteLogMetadata] = []
            part.copies += 1
            if part.last is not None and part.copies % LEADER_CHANGE_EVERY == 0:
                # a new leader re-uploads the previous segment's range, extended (a duplicate)
                old = part.last
                part.epoch += 1
                start, end = old.start_offset, part.next_offset + SEGMENT_RECORDS - 1
                epochs = (*old.segment_leader_epochs, (part.epoch, part.next_offset))
            else:
                start, end = part.next_offset, part.next_offset + SEGMENT_RECORDS - 1
                epochs = ((part.epoch, start),)
            events += _copy(part, start, end, epochs)
            part.next_offset = end + 1
            if len(part.live) > LIVE_SEGMENTS:
                oldest = part.live.popleft()
                events.append(_update(oldest, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
                events.append(_update(oldest, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
            for event in events[: total - produced]:
                yield event
                produced += 1
            if produced >= total:
                return


def synthetic_topic(
    total: int, partitions: int, metadata_partitions: int = 50
) -> Iterator[tuple[int, int, list[RemoteLogMetadata]]]:
    """``total`` events as the tailer reads them from a metadata topic: the user partitions'
    histories, each on its metadata partition, fetched partition by partition in chunks of
    BATCH records; yields (metadata partition, offset of the chunk's last record, events)."""
    parts = [
        _Partition(TopicIdPartition(uuid.UUID(int=1 + i // 10), f"topic-{i // 10}", i % 10))
        for i in range(partitions)
    ]
    by_metadata_partition: dict[int, list[_Partition]] = {}
    for part in parts:
        by_metadata_partition.setdefault(
            metadata_partition(part.tp, metadata_partitions), []
        ).append(part)
    remaining = total
    for index, (mp, members) in enumerate(sorted(by_metadata_partition.items())):
        last = index == len(by_metadata_partition) - 1
        share = remaining if last else total * len(members) // partitions
        remaining -= share
        offset = -1
        chunk: list[RemoteLogMetadata] = []
        for event in _partition_history(members, share):
            chunk.append(event)
            if len(chunk) == BATCH:
                offset += len(chunk)
                yield mp, offset, chunk
                chunk = []
        if chunk:
            yield mp, offset + len(chunk), chunk


def bench_apply(directory: Path, total: int, partitions: int) -> tuple[float, float]:
    """Apply ``total`` events; return (seconds in store.apply, seconds decoding a sample)."""
    applied_s = 0.0
    decode_s = 0.0
    decoded = 0
    with RemoteSegmentStore(directory) as store:
        for mp, offset, batch in synthetic_topic(total, partitions):
            if decoded < 200_000:  # decode a sample of encoded values (the tailer's other cost)
                values = [encode(event) for event in batch]  # type: ignore[arg-type]
                t0 = time.perf_counter()
                for value in values:
                    decode(value)
                decode_s += time.perf_counter() - t0
                decoded += len(values)
            t0 = time.perf_counter()
            result = store.apply(batch, consumed={mp: offset})
            applied_s += time.perf_counter() - t0
            assert not result.rejected, result.rejected[:3]
        counters = store.counters()
        assert counters.applied == total, counters
    return applied_s, decode_s / decoded


def bench_open(directory: Path, partitions: int) -> dict[str, float]:
    """Reopen the store and answer a start-up's first queries; return seconds per step."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    store = RemoteSegmentStore(directory)
    timings["open"] = time.perf_counter() - t0
    try:
        t = time.perf_counter()
        consumed = store.consumed_offsets()
        timings["consumed offsets"] = time.perf_counter() - t
        assert consumed, "no consumed offsets were stored"
        t = time.perf_counter()
        store.unfinished_copies()
        store.unfinished_deletes()
        timings["unfinished copies and deletes (all partitions)"] = time.perf_counter() - t
        tp = TopicIdPartition(uuid.UUID(int=1 + (partitions - 1) // 10), "", 0)
        tp = TopicIdPartition(tp.topic_id, f"topic-{(partitions - 1) // 10}", (partitions - 1) % 10)
        t = time.perf_counter()
        segments = store.segments(tp)
        timings[f"segments(tp) ({len(segments)} segments)"] = time.perf_counter() - t
        t = time.perf_counter()
        lineage = store.finished_lineage(tp)
        timings[f"finished_lineage(tp) ({len(lineage)} spans)"] = time.perf_counter() - t
        t = time.perf_counter()
        assert store.is_tiered(tp, segments[-1].start_offset, segments[-1].end_offset)
        timings["is_tiered"] = time.perf_counter() - t
        timings["until ready"] = time.perf_counter() - t0
    finally:
        store.close()
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None, help="keep the store here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-metadata-store-") as tmp:
        directory = args.dir or Path(tmp)
        applied_s, decode_per_event = bench_apply(directory, args.events, args.partitions)
        size = (directory / "metadata.sqlite3").stat().st_size
        print(f"events: {args.events:,} over {args.partitions:,} user partitions")
        print(
            f"store.apply: {applied_s:.2f} s, {args.events / applied_s:,.0f} events/s"
            f" (batches of {BATCH})"
        )
        per_event = applied_s / args.events + decode_per_event
        print(
            f"decode: {decode_per_event * 1e6:.1f} us/event;"
            f" decode + apply: {1 / per_event:,.0f} events/s"
        )
        print(f"store file: {size / 2**20:.1f} MiB")
        for step, seconds in bench_open(directory, args.partitions).items():
            print(f"reopen, {step}: {seconds * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
