"""SelectionMonitor: a daemon that selects nothing says so at once and every hour; the count of
tiered partitions this broker leads."""

from __future__ import annotations

import structlog

from sidecar.tiering.selection import SelectionMonitor, broker_plugin_gauge, count_led


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _monitor(clock: FakeClock, gauge: list[int], details: dict[str, object]) -> SelectionMonitor:
    return SelectionMonitor(
        include_topics=[],
        set_gauge=gauge.append,
        set_detail=details.__setitem__,
        warn_interval_s=3600,
        clock=clock,
    )


class TestSelectionMonitor:
    def test_warns_at_once_then_hourly_while_nothing_is_selected(self):
        """The first empty count warns with the setting to add; the next warning waits an
        hour; the gauge and the /readyz detail show 0."""
        clock, gauge, details = FakeClock(), [], {}
        monitor = _monitor(clock, gauge, details)
        partitions = {"orders": 2}
        with structlog.testing.capture_logs() as logs:
            monitor.update(partitions, lambda _t: False)
            clock.now = 3599
            monitor.update(partitions, lambda _t: False)
            clock.now = 3600
            monitor.update(partitions, lambda _t: False)
        warnings = [e for e in logs if e["event"] == "no_partition_selected"]
        assert len(warnings) == 2
        assert warnings[0]["log_level"] == "warning"
        assert "include_topics" in warnings[0]["hint"]
        assert warnings[0]["partitions_in_log_dirs"] == 2
        assert gauge == [0, 0, 0]
        assert details == {"selected_partitions": 0}

    def test_selected_partitions_are_counted_and_silence_the_warning(self):
        """Once a topic is selected the count is exported and nothing is logged; losing the
        selection again warns at once."""
        clock, gauge, details = FakeClock(), [], {}
        monitor = _monitor(clock, gauge, details)
        partitions = {"orders": 2, "audit": 1}
        with structlog.testing.capture_logs() as logs:
            assert monitor.update(partitions, lambda t: t == "orders") == 2
            clock.now = 10
            assert monitor.update(partitions, lambda _t: False) == 0
        assert [e["event"] for e in logs] == ["no_partition_selected"]
        assert details == {"selected_partitions": 0}
        assert gauge == [2, 0]


def test_led_partitions_of_tiered_topics_are_counted_asking_once_per_topic() -> None:
    leaders = {
        ("orders", 0): 1,
        ("orders", 1): 2,
        ("orders", 2): 1,
        ("clicks", 0): 1,
        ("__consumer_offsets", 0): 1,
        ("nowhere", 0): -1,
    }
    asked: list[str] = []

    def tiered(topic: str) -> bool:
        asked.append(topic)
        return topic in ("orders", "clicks")

    assert count_led(leaders, 1, tiered) == 3
    assert sorted(asked) == ["__consumer_offsets", "clicks", "orders"]
    assert count_led(leaders, 2, tiered) == 1
    assert count_led(leaders, None, tiered) == 0  # the broker's id is not known yet


def test_the_plugin_gauge_is_0_only_where_a_topic_is_copied_by_another_class() -> None:
    """A standalone-only sidecar beside a broker rightly without the plugin is not flagged."""
    assert broker_plugin_gauge(True, True) == 1
    assert broker_plugin_gauge(True, False) == 1
    assert broker_plugin_gauge(False, True) == 0
    assert broker_plugin_gauge(False, False) == -1
    assert broker_plugin_gauge(None, True) == -1
