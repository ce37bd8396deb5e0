"""Offset, time and transaction indexes: parsing, zero tails, lookups and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import (
    IndexFormatError,
    SegmentVanishedError,
    TruncatedFileError,
    UnreadableFileError,
)
from sidecar.kafka.indexes import (
    ABORTED_TXN_ENTRY,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    AbortedTxn,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
    TxnIndex,
    index_tail,
)

BASE = 1000


def offset_index_bytes(*entries: tuple[int, int]) -> bytes:
    return b"".join(OFFSET_INDEX_ENTRY.pack(rel, pos) for rel, pos in entries)


def time_index_bytes(*entries: tuple[int, int]) -> bytes:
    return b"".join(TIME_INDEX_ENTRY.pack(ts, rel) for ts, rel in entries)


OFFSETS = offset_index_bytes((4, 4100), (9, 8300), (15, 12500))
TIMES = time_index_bytes((100, 4), (200, 9), (300, 15))


class TestOffsetIndex:
    """``.index``: (relativeOffset, position) entries."""

    def test_golden_bytes(self) -> None:
        """Entries are big-endian int32 pairs, relative to the segment base offset."""
        assert OFFSET_INDEX_ENTRY.pack(4, 4100) == b"\x00\x00\x00\x04\x00\x00\x10\x04"
        index = OffsetIndex.parse(OFFSETS, base_offset=BASE)
        assert list(index) == [
            OffsetPosition(1004, 4100),
            OffsetPosition(1009, 8300),
            OffsetPosition(1015, 12500),
        ]
        assert index[-1] == OffsetPosition(1015, 12500)
        assert len(index) == 3
        assert index.trimmed
        with pytest.raises(IndexError):
            index[3]

    @pytest.mark.parametrize(
        ("target", "expected"),
        [
            pytest.param(999, OffsetPosition(BASE, 0), id="below-base"),
            pytest.param(1003, OffsetPosition(BASE, 0), id="before-first-entry"),
            pytest.param(1004, OffsetPosition(1004, 4100), id="exact-first"),
            pytest.param(1008, OffsetPosition(1004, 4100), id="between"),
            pytest.param(1009, OffsetPosition(1009, 8300), id="exact-middle"),
            pytest.param(1015, OffsetPosition(1015, 12500), id="exact-last"),
            pytest.param(99999, OffsetPosition(1015, 12500), id="past-last"),
        ],
    )
    def test_lookup(self, target: int, expected: OffsetPosition) -> None:
        """lookup answers like OffsetIndex.lookup: the largest entry <= target, else (base, 0)."""
        assert OffsetIndex.parse(OFFSETS, base_offset=BASE).lookup(target) == expected

    def test_lookup_empty(self) -> None:
        """An empty index answers (base offset, 0)."""
        assert OffsetIndex.parse(b"", base_offset=BASE).lookup(5000) == OffsetPosition(BASE, 0)

    @pytest.mark.parametrize(
        ("data", "entries", "tail"),
        [
            pytest.param(OFFSETS, 3, 0, id="trimmed"),
            pytest.param(OFFSETS + bytes(80), 3, 10, id="preallocated"),
            pytest.param(bytes(8 * 64), 0, 64, id="preallocated-empty"),
            pytest.param(bytes(8), 1, 0, id="single-zero-entry-is-base-offset"),
            pytest.param(b"", 0, 0, id="empty"),
            pytest.param(offset_index_bytes((0, 0), (3, 500)), 2, 0, id="first-entry-zero"),
            pytest.param(offset_index_bytes((3, 0)) + bytes(8), 1, 1, id="position-zero-kept"),
        ],
    )
    def test_zero_tail(self, data: bytes, entries: int, tail: int) -> None:
        """A preallocated index's zero tail is set aside; a trimmed one has none."""
        index = OffsetIndex.parse(data, base_offset=BASE)
        assert (len(index), index.zero_tail_entries, index.trimmed) == (entries, tail, tail == 0)
        assert index.file_size == len(data)

    def test_partial_entry_is_truncation(self) -> None:
        """A length that is not a multiple of 8 names the byte where the partial entry starts."""
        with pytest.raises(TruncatedFileError) as info:
            OffsetIndex.parse(OFFSETS + b"\x00\x01", base_offset=BASE, path="a.index")
        assert (info.value.path, info.value.position) == ("a.index", 24)

    def test_entry_pointing_past_end_of_log(self) -> None:
        """validate names the entry whose position is outside the .log, by its byte in the index."""
        (problem,) = OffsetIndex.parse(OFFSETS, base_offset=BASE, path="s.index").validate(
            log_size=12000
        )
        assert isinstance(problem, IndexFormatError)
        assert (problem.path, problem.position) == ("s.index", 16)
        assert "12500" in str(problem)

    @pytest.mark.parametrize(
        ("data", "end_offset", "fragment", "position"),
        [
            pytest.param(
                offset_index_bytes((5, 100), (5, 200)),
                None,
                "does not increase",
                8,
                id="offset-repeats",
            ),
            pytest.param(
                offset_index_bytes((5, 100), (3, 200)),
                None,
                "does not increase",
                8,
                id="offset-decreases",
            ),
            pytest.param(
                offset_index_bytes((5, 300), (6, 200)),
                None,
                "<= previous",
                8,
                id="position-decreases",
            ),
            pytest.param(
                offset_index_bytes((-2, 100)), None, "relative offset -2", 0, id="negative-relative"
            ),
            pytest.param(
                offset_index_bytes((5, 100), (50, 200)),
                1020,
                "past the segment end",
                8,
                id="past-end-offset",
            ),
            pytest.param(offset_index_bytes((5, -1)), None, "outside", 0, id="negative-position"),
        ],
    )
    def test_validate(
        self, data: bytes, end_offset: int | None, fragment: str, position: int
    ) -> None:
        """Each inconsistency is one IndexFormatError at the entry's byte."""
        problems = OffsetIndex.parse(data, base_offset=BASE, path="i").validate(
            end_offset=end_offset
        )
        assert [p.position for p in problems] == [position]
        assert fragment in str(problems[0])

    def test_valid_index_has_no_problems(self) -> None:
        """A consistent index validates clean."""
        index = OffsetIndex.parse(OFFSETS, base_offset=BASE)
        assert index.validate(log_size=20000, end_offset=1020) == []

    def test_read_with_deleted_fallback(self, tmp_path: Path) -> None:
        """read() follows the broker's rename to .deleted."""
        (tmp_path / "00000000000000001000.index.deleted").write_bytes(OFFSETS)
        index = OffsetIndex.read(tmp_path / "00000000000000001000.index", base_offset=BASE)
        assert len(index) == 3
        assert index.path is not None

    def test_read_directory_in_place(self, tmp_path: Path) -> None:
        """A directory where the index should be is an UnreadableFileError naming it."""
        path = tmp_path / "00000000000000001000.index"
        path.mkdir()
        with pytest.raises(UnreadableFileError) as info:
            OffsetIndex.read(path, base_offset=BASE)
        assert info.value.path == str(path)


