"""The local-segment gauges follow the detector's views, and keeping them costs each changed
partition's segments only: a first scan of P partitions is O(P), not O(P^2)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

import sidecar.app
from sidecar.app import Daemon
from sidecar.config import SidecarConfig
from sidecar.kafka.logdir import PartitionScan, Segment, scan_partition_dir
from sidecar.testing import TestRecord, build_batch, write_partition

PARTITIONS = 200
SEGMENTS = 3
NS = "kafka_tiered_sidecar_"


class _Visits:
    count = 0


class _CountedSegments(tuple[Segment, ...]):
    """A view's segments that count every segment anyone iterates over."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        for segment in super().__iter__():
            _Visits.count += 1
            yield segment


def _counted(directory: Path) -> PartitionScan | None:
    scan = scan_partition_dir(directory)
    if scan is None:
        return None
    return dataclasses.replace(scan, segments=_CountedSegments(scan.segments))


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    batches = [[build_batch([TestRecord(b"k", b"v" * 100)])] for _ in range(SEGMENTS)]
    for i in range(PARTITIONS):
        write_partition(logs, f"t{i}", 0, batches)
    return logs


def _daemon(tmp_path: Path, log_dir: Path) -> Daemon:
    config = SidecarConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "broker": {"log_dirs": [str(log_dir)], "broker_id": 1},
        }
    )
    return Daemon(config)


def _gauge(daemon: Daemon, name: str, labels: dict[str, str] | None = None) -> float | None:
    return daemon.metrics.registry.get_sample_value(NS + name, labels or {})


async def test_first_scan_visits_each_segment_a_constant_number_of_times(
    tmp_path: Path, log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every discovered partition moved the gauges by walking every view known so far (quadratic
    in partitions); now the scan's whole merge visits each segment a few times at most."""
    monkeypatch.setattr(sidecar.app, "scan_partition_dir", _counted)
    monkeypatch.setattr(_Visits, "count", 0)
    daemon = _daemon(tmp_path, log_dir)
    await daemon.detector.scan_once()
    assert len(daemon.detector.views) == PARTITIONS
    assert _Visits.count <= 6 * PARTITIONS * SEGMENTS  # was about PARTITIONS / 2 times that


async def test_gauges_follow_discovery_and_removal(tmp_path: Path, log_dir: Path) -> None:
    """After a full scan the gauges equal the views' totals; a partition removed from the log
    dir takes its segments and bytes out of them."""
    daemon = _daemon(tmp_path, log_dir)
    await daemon.detector.scan_once()

    def totals() -> tuple[int, int, int, int]:
        views = daemon.detector.views.values()
        return (
            len(views),
            sum(len(v.segments) - 1 for v in views if v.segments),
            sum(1 for v in views if v.segments),
            sum(s.size for v in views for s in v.segments),
        )

    def gauges() -> tuple[float | None, ...]:
        return (
            _gauge(daemon, "partitions_watched"),
            _gauge(daemon, "local_segments", {"state": "rolled"}),
            _gauge(daemon, "local_segments", {"state": "active"}),
            _gauge(daemon, "local_segment_bytes"),
        )

    before = totals()
    assert before[:3] == (PARTITIONS, PARTITIONS * (SEGMENTS - 1), PARTITIONS)
    assert gauges() == before
    shutil.rmtree(log_dir / "t7-0")
    await daemon.detector.scan_once()
    after = totals()
    assert after[0] == PARTITIONS - 1
    assert after[3] < before[3]
    assert gauges() == after


def test_a_missing_log_dir_is_logged_as_an_error(tmp_path: Path) -> None:
    """With broker_id given, a log dir that is not there does not stop the start (another may
    be fine), but it is named in an error line: nothing in it would be tiered."""
    from structlog.testing import capture_logs

    there = tmp_path / "logs"
    there.mkdir()
    gone = tmp_path / "unmounted"
    config = SidecarConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "broker": {"log_dirs": [str(there), str(gone)], "broker_id": 1},
        }
    )
    with capture_logs() as logs:
        assert Daemon(config)._broker_id(None) == 1
    missing = [e for e in logs if e["event"] == "broker_log_dir_missing"]
    assert [(e["log_dir"], e["log_level"]) for e in missing] == [(str(gone), "error")]
