"""Planning uploads: Kafka's starting point after leader changes, LSO, readiness, strict order."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.kafka.checkpoints import EpochEntry
from sidecar.kafka.logdir import NotReadyReason, scan_partition_dir
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering.planner import RemoteCoverage, find_highest_remote_offset, plan_partition


def _segments(count: int, per_segment: int = 10, epoch: int = 0) -> list[list[bytes]]:
    """``count`` segments of ``per_segment`` single-record batches (the last one is active)."""
    return [
        [build_batch([TestRecord(b"k", b"v" * 10)], leader_epoch=epoch) for _ in range(per_segment)]
        for _ in range(count)
    ]


def _scan(tmp_path: Path, count: int = 4, **kwargs):
    path = write_partition(tmp_path, "orders", 0, _segments(count), **kwargs)
    scan = scan_partition_dir(path)
    assert scan is not None
    return scan


def _named(scan, index: int = 0) -> set[tuple[int, int | None, int]]:
    """The quarantine's name of one segment: base offset, end offset, size."""
    segment = scan.segments[index]
    return {(segment.base_offset, segment.end_offset, segment.size)}


class TestFindHighestRemoteOffset:
    EPOCHS = (EpochEntry(0, 0), EpochEntry(1, 100), EpochEntry(3, 250))

    @pytest.mark.parametrize(
        ("remote", "expected"),
        [
            pytest.param({}, -1, id="nothing-remote"),
            pytest.param({3: 270}, 270, id="latest-epoch"),
            pytest.param({1: 180}, 180, id="older-epoch"),
            pytest.param({1: 400}, 249, id="clamped-to-epoch-end"),
            pytest.param({0: 99, 1: 120, 3: 260}, 260, id="latest-wins"),
            pytest.param({7: 999}, -1, id="foreign-epoch-ignored"),
        ],
    )
    def test_matches_kafka(self, remote, expected):
        """The latest epoch with remote data decides, clamped by that epoch's end (§3.3)."""
        assert find_highest_remote_offset(self.EPOCHS, 300, remote.get) == expected


class TestPlanPartition:
    def test_first_upload_is_the_oldest_rolled_segment(self, tmp_path):
        """With nothing remote, the plan starts at the first segment, one at a time."""
        scan = _scan(tmp_path)
        plan = plan_partition(scan, lso=10_000, highest_for_epoch=lambda e: None)
        assert [s.base_offset for s in plan.uploads] == [0]
        plan = plan_partition(scan, lso=10_000, highest_for_epoch=lambda e: None, limit=10)
        assert [s.base_offset for s in plan.uploads] == [0, 10, 20]  # never the active one

    def test_already_remote_segments_are_skipped(self, tmp_path):
        """Segments ending at or below the highest remote offset are not uploaded again."""
        scan = _scan(tmp_path)
        plan = plan_partition(scan, lso=10_000, highest_for_epoch={0: 19}.get, limit=10)
        assert plan.highest_remote_offset == 19
        assert [s.base_offset for s in plan.uploads] == [20]

    def test_lso_holds_back_segments(self, tmp_path):
        """A segment whose end offset is not below the LSO waits (open transactions)."""
        scan = _scan(tmp_path)
        plan = plan_partition(scan, lso=19, highest_for_epoch={0: 9}.get, limit=10)
        assert plan.uploads == ()
        assert plan.waiting is not None
        assert "LSO" in plan.waiting

    def test_unknown_lso_uploads_nothing(self, tmp_path):
        """Without an LSO from the cluster nothing is uploaded."""
        scan = _scan(tmp_path)
        plan = plan_partition(scan, lso=None, highest_for_epoch=lambda e: None)
        assert plan.uploads == ()

    def test_not_ready_segment_blocks_the_ones_after_it(self, tmp_path):
        """A missing <nextBase>.snapshot stops planning there: uploads stay in order."""
        scan = _scan(tmp_path)
        (scan.path / "00000000000000000020.snapshot").unlink()
        scan = scan_partition_dir(scan.path)
        assert scan is not None
        plan = plan_partition(scan, lso=10_000, highest_for_epoch={0: 9}.get, limit=10)
        assert plan.uploads == ()
        assert plan.waiting is not None
        assert "10 not ready" in plan.waiting
        assert plan.stalled_on is not None
        assert plan.stalled_on.base_offset == 10

    def test_a_corrupt_older_snapshot_does_not_block(self, tmp_path):
        """An older <nextBase>.snapshot that fails its CRC never heals: its segment is planned
        with the file as it is, as Kafka's RLM uploads it."""
        scan = _scan(tmp_path)
        snapshot = scan.path / "00000000000000000020.snapshot"
        data = bytearray(snapshot.read_bytes())
        data[-1] ^= 0xFF
        snapshot.write_bytes(bytes(data))
        scan = scan_partition_dir(scan.path)
        assert scan is not None
        assert scan.segments[1].not_ready is NotReadyReason.SNAPSHOT_CORRUPT
        assert scan.segments[1].snapshot_path == snapshot
        plan = plan_partition(scan, lso=10_000, highest_for_epoch=lambda e: None, limit=10)
        assert [s.base_offset for s in plan.uploads] == [0, 10, 20]

    def test_quarantined_segment_blocks(self, tmp_path):
        """A quarantined (corrupt) segment is never planned, nor anything after it."""
        scan = _scan(tmp_path)
        plan = plan_partition(
            scan, lso=10_000, highest_for_epoch=lambda e: None, quarantined=_named(scan), limit=10
        )
        assert plan.uploads == ()
        assert plan.waiting is not None
        assert "quarantined" in plan.waiting

    def test_quarantine_entry_of_another_segment_at_the_same_offset_holds_nothing_back(
        self, tmp_path
    ):
        """An entry names its segment by base offset, end offset and size: a segment rebuilt
        at the same base offset (another end, another size) is planned."""
        scan = _scan(tmp_path)
        first = scan.segments[0]
        for other in [(0, 999, first.size), (0, first.end_offset, first.size + 1)]:
            plan = plan_partition(
                scan, lso=10_000, highest_for_epoch=lambda e: None, quarantined={other}, limit=10
            )
            assert [s.base_offset for s in plan.uploads] == [0, 10, 20]


