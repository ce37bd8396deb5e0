"""Benchmark of planning's coverage query on a partition with a long remote history: the whole
lineage (``RemoteSegmentStore.finished_lineage``, every FINISHED segment built) against
``finished_coverage`` from the first local segment (the segments that hold the local offsets,
and the first copy for the floor), side by side in one process, alternating.

Run from the repository root: ``.venv/bin/python tests/bench/bench_coverage.py``
(``--segments`` remote segments in one partition, ``--local`` of them still local,
``--epochs`` leader epochs spread over the history, ``--runs`` rounds). Prints the median
CPU time per call of each and their ratio, and checks that both give the same offsets from the
first local segment on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sidecar.metadata import (
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemoteSegmentStore,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)

SEGMENT_RECORDS = 1000
TP = TopicIdPartition(uuid.UUID(int=7), "bench", 0)
T = TypeVar("T")


def finished_copy(
    tp: TopicIdPartition, start: int, epoch: int = 0
) -> tuple[SegmentMetadata, SegmentMetadataUpdate]:
    """COPY_SEGMENT_STARTED and FINISHED of one segment of ``SEGMENT_RECORDS`` records from
    ``start``, in leader epoch ``epoch``, under a new random segment id."""
    segment_id = RemoteLogSegmentId(tp, uuid.uuid4())
    return (
        SegmentMetadata(
            segment_id=segment_id,
            start_offset=start,
            end_offset=start + SEGMENT_RECORDS - 1,
            broker_id=1,
            max_timestamp_ms=start,
            event_timestamp_ms=1,
            segment_leader_epochs=((epoch, start),),
            segment_size_in_bytes=1 << 20,
            state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
        ),
        SegmentMetadataUpdate(
            segment_id=segment_id,
            event_timestamp_ms=2,
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            broker_id=1,
        ),
    )


def _history(segments: int, epochs: int) -> tuple[list[RemoteLogMetadata], list[tuple[int, int]]]:
    events: list[RemoteLogMetadata] = []
    per_epoch = max(1, segments // epochs)
    lineage: list[tuple[int, int]] = []
    for n in range(segments):
        epoch = min(n // per_epoch, epochs - 1)
        start = n * SEGMENT_RECORDS
        if not lineage or lineage[-1][0] != epoch:
            lineage.append((epoch, start))
        events.extend(finished_copy(TP, start, epoch))
    return events, lineage


def _cpu(call: Callable[[], T]) -> tuple[float, T]:
    started = time.thread_time()
    result = call()
    return time.thread_time() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=20_000)
    parser.add_argument("--local", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = RemoteSegmentStore(tmp)
        events, lineage = _history(args.segments, args.epochs)
        for at in range(0, len(events), 5000):
            store.apply(events[at : at + 5000], consumed={0: at + 5000})
        from_offset = (args.segments - args.local) * SEGMENT_RECORDS
        full_s: list[float] = []
        part_s: list[float] = []
        for _ in range(args.runs):
            spent, spans = _cpu(lambda: store.finished_lineage(TP, lineage))
            full_s.append(spent)
            spent, ranges = _cpu(lambda: store.finished_coverage(TP, lineage, from_offset))
            part_s.append(spent)
        full = [(s.start_offset, s.end_offset) for s in spans]
        tail = [(max(a, from_offset), b) for a, b in full if b >= from_offset]
        assert ranges[0][0] == full[0][0], (ranges[0], full[0])
        assert [r for r in ranges if r[1] >= from_offset] == tail, "coverage differs"
        store.close()
    full_med, part_med = statistics.median(full_s), statistics.median(part_s)
    print(
        f"{args.segments} FINISHED segments in one partition, {args.epochs} epochs,"
        f" {args.local} local; median CPU per call of {args.runs}:"
    )
    print(f"  whole lineage (finished_lineage)          {full_med * 1000:9.1f} ms")
    print(f"  from the first local segment (coverage)   {part_med * 1000:9.1f} ms")
    print(f"  ratio whole / from local                  {full_med / part_med:9.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
