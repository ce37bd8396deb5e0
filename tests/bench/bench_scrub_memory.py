"""Benchmark of the orphan scrub's memory for the live segment ids it holds while it lists the
prefix: the scrub's own snapshot (``sidecar.retention.scrub._live_segments``, ids as 128-bit
integers) against the same snapshot keyed by ``uuid.UUID`` objects (how it was kept before), built
from the same store in the same process, each measured with ``tracemalloc`` while it is held.

Run from the repository root: ``.venv/bin/python tests/bench/bench_scrub_memory.py``
(``--segments`` FINISHED segments over ``--partitions`` partitions). Prints the bytes each
snapshot holds, per million segments, and the scrub's peak: it used to hold two snapshots at
once (the second read before the first was dropped), now one.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sidecar.metadata import (
    RemoteLogMetadata,
    RemoteLogSegmentState,
    RemoteSegmentStore,
    TopicIdPartition,
)
from sidecar.retention.scrub import _live_segments
from tests.bench.bench_coverage import SEGMENT_RECORDS, finished_copy


def _events(segments: int, partitions: int) -> list[RemoteLogMetadata]:
    tps = [TopicIdPartition(uuid.UUID(int=p + 1), "bench", p) for p in range(partitions)]
    events: list[RemoteLogMetadata] = []
    for n in range(segments):
        events.extend(finished_copy(tps[n % partitions], (n // partitions) * SEGMENT_RECORDS))
    return events


def _uuid_keyed(store: RemoteSegmentStore) -> dict[uuid.UUID, RemoteLogSegmentState]:
    """The same snapshot with the segment ids as ``uuid.UUID`` keys."""
    return {
        segment.segment_id.id: segment.state
        for tp in store.partitions()
        for segment in store.segments(tp)
    }


def _held(build: Callable[[], object]) -> int:
    """Bytes still allocated while the result of ``build`` is held."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = build()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del result
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = RemoteSegmentStore(tmp)
        events = _events(args.segments, args.partitions)
        for at in range(0, len(events), 5000):
            store.apply(events[at : at + 5000], consumed={0: at + 5000})
        del events
        ints = _held(lambda: _live_segments(store))
        uuids = _held(lambda: _uuid_keyed(store))
        assert len(_live_segments(store)) == len(_uuid_keyed(store)) == args.segments
        store.close()
    per_million = 1_000_000 / args.segments / 2**20
    print(f"{args.segments} FINISHED segments over {args.partitions} partitions:")
    print(f"  snapshot, integer ids (the scrub's)   {ints * per_million:8.1f} MiB per million")
    print(f"  snapshot, UUID ids (before)           {uuids * per_million:8.1f} MiB per million")
    print(f"  ratio UUID / integer                  {uuids / ints:8.2f}x")
    print(
        f"  scrub's peak: one integer snapshot {ints * per_million:.1f} MiB against two UUID"
        f" snapshots {2 * uuids * per_million:.1f} MiB per million ({2 * uuids / ints:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
