"""Benchmark of the eager stager at rest: the CPU an idle broker-driven broker spends looking
for segments to upload ahead of the broker's copy.

The stager (``sidecar.tiering.eager.EagerStager``) passes over its partitions once a second
and on every poke: over every partition every ``full_pass_interval_s`` (30 s) or on a new
picture of the cluster, and between those over the partitions something happened to (a roll,
an LSO that moved, work left over). ``--partitions`` broker-driven partitions, all led by this
broker, each with two rolled segments already staged (a first, unmeasured pass stages them
into the in-memory object store) and an active one; the metadata store is a real
``RemoteSegmentStore``. The scans are one partition written with ``sidecar.testing`` and its
copies under other partition numbers, in a ``ViewMap`` as the detector keeps them; nothing
changes during the measurement. The cluster and the tailer are stand-ins that answer at once
(a fresh view, every partition led, its metadata read). The stager's clock is moved by the
script, so each measured pass is of the kind intended.

Measured in one process: the CPU of a pass over every partition and of a pass between two of
them (medians of ``--passes`` each). Printed: % of one core at the daemon's cadence for the
stager, and, side by side, for passes over every partition every second (the baseline: the
same stager without the passes between; its plans are reused all the same), and their
ratio. The design's target for a whole idle daemon is <= 2 % of one core at 10,000
partitions.

    .venv/bin/python tests/bench/bench_stager_idle.py                    # 10,000 partitions
    .venv/bin/python tests/bench/bench_stager_idle.py --partitions 2000 --passes 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sidecar.kafka.logdir import PartitionScan, scan_partition_dir  # noqa: E402
from sidecar.metadata.store import RemoteSegmentStore  # noqa: E402
from sidecar.observability.metrics import Metrics  # noqa: E402
from sidecar.storage.keys import KeyLayout  # noqa: E402
from sidecar.storage.memory import MemoryObjectStore  # noqa: E402
from sidecar.testing import TestRecord, build_batch, write_partition  # noqa: E402
from sidecar.tiering.cluster import ClusterView, TopicConfig, TopicSelector  # noqa: E402
from sidecar.tiering.detector import ViewMap  # noqa: E402
from sidecar.tiering.eager import EagerStager, StagingLedger  # noqa: E402

TOPIC = "orders"
#: the stager's default ``full_pass_interval_s``
FULL_PASS_S = 30.0
TOPIC_ID = uuid.UUID(int=0xBE7C4 << 64 | 1)


class _Cluster:
    """The cluster watcher as the stager sees it: one broker-driven topic, all led here."""

    def __init__(self, partitions: int) -> None:
        self.view = ClusterView(
            broker_id=1,
            leaders={(TOPIC, p): 1 for p in range(partitions)},
            configs={TOPIC: TopicConfig(remote_storage_enable=True)},
            last_stable_offsets={(TOPIC, p): 1_000_000 for p in range(partitions)},
            refreshed_at=time.monotonic(),
            stale_after_s=86_400,
        )
        self.broker_runs_plugin = True

    def broker_copies(self, topic: str) -> bool:
        return TopicSelector.broker_copies(self.view.configs.get(topic))

    async def fetch_lso(self, topic: str, partition: int) -> int | None:
        return self.view.lso(topic, partition)


class _Tailer:
    def wants(self, tp: object) -> bool:
        return True

    def caught_up(self, metadata_partition: int) -> bool:
        return True


def _views(root: Path, partitions: int) -> ViewMap[PartitionScan]:
    batches = [
        [build_batch([TestRecord(value=b"v" * 200) for _ in range(10)], base_offset=base)]
        for base in (0, 10, 20)
    ]
    one = write_partition(root / "data", TOPIC, 0, batches, topic_id=TOPIC_ID)
    scan = scan_partition_dir(one)
    assert scan is not None
    assert len(scan.segments) == 3
    views: ViewMap[PartitionScan] = ViewMap()
    for p in range(partitions):
        views[root / "data" / f"{TOPIC}-{p}"] = dataclasses.replace(scan, partition=p)
    return views


async def _measure(root: Path, partitions: int, passes: int) -> tuple[float, float]:
    """CPU seconds of one pass over every partition, and of one pass between two of those
    (medians of ``passes`` each), after a first pass that stages every rolled segment."""
    clock = [time.monotonic()]
    store = RemoteSegmentStore(root / "state")
    stager = EagerStager(
        objects=MemoryObjectStore(),
        layout=KeyLayout(prefix="bench/"),
        views=lambda: views,
        cluster=_Cluster(partitions),  # type: ignore[arg-type]
        store=store,
        tailer=_Tailer(),  # type: ignore[arg-type]
        ledger=StagingLedger(),
        metrics=Metrics(),
        num_metadata_partitions=50,
        part_size=8 * 1024 * 1024,
        concurrency=2,
        full_pass_interval_s=FULL_PASS_S,
        monotonic=lambda: clock[0],
    )
    views = _views(root / "views", partitions)
    stopping = asyncio.Event()
    full: list[float] = []
    between: list[float] = []
    try:
        await stager._pass(stopping)  # stages every rolled segment: not measured
        for _ in range(passes):
            clock[0] += FULL_PASS_S  # time for a pass over every partition
            cpu = time.process_time()
            await stager._pass(stopping)
            full.append(time.process_time() - cpu)
            clock[0] += 1.0  # the next wake-up
            cpu = time.process_time()
            await stager._pass(stopping)
            between.append(time.process_time() - cpu)
    finally:
        store.close()
    return statistics.median(full), statistics.median(between)


def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-stager-") as tmp:
        full, between = asyncio.run(_measure(Path(tmp), args.partitions, args.passes))
    # the daemon's cadence: a pass a second, one in FULL_PASS_S of them over every partition
    stager = 100.0 * (full + (FULL_PASS_S - 1) * between) / FULL_PASS_S
    walk_all = 100.0 * full
    print(
        f"eager stager at rest, {args.partitions} broker-driven partitions led here, "
        f"medians of {args.passes} passes of each kind"
    )
    print(f"  pass over every partition      {1000 * full:9.2f} ms CPU")
    print(f"  pass between two of those      {1000 * between:9.2f} ms CPU")
    print(f"  {'contender':<34}{'% of one core at a pass a second':>34}")
    print(f"  {'stager (all every 30 s)':<34}{stager:>34.3f}")
    print(f"  {'every pass over all':<34}{walk_all:>34.3f}")
    print(f"  stager / every pass over all: {stager / max(walk_all, 1e-9):.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=5, help="passes of each kind measured")
    _main(parser.parse_args())


if __name__ == "__main__":
    main()
