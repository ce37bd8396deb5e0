"""``sidecar inspect``: exit codes, tables, JSON, the verify report and the records dump."""

from __future__ import annotations

import io
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

import sidecar.kafka.inspect as inspect_module
from sidecar.errors import (
    CorruptRecordError,
    IndexFormatError,
    SegmentVanishedError,
    SidecarError,
)
from sidecar.kafka.indexes import OFFSET_INDEX_ENTRY
from sidecar.kafka.inspect import (
    EXIT_NOT_A_LOG_DIR,
    EXIT_OK,
    EXIT_PROBLEMS,
    SegmentTarget,
    problem_row,
    resolve_target,
    run_inspect,
    verify_segment,
    verify_settled,
)
from sidecar.kafka.logdir import (
    FileKind,
    LogDirScan,
    PartitionScan,
    scan_partition_dir,
    segment_file_name,
)
from sidecar.kafka.records import Compression, ControlRecordType, parse_batch_header
from sidecar.testing import (
    TestRecord,
    build_batch,
    build_control_batch,
    write_meta_properties,
    write_partition,
)

T0 = 1_700_000_000_000
PART = "payments-7"


def batch(n: int, *, compression: Compression = Compression.NONE, first: int = 0) -> bytes:
    return build_batch(
        [
            TestRecord(b"key-%d" % (first + i), b"value-%d" % (first + i), [("h", b"\xff")], T0 + i)
            for i in range(n)
        ],
        compression=compression,
    )


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A log dir with payments-7: two rolled segments (gzip and zstd) and an active one."""
    root = tmp_path / "logs"
    write_meta_properties(root, node_id=5)
    write_partition(
        root,
        "payments",
        7,
        [
            [batch(3, compression=Compression.GZIP), batch(2)],
            [batch(4, compression=Compression.ZSTD)],
            [batch(1), build_control_batch(ControlRecordType.COMMIT)],
        ],
    )
    return root


def seg_path(log_dir: Path, offset: int, kind: FileKind = FileKind.LOG) -> Path:
    return log_dir / PART / segment_file_name(offset, kind)


def inspect_streams(path: Path, **flags: bool) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``sidecar inspect``."""
    out, err = io.StringIO(), io.StringIO()
    code = run_inspect(
        path,
        as_json=flags.get("as_json", False),
        verify=flags.get("verify", False),
        records=flags.get("records", False),
        out=out,
        err=err,
    )
    return code, out.getvalue(), err.getvalue()


def inspect(path: Path, **flags: bool) -> tuple[int, str]:
    """Exit code and everything written (stdout, then stderr)."""
    code, out, err = inspect_streams(path, **flags)
    return code, out + err


def inspect_json(path: Path, **flags: bool) -> tuple[int, dict[str, Any]]:
    code, text = inspect(path, as_json=True, **flags)
    return code, json.loads(text)


class TestTargets:
    """Which paths inspect accepts, and the exit code for the others."""

    def test_resolves_each_kind(self, log_dir: Path) -> None:
        """A log dir, a partition dir and a .log file each resolve to their scan."""
        assert isinstance(resolve_target(log_dir), LogDirScan)
        assert isinstance(resolve_target(log_dir / PART), PartitionScan)
        target = resolve_target(seg_path(log_dir, 0))
        assert target == SegmentTarget(seg_path(log_dir, 0), 0, 5)
        assert resolve_target(seg_path(log_dir, 9)) == SegmentTarget(seg_path(log_dir, 9), 9, None)

    @pytest.mark.parametrize(
        ("make", "fragment"),
        [
            pytest.param(lambda root: root / "missing", "does not exist", id="missing"),
            pytest.param(
                lambda root: root / PART / "leader-epoch-checkpoint",
                "not a segment .log",
                id="not-a-log-file",
            ),
            pytest.param(lambda root: root.parent, "not a Kafka log dir", id="unrelated-dir"),
        ],
    )
    def test_not_a_log_dir_exits_2(self, log_dir: Path, make: Any, fragment: str) -> None:
        """A missing path or something that is not Kafka data exits 2 with a reason."""
        code, out, err = inspect_streams(make(log_dir))
        assert code == EXIT_NOT_A_LOG_DIR
        assert out == ""  # errors go to stderr, as every command's do
        assert err.startswith("sidecar: error: ")
        assert fragment in err
        code, out, err = inspect_streams(make(log_dir), as_json=True)
        assert code == EXIT_NOT_A_LOG_DIR
        assert out == ""  # --json too: stdout holds documents only
        assert err.startswith("sidecar: error: ")
        assert fragment in err

    def test_delete_dir_exits_2_with_reason(self, log_dir: Path) -> None:
        """A partition dir scheduled for deletion is named as such."""
        doomed = log_dir / "payments-7.0123456789abcdef0123456789abcdef-delete"
        doomed.mkdir()
        code, text = inspect(doomed)
        assert code == EXIT_NOT_A_LOG_DIR
        assert "scheduled for deletion" in text


