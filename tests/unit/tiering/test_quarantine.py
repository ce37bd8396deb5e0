"""Corrupt versus unreadable, the partition backoff, and the quarantine file keyed by topic id."""

from __future__ import annotations

import errno
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import (
    CorruptRecordError,
    StorageError,
    TruncatedFileError,
    UnreadableFileError,
)
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.kafka.logdir import scan_partition_dir
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering._backoff import partition_backoff
from sidecar.tiering.quarantine import (
    FORMAT_VERSION,
    Quarantine,
    QuarantineEntry,
    Verdict,
    classify,
    read_error_reason,
)
from sidecar.tiering.uploader import (
    CorruptSegmentError,
    SegmentChangedError,
    _check_batches,
    _open_segment,
)
from tests.read_faults import failing_opener

ORDERS = uuid.UUID(int=1)
ORDERS_AGAIN = uuid.UUID(int=2)  # "orders", deleted and created again


def _entry(
    topic_id: uuid.UUID = ORDERS, partition: int = 0, base: int = 0, **kw
) -> QuarantineEntry:
    fields = {
        "topic_id": topic_id,
        "topic": "orders",
        "partition": partition,
        "base_offset": base,
        "end_offset": base + 99,
        "size_bytes": 1000,
        "reason": "record batch at offset 0 is corrupt",
        "since_ms": 1_700_000_000_000,
    }
    fields.update(kw)
    return QuarantineEntry(**fields)  # type: ignore[arg-type]


def _caused(outer: Any, cause: Exception) -> Any:
    """``outer`` as ``raise outer from cause`` leaves it."""
    outer.__cause__ = cause
    return outer


def _wrapped(cause: Exception) -> CorruptSegmentError:
    return _caused(CorruptSegmentError("segment x is corrupt"), cause)


class TestClassify:
    def test_unreadable_file_is_not_corrupt(self):
        """EIO while reading is a disk problem: retried, never quarantined."""
        exc = UnreadableFileError("cannot read file", path="x", errno=errno.EIO)
        assert classify(exc) is Verdict.UNREADABLE
        assert exc.retriable
        assert read_error_reason(exc) == "eio"

    def test_bare_oserror_is_unreadable(self):
        """A bare OSError from a file read is unreadable, labelled by its errno."""
        exc = PermissionError(errno.EACCES, "Permission denied")
        assert classify(exc) is Verdict.UNREADABLE
        assert read_error_reason(exc) == "eacces"

    @pytest.mark.parametrize(
        "cause",
        [
            pytest.param(CorruptRecordError("bad crc", path="x", position=0), id="crc"),
            pytest.param(TruncatedFileError("cut off", path="x", position=7), id="framing"),
        ],
    )
    def test_bad_bytes_are_corrupt(self, cause):
        """A CRC mismatch or broken batch framing is proof of corrupt bytes."""
        assert classify(_wrapped(cause)) is Verdict.CORRUPT

    def test_corrupt_without_cause_is_corrupt(self):
        """Batches that do not fill the file (no parse error) are corrupt too."""
        assert classify(CorruptSegmentError("batches end at byte 10 of 17")) is Verdict.CORRUPT

    def test_read_error_under_corrupt_is_unreadable(self):
        """A read error wrapped as corrupt (as the uploader used to) is still only unreadable."""
        exc = _wrapped(UnreadableFileError("cannot read file", path="x", errno=errno.EIO))
        assert classify(exc) is Verdict.UNREADABLE
        assert read_error_reason(exc) == "eio"

    def test_storage_errors_are_neither(self):
        """An S3 failure (even one caused by a refused connection) is not about local files."""
        refused = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        assert classify(_caused(StorageError("put failed"), refused)) is Verdict.OTHER

    def test_reason_without_errno(self):
        """An error without an errno gets the bounded label ``unknown``."""
        assert read_error_reason(UnreadableFileError("odd", path="x")) == "unknown"