class TestTimeIndex:
    """``.timeindex``: (timestamp, relativeOffset) entries."""

    def test_entries_and_last_entry(self) -> None:
        """Entries are int64 timestamp then int32 relative offset."""
        assert TIME_INDEX_ENTRY.size == 12
        index = TimeIndex.parse(TIMES + bytes(36), base_offset=BASE)
        assert list(index) == [
            TimestampOffset(100, 1004),
            TimestampOffset(200, 1009),
            TimestampOffset(300, 1015),
        ]
        assert index.zero_tail_entries == 3
        assert index.last_entry() == TimestampOffset(300, 1015)
        assert TimeIndex.parse(b"", base_offset=BASE).last_entry() == TimestampOffset(-1, BASE)

    @pytest.mark.parametrize(
        ("target", "expected"),
        [
            pytest.param(50, TimestampOffset(-1, BASE), id="before-first"),
            pytest.param(100, TimestampOffset(100, 1004), id="exact-first"),
            pytest.param(250, TimestampOffset(200, 1009), id="between"),
            pytest.param(10**15, TimestampOffset(300, 1015), id="after-last"),
        ],
    )
    def test_lookup(self, target: int, expected: TimestampOffset) -> None:
        """lookup answers like TimeIndex.lookup: largest timestamp <= target, else (-1, base)."""
        assert TimeIndex.parse(TIMES, base_offset=BASE).lookup(target) == expected

    @pytest.mark.parametrize(
        ("data", "fragment", "position"),
        [
            pytest.param(
                time_index_bytes((200, 4), (100, 9)),
                "timestamp 100 decreases",
                12,
                id="timestamp-decreases",
            ),
            pytest.param(
                time_index_bytes((100, 9), (200, 4)),
                "offset 1004 decreases",
                12,
                id="offset-decreases",
            ),
            pytest.param(
                time_index_bytes((100, -1)), "relative offset -1", 0, id="negative-relative"
            ),
            pytest.param(
                time_index_bytes((100, 4), (200, 40)), "past the segment end", 12, id="past-end"
            ),
        ],
    )
    def test_validate(self, data: bytes, fragment: str, position: int) -> None:
        """Each inconsistency is one IndexFormatError at the entry's byte."""
        problems = TimeIndex.parse(data, base_offset=BASE, path="t").validate(end_offset=1020)
        assert [p.position for p in problems] == [position]
        assert fragment in str(problems[0])
        assert problems[0].path == "t"

    def test_equal_timestamps_are_valid(self) -> None:
        """Timestamps may repeat (the roll entry), offsets may repeat; neither is a problem."""
        data = time_index_bytes((100, 4), (100, 4))
        assert TimeIndex.parse(data, base_offset=BASE).validate() == []

    def test_partial_entry(self) -> None:
        """A time index whose length is not a multiple of 12 is truncated at the partial entry."""
        with pytest.raises(TruncatedFileError) as info:
            TimeIndex.parse(TIMES[:-4], base_offset=BASE, path="x.timeindex")
        assert info.value.position == 24