class TestListing:
    """Tables and JSON for the three kinds of path."""

    def test_log_dir_table(self, log_dir: Path) -> None:
        """The log dir table has one row per segment with RLM facts and readiness."""
        code, text = inspect(log_dir)
        assert code == EXIT_OK
        assert "node 5" in text
        lines = text.splitlines()
        header = next(line for line in lines if line.startswith("PARTITION"))
        assert header.split() == [
            "PARTITION",
            "BASE",
            "END",
            "SIZE",
            "MAX_TIMESTAMP",
            "EPOCHS",
            "TXNINDEX",
            "STATE",
        ]
        rows = [line.split() for line in lines if line.startswith(PART)]
        assert [r[1:3] for r in rows[1:]] == [["0", "4"], ["5", "8"], ["9", "-"]]
        assert [r[-1] for r in rows[1:]] == ["ready", "ready", "active"]
        assert "2023-11-14T22:13:20.002Z" in text
        assert text.rstrip().endswith("ok")

    def test_log_dir_json(self, log_dir: Path) -> None:
        """--json gives the same facts as a document."""
        code, doc = inspect_json(log_dir)
        assert code == EXIT_OK
        assert doc["kind"] == "log_dir"
        assert doc["meta"]["node_id"] == 5
        (partition,) = doc["partitions"]
        assert partition["topic"] == "payments"
        assert [s["end_offset"] for s in partition["segments"]] == [4, 8, None]
        assert [s["ready"] for s in partition["segments"]] == [True, True, False]
        assert partition["segments"][0]["leader_epochs"] == [[0, 0]]
        assert doc["ok"] is True
        assert doc["problems"] == []

    def test_partition_dir(self, log_dir: Path) -> None:
        """A partition dir lists its segments."""
        code, doc = inspect_json(log_dir / PART)
        assert code == EXIT_OK
        assert doc["kind"] == "partition"
        assert len(doc["partitions"][0]["segments"]) == 3

    def test_segment_batches(self, log_dir: Path) -> None:
        """A .log file lists its batches with position, offsets, codec and flags."""
        code, text = inspect(seg_path(log_dir, 0))
        assert code == EXIT_OK
        assert "rolled, next base 5" in text
        rows = [line.split() for line in text.splitlines() if line[:1].isdigit()]
        assert [r[:4] for r in rows] == [["0", "0", "2", "3"], [rows[1][0], "3", "4", "2"]]
        assert [r[5] for r in rows] == ["gzip", "none"]

    def test_control_batch_flags(self, log_dir: Path) -> None:
        """Transaction markers show as txn,control batches."""
        code, doc = inspect_json(seg_path(log_dir, 9))
        assert code == EXIT_OK
        assert doc["active"] is True
        assert [(b["transactional"], b["control"]) for b in doc["batches"]] == [
            (False, False),
            (True, True),
        ]


class TestRecordsDump:
    """--records decodes every record, text or JSON."""

    def test_segment_records_json(self, log_dir: Path) -> None:
        """Records come with offsets, keys, values and headers; non-UTF-8 bytes as base64."""
        code, doc = inspect_json(seg_path(log_dir, 0), records=True)
        assert code == EXIT_OK
        records = [r for b in doc["batches"] for r in b["records"]]
        assert [r["offset"] for r in records] == [0, 1, 2, 3, 4]
        assert records[0]["key"] == "key-0"
        assert records[0]["headers"] == [["h", {"base64": "/w=="}]]

    def test_partition_records_text(self, log_dir: Path) -> None:
        """The text dump shows one line per record, including the commit marker."""
        code, text = inspect(log_dir / PART, records=True)
        assert code == EXIT_OK
        lines = [line for line in text.splitlines() if " offset=" in line]
        assert len(lines) == 5 + 4 + 2
        assert 'key="key-0"' in lines[0]
        assert "control=COMMIT" in lines[-1]


