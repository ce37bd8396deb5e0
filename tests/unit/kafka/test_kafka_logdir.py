"""Log-dir scans: names, segment facts as RLM computes them, readiness, and the broker's races."""

from __future__ import annotations

import os
import shutil
import struct
import uuid
from pathlib import Path

import pytest

import sidecar.kafka.logdir as logdir_module
from sidecar.errors import (
    CheckpointFormatError,
    SegmentVanishedError,
    SnapshotFormatError,
    UnreadableFileError,
)
from sidecar.kafka.checkpoints import EpochEntry, ProducerSnapshotEntry, format_producer_snapshot
from sidecar.kafka.indexes import AbortedTxn, index_tail
from sidecar.kafka.logdir import (
    FileKind,
    NotReadyReason,
    SegmentFileName,
    SkipReason,
    TopicPartition,
    classify_dir_name,
    open_segment_file,
    parse_segment_file_name,
    scan_log_dir,
    scan_partition_dir,
    segment_file_name,
)
from sidecar.testing import (
    TestRecord,
    build_batch,
    write_meta_properties,
    write_partition,
)

TOPIC_ID = uuid.UUID("0123456789abcdeffedcba9876543210")
T0 = 1_700_000_000_000


def batch(n: int, *, epoch: int = 0, ts: int = T0) -> bytes:
    return build_batch(
        [TestRecord(b"k%d" % i, b"v" * 30, timestamp=ts + i) for i in range(n)],
        leader_epoch=epoch,
    )