def txn(producer: int, first: int, last: int, lso: int, version: int = 0) -> bytes:
    return ABORTED_TXN_ENTRY.pack(version, producer, first, last, lso)


class TestTxnIndex:
    """``.txnindex``: 34-byte aborted-transaction entries."""

    def test_layout_and_entries(self) -> None:
        """An entry is version int16, producerId, firstOffset, lastOffset, lastStableOffset."""
        assert ABORTED_TXN_ENTRY.size == 34
        data = txn(7, 1001, 1005, 1000) + txn(8, 1003, 1010, 1001)
        index = TxnIndex.parse(data, base_offset=BASE)
        assert list(index) == [
            AbortedTxn(0, 7, 1001, 1005, 1000),
            AbortedTxn(0, 8, 1003, 1010, 1001),
        ]
        assert index.validate() == []

    def test_unknown_version(self) -> None:
        """An entry with a version other than 0 is an IndexFormatError at that entry."""
        with pytest.raises(IndexFormatError, match="version 3") as info:
            TxnIndex.parse(txn(1, 1, 2, 1) + txn(1, 1, 2, 1, version=3), base_offset=0, path="t")
        assert (info.value.path, info.value.position) == ("t", 34)

    def test_partial_entry(self) -> None:
        """A txn index cut inside an entry is truncated there (zeros are never padding here)."""
        with pytest.raises(TruncatedFileError) as info:
            TxnIndex.parse(txn(1, 1, 2, 1) + bytes(10), base_offset=0)
        assert info.value.position == 34

    def test_missing_file_is_empty(self, tmp_path: Path) -> None:
        """A missing .txnindex is an empty index, as in the broker."""
        index = TxnIndex.read(tmp_path / "00000000000000000000.txnindex", base_offset=0)
        assert len(index) == 0

    @pytest.mark.parametrize(
        ("data", "fragment"),
        [
            pytest.param(
                txn(1, 1010, 1005, 1000), "first offset 1010 > last 1005", id="first-after-last"
            ),
            pytest.param(txn(1, 900, 950, 900), "last offset 950 < base 1000", id="before-segment"),
        ],
    )
    def test_validate(self, data: bytes, fragment: str) -> None:
        """TransactionIndex.sanityCheck's conditions are reported per entry."""
        (problem,) = TxnIndex.parse(data, base_offset=BASE).validate()
        assert fragment in str(problem)


class TestIndexTail:
    """The one-read probe that tells a trimmed index from a preallocated one."""

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            pytest.param(b"", (0, b""), id="empty"),
            pytest.param(OFFSETS, (24, OFFSETS[-8:]), id="trimmed"),
            pytest.param(OFFSETS + bytes(800), (824, bytes(8)), id="preallocated"),
        ],
    )
    def test_tail(self, tmp_path: Path, data: bytes, expected: tuple[int, bytes]) -> None:
        """index_tail returns the file size and its last entry's bytes."""
        path = tmp_path / "00000000000000000000.index"
        path.write_bytes(data)
        assert index_tail(path, 8) == expected

    def test_partial_entry(self, tmp_path: Path) -> None:
        """A size that is not a whole number of entries is a TruncatedFileError at the remainder."""
        path = tmp_path / "00000000000000000000.timeindex"
        path.write_bytes(bytes(30))
        with pytest.raises(TruncatedFileError) as info:
            index_tail(path, 12)
        assert (info.value.path, info.value.position) == (str(path), 24)

    def test_vanished(self, tmp_path: Path) -> None:
        """A vanished index (and no .deleted twin) raises SegmentVanishedError."""
        with pytest.raises(SegmentVanishedError):
            index_tail(tmp_path / "00000000000000000000.index", 8)
