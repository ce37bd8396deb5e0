"""The event-loop watchdog: how late the loop runs a timer, as a histogram and a log line.

Everything the daemon does shares one event loop: uploads, the Kafka clients, the metadata
read-back, the read server and ``/healthz`` (whose probe times out after 1 s). Code that holds
the loop (CPU work, blocking I/O) delays all of them at once. :class:`LoopWatchdog` arms a timer
every 100 ms and measures how much later than asked it runs: that delay
is the longest time the loop could not run anything else during the interval. Every
measurement goes into ``event_loop_lag_seconds``; one above ``threshold_s`` (100 ms) is also
logged as ``event_loop_blocked``, with the CPU time the loop's thread used in that interval:
close to the lag, the loop was busy running code; far below it, the thread was waiting (for the
GIL that worker threads hold, or for a core on a loaded host). When it stops,
``event_loop_lag_summary`` logs the count, the p99 (as Prometheus' ``histogram_quantile``
computes it from the buckets), the maximum, and the most CPU the loop's thread used in one
interval.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Final

from prometheus_client import Histogram

from sidecar.observability.logging import get_logger

__all__ = ["LoopWatchdog"]

log = get_logger(__name__)

#: how long the watchdog sleeps between measurements
DEFAULT_INTERVAL_S: Final = 0.1  # = the threshold: a block that long always spans a wake-up
#: a lag above this is logged
DEFAULT_THRESHOLD_S: Final = 0.1


class LoopWatchdog:
    """Measure the event loop's lag every ``interval_s`` until ``stopping`` is set.

    ``max_lag_s`` and ``measurements`` summarise what was measured since the watchdog was
    created (tests and benchmarks read them); ``measured`` is set after every measurement.
    """

    def __init__(
        self,
        *,
        histogram: Histogram,
        interval_s: float = DEFAULT_INTERVAL_S,
        threshold_s: float = DEFAULT_THRESHOLD_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._histogram = histogram
        self._interval_s = interval_s
        self._threshold_s = threshold_s
        self.max_lag_s = 0.0
        self.max_cpu_s = 0.0
        self.measurements = 0
        self.blocked = 0
        self.measured = asyncio.Event()

    def observe(self, lag_s: float, cpu_s: float = 0.0) -> None:
        """Record one measured lag (negative values, timer rounding, count as zero) and the CPU
        time the loop's thread used in the interval."""
        lag_s = max(0.0, lag_s)
        self._histogram.observe(lag_s)
        self.measurements += 1
        self.max_lag_s = max(self.max_lag_s, lag_s)
        self.max_cpu_s = max(self.max_cpu_s, cpu_s)
        if lag_s > self._threshold_s:
            self.blocked += 1
            log.warning(
                "event_loop_blocked",
                lag_seconds=round(lag_s, 3),
                loop_cpu_seconds=round(cpu_s, 3),
                threshold_seconds=self._threshold_s,
            )
        self.measured.set()

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the lags in the histogram, interpolated within its bucket (as
        Prometheus' ``histogram_quantile``), at most the largest lag measured."""
        buckets = [
            (float(sample.labels["le"]), sample.value)
            for metric in self._histogram.collect()
            for sample in metric.samples
            if sample.name.endswith("_bucket")
        ]
        total = buckets[-1][1] if buckets else 0.0
        if not total:
            return 0.0
        rank = q * total
        lower, below = 0.0, 0.0
        for bound, cumulative in buckets:
            if cumulative >= rank:
                if math.isinf(bound) or cumulative == below:
                    return self.max_lag_s if math.isinf(bound) else min(bound, self.max_lag_s)
                found = lower + (bound - lower) * (rank - below) / (cumulative - below)
                return min(found, self.max_lag_s)
            lower, below = bound, cumulative
        return self.max_lag_s

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task: a timer every ``interval_s`` records how late it ran, until ``stopping``.

        A plain timer callback, not a task sleeping in a loop: it runs ten times a second for
        the daemon's life, and a task's sleep and wake-up cost about twice the callback's CPU
        (measured: a quarter of a percent of a core at 20 Hz)."""
        loop = asyncio.get_running_loop()
        interval = self._interval_s
        handle: asyncio.TimerHandle

        def tick(due: float, cpu: float) -> None:
            nonlocal handle
            now, cpu_now = time.monotonic(), time.thread_time()
            self.observe(now - due, cpu_now - cpu)
            handle = loop.call_later(interval, tick, now + interval, cpu_now)

        handle = loop.call_later(interval, tick, time.monotonic() + interval, time.thread_time())
        try:
            await stopping.wait()
        finally:
            handle.cancel()
            log.info(
                "event_loop_lag_summary",
                measurements=self.measurements,
                blocked=self.blocked,
                p99_seconds=round(self.quantile(0.99), 4),
                max_seconds=round(self.max_lag_s, 4),
                max_loop_cpu_seconds=round(self.max_cpu_s, 4),
            )