def name(offset: int, kind: FileKind) -> str:
    return segment_file_name(offset, kind)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A log dir with orders.v1-eu-2: [0,5) epoch 0, [5,12) epochs 1 then 2, active from 12."""
    root = tmp_path / "kafka-logs"
    write_meta_properties(root, node_id=3)
    write_partition(
        root,
        "orders.v1-eu",
        2,
        [
            [batch(2, ts=T0), batch(3, ts=T0 + 50)],
            [batch(3, epoch=1, ts=T0 + 100), batch(4, epoch=2, ts=T0 + 200)],
            [batch(2, epoch=2, ts=T0 + 300)],
        ],
        topic_id=TOPIC_ID,
        producers=[ProducerSnapshotEntry(9, 0, 4, 4, 4, T0, -1, -1)],
        aborted={1: [AbortedTxn(0, 9, 6, 8, 5)]},
    )
    return root


PART = "orders.v1-eu-2"


class TestNames:
    """Partition directory and segment file names."""

    @pytest.mark.parametrize(
        ("dir_name", "expected"),
        [
            pytest.param("orders-0", TopicPartition("orders", 0), id="simple"),
            pytest.param(
                "my.topic-with-dashes-12",
                TopicPartition("my.topic-with-dashes", 12),
                id="dashes-and-dots",
            ),
            pytest.param(
                "__consumer_offsets-49",
                TopicPartition("__consumer_offsets", 49),
                id="internal-topic",
            ),
            pytest.param("t--1", TopicPartition("t-", 1), id="topic-ending-in-dash"),
            pytest.param(
                "orders-0.0123456789abcdef0123456789abcdef-delete", SkipReason.DELETE, id="delete"
            ),
            pytest.param(
                "orders-0.0123456789abcdef0123456789abcdef-future", SkipReason.FUTURE, id="future"
            ),
            pytest.param(
                "orders-0.0123456789abcdef0123456789abcdef-stray", SkipReason.STRAY, id="stray"
            ),
            pytest.param("__cluster_metadata-0", SkipReason.METADATA_LOG, id="kraft-metadata-log"),
            pytest.param("orders-delete", SkipReason.NOT_A_PARTITION, id="malformed-delete"),
            pytest.param("nodash", SkipReason.NOT_A_PARTITION, id="no-dash"),
            pytest.param("orders-", SkipReason.NOT_A_PARTITION, id="no-partition"),
            pytest.param("-3", SkipReason.NOT_A_PARTITION, id="no-topic"),
            pytest.param("orders-x", SkipReason.NOT_A_PARTITION, id="partition-not-a-number"),
            pytest.param("orders-05", SkipReason.NOT_A_PARTITION, id="leading-zero"),
            pytest.param("orders-+5", SkipReason.NOT_A_PARTITION, id="signed"),
            pytest.param("orders-2147483648", SkipReason.NOT_A_PARTITION, id="partition-overflow"),
            pytest.param("orders-\u0661", SkipReason.NOT_A_PARTITION, id="non-ascii-digit"),
            pytest.param("bad topic-1", SkipReason.NOT_A_PARTITION, id="illegal-topic-char"),
            pytest.param("..-1", SkipReason.NOT_A_PARTITION, id="dot-dot"),
            pytest.param("a" * 250 + "-1", SkipReason.NOT_A_PARTITION, id="topic-too-long"),
            pytest.param("lost+found", SkipReason.NOT_A_PARTITION, id="lost-found"),
        ],
    )
    def test_classify_dir_name(self, dir_name: str, expected: TopicPartition | SkipReason) -> None:
        """Partition dirs parse like LocalLog.parseTopicPartitionName; others get a typed reason."""
        assert classify_dir_name(dir_name) == expected

    @pytest.mark.parametrize(
        ("file_name", "expected"),
        [
            pytest.param(
                "00000000000000000000.log", SegmentFileName(0, FileKind.LOG, ""), id="log"
            ),
            pytest.param(
                "00000000000000001234.index", SegmentFileName(1234, FileKind.INDEX, ""), id="index"
            ),
            pytest.param(
                "09223372036854775807.timeindex",
                SegmentFileName(2**63 - 1, FileKind.TIMEINDEX, ""),
                id="max-offset",
            ),
            pytest.param(
                "00000000000000000007.txnindex",
                SegmentFileName(7, FileKind.TXNINDEX, ""),
                id="txnindex",
            ),
            pytest.param(
                "00000000000000000010.snapshot",
                SegmentFileName(10, FileKind.SNAPSHOT, ""),
                id="snapshot",
            ),
            pytest.param(
                "00000000000000000000.log.deleted",
                SegmentFileName(0, FileKind.LOG, ".deleted"),
                id="deleted",
            ),
            pytest.param(
                "00000000000000000000.index.swap",
                SegmentFileName(0, FileKind.INDEX, ".swap"),
                id="swap",
            ),
            pytest.param(
                "00000000000000000000.log.cleaned",
                SegmentFileName(0, FileKind.LOG, ".cleaned"),
                id="cleaned",
            ),
            pytest.param("0000000000000000000.log", None, id="19-digits"),
            pytest.param("00000000000000000000.logx", None, id="bad-kind"),
            pytest.param("00000000000000000000.log.tmp", None, id="tmp"),
            pytest.param("leader-epoch-checkpoint", None, id="checkpoint"),
        ],
    )
    def test_segment_file_names(self, file_name: str, expected: SegmentFileName | None) -> None:
        """Segment files are the 20-digit base offset, a kind and an optional transition suffix."""
        assert parse_segment_file_name(file_name) == expected

    def test_segment_file_name_is_20_digits(self) -> None:
        """Names are zero-padded to 20 digits, as LogFileUtils.filenamePrefixFromOffset does."""
        assert segment_file_name(1234, FileKind.LOG) == "00000000000000001234.log"


class TestScanLogDir:
    """A whole log dir: broker facts, partitions, segment facts and readiness."""

    def test_broker_and_partition_facts(self, log_dir: Path) -> None:
        """meta.properties, topic id, epochs and segments sorted by base offset, the last active."""
        scan = scan_log_dir(log_dir)
        assert scan.meta is not None
        assert (scan.meta.version, scan.meta.node_id) == (1, 3)
        (partition,) = scan.partitions
        assert partition.topic_partition == TopicPartition("orders.v1-eu", 2)
        assert partition.topic_id == "ASNFZ4mrze_-3LqYdlQyEA"
        assert partition.leader_epochs == (EpochEntry(0, 0), EpochEntry(1, 5), EpochEntry(2, 8))
        assert [s.base_offset for s in partition.segments] == [0, 5, 12]
        assert [s.is_active for s in partition.segments] == [False, False, True]
        assert partition.active_segment is partition.segments[-1]
        assert partition.snapshot_offsets == (5, 12)
        assert scan.problems == ()
        assert scan.partition("orders.v1-eu", 2) is partition
        assert scan.partition("orders.v1-eu", 3) is None

    def test_segment_facts_match_rlm(self, log_dir: Path) -> None:
        """start, end = next base - 1, max timestamp, size, epochs in range, txn-index-empty."""
        first, second, active = scan_log_dir(log_dir).partitions[0].segments
        assert (first.start_offset, first.end_offset) == (0, 4)
        assert first.max_timestamp_ms == T0 + 52
        assert first.size == (log_dir / PART / name(0, FileKind.LOG)).stat().st_size
        assert first.leader_epochs == (EpochEntry(0, 0),)
        assert first.txn_index_empty
        assert (second.start_offset, second.end_offset) == (5, 11)
        assert second.leader_epochs == (EpochEntry(1, 5), EpochEntry(2, 8))
        assert second.max_timestamp_ms == T0 + 203
        assert not second.txn_index_empty
        assert active.end_offset is None
        assert active.max_timestamp_ms is None
        assert active.leader_epochs == (EpochEntry(2, 12),)

    def test_readiness(self, log_dir: Path) -> None:
        """Rolled segments with trimmed indexes and a valid next snapshot are ready; the active
        one never is."""
        first, second, active = scan_log_dir(log_dir).partitions[0].segments
        assert first.ready
        assert second.ready
        assert first.index_trimmed
        assert first.timeindex_trimmed
        assert first.snapshot_path == log_dir / PART / name(5, FileKind.SNAPSHOT)
        assert active.not_ready is NotReadyReason.ACTIVE
        assert not active.ready
        assert scan_log_dir(log_dir).partitions[0].ready_segments == (first, second)

    def test_skipped_dirs_and_files(self, log_dir: Path) -> None:
        """Special and garbage directories are skipped with a reason; stray files are listed."""
        for d in (
            "orders-0.0123456789abcdef0123456789abcdef-delete",
            "__cluster_metadata-0",
            "not_a_partition",
        ):
            (log_dir / d).mkdir()
        (log_dir / "recovery-point-offset-checkpoint").write_text("0\n0\n")
        part = log_dir / PART
        (part / (name(0, FileKind.LOG) + ".swap")).write_bytes(b"")
        (part / "leader-epoch-checkpoint.tmp").write_bytes(b"")
        (part / "core.1234").write_bytes(b"")
        scan = scan_log_dir(log_dir)
        assert {(s.path.name, s.reason) for s in scan.skipped} == {
            ("orders-0.0123456789abcdef0123456789abcdef-delete", SkipReason.DELETE),
            ("__cluster_metadata-0", SkipReason.METADATA_LOG),
            ("not_a_partition", SkipReason.NOT_A_PARTITION),
        }
        (partition,) = scan.partitions
        assert partition.transient_files == (
            name(0, FileKind.LOG) + ".swap",
            "leader-epoch-checkpoint.tmp",
        )
        assert partition.unknown_files == ("core.1234",)

    def test_partitions_sorted(self, tmp_path: Path) -> None:
        """Partitions come sorted by topic then numeric partition."""
        for partition in (10, 2, 1):
            write_partition(tmp_path, "t", partition, [[batch(1)]])
        write_partition(tmp_path, "a", 5, [[batch(1)]])
        scan = scan_log_dir(tmp_path)
        assert [(p.topic, p.partition) for p in scan.partitions] == [
            ("a", 5),
            ("t", 1),
            ("t", 2),
            ("t", 10),
        ]
        assert scan.meta is None

    def test_scans_compare_equal(self, log_dir: Path) -> None:
        """Two scans of an unchanged dir are equal, so the detector sees no change."""
        assert scan_log_dir(log_dir) == scan_log_dir(log_dir)
        assert scan_partition_dir(log_dir / PART) == scan_partition_dir(log_dir / PART)

    def test_active_growth_is_not_a_change(self, log_dir: Path) -> None:
        """Appends to the active segment do not change the partition's view."""
        before = scan_partition_dir(log_dir / PART)
        with (log_dir / PART / name(12, FileKind.LOG)).open("ab") as fh:
            fh.write(batch(1))
        assert scan_partition_dir(log_dir / PART) == before

    def test_missing_log_dir(self, tmp_path: Path) -> None:
        """A log dir that does not exist is an UnreadableFileError naming it."""
        with pytest.raises(UnreadableFileError, match="does not exist") as info:
            scan_log_dir(tmp_path / "nope")
        assert info.value.path == str(tmp_path / "nope")

    def test_corrupt_checkpoints_are_partition_problems(self, log_dir: Path) -> None:
        """A bad leader-epoch-checkpoint or partition.metadata is reported, not raised."""
        part = log_dir / PART
        (part / "leader-epoch-checkpoint").write_bytes(b"0\n5\n0 0\n")
        (part / "partition.metadata").write_bytes(b"version: 7\ntopic_id: x")
        (partition,) = scan_log_dir(log_dir).partitions
        problems = {(type(p), p.path) for p in partition.problems}  # type: ignore[attr-defined]
        assert problems == {
            (CheckpointFormatError, str(part / "leader-epoch-checkpoint")),
            (CheckpointFormatError, str(part / "partition.metadata")),
        }
        assert partition.topic_id is None
        assert partition.leader_epochs == ()
        assert partition.segments[0].leader_epochs == ()

    def test_corrupt_meta_properties(self, log_dir: Path) -> None:
        """A bad meta.properties is a log-dir problem; the partitions are still scanned."""
        (log_dir / "meta.properties").write_bytes(b"version=9\n")
        scan = scan_log_dir(log_dir)
        assert scan.meta is None
        (problem,) = scan.problems
        assert isinstance(problem, CheckpointFormatError)
        assert len(scan.partitions) == 1

    def test_max_timestamp_falls_back_to_mtime(self, tmp_path: Path) -> None:
        """With no timestamp in the time index, the max timestamp is the .log mtime (Kafka's
        LogSegment.largestTimestamp)."""
        part = write_partition(tmp_path, "t", 0, [[batch(1)], [batch(1)]])
        (part / name(0, FileKind.TIMEINDEX)).write_bytes(b"")
        os.utime(part / name(0, FileKind.LOG), ns=(1_600_000_000_123_000_000,) * 2)
        (segment, _) = scan_partition_dir(part).segments  # type: ignore[union-attr]
        assert segment.max_timestamp_ms == 1_600_000_000_123


