"""Benchmark of the daemon's first scan of a broker with many partitions: the event-loop lag
while it runs (goal p99 < 100 ms).

``--partitions`` partition directories (default 10,000) of ``--segments`` segments each are
built with ``sidecar.testing.write_partition`` (one directory written, the others hard links to
its files: the detector reads names, sizes and the checkpoint files, not contents). A
:class:`sidecar.app.Daemon` is created as ``sidecar run`` creates it, its log-dir detector runs
one full scan (the scan in a worker thread; merging the ten thousand new views on the event
loop: a ``partition_discovered`` log line each, JSON to ``/dev/null``, the local-segment
gauges, the readiness summary), and a :class:`sidecar.observability.loopwatch.LoopWatchdog`
measures the loop meanwhile. Printed: the scan's time, the lag's p99 and max, the intervals
over 100 ms, the most CPU the loop's thread used in one 50 ms interval, and the gauges (checked
against the views).

    .venv/bin/python tests/bench/bench_first_scan.py                      # 10,000 x 3
    .venv/bin/python tests/bench/bench_first_scan.py --partitions 4000 --segments 10
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sidecar.app import Daemon
from sidecar.config import SidecarConfig
from sidecar.observability.logging import configure_logging
from sidecar.observability.loopwatch import LoopWatchdog
from sidecar.testing import TestRecord, build_batch, write_partition

NS = "kafka_tiered_sidecar_"


def build(log_dir: Path, partitions: int, segments: int) -> None:
    """``partitions`` directories ``t<i>-0``: one written, the rest hard links to its files."""
    batches = [[build_batch([TestRecord(b"k", b"v" * 100)])] for _ in range(segments)]
    template = write_partition(log_dir, "t0", 0, batches)
    files = sorted(template.iterdir())
    for i in range(1, partitions):
        directory = log_dir / f"t{i}-0"
        directory.mkdir()
        for path in files:
            os.link(path, directory / path.name)


class _Recording(LoopWatchdog):
    """The watchdog, keeping (lag, loop CPU) of the intervals over 100 ms."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slow: list[tuple[float, float]] = []

    def observe(self, lag_s: float, cpu_s: float = 0.0) -> None:
        super().observe(lag_s, cpu_s)
        if lag_s > 0.1:
            self.slow.append((lag_s, cpu_s))


async def first_scan(config: SidecarConfig) -> tuple[Daemon, _Recording, float]:
    daemon = Daemon(config)
    watchdog = _Recording(histogram=daemon.metrics.event_loop_lag)
    stopping = asyncio.Event()
    watching = asyncio.create_task(watchdog.run(stopping))
    await watchdog.measured.wait()
    started = time.perf_counter()
    ready = asyncio.create_task(daemon._mark_ready_after_first_scan())  # the readiness summary
    await daemon.detector.scan_once()
    await ready
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0.2)  # a few measurements after it, like any other moment
    stopping.set()
    await watching
    return daemon, watchdog, elapsed


class _FullCollections:
    """Durations of the cyclic GC's full (generation 2) collections, in any thread."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds.append(time.perf_counter() - self._started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--segments", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-first-scan-"))
    try:
        t0 = time.perf_counter()
        build(root / "logs", args.partitions, args.segments)
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python"
            f" {platform.python_version()}; load average {os.getloadavg()[0]:.1f}"
        )
        print(
            f"built {args.partitions} partitions x {args.segments} segments in"
            f" {time.perf_counter() - t0:.1f} s"
        )
        config = SidecarConfig.model_validate(
            {
                "state_dir": str(root / "state"),
                "broker": {"log_dirs": [str(root / "logs")], "broker_id": 1},
            }
        )
        collections = _FullCollections()
        gc.callbacks.append(collections)
        with Path(os.devnull).open("w") as sink:
            configure_logging(level="INFO", fmt="json", stream=sink)
            daemon, watchdog, elapsed = asyncio.run(first_scan(config))
        gc.callbacks.remove(collections)
        views = daemon.detector.views.values()
        registry = daemon.metrics.registry
        watched = registry.get_sample_value(NS + "partitions_watched")
        rolled = registry.get_sample_value(NS + "local_segments", {"state": "rolled"})
        assert watched == len(views) == args.partitions, (watched, len(views))
        assert rolled == sum(len(v.segments) - 1 for v in views), rolled
        p99 = watchdog.quantile(0.99)
        print(f"first scan (thread scan + loop merge)   {elapsed:.2f} s")
        print(
            f"event-loop lag                          p99 {p99 * 1000:.1f} ms, max"
            f" {watchdog.max_lag_s * 1000:.1f} ms over {watchdog.measurements} measurements,"
            f" {watchdog.blocked} > 100 ms   (goal p99 < 100 ms:"
            f" {'met' if p99 < 0.1 else 'NOT met'})"
        )
        print(f"loop thread CPU in one 50 ms interval   max {watchdog.max_cpu_s * 1000:.1f} ms")
        slow = ", ".join(f"{lag * 1000:.0f}/{cpu * 1000:.0f}" for lag, cpu in watchdog.slow[:12])
        print(f"intervals > 100 ms, lag/loop CPU in ms   {slow or '-'}")
        longest = max(collections.seconds, default=0.0)
        print(
            f"full GC collections (any thread)        {len(collections.seconds)},"
            f" longest {longest * 1000:.0f} ms"
        )
        print(
            f"gauges                                  {watched:.0f} partitions, {rolled:.0f} rolled"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