class TestWaitingForLso:
    def test_plan_says_when_only_the_lso_holds_it_back(self, tmp_path):
        """A plan blocked by the LSO says so, so the engine can fetch a fresh LSO at once."""
        scan = _scan(tmp_path)
        blocked = plan_partition(scan, lso=5, highest_for_epoch=lambda e: None)
        assert blocked.uploads == ()
        assert blocked.waiting_for_lso
        assert blocked.lso == 5
        ready = plan_partition(scan, lso=10_000, highest_for_epoch=lambda e: None)
        assert not ready.waiting_for_lso


class TestRemoteCoverage:
    """Planning from the FINISHED coverage of the lineage: holes are uploaded, the floor is not."""

    def test_uncovered_finds_holes_and_the_tail(self):
        """A range is uncovered when any offset at or above the floor misses a span."""
        coverage = RemoteCoverage.of([(10, 19), (0, 9), (30, 39)], floor=0, highest=39)
        assert coverage.spans == ((0, 19), (30, 39))  # sorted and merged
        assert not coverage.uncovered(0, 19)
        assert coverage.uncovered(20, 29)  # a hole
        assert coverage.uncovered(35, 45)  # past the last copy
        assert coverage.uncovered(15, 31)  # straddles the hole

    def test_floor_hides_what_was_deleted_on_purpose(self):
        """Below the floor nothing is uncovered; an unknown floor falls back to the first span,
        and with no span at all to Kafka's monotone highest offset."""
        assert not RemoteCoverage.of([(30, 39)], floor=30, highest=39).uncovered(0, 29)
        assert RemoteCoverage.of([(30, 39)], floor=0, highest=39).uncovered(0, 29)
        assert RemoteCoverage.of([(30, 39)], floor=None, highest=39).floor == 30
        assert RemoteCoverage.of([], floor=None, highest=39).floor == 40
        assert RemoteCoverage.of([], floor=None, highest=-1).floor == 0

    def test_plan_fills_a_hole_before_newer_segments(self, tmp_path):
        """With coverage, a hole in the middle is the first upload, although the monotone
        highest offset is past it."""
        scan = _scan(tmp_path)  # rolled segments 0-9, 10-19, 20-29
        coverage = RemoteCoverage.of([(0, 9), (20, 29)], floor=0, highest=29)
        plan = plan_partition(
            scan, lso=10_000, highest_for_epoch=lambda e: 29, coverage=coverage, limit=10
        )
        assert [s.base_offset for s in plan.uploads] == [10]
        assert plan_partition(scan, lso=10_000, highest_for_epoch=lambda e: 29).uploads == ()

    def test_quarantined_segment_is_skipped_with_coverage(self, tmp_path):
        """A quarantined segment stops the monotone plan but not the coverage plan: the gap
        stays visible, so later segments may go."""
        scan = _scan(tmp_path)
        coverage = RemoteCoverage.of([], floor=0, highest=-1)
        plan = plan_partition(
            scan,
            lso=10_000,
            highest_for_epoch=lambda e: None,
            quarantined=_named(scan),
            coverage=coverage,
            limit=10,
        )
        assert [s.base_offset for s in plan.uploads] == [10, 20]
        plan = plan_partition(
            scan, lso=10_000, highest_for_epoch=lambda e: None, quarantined=_named(scan)
        )
        assert plan.uploads == ()
