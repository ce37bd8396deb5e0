"""Record batches: header parsing, batch walks with CRC and tail detection, record decoding."""

from __future__ import annotations

import builtins
import io
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import crc32c
import pytest

import sidecar.kafka.records as records_module
from sidecar.errors import (
    CorruptRecordError,
    MissingToolError,
    SegmentVanishedError,
    TruncatedFileError,
    UnreadableFileError,
)
from sidecar.kafka.records import (
    BATCH_HEADER,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Compression,
    ControlRecordType,
    TimestampType,
    decode_batches,
    decode_records,
    iter_batches,
    parse_batch_header,
    read_batch,
)
from sidecar.testing import TestRecord, build_batch, build_control_batch, rebase_batch

RECORDS = [
    TestRecord(b"k0", b"v" * 40, [("h1", b"x"), ("h2", None)], timestamp=1_700_000_000_000),
    TestRecord(None, b"value-1", (), timestamp=1_700_000_000_005),
    TestRecord(b"k2", None, [("h", b"")], timestamp=1_699_999_999_990),
]


def _segment(*batches: bytes) -> bytes:
    """Concatenate batches with consecutive offsets, as in a .log file."""
    out = bytearray()
    offset = 0
    for batch in batches:
        rebased = rebase_batch(batch, offset)
        out += rebased
        offset = parse_batch_header(rebased).next_offset
    return bytes(out)


def _recrc(batch: bytes) -> bytes:
    """The batch with its CRC recomputed after an edit (to reach checks behind the CRC)."""
    out = bytearray(batch)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


class TestBatchHeader:
    """Parsing the 61-byte v2 header and its attribute bits."""

    def test_golden_header_fields(self) -> None:
        """Every header field is read from its documented byte offset, big-endian."""
        raw = BATCH_HEADER.pack(
            1234, 49 + 7, 5, 2, 0xDEADBEEF, 0x0001 | 0x08 | 0x10, 3, 1000, 2000, 77, 4, 9, 4
        ) + bytes(7)
        assert raw[:8] == (1234).to_bytes(8, "big")
        assert raw[16] == 2
        header = parse_batch_header(raw, position=500)
        assert header == BatchHeader(
            position=500,
            base_offset=1234,
            batch_length=56,
            partition_leader_epoch=5,
            magic=2,
            crc=0xDEADBEEF,
            attributes=0x19,
            last_offset_delta=3,
            base_timestamp=1000,
            max_timestamp=2000,
            producer_id=77,
            producer_epoch=4,
            base_sequence=9,
            record_count=4,
        )
        assert header.size == 68
        assert header.end_position == 568
        assert header.last_offset == 1237
        assert header.next_offset == 1238

    @pytest.mark.parametrize(
        ("attributes", "compression", "timestamp_type", "txn", "control", "horizon"),
        [
            pytest.param(
                0x00, Compression.NONE, TimestampType.CREATE_TIME, False, False, False, id="plain"
            ),
            pytest.param(
                0x01, Compression.GZIP, TimestampType.CREATE_TIME, False, False, False, id="gzip"
            ),
            pytest.param(
                0x02,
                Compression.SNAPPY,
                TimestampType.CREATE_TIME,
                False,
                False,
                False,
                id="snappy",
            ),
            pytest.param(
                0x03, Compression.LZ4, TimestampType.CREATE_TIME, False, False, False, id="lz4"
            ),
            pytest.param(
                0x04, Compression.ZSTD, TimestampType.CREATE_TIME, False, False, False, id="zstd"
            ),
            pytest.param(
                0x08,
                Compression.NONE,
                TimestampType.LOG_APPEND_TIME,
                False,
                False,
                False,
                id="log-append-time",
            ),
            pytest.param(
                0x10,
                Compression.NONE,
                TimestampType.CREATE_TIME,
                True,
                False,
                False,
                id="transactional",
            ),
            pytest.param(
                0x30,
                Compression.NONE,
                TimestampType.CREATE_TIME,
                True,
                True,
                False,
                id="txn-marker",
            ),
            pytest.param(
                0x40,
                Compression.NONE,
                TimestampType.CREATE_TIME,
                False,
                False,
                True,
                id="delete-horizon",
            ),
        ],
    )
    def test_attribute_bits(
        self,
        attributes: int,
        compression: Compression,
        timestamp_type: TimestampType,
        txn: bool,
        control: bool,
        horizon: bool,
    ) -> None:
        """Attribute bits map to codec, timestamp type, transactional, control, delete horizon."""
        raw = BATCH_HEADER.pack(0, 49, 0, 2, 0, attributes, 0, 111, 222, -1, -1, -1, 0)
        header = parse_batch_header(raw)
        assert header.compression is compression
        assert header.timestamp_type is timestamp_type
        assert header.is_transactional is txn
        assert header.is_control is control
        assert header.has_delete_horizon is horizon
        assert header.delete_horizon_ms == (111 if horizon else None)

    @pytest.mark.parametrize(
        ("raw", "error", "fragment"),
        [
            pytest.param(b"", TruncatedFileError, "end of file", id="empty"),
            pytest.param(b"\x00" * 40, CorruptRecordError, "zero-padded", id="zeros"),
            pytest.param(
                b"\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x31\x00",
                TruncatedFileError,
                "inside a record batch header",
                id="short-header",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, 49, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                CorruptRecordError,
                "magic 1",
                id="magic-1",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, 48, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                CorruptRecordError,
                "smaller than the minimum",
                id="length-too-small",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, -1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                CorruptRecordError,
                "smaller than the minimum",
                id="negative-length",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, 60, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                TruncatedFileError,
                "cut off",
                id="length-past-end",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, 49, 0, 2, 0, 5, 0, 0, 0, 0, 0, 0, 0),
                CorruptRecordError,
                "unknown compression codec id 5",
                id="codec-5",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, 49, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, -1),
                CorruptRecordError,
                "recordsCount -1",
                id="negative-count",
            ),
            pytest.param(
                BATCH_HEADER.pack(0, 49, 0, 2, 0, 0, -2, 0, 0, 0, 0, 0, 0),
                CorruptRecordError,
                "lastOffsetDelta -2",
                id="negative-delta",
            ),
        ],
    )
    def test_bad_headers_name_file_and_position(
        self, raw: bytes, error: type[Exception], fragment: str
    ) -> None:
        """A malformed header raises the typed error with the file and the batch's byte position."""
        with pytest.raises(error, match=fragment) as info:
            parse_batch_header(raw, position=4096, path="/logs/t-0/00000000000000000000.log")
        assert info.value.path == "/logs/t-0/00000000000000000000.log"  # type: ignore[attr-defined]
        assert info.value.position == 4096  # type: ignore[attr-defined]
        assert "00000000000000000000.log at byte 4096" in str(info.value)


