"""What changed since a reader's last look at the log dirs and the cluster view.

The engine and the stager each pass over the partitions once a second: over every one when
the cluster view changed in a way that concerns them all (leaders, topic configs, freshness),
else over those something happened to. :class:`ChangeWatch` keeps, for one reader, what it saw
last and answers both questions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sidecar.kafka.logdir import PartitionScan
from sidecar.tiering.cluster import ClusterView
from sidecar.tiering.detector import ViewMap

__all__ = ["ChangeWatch"]


class ChangeWatch:
    """One reader's memory of the log dirs' scans and the cluster view it last looked at."""

    def __init__(self) -> None:
        #: the detector's journal of changed dirs, or (views of another kind) the scans seen
        self._journal: set[Path] | None = None
        self._seen_scans: dict[Path, PartitionScan] = {}
        self._seen_view: ClusterView | None = None
        self._seen_fresh = False

    def changed_paths(self, views: Mapping[Path, PartitionScan]) -> set[Path]:
        """The partition dirs whose scan changed (appeared, changed, gone) since the last
        call."""
        if self._journal is None and isinstance(views, ViewMap):
            self._journal = views.journal()  # from now on: the first pass walks them all
        if self._journal is not None:
            changed = set(self._journal)
            self._journal.clear()
            return changed
        seen = self._seen_scans
        changed = {path for path, scan in views.items() if seen.get(path) is not scan}
        changed.update(path for path in seen if path not in views)
        self._seen_scans = dict(views)
        return changed

    def view_changes(self, view: ClusterView, fresh: bool) -> tuple[bool, set[tuple[str, int]]]:
        """Whether the view changed in a way that needs a pass over every partition (leaders,
        configs, freshness), and else the (topic, partition)s whose LSO moved (one looked up
        with ``fetch_lso``)."""
        seen, self._seen_view = self._seen_view, view
        seen_fresh, self._seen_fresh = self._seen_fresh, fresh
        if fresh != seen_fresh or seen is None:
            return True, set()
        if view is seen:
            return False, set()
        if (
            view.leaders is not seen.leaders
            or view.configs is not seen.configs
            or view.broker_id != seen.broker_id
        ):
            return True, set()  # a refresh that changed neither keeps both objects
        before = seen.last_stable_offsets
        return False, {k for k, v in view.last_stable_offsets.items() if before.get(k) != v}