class TestUploaderReadErrors:
    def test_eio_during_crc_check_is_unreadable_not_corrupt(self, tmp_path, monkeypatch):
        """An EIO while the batch CRCs are checked raises UnreadableFileError, and the segment
        opens fine once the disk reads again."""
        import sidecar.kafka.records as records

        batches = [[build_batch([TestRecord(b"k", b"v" * 50)]) for _ in range(3)] for _ in range(2)]
        scan = scan_partition_dir(write_partition(tmp_path, "orders", 0, batches))
        assert scan is not None
        segment = scan.segments[0]
        opener, handed = failing_opener(segment.log_path, 1, records.open_with_deleted_fallback)
        monkeypatch.setattr(records, "open_with_deleted_fallback", opener)
        with pytest.raises(UnreadableFileError) as info:
            _open_segment(scan, segment)
        assert handed() == 1
        assert info.value.errno == errno.EIO
        assert classify(info.value) is Verdict.UNREADABLE
        opened = _open_segment(scan, segment)  # the next read succeeds
        opened.log.close()

    def test_segment_truncated_under_the_check_is_changed_not_corrupt(self, tmp_path):
        """A segment the broker truncates while its CRCs are checked is not corrupt: it raises
        the retriable SegmentChangedError (planned again), and is never quarantined."""
        batches = [[build_batch([TestRecord(b"k", b"v" * 50)]) for _ in range(3)] for _ in range(2)]
        scan = scan_partition_dir(write_partition(tmp_path, "orders", 0, batches))
        assert scan is not None
        segment = scan.segments[0]
        size = segment.log_path.stat().st_size
        with segment.log_path.open("r+b") as f:
            f.truncate(size - 10)  # inside the last batch
        with pytest.raises(SegmentChangedError) as info:
            _check_batches(str(segment.log_path), segment, size)
        assert classify(info.value) is Verdict.OTHER
        with segment.log_path.open("r+b") as f:
            f.truncate(len(batches[0][0]))  # at a batch boundary
        with pytest.raises(SegmentChangedError):
            _check_batches(str(segment.log_path), segment, size)


class TestBackoff:
    def test_doubles_then_caps(self):
        """Each consecutive failure doubles the step, up to the cap."""
        steps = [
            partition_backoff(n, initial_s=0.5, max_s=60, retriable=True, draw=1.0)
            for n in range(1, 10)
        ]
        assert steps == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]

    @pytest.mark.parametrize("failures", [1, 3, 20, 10_000])
    def test_jitter_stays_in_the_upper_half(self, failures):
        """The jittered wait is never below half its step nor above it."""
        cap = min(60.0, 0.5 * 2 ** min(failures - 1, 62))
        low = partition_backoff(failures, initial_s=0.5, max_s=60, retriable=True, draw=0.0)
        high = partition_backoff(failures, initial_s=0.5, max_s=60, retriable=True, draw=0.999)
        assert low == cap / 2
        assert cap / 2 < high < cap

    def test_not_retriable_waits_the_cap(self):
        """An error that retrying cannot fix waits (about) the cap from the first failure."""
        delay = partition_backoff(1, initial_s=0.5, max_s=60, retriable=False, draw=0.5)
        assert delay == 45.0

    def test_rejects_zero_failures(self):
        """The first failure is number 1."""
        with pytest.raises(ValueError, match="at least 1"):
            partition_backoff(0, initial_s=0.5, max_s=60, retriable=True, draw=0.5)