class TestReadiness:
    """Each condition that keeps a rolled segment from being tiered."""

    def test_untrimmed_index(self, log_dir: Path) -> None:
        """A rolled segment whose .index still has a zero tail is not ready."""
        path = log_dir / PART / name(0, FileKind.INDEX)
        path.write_bytes(path.read_bytes() + bytes(80))
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.not_ready is NotReadyReason.INDEX_NOT_TRIMMED
        assert first.index_trimmed is False
        assert first.problem is None

    def test_untrimmed_time_index(self, log_dir: Path) -> None:
        """A rolled segment whose .timeindex still has a zero tail is not ready."""
        path = log_dir / PART / name(0, FileKind.TIMEINDEX)
        path.write_bytes(path.read_bytes() + bytes(120))
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.not_ready is NotReadyReason.TIMEINDEX_NOT_TRIMMED

    def test_missing_indexes_do_not_block(self, log_dir: Path) -> None:
        """Indexes are created lazily: a rolled segment without them is still ready."""
        (log_dir / PART / name(0, FileKind.INDEX)).unlink()
        (log_dir / PART / name(0, FileKind.TIMEINDEX)).unlink()
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.ready
        assert (first.index_path, first.index_trimmed) == (None, None)

    def test_missing_snapshot(self, log_dir: Path) -> None:
        """Until <nextBase>.snapshot exists the segment is not ready."""
        (log_dir / PART / name(12, FileKind.SNAPSHOT)).unlink()
        _, second, _ = scan_log_dir(log_dir).partitions[0].segments
        assert second.not_ready is NotReadyReason.SNAPSHOT_MISSING

    @pytest.mark.parametrize(
        "content",
        [
            pytest.param(b"", id="just-created"),
            pytest.param(
                format_producer_snapshot([ProducerSnapshotEntry(1, 0, 0, 0, 0, 0, 0, -1)])[:20],
                id="half-written",
            ),
            pytest.param(b"\x00\x01" + bytes(8), id="bad-crc"),
        ],
    )
    def test_newest_snapshot_being_written(self, log_dir: Path, content: bytes) -> None:
        """A newest snapshot that does not parse yet means "wait", not corruption."""
        (log_dir / PART / name(12, FileKind.SNAPSHOT)).write_bytes(content)
        _, second, _ = scan_log_dir(log_dir).partitions[0].segments
        assert second.not_ready is NotReadyReason.SNAPSHOT_INCOMPLETE
        assert second.problem is None

    def test_older_snapshot_corrupt(self, log_dir: Path) -> None:
        """A bad CRC on a snapshot that is not the newest is corruption, with a typed error."""
        path = log_dir / PART / name(5, FileKind.SNAPSHOT)
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(data)
        first, second, _ = scan_log_dir(log_dir).partitions[0].segments
        assert first.not_ready is NotReadyReason.SNAPSHOT_CORRUPT
        assert isinstance(first.problem, SnapshotFormatError)
        assert first.problem.path == str(path)
        assert first.problem.position == 2
        assert second.ready

    def test_unreadable_index(self, log_dir: Path) -> None:
        """A directory in place of an index makes the segment UNREADABLE with a typed error."""
        path = log_dir / PART / name(5, FileKind.INDEX)
        path.unlink()
        path.mkdir()
        _, second, _ = scan_log_dir(log_dir).partitions[0].segments
        assert second.not_ready is NotReadyReason.UNREADABLE
        assert isinstance(second.problem, UnreadableFileError)
        assert second.problem.path == str(path)

    def test_unreadable_snapshot(self, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A snapshot we may not read (simulated: tests run as root) is UNREADABLE, not waiting."""
        path = log_dir / PART / name(5, FileKind.SNAPSHOT)
        real_open = Path.open

        def deny(self: Path, *args: object, **kwargs: object) -> object:
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(Path, "open", deny)
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.not_ready is NotReadyReason.UNREADABLE
        assert isinstance(first.problem, UnreadableFileError)
        assert first.problem.path == str(path)
        assert "Permission denied" in str(first.problem)

    def test_corrupt_index_length(self, log_dir: Path) -> None:
        """An index whose size is not whole entries is UNREADABLE, naming the byte."""
        path = log_dir / PART / name(0, FileKind.INDEX)
        path.write_bytes(path.read_bytes() + b"\x01\x02\x03")
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.not_ready is NotReadyReason.UNREADABLE
        assert first.problem is not None
        assert first.problem.position == path.stat().st_size - 3  # type: ignore[attr-defined]


class TestRaces:
    """The broker renames, deletes and writes while we scan."""

    def test_open_segment_file_after_rename(self, log_dir: Path) -> None:
        """A .log renamed to .deleted after listing is opened under the new name."""
        path = log_dir / PART / name(0, FileKind.LOG)
        path.rename(path.with_name(path.name + ".deleted"))
        fh, opened = open_segment_file(path)
        with fh:
            assert fh.read(8) == struct.pack(">q", 0)
        assert opened.name.endswith(".log.deleted")

    def test_open_segment_file_vanished(self, log_dir: Path) -> None:
        """A .log gone under both names raises SegmentVanishedError."""
        path = log_dir / PART / name(0, FileKind.LOG)
        path.unlink()
        with pytest.raises(SegmentVanishedError, match=path.name):
            open_segment_file(path)

    def test_rename_to_deleted_mid_scan(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Files renamed to .deleted between listing and reading are read under the new name."""

        def rename_then_read(path: Path, entry_size: int) -> tuple[int, bytes]:
            if path.exists():
                path.rename(path.with_name(path.name + ".deleted"))
            return index_tail(path, entry_size)

        monkeypatch.setattr(logdir_module, "index_tail", rename_then_read)
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.ready
        assert first.max_timestamp_ms == T0 + 52

    def test_vanish_mid_scan(self, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A segment deleted between listing and reading is VANISHED with SegmentVanishedError."""

        def delete_then_read(path: Path, entry_size: int) -> tuple[int, bytes]:
            path.unlink(missing_ok=True)
            return index_tail(path, entry_size)

        monkeypatch.setattr(logdir_module, "index_tail", delete_then_read)
        first = scan_log_dir(log_dir).partitions[0].segments[0]
        assert first.not_ready is NotReadyReason.VANISHED
        assert isinstance(first.problem, SegmentVanishedError)

    def test_partition_dir_vanishes(self, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A partition dir removed after the log dir was listed is skipped as VANISHED."""
        real_scan = logdir_module._scan_partition

        def remove_then_scan(path: Path, tp: TopicPartition) -> object:
            shutil.rmtree(path)
            return real_scan(path, tp)

        monkeypatch.setattr(logdir_module, "_scan_partition", remove_then_scan)
        scan = scan_log_dir(log_dir)
        assert scan.partitions == ()
        assert [s.reason for s in scan.skipped] == [SkipReason.VANISHED]

    def test_scan_partition_dir_returns_none_for_untracked(self, log_dir: Path) -> None:
        """The detector hook returns None for -delete dirs, garbage names and vanished dirs."""
        deleted = log_dir / "orders-0.0123456789abcdef0123456789abcdef-delete"
        deleted.mkdir()
        assert scan_partition_dir(deleted) is None
        assert scan_partition_dir(log_dir / "garbage") is None
        assert scan_partition_dir(log_dir / "gone-0") is None

    def test_unlistable_partition_dir(self, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A partition dir we may not list is reported as a partition problem."""
        real_iterdir = Path.iterdir

        def deny(self: Path) -> object:
            if self.name == PART:
                raise PermissionError(13, "Permission denied", str(self))
            return real_iterdir(self)

        monkeypatch.setattr(Path, "iterdir", deny)
        (partition,) = scan_log_dir(log_dir).partitions
        (problem,) = partition.problems
        assert isinstance(problem, UnreadableFileError)
        assert problem.path == str(log_dir / PART)
        assert partition.segments == ()