class TestIterBatches:
    """Walking a .log: positions, CRCs, truncation, zero tails, races and unreadable files."""

    def test_walks_buffer_with_positions_and_sizes(self) -> None:
        """Each header carries its byte position and size, and batches follow each other."""
        seg = _segment(build_batch(RECORDS), build_batch(RECORDS[:1]), build_batch(RECORDS[:2]))
        headers = list(iter_batches(seg))
        assert [h.base_offset for h in headers] == [0, 3, 4]
        assert headers[0].position == 0
        assert headers[1].position == headers[0].size
        assert headers[2].end_position == len(seg)
        assert [h.record_count for h in headers] == [3, 1, 2]

    def test_buffer_file_and_path_agree(self, tmp_path: Path) -> None:
        """A buffer, an open file and a path give the same headers."""
        seg = _segment(*(build_batch(RECORDS, compression=c) for c in Compression))
        path = tmp_path / "00000000000000000000.log"
        path.write_bytes(seg)
        from_buffer = list(iter_batches(seg))
        with path.open("rb") as fh:
            from_file = list(iter_batches(fh))
        assert from_buffer == from_file == list(iter_batches(path))
        assert len(from_buffer) == len(Compression)

    def test_origin_start_and_end_bound_the_walk(self) -> None:
        """A ranged read from file position P reports positions from P, within [start, end)."""
        seg = _segment(build_batch(RECORDS), build_batch(RECORDS), build_batch(RECORDS))
        size = parse_batch_header(seg).size
        tail = seg[size:]
        headers = list(iter_batches(tail, origin=size))
        assert [h.position for h in headers] == [size, 2 * size]
        only_middle = list(iter_batches(seg, start=size, end=2 * size))
        assert [h.base_offset for h in only_middle] == [3]

    def test_bad_crc_names_file_and_batch_position(self, tmp_path: Path) -> None:
        """A flipped bit inside the second batch fails its CRC at that batch's position."""
        seg = bytearray(_segment(build_batch(RECORDS), build_batch(RECORDS)))
        second = parse_batch_header(seg).size
        seg[second + 70] ^= 0x01
        path = tmp_path / "00000000000000000000.log"
        path.write_bytes(seg)
        with pytest.raises(CorruptRecordError, match="stored crc") as info:
            list(iter_batches(path))
        assert info.value.path == str(path)
        assert info.value.position == second
        assert list(iter_batches(path, verify_crc=False))[1].position == second

    def test_crc_excludes_leader_epoch_and_base_offset(self) -> None:
        """The broker restamps baseOffset and partitionLeaderEpoch without touching the CRC."""
        batch = bytearray(build_batch(RECORDS))
        struct.pack_into(">qii", batch, 0, 999, len(batch) - 12, 42)
        (header,) = iter_batches(bytes(batch))
        assert (header.base_offset, header.partition_leader_epoch) == (999, 42)

    def test_truncated_batch(self, tmp_path: Path) -> None:
        """A batch cut off by end of file is a TruncatedFileError at its start, or the end of an
        active segment's walk with tolerate_tail."""
        seg = _segment(build_batch(RECORDS), build_batch(RECORDS))
        cut = seg[:-10]
        path = tmp_path / "00000000000000000000.log"
        path.write_bytes(cut)
        second = parse_batch_header(seg).size
        with pytest.raises(TruncatedFileError, match="cut off") as info:
            list(iter_batches(path))
        assert (info.value.path, info.value.position) == (str(path), second)
        assert [h.position for h in iter_batches(path, tolerate_tail=True)] == [0]

    def test_a_file_truncated_under_the_walk(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A follower truncates its active segment while it is walked: the next window comes
        back short. A tolerant walk ends there; a strict one says the file shrank."""
        monkeypatch.setattr(records_module, "_CRC_CHUNK", 256)  # a window per batch or so
        one = build_batch(RECORDS)
        path = tmp_path / "00000000000000000000.log"

        def walk(tolerate: bool) -> list[int]:
            # past what the file object's own buffer (8 KiB) holds from its first read
            path.write_bytes(_segment(*[one] * 200))
            seen = []
            for header in iter_batches(path, tolerate_tail=tolerate):
                seen.append(header.position)
                if len(seen) == 2:
                    with path.open("r+b") as fh:
                        fh.truncate(len(one))
            return seen

        seen = walk(True)
        assert seen == [i * len(one) for i in range(len(seen))]
        assert 2 <= len(seen) < 200
        with pytest.raises(TruncatedFileError, match="shrank"):
            walk(False)

    @pytest.mark.parametrize("decode", [False, True], ids=["crc-walk", "decode"])
    def test_a_file_truncated_inside_the_next_batch(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decode: bool
    ) -> None:
        """The truncation cuts the next batch after its header: the header still reads, then
        the read of its body (for the CRC, or to decode it) comes back short. A tolerant walk
        ends there too; a strict one says the file shrank."""
        monkeypatch.setattr(records_module, "_CRC_CHUNK", 256)  # batches span several windows
        one = build_batch([TestRecord(b"k", b"v" * 600, ())])
        path = tmp_path / "00000000000000000000.log"

        def walk(tolerate: bool) -> list[int]:
            path.write_bytes(_segment(one, one, one))
            seen = []
            # unbuffered: every window is read from the file as it is now
            with path.open("rb", buffering=0) as fh:
                walker = (
                    (h for h, _ in decode_batches(fh, tolerate_tail=tolerate))
                    if decode
                    else iter_batches(fh, tolerate_tail=tolerate)
                )
                for header in walker:
                    seen.append(header.position)
                    with path.open("r+b") as out:
                        out.truncate(len(one) + RECORD_BATCH_OVERHEAD + 40)
            return seen

        assert walk(True) == [0]
        with pytest.raises(TruncatedFileError, match="shrank"):
            walk(False)

    def test_truncated_header(self) -> None:
        """A file ending inside the 17 bytes before magic is truncated, not corrupt."""
        seg = _segment(build_batch(RECORDS)) + b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00"
        with pytest.raises(TruncatedFileError) as info:
            list(iter_batches(seg, path="x.log"))
        assert info.value.position == len(seg) - 10

    def test_zero_padded_tail(self) -> None:
        """Preallocated zeros after the last batch are reported at their first byte, or end a
        tolerant walk."""
        seg = _segment(build_batch(RECORDS))
        padded = seg + bytes(4096)
        with pytest.raises(CorruptRecordError, match="zero-padded tail") as info:
            list(iter_batches(padded, path="seg.log"))
        assert info.value.position == len(seg)
        assert "seg.log at byte" in str(info.value)
        assert len(list(iter_batches(padded, tolerate_tail=True))) == 1

    def test_short_zero_tail(self) -> None:
        """Fewer than 12 zero bytes at the end are a zero tail too."""
        seg = _segment(build_batch(RECORDS))
        with pytest.raises(CorruptRecordError, match="zero-padded"):
            list(iter_batches(seg + bytes(5)))
        assert len(list(iter_batches(seg + bytes(5), tolerate_tail=True))) == 1

    def test_bad_magic_is_not_tolerated(self) -> None:
        """A wrong magic byte is corruption even in a tolerant walk."""
        seg = bytearray(_segment(build_batch(RECORDS), build_batch(RECORDS)))
        second = parse_batch_header(seg).size
        seg[second + 16] = 1
        with pytest.raises(CorruptRecordError, match="magic 1") as info:
            list(iter_batches(bytes(seg), tolerate_tail=True))
        assert info.value.position == second

    def test_crc_is_computed_in_chunks_without_reading_the_whole_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reads are bounded by the CRC chunk size, whatever the batch or file size."""
        big = [TestRecord(b"k", bytes(range(256)) * 40) for _ in range(20)]
        seg = _segment(build_batch(big), build_batch(big))
        path = tmp_path / "00000000000000000000.log"
        path.write_bytes(seg)
        monkeypatch.setattr(records_module, "_CRC_CHUNK", 1000)
        sizes: list[int] = []

        class Spy(io.FileIO):
            def read(self, size: int | None = -1, /) -> bytes:
                sizes.append(-1 if size is None else size)
                return super().read(size)

            def readinto(self, buffer: Any, /) -> int | None:
                sizes.append(len(memoryview(buffer)))
                return super().readinto(buffer)

        with Spy(path) as fh:
            headers = list(iter_batches(fh))
        assert len(headers) == 2
        assert max(sizes) <= 1000
        assert sum(s for s in sizes) >= len(seg) - 2 * 21

    def test_reads_a_file_renamed_to_deleted(self, tmp_path: Path) -> None:
        """A segment the broker renamed to .deleted is read under the new name."""
        path = tmp_path / "00000000000000000000.log"
        (tmp_path / "00000000000000000000.log.deleted").write_bytes(_segment(build_batch(RECORDS)))
        assert [h.base_offset for h in iter_batches(path)] == [0]

    def test_vanished_file(self, tmp_path: Path) -> None:
        """A segment gone under both names raises SegmentVanishedError naming it."""
        path = tmp_path / "00000000000000000000.log"
        with pytest.raises(SegmentVanishedError, match=r"00000000000000000000\.log"):
            list(iter_batches(path))

    def test_directory_in_place_of_file(self, tmp_path: Path) -> None:
        """A directory where the .log should be is an UnreadableFileError naming the path."""
        path = tmp_path / "00000000000000000000.log"
        path.mkdir()
        with pytest.raises(UnreadableFileError, match="is a directory") as info:
            list(iter_batches(path))
        assert (info.value.path, info.value.position) == (str(path), 0)

    def test_permission_denied(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A file we may not open is an UnreadableFileError naming the path (tests run as root,
        so the denial is simulated)."""
        path = tmp_path / "00000000000000000000.log"
        path.write_bytes(_segment(build_batch(RECORDS)))
        real_open = builtins.open

        def deny(file: Any, *args: Any, **kwargs: Any) -> Any:
            if str(file) == str(path):
                raise PermissionError(13, "Permission denied", str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", deny)
        monkeypatch.setattr(io, "open", deny)
        with pytest.raises(UnreadableFileError, match="Permission denied") as info:
            list(iter_batches(path))
        assert info.value.path == str(path)

    def test_read_batch_returns_exact_bytes(self, tmp_path: Path) -> None:
        """read_batch returns the bytes a header describes, from a buffer or a file."""
        seg = _segment(build_batch(RECORDS), build_batch(RECORDS[:1]))
        path = tmp_path / "s.log"
        path.write_bytes(seg)
        headers = list(iter_batches(seg))
        with path.open("rb") as fh:
            for h in headers:
                assert read_batch(seg, h) == read_batch(fh, h) == seg[h.position : h.end_position]
        with pytest.raises(TruncatedFileError):
            read_batch(seg[:-3], headers[-1])


class TestDecodeRecords:
    """Decoding records with every codec, control batches, headers and log-append time."""

    @pytest.mark.parametrize(
        ("compression", "xerial"),
        [
            pytest.param(Compression.NONE, True, id="none"),
            pytest.param(Compression.GZIP, True, id="gzip"),
            pytest.param(Compression.SNAPPY, True, id="snappy-xerial"),
            pytest.param(Compression.SNAPPY, False, id="snappy-raw"),
            pytest.param(Compression.LZ4, True, id="lz4"),
            pytest.param(Compression.ZSTD, True, id="zstd"),
        ],
    )
    def test_every_codec_round_trips(self, compression: Compression, xerial: bool) -> None:
        """Keys, values, headers, offsets and timestamps come back exactly, for every codec."""
        batch = build_batch(RECORDS, base_offset=500, compression=compression, xerial=xerial)
        decoded = decode_records(batch)
        assert [r.offset for r in decoded] == [500, 501, 502]
        assert [r.key for r in decoded] == [r.key for r in RECORDS]
        assert [r.value for r in decoded] == [r.value for r in RECORDS]
        assert [list(r.headers) for r in decoded] == [list(r.headers) for r in RECORDS]
        assert [r.timestamp for r in decoded] == [r.timestamp for r in RECORDS]
        assert {r.timestamp_type for r in decoded} == {TimestampType.CREATE_TIME}
        assert {r.control_type for r in decoded} == {None}

    @pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
    def test_batches_built_by_aiokafka_decode(self, codec: Compression) -> None:
        """Batches from aiokafka's own builder (an independent encoder) decode the same."""
        from aiokafka.record.default_records import DefaultRecordBatchBuilder

        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=int(codec),
            is_transactional=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=10**9,
        )
        for i in range(10):
            builder.append(
                i, 1_000 + i, f"k{i}".encode(), f"v{i}".encode() * 10, [("i", b"%d" % i)]
            )
        batch = rebase_batch(bytes(builder.build()), 70)
        (header,) = iter_batches(batch)
        assert header.compression is codec
        decoded = decode_records(batch)
        assert [r.offset for r in decoded] == list(range(70, 80))
        assert decoded[3].key == b"k3"
        assert decoded[3].value == b"v3" * 10
        assert list(decoded[3].headers) == [("i", b"3")]
        assert decoded[9].timestamp == 1_009

    def test_log_append_time_uses_max_timestamp(self) -> None:
        """Every record of a LogAppendTime batch gets the batch's maxTimestamp."""
        batch = build_batch(
            RECORDS, timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=1_800_000_000_000
        )
        decoded = decode_records(batch)
        assert {r.timestamp for r in decoded} == {1_800_000_000_000}
        assert {r.timestamp_type for r in decoded} == {TimestampType.LOG_APPEND_TIME}

    @pytest.mark.parametrize(
        "kind",
        [
            pytest.param(ControlRecordType.COMMIT, id="commit"),
            pytest.param(ControlRecordType.ABORT, id="abort"),
        ],
    )
    def test_transaction_markers(self, kind: ControlRecordType) -> None:
        """Commit and abort markers decode as control records of that type."""
        batch = build_control_batch(kind, base_offset=9, producer_id=5, coordinator_epoch=3)
        (header,) = iter_batches(batch)
        assert header.is_control
        assert header.is_transactional
        (record,) = decode_records(batch)
        assert record.control_type is kind
        assert record.offset == 9
        assert record.value == struct.pack(">hi", 0, 3)

    def test_unknown_control_type(self) -> None:
        """A control record type Kafka does not know decodes as UNKNOWN, as in Kafka."""
        batch = build_batch([TestRecord(key=struct.pack(">hh", 0, 99), value=b"")], control=True)
        assert decode_records(batch)[0].control_type is ControlRecordType.UNKNOWN

    def test_short_control_key(self) -> None:
        """A control record whose key is not 4 bytes is corrupt, named at the batch position."""
        batch = build_batch([TestRecord(key=b"\x00", value=b"")], control=True)
        with pytest.raises(CorruptRecordError, match="control record key") as info:
            decode_records(batch, path="p.log", position=123)
        assert (info.value.path, info.value.position) == ("p.log", 123)

    def test_bad_crc(self) -> None:
        """decode_records checks the CRC before handing bytes to the compiled decoder."""
        batch = bytearray(build_batch(RECORDS))
        batch[-1] ^= 0xFF
        with pytest.raises(CorruptRecordError, match="stored crc") as info:
            decode_records(bytes(batch), path="p.log", position=8192)
        assert info.value.position == 8192

    @pytest.mark.parametrize(
        "compression",
        [pytest.param(c, id=c.name.lower()) for c in Compression if c is not Compression.NONE],
    )
    def test_garbage_compressed_payload_with_valid_crc(self, compression: Compression) -> None:
        """A payload the codec cannot decompress is a CorruptRecordError, not a codec exception."""
        batch = build_batch(RECORDS, compression=compression)
        garbage = batch[:RECORD_BATCH_OVERHEAD] + bytes(range(200, 256)) * 3
        garbage = struct.pack(">q i", 0, len(garbage) - 12) + garbage[12:]
        with pytest.raises(CorruptRecordError, match="cannot decode") as info:
            decode_records(_recrc(garbage), path="g.log", position=77)
        assert (info.value.path, info.value.position) == ("g.log", 77)

    def test_record_count_larger_than_records(self) -> None:
        """A recordsCount promising more records than the bytes hold is corrupt."""
        batch = bytearray(build_batch(RECORDS))
        struct.pack_into(">i", batch, 57, 10)
        with pytest.raises(CorruptRecordError, match="cannot decode"):
            decode_records(_recrc(bytes(batch)))

    def test_non_utf8_header_key(self) -> None:
        """A header key that is not UTF-8 reads as Kafka's Java consumer reads it (its
        Utils.utf8 replaces bad bytes): U+FFFD (tests/unit/kafka/test_kafka_lenient.py)."""
        batch = build_batch([TestRecord(b"k", b"v", [("h", b"x")])])
        broken = batch.replace(b"\x02h", b"\x02\xff")
        (record,) = decode_records(_recrc(broken))
        assert record.headers == [("\ufffd", b"x")]
        assert (record.key, record.value) == (b"k", b"v")

    def test_missing_codec_library(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without cramjam a snappy batch raises MissingToolError saying what to install."""
        import aiokafka.codec

        batch = build_batch(RECORDS, compression=Compression.SNAPPY)
        monkeypatch.setattr(aiokafka.codec, "has_snappy", lambda: False)
        with pytest.raises(MissingToolError, match="cramjam"):
            decode_records(batch)

    def test_extra_bytes_after_the_batch_are_ignored(self) -> None:
        """A buffer that continues past the batch decodes only the batch."""
        batch = build_batch(RECORDS)
        assert len(decode_records(batch + build_batch(RECORDS[:1]))) == 3

    def test_first_decodes_in_many_threads_at_once(self, tmp_path: Path) -> None:
        """The read server's worker threads may make the first decode (and so the first import
        of aiokafka's record package) at the same moment: every one of them decodes."""
        batch = tmp_path / "batch"
        batch.write_bytes(build_batch(RECORDS))
        code = (
            "import sys, threading\n"
            "from sidecar.kafka.records import decode_records\n"
            f"data = open({str(batch)!r}, 'rb').read()\n"
            "start, errors, counts = threading.Barrier(16), [], []\n"
            "def work():\n"
            "    start.wait()\n"
            "    try:\n"
            "        counts.append(len(decode_records(data)))\n"
            "    except Exception as exc:\n"
            "        errors.append(repr(exc))\n"
            "threads = [threading.Thread(target=work) for _ in range(16)]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "assert not errors, errors\n"
            "assert counts == [3] * 16, counts\n"
        )
        root = Path(__file__).resolve().parents[3]
        for _ in range(3):  # a fresh interpreter each time: the first import races anew
            subprocess.run([sys.executable, "-c", code], check=True, cwd=root)

    def test_header_walk_does_not_import_aiokafka(self) -> None:
        """Importing sidecar.kafka and walking batches never imports aiokafka (Spark executors)."""
        code = (
            "import sys, sidecar.kafka as k\n"
            "from sidecar.kafka.records import iter_batches\n"
            "list(iter_batches(b''))\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('aiokafka', 'aiohttp', 'aiobotocore', 'asyncio')]\n"
            "assert not bad, bad\n"
        )
        root = Path(__file__).resolve().parents[3]
        subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