class TestQuarantineStore:
    def test_persists_across_restarts(self, tmp_path):
        """Entries survive a restart, keyed by topic id and partition."""
        q = Quarantine(tmp_path / "quarantine.json")
        q.add(_entry(base=1024))
        again = Quarantine(tmp_path / "quarantine.json")
        assert again.offsets(ORDERS, 0) == {1024}
        assert again.offsets(ORDERS, 1) == frozenset()
        assert len(again) == 1
        assert again.size_bytes == 1000
        assert again.entries() == [_entry(base=1024)]

    def test_recreated_topic_inherits_nothing(self, tmp_path):
        """A topic deleted and created again under the same name has a new id: not quarantined."""
        q = Quarantine(tmp_path / "quarantine.json")
        q.add(_entry(base=0))
        assert q.offsets(ORDERS, 0) == {0}
        assert q.offsets(ORDERS_AGAIN, 0) == frozenset()

    def test_file_format(self, tmp_path):
        """The file names the topic id (Kafka's base64), the topic and the segment."""
        Quarantine(tmp_path / "quarantine.json").add(_entry(base=5))
        saved = json.loads((tmp_path / "quarantine.json").read_text())
        assert saved["version"] == FORMAT_VERSION
        assert saved["segments"] == [
            {
                "topic_id": encode_kafka_uuid(ORDERS),
                "topic": "orders",
                "partition": 0,
                "base_offset": 5,
                "end_offset": 104,
                "size_bytes": 1000,
                "reason": "record batch at offset 0 is corrupt",
                "since_ms": 1_700_000_000_000,
            }
        ]

    def test_legacy_name_keyed_entries_are_dropped(self, tmp_path):
        """Entries of the older format (by topic name) are dropped and the file rewritten."""
        path = tmp_path / "quarantine.json"
        legacy = {"topic": "orders", "partition": 0, "base_offset": 0, "reason": "EIO"}
        path.write_text(json.dumps({"segments": [legacy]}))
        q = Quarantine(path)
        assert len(q) == 0
        assert q.legacy_dropped == 1
        assert json.loads(path.read_text()) == {"version": FORMAT_VERSION, "segments": []}

    def test_legacy_entries_only_counted_without_migrate(self, tmp_path):
        """A reader that must not change anything (``quarantine list``) leaves the file as is."""
        path = tmp_path / "quarantine.json"
        text = json.dumps({"segments": [{"topic": "orders", "partition": 0, "base_offset": 0}]})
        path.write_text(text)
        assert Quarantine(path, migrate=False).legacy_dropped == 1
        assert path.read_text() == text

    def test_unreadable_file_starts_empty(self, tmp_path):
        """A damaged quarantine file is reported and ignored, not fatal."""
        (tmp_path / "quarantine.json").write_text("{not json")
        q = Quarantine(tmp_path / "quarantine.json")
        assert len(q) == 0
        q.add(_entry())  # and the next write replaces it
        assert Quarantine(tmp_path / "quarantine.json").offsets(ORDERS, 0) == {0}

    def test_clear_one_offset(self, tmp_path):
        """Clearing one base offset leaves the partition's other entries."""
        q = Quarantine(tmp_path / "quarantine.json")
        q.add(_entry(base=0))
        q.add(_entry(base=100))
        removed = q.clear(topic="orders", partition=0, base_offset=100)
        assert [e.base_offset for e in removed] == [100]
        assert q.offsets(ORDERS, 0) == {0}

    def test_clear_partition_every_incarnation(self, tmp_path):
        """Without an offset, every entry of the partition goes, for every id the name had,
        unless a topic id narrows it; other partitions stay."""
        q = Quarantine(tmp_path / "quarantine.json")
        q.add(_entry(ORDERS, base=0))
        q.add(_entry(ORDERS_AGAIN, base=0))
        q.add(_entry(ORDERS_AGAIN, base=7))
        q.add(_entry(ORDERS, partition=1, base=0))
        assert q.clear(topic="orders", partition=0, topic_id=ORDERS_AGAIN) == [
            _entry(ORDERS_AGAIN, base=0),
            _entry(ORDERS_AGAIN, base=7),
        ]
        assert q.offsets(ORDERS, 0) == {0}
        assert len(q.clear(topic="orders", partition=0)) == 1
        assert q.offsets(ORDERS, 1) == {0}
        assert q.clear(topic="payments", partition=1) == []

    def test_a_clear_elsewhere_is_seen_on_refresh(self, tmp_path):
        """The daemon's copy picks up a clear by another process (the CLI) on refresh, and a
        refresh without a change reports none."""
        daemon = Quarantine(tmp_path / "quarantine.json")
        daemon.add(_entry(base=0))
        daemon.add(_entry(base=100))
        assert daemon.refresh() is False
        Quarantine(tmp_path / "quarantine.json").clear(topic="orders", partition=0, base_offset=0)
        assert daemon.offsets(ORDERS, 0) == {0, 100}
        assert daemon.refresh() is True
        assert daemon.offsets(ORDERS, 0) == {100}
        assert daemon.refresh() is False

    def test_writers_merge(self, tmp_path):
        """A daemon that adds after a clear elsewhere keeps the clear (each writer merges its
        change into the file as it is on disk)."""
        daemon = Quarantine(tmp_path / "quarantine.json")
        daemon.add(_entry(base=0))
        Quarantine(tmp_path / "quarantine.json").clear(topic="orders", partition=0)
        daemon.add(_entry(base=200))  # without a refresh in between
        assert Quarantine(tmp_path / "quarantine.json").offsets(ORDERS, 0) == {200}
        assert daemon.offsets(ORDERS, 0) == {200}

    def test_add_survives_an_unwritable_state_dir(self, tmp_path):
        """If the file cannot be written, the entry still holds in memory (and is logged)."""
        blocker = tmp_path / "file"
        blocker.write_text("")
        q = Quarantine(blocker / "quarantine.json")  # its directory is a file
        q.add(_entry(base=3))
        assert q.offsets(ORDERS, 0) == {3}


def test_paths_are_plain(tmp_path: Path) -> None:
    """The lock and temporary files sit beside the quarantine file in the state dir."""
    q = Quarantine(tmp_path / "quarantine.json")
    q.add(_entry())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quarantine.json", "quarantine.json.lock"]
