"""What the uploader checks before anything is published: batch CRCs and the files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.kafka.logdir import scan_partition_dir
from sidecar.storage.manifest import IndexKind
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering.uploader import CorruptSegmentError, _open_segment


def _partition(tmp_path: Path):
    batches = [[build_batch([TestRecord(b"k", b"v" * 50)]) for _ in range(5)] for _ in range(3)]
    scan = scan_partition_dir(write_partition(tmp_path, "orders", 0, batches))
    assert scan is not None
    return scan


class TestOpenSegment:
    def test_valid_segment_opens_with_its_files(self, tmp_path):
        """A rolled segment opens with every Kafka file that travels with it."""
        scan = _partition(tmp_path)
        opened = _open_segment(scan, scan.segments[0])
        try:
            assert opened.size == scan.segments[0].log_path.stat().st_size
            assert opened.index_files[IndexKind.PRODUCER_SNAPSHOT] is not None
            assert opened.index_files[IndexKind.TXN_INDEX] is None
            assert opened.index_files[IndexKind.LEADER_EPOCH_CHECKPOINT].startswith(b"0\n")
            # the descriptor path keeps reading after the broker renames the file
            scan.segments[0].log_path.rename(str(scan.segments[0].log_path) + ".deleted")
            assert Path(opened.log_path).read_bytes()[:8] == (0).to_bytes(8, "big")
        finally:
            opened.log.close()

    def test_bad_crc_is_corrupt(self, tmp_path):
        """A flipped byte inside a batch makes the segment corrupt: it is never uploaded."""
        scan = _partition(tmp_path)
        path = scan.segments[1].log_path
        data = bytearray(path.read_bytes())
        data[70] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(CorruptSegmentError, match="corrupt") as info:
            _open_segment(scan, scan.segments[1])
        assert str(path) in str(info.value)

    def test_trailing_garbage_is_corrupt(self, tmp_path):
        """Bytes after the last batch that do not form a batch make the segment corrupt."""
        scan = _partition(tmp_path)
        path = scan.segments[0].log_path
        path.write_bytes(path.read_bytes() + b"\x00" * 7)
        with pytest.raises(CorruptSegmentError):
            _open_segment(scan, scan.segments[0])
