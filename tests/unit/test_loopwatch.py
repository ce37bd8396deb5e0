"""The event-loop watchdog: lag measured into the histogram, a log line for a blocked loop,
a clean stop."""

from __future__ import annotations

import asyncio
import time

import pytest
from structlog.testing import capture_logs

from sidecar._aio import guard
from sidecar.observability.loopwatch import LoopWatchdog
from sidecar.observability.metrics import Metrics

LAG = "kafka_tiered_sidecar_event_loop_lag_seconds"


def _above(metrics: Metrics, bound: float) -> float:
    """Observations of the lag histogram above ``bound`` (one of its bucket bounds)."""
    registry = metrics.registry
    count = registry.get_sample_value(f"{LAG}_count")
    below = registry.get_sample_value(f"{LAG}_bucket", {"le": str(bound)})
    assert count is not None
    assert below is not None
    return count - below


class TestLoopWatchdog:
    async def test_a_blocked_loop_is_observed_and_logged(self):
        """A 300 ms blocking call on the loop is one observation above 0.1 s and one
        ``event_loop_blocked`` line."""
        metrics = Metrics()
        watchdog = LoopWatchdog(histogram=metrics.event_loop_lag, interval_s=0.02)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(watchdog.run(stopping))
            await watchdog.measured.wait()  # it runs: the next wake-up is due in 20 ms
            watchdog.measured.clear()
            time.sleep(0.3)  # the block under test
            await watchdog.measured.wait()
            stopping.set()
            await task
        assert _above(metrics, 0.1) >= 1
        assert watchdog.max_lag_s >= 0.25  # 300 ms minus at most one interval
        blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
        assert [e for e in blocked if e["lag_seconds"] >= 0.25]
        assert blocked[0]["log_level"] == "warning"
        assert blocked[0]["threshold_seconds"] == 0.1
        # time.sleep holds the loop without using CPU: told apart from a busy loop
        assert [e for e in blocked if e["loop_cpu_seconds"] < e["lag_seconds"] / 2]
        (summary,) = [e for e in logs if e["event"] == "event_loop_lag_summary"]
        assert summary["max_seconds"] >= 0.25
        assert summary["measurements"] == watchdog.measurements

    def test_lag_below_the_threshold_is_only_counted(self):
        """Small lags go into the histogram without a log line; timer rounding below zero
        counts as zero."""
        metrics = Metrics()
        watchdog = LoopWatchdog(histogram=metrics.event_loop_lag)
        with capture_logs() as logs:
            watchdog.observe(0.004)
            watchdog.observe(-0.001)
        assert logs == []
        assert watchdog.measurements == 2
        assert watchdog.max_lag_s == 0.004
        assert metrics.registry.get_sample_value(f"{LAG}_bucket", {"le": "0.001"}) == 1

    async def test_stops_when_asked(self):
        """Under the root-task guard, setting ``stopping`` ends the watchdog without error and
        without waiting for its next wake-up."""
        watchdog = LoopWatchdog(histogram=Metrics().event_loop_lag, interval_s=3600)
        stopping = asyncio.Event()
        task = asyncio.create_task(guard(watchdog.run(stopping), name="w", stopping=stopping))
        await asyncio.sleep(0)
        stopping.set()
        await task  # an interval of an hour: this returns only because stopping ended it
        assert watchdog.measurements == 0

    def test_quantile_follows_the_buckets(self):
        """The p99 is interpolated within the bucket that holds it, as Prometheus computes it,
        and never above the largest lag measured."""
        watchdog = LoopWatchdog(histogram=Metrics().event_loop_lag)
        assert watchdog.quantile(0.99) == 0.0
        for _ in range(99):
            watchdog.observe(0.0005)
        watchdog.observe(0.07)
        assert watchdog.quantile(0.5) == pytest.approx(0.001 * 50 / 99)
        assert 0.05 < watchdog.quantile(0.995) <= 0.07
        watchdog.observe(20.0)  # past the last bucket
        assert watchdog.quantile(1.0) == 20.0

    async def test_a_busy_loop_shows_its_cpu_time(self):
        """A loop held by CPU work (not a sleep) logs that CPU time with the lag."""
        watchdog = LoopWatchdog(histogram=Metrics().event_loop_lag, interval_s=0.02)
        stopping = asyncio.Event()
        with capture_logs() as logs:
            task = asyncio.create_task(watchdog.run(stopping))
            await watchdog.measured.wait()
            watchdog.measured.clear()
            spin_until = time.thread_time() + 0.3  # 300 ms of this thread's CPU
            while time.thread_time() < spin_until:
                pass
            await watchdog.measured.wait()
            stopping.set()
            await task
        assert watchdog.max_cpu_s >= 0.25
        blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
        assert [e for e in blocked if e["loop_cpu_seconds"] >= 0.25]

    def test_rejects_a_non_positive_interval(self):
        """An interval of zero would spin the loop."""
        with pytest.raises(ValueError, match="interval_s"):
            LoopWatchdog(histogram=Metrics().event_loop_lag, interval_s=0)