class TestVerify:
    """--verify collects every problem with its file and byte position, and exits 1."""

    def test_clean_log_dir(self, log_dir: Path) -> None:
        """A consistent log dir verifies with exit 0."""
        code, text = inspect(log_dir, verify=True)
        assert code == EXIT_OK, text

    def test_bad_crc_is_found_and_walk_continues(self, log_dir: Path) -> None:
        """A corrupt first batch is reported at byte 0 and the second batch is still checked."""
        path = seg_path(log_dir, 0)
        data = bytearray(path.read_bytes())
        data[70] ^= 0x10
        second = parse_batch_header(data).size
        data[second + 70] ^= 0x10
        path.write_bytes(data)
        code, doc = inspect_json(log_dir, verify=True)
        assert code == EXIT_PROBLEMS
        crc = [p for p in doc["problems"] if "stored crc" in p["message"]]
        assert [(p["error"], p["path"], p["position"]) for p in crc] == [
            ("CorruptRecordError", str(path), 0),
            ("CorruptRecordError", str(path), second),
        ]
        assert doc["ok"] is False

    def test_truncated_rolled_segment(self, log_dir: Path) -> None:
        """A rolled .log cut inside a batch is a TruncatedFileError at that batch."""
        path = seg_path(log_dir, 0)
        data = path.read_bytes()
        path.write_bytes(data[:-5])
        code, text = inspect(path, verify=True)
        assert code == EXIT_PROBLEMS
        assert "TruncatedFileError" in text
        assert f"{path} at byte {parse_batch_header(data).size}" in text

    def test_zero_padded_rolled_segment(self, log_dir: Path) -> None:
        """A rolled .log with a preallocated zero tail is reported where the zeros start."""
        path = seg_path(log_dir, 5)
        size = path.stat().st_size
        path.write_bytes(path.read_bytes() + bytes(1024))
        code, doc = inspect_json(path, verify=True)
        assert code == EXIT_PROBLEMS
        (problem,) = [p for p in doc["problems"] if "zero-padded" in p["message"]]
        assert (problem["path"], problem["position"]) == (str(path), size)

    def test_zero_padded_active_segment_is_fine(self, log_dir: Path) -> None:
        """The active segment may be preallocated: its zero tail is not a problem."""
        path = seg_path(log_dir, 9)
        path.write_bytes(path.read_bytes() + bytes(1024))
        code, text = inspect(path, verify=True)
        assert code == EXIT_OK, text

    def test_index_entry_past_end(self, log_dir: Path) -> None:
        """An index entry pointing past the end of the .log is an IndexFormatError at its entry."""
        index = seg_path(log_dir, 0, FileKind.INDEX)
        index.write_bytes(index.read_bytes() + OFFSET_INDEX_ENTRY.pack(4, 10_000_000))
        code, doc = inspect_json(log_dir / PART, verify=True)
        assert code == EXIT_PROBLEMS
        hits = [p for p in doc["problems"] if "outside" in p["message"]]
        assert [(p["error"], p["path"], p["position"]) for p in hits] == [
            ("IndexFormatError", str(index), 8)
        ]

    def test_an_active_segment_indexed_while_verified_is_fine(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The broker appends to the active .log, then indexes it: an entry read after the
        walk may point past the size taken before it. Past the size now it is still wrong."""
        log = seg_path(log_dir, 9)
        index = seg_path(log_dir, 9, FileKind.INDEX)
        walked = log.stat().st_size
        real_read = inspect_module.OffsetIndex.read

        def append_then_read(path: Path, **kwargs: Any) -> Any:
            with log.open("ab") as out:  # the broker's next append, during the verify
                out.write(batch(1, first=11))
            return real_read(path, **kwargs)

        monkeypatch.setattr(inspect_module.OffsetIndex, "read", staticmethod(append_then_read))
        target = SegmentTarget(log, 9, None)
        index.write_bytes(OFFSET_INDEX_ENTRY.pack(2, walked))
        assert verify_segment(target) == []
        index.write_bytes(OFFSET_INDEX_ENTRY.pack(2, 10_000_000))
        problems = verify_segment(target)
        assert any("outside the" in str(p) for p in problems), problems

    def test_index_entry_not_at_batch(self, log_dir: Path) -> None:
        """An index entry pointing into the middle of a batch is reported."""
        index = seg_path(log_dir, 0, FileKind.INDEX)
        rel, position = struct.unpack(">ii", index.read_bytes()[:8])
        index.write_bytes(OFFSET_INDEX_ENTRY.pack(rel, position + 3))
        problems = verify_segment(SegmentTarget(seg_path(log_dir, 0), 0, 5))
        assert any(
            isinstance(p, IndexFormatError) and "not the start of a batch" in str(p)
            for p in problems
        )

    def test_untrimmed_rolled_index(self, log_dir: Path) -> None:
        """A rolled segment's index with a zero tail is a problem for verify."""
        index = seg_path(log_dir, 5, FileKind.TIMEINDEX)
        index.write_bytes(index.read_bytes() + bytes(24))
        code, text = inspect(log_dir, verify=True)
        assert code == EXIT_PROBLEMS
        assert "preallocated zero tail of 2 entries" in text

    def test_unreadable_index(self, log_dir: Path) -> None:
        """A directory where an index should be is reported with the path, and the rest goes on."""
        index = seg_path(log_dir, 5, FileKind.INDEX)
        index.unlink()
        index.mkdir()
        code, doc = inspect_json(log_dir, verify=True)
        assert code == EXIT_PROBLEMS
        assert {p["error"] for p in doc["problems"]} == {"UnreadableFileError"}
        assert {p["path"] for p in doc["problems"]} == {str(index)}

    def test_offsets_past_segment_end(self, log_dir: Path) -> None:
        """A batch whose offsets run into the next segment is reported."""
        problems = verify_segment(SegmentTarget(seg_path(log_dir, 0), 0, 3))
        assert any(
            isinstance(p, CorruptRecordError) and "past the segment end 2" in str(p)
            for p in problems
        )

    def test_without_verify_only_listing_errors_count(self, log_dir: Path) -> None:
        """Without --verify a corrupt batch met while listing the segment still exits 1."""
        path = seg_path(log_dir, 5)
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(data)
        code, text = inspect(path)
        assert code == EXIT_PROBLEMS
        assert "PROBLEM CorruptRecordError" in text


def clean_merge(log_dir: Path) -> None:
    """What the log cleaner does to payments-7: one merged segment 0-8 replaces segments 0 and 5
    (new inodes), the active segment stays."""
    merged = log_dir.parent / "merged"
    write_partition(
        merged,
        "payments",
        7,
        [
            [
                batch(3, compression=Compression.GZIP),
                batch(2),
                batch(4, compression=Compression.ZSTD),
            ],
            [batch(1), build_control_batch(ControlRecordType.COMMIT)],
        ],
    )
    target = log_dir / PART
    for old in target.iterdir():
        old.unlink()
    for new in (merged / PART).iterdir():
        new.rename(target / new.name)


class TestVerifyRacingTheBroker:
    """A partition the broker rewrites during --verify is checked again, not reported corrupt."""

    def test_cleaner_swap_during_the_pass_is_rechecked(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The cleaner merges two segments while the first pass reads the old segment list: the
        merged .log runs past the old segment end, a second pass on a fresh scan finds nothing."""
        real_pass = inspect_module._verify_pass
        passes: list[list[int]] = []

        def racing_pass(partition: PartitionScan) -> list[SidecarError]:
            passes.append([s.base_offset for s in partition.segments])
            if len(passes) == 1:
                clean_merge(log_dir)
            return real_pass(partition)

        monkeypatch.setattr(inspect_module, "_verify_pass", racing_pass)
        code, doc = inspect_json(log_dir, verify=True)
        assert code == EXIT_OK, doc["problems"]
        assert passes == [[0, 5, 9], [0, 9]]
        [partition] = doc["partitions"]
        assert partition["rechecks"] == 1
        assert [s["base_offset"] for s in partition["segments"]] == [0, 9]

    def test_one_segment_is_rechecked_too(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """inspect of one .log: the cleaner swaps it mid-verify, the recheck uses its new end."""
        real_verify = inspect_module.verify_segment
        targets: list[SegmentTarget] = []

        def racing_verify(target: SegmentTarget) -> list[SidecarError]:
            targets.append(target)
            if len(targets) == 1:
                clean_merge(log_dir)
            return real_verify(target)

        monkeypatch.setattr(inspect_module, "verify_segment", racing_verify)
        code, doc = inspect_json(seg_path(log_dir, 0), verify=True)
        assert code == EXIT_OK, doc["problems"]
        assert [t.next_base_offset for t in targets] == [5, 9]
        assert (doc["rechecks"], doc["next_base_offset"]) == (1, 9)

    def test_one_segment_absorbed_by_the_cleaner_is_vanished(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The segment given is merged into the one before it mid-verify: vanished, exit 0."""
        real_verify = inspect_module.verify_segment

        def racing_verify(target: SegmentTarget) -> list[SidecarError]:
            found = real_verify(target)
            clean_merge(log_dir)
            return [*found, IndexFormatError("looked wrong mid-swap", path="x", position=0)]

        monkeypatch.setattr(inspect_module, "verify_segment", racing_verify)
        code, doc = inspect_json(seg_path(log_dir, 5), verify=True)
        assert code == EXIT_OK, doc["problems"]
        assert [v["message"] for v in doc["vanished"]] == [
            f"{seg_path(log_dir, 5)} vanished while being verified (deleted by the broker)"
        ]

    def test_stale_scan_alone_finds_the_race(self, log_dir: Path) -> None:
        """Without the recheck the same race is a problem: the test above would fail without it."""
        stale = scan_partition_dir(log_dir / PART)
        assert stale is not None
        clean_merge(log_dir)
        assert any("past the segment end 4" in str(p) for p in inspect_module._verify_pass(stale))
        verified = verify_settled(stale)
        assert verified.rechecks == 1
        assert [type(p) for p in verified.problems] == [SegmentVanishedError]
        assert str(seg_path(log_dir, 5)) in str(verified.problems[0])

    def test_real_corruption_is_still_reported(self, log_dir: Path) -> None:
        """A bad CRC in files that hold still is found again by the recheck and reported once."""
        path = seg_path(log_dir, 5)
        data = bytearray(path.read_bytes())
        data[70] ^= 0x10
        path.write_bytes(data)
        scan = scan_partition_dir(log_dir / PART)
        assert scan is not None
        verified = verify_settled(scan)
        assert verified.rechecks == 1
        assert [(type(p), getattr(p, "position", None)) for p in verified.problems] == [
            (CorruptRecordError, 0)
        ]

    def test_files_that_never_hold_still_are_reported_after_three_passes(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A partition that changes during every pass gets three, then its problems are shown."""
        seg_path(log_dir, 5, FileKind.TIMEINDEX).write_bytes(
            seg_path(log_dir, 5, FileKind.TIMEINDEX).read_bytes() + bytes(12)
        )
        ticks = iter(range(100))
        monkeypatch.setattr(inspect_module, "_files_fingerprint", lambda _path: (next(ticks),))
        scan = scan_partition_dir(log_dir / PART)
        assert scan is not None
        verified = verify_settled(scan)
        assert verified.rechecks == 2
        assert [type(p) for p in verified.problems] == [IndexFormatError]

    def test_partition_deleted_during_the_recheck_is_vanished(
        self, log_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Topic deletion between the passes: exit 0, the partition listed under vanished."""
        real_pass = inspect_module._verify_pass

        def deleting_pass(partition: PartitionScan) -> list[SidecarError]:
            found = real_pass(partition)
            shutil.rmtree(log_dir / PART)
            return found

        seg_path(log_dir, 0, FileKind.INDEX).write_bytes(OFFSET_INDEX_ENTRY.pack(1, 3))
        monkeypatch.setattr(inspect_module, "_verify_pass", deleting_pass)
        code, doc = inspect_json(log_dir, verify=True)
        assert code == EXIT_OK, doc["problems"]
        assert [v["error"] for v in doc["vanished"]] == ["SegmentVanishedError"]
        assert doc["partitions"][0]["rechecks"] == 1


class TestRows:
    """The row helpers produce JSON-able dicts."""

    def test_problem_row(self) -> None:
        """A typed error becomes its type name, message, path and position."""
        row = problem_row(CorruptRecordError("bad", path="/x.log", position=12))
        assert row == {
            "error": "CorruptRecordError",
            "message": "bad (/x.log at byte 12)",
            "path": "/x.log",
            "position": 12,
        }
        json.dumps(row)


def test_no_timestamp_is_shown_as_such() -> None:
    """-1 (NO_TIMESTAMP, data converted from the v0 format) is not a date in 1969."""
    assert inspect_module._timestamp_text(-1) == "-1"
    assert inspect_module._timestamp_text(T0) == "2023-11-14T22:13:20.000Z"
