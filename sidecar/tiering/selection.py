"""Says, loudly and repeatedly, when the sidecar tiers nothing.

Out of the box nothing is tiered: a topic is selected by ``remote.storage.enable=true`` (which a
broker without KIP-405 refuses unless the sidecar's plugin is installed) or by a
``tiering.include_topics`` pattern, and the default is an empty list. A daemon that selects no
partition of its broker's log dirs would otherwise look healthy while uploading nothing.

:class:`SelectionMonitor` counts the selected partitions of the log dirs each time it is asked,
from the number of partitions of each topic (at ten thousand partitions a walk over every
partition, once per cluster refresh, was a large part of an idle daemon's work). It exports
the count (``selected_partitions`` gauge, ``/readyz`` detail), and logs
``no_partition_selected`` at WARNING, with the exact setting to add, on the first evaluation
and every ``warn_interval_s`` (an hour) while the count stays 0. It never changes readiness:
a sidecar beside a broker with no tiered topic yet is still a healthy sidecar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import structlog

__all__ = ["SelectionMonitor", "broker_plugin_gauge", "count_led"]

log = structlog.get_logger(__name__)

#: how often the warning repeats while nothing is selected
WARN_INTERVAL_S = 3600.0


class SelectionMonitor:
    """Counts selected partitions and warns while there are none."""

    def __init__(
        self,
        *,
        include_topics: Iterable[str],
        set_gauge: Callable[[int], None],
        set_detail: Callable[[str, object], None],
        warn_interval_s: float = WARN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._include = list(include_topics)
        self._set_gauge = set_gauge
        self._set_detail = set_detail
        self._warn_interval_s = warn_interval_s
        self._clock = clock
        self._next_warning: float | None = None  # None: warn at the next empty evaluation
        self.count: int | None = None

    def update(self, per_topic: Mapping[str, int], selected: Callable[[str], bool]) -> int:
        """Count the partitions of the log dirs whose topic ``selected`` accepts, from the
        number of partitions of each topic (``per_topic``); call once the cluster's topic
        configs are known."""
        count = sum(n for topic, n in per_topic.items() if selected(topic))
        self.count = count
        self._set_gauge(count)
        self._set_detail("selected_partitions", count)
        now = self._clock()
        if count > 0:
            self._next_warning = None
            return count
        if self._next_warning is None or now >= self._next_warning:
            self._next_warning = now + self._warn_interval_s
            log.warning(
                "no_partition_selected",
                partitions_in_log_dirs=sum(per_topic.values()),
                include_topics=self._include,
                hint=(
                    "nothing will be tiered: add the topics to tier under [tiering], e.g."
                    ' include_topics = ["orders.*"] (SIDECAR_TIERING__INCLUDE_TOPICS=orders.*),'
                    " or set remote.storage.enable=true on topics of a broker that runs the"
                    " sidecar's broker plugin (deploy/kafka-plugin)"
                ),
            )
        return count


def count_led(
    leaders: Mapping[tuple[str, int], int], broker_id: int | None, tiered: Callable[[str], bool]
) -> int:
    """The partitions ``broker_id`` leads whose topic is tiered (standalone or broker-driven):
    the ``partitions_led`` gauge. ``tiered`` is asked once per topic."""
    if broker_id is None:
        return 0
    topics: dict[str, bool] = {}
    count = 0
    for (topic, _partition), leader in leaders.items():
        if leader != broker_id:
            continue
        is_tiered = topics.get(topic)
        if is_tiered is None:
            is_tiered = topics[topic] = tiered(topic)
        count += is_tiered
    return count


def broker_plugin_gauge(runs_plugin: bool | None, broker_copies_a_topic: bool) -> int:
    """The ``broker_runs_plugin`` gauge: 1 the broker loads the plugin; 0 it does not while a
    topic is copied by the broker's RLM (another class copies it: what an operator must see);
    -1 unknown, or no topic the broker copies (a standalone-only sidecar, rightly without)."""
    if runs_plugin is None:
        return -1
    if runs_plugin:
        return 1
    return 0 if broker_copies_a_topic else -1
