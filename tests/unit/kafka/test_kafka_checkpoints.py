"""Checkpoint files, partition.metadata, meta.properties, producer snapshots and epoch ranges."""

from __future__ import annotations

import os
import struct
import uuid
from pathlib import Path
from typing import Any

import crc32c
import pytest

from sidecar.errors import CheckpointFormatError, SnapshotFormatError, TruncatedFileError
from sidecar.kafka import _io as io_module
from sidecar.kafka._io import read_small_file
from sidecar.kafka.checkpoints import (
    PRODUCER_SNAPSHOT_ENTRY,
    EpochEntry,
    MetaProperties,
    PartitionMetadata,
    ProducerSnapshotEntry,
    check_producer_snapshot,
    decode_kafka_uuid,
    encode_kafka_uuid,
    epoch_entries_in_range,
    format_leader_epoch_checkpoint,
    format_partition_metadata,
    format_producer_snapshot,
    leader_epoch_checkpoint_for_segment,
    parse_leader_epoch_checkpoint,
    parse_meta_properties,
    parse_partition_metadata,
    parse_producer_snapshot,
    read_leader_epoch_checkpoint,
    read_meta_properties,
    read_partition_metadata,
    read_producer_snapshot,
    verify_producer_snapshot,
)

E = EpochEntry
EPOCHS = (E(0, 0), E(1, 100), E(2, 200))
# the reference vector (metadata-vectors.json): Uuid(0x0123456789abcdef, 0xfedcba9876543210)
TOPIC_ID = "ASNFZ4mrze_-3LqYdlQyEA"
TOPIC_UUID = uuid.UUID("0123456789abcdeffedcba9876543210")


class TestKafkaUuid:
    """Kafka's Uuid text form: base64url of the 16 bytes, no padding."""

    def test_vector(self) -> None:
        """The reference vector decodes and encodes both ways."""
        assert decode_kafka_uuid(TOPIC_ID) == TOPIC_UUID
        assert encode_kafka_uuid(TOPIC_UUID) == TOPIC_ID
        assert decode_kafka_uuid(TOPIC_ID + "==") == TOPIC_UUID

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param("", id="empty"),
            pytest.param("AAAA", id="too-short"),
            pytest.param("ASNFZ4mrze/+3LqYdlQyEA", id="standard-alphabet"),
            pytest.param("ASNFZ4mrze_-3LqYdlQyEAAA", id="too-long"),
            pytest.param("ASNFZ4mrze_-3LqYdlQy E", id="space"),
        ],
    )
    def test_rejects(self, text: str) -> None:
        """Anything that is not 16 bytes of base64url is a ValueError."""
        with pytest.raises(ValueError, match="Kafka Uuid"):
            decode_kafka_uuid(text)


class TestLeaderEpochCheckpoint:
    """``leader-epoch-checkpoint``: version 0 text read as CheckpointFile reads it."""

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            pytest.param(b"0\n3\n0 0\n1 100\n2 200\n", EPOCHS, id="three-entries"),
            pytest.param(b"0\r\n1\r\n5 10\r\n", (E(5, 10),), id="crlf"),
            pytest.param(b"0\n1\n5 \t 10", (E(5, 10),), id="whitespace-no-final-newline"),
            pytest.param(b"0\n1\n5 10  \n", (E(5, 10),), id="trailing-space"),
            pytest.param(b"", (), id="empty-file"),
            pytest.param(b"0\n", (), id="version-only"),
            pytest.param(b"0\n0\n", (), id="zero-entries"),
            pytest.param(
                b"0\n1\n+3 9223372036854775807\n", (E(3, 2**63 - 1),), id="java-int-forms"
            ),
        ],
    )
    def test_parse(self, text: bytes, expected: tuple[EpochEntry, ...]) -> None:
        """Valid files parse to their entries, in order."""
        assert parse_leader_epoch_checkpoint(text) == expected

    @pytest.mark.parametrize(
        ("text", "fragment", "position"),
        [
            pytest.param(b"1\n0\n", "unrecognised checkpoint version 1", 0, id="version-1"),
            pytest.param(b"0\n2\n0 0\n", "expected 2 entries", 2, id="count-too-high"),
            pytest.param(b"0\n1\n0 0\n1 5\n", "expected 1 entries", 2, id="count-too-low"),
            pytest.param(b"0\n1\n0 x\n", "malformed number", 4, id="not-a-number"),
            pytest.param(b"0\n1\n0 0 0\n", "malformed line", 4, id="three-fields"),
            pytest.param(b"0\n1\n 0 0\n", "malformed line", 4, id="leading-space"),
            pytest.param(b"0\n1\n\n", "malformed line", 4, id="blank-line"),
            pytest.param(b"0\nx\n", "malformed number", 2, id="bad-count"),
            pytest.param(b"0\n1\n-1 5\n", "invalid leader epoch entry", 4, id="negative-epoch"),
            pytest.param(b"0\n1\n2147483648 5\n", "out of range", 4, id="epoch-overflow"),
            pytest.param(b"0\n1\n1 \xff\n", "not UTF-8", 6, id="not-utf8"),
        ],
    )
    def test_rejects_with_position(self, text: bytes, fragment: str, position: int) -> None:
        """Malformed checkpoints raise CheckpointFormatError naming the file and the line's byte."""
        with pytest.raises(CheckpointFormatError, match=fragment) as info:
            parse_leader_epoch_checkpoint(text, path="/d/t-0/leader-epoch-checkpoint")
        assert info.value.path == "/d/t-0/leader-epoch-checkpoint"
        assert info.value.position == position

    def test_format_golden(self) -> None:
        """format writes the exact text Kafka writes (and RLM uploads)."""
        assert format_leader_epoch_checkpoint(EPOCHS) == b"0\n3\n0 0\n1 100\n2 200\n"
        assert format_leader_epoch_checkpoint(()) == b"0\n0\n"

    def test_read(self, tmp_path: Path) -> None:
        """read parses a file and reports a missing one as FileNotFoundError."""
        path = tmp_path / "leader-epoch-checkpoint"
        path.write_bytes(b"0\n1\n4 40\n")
        assert read_leader_epoch_checkpoint(path) == (E(4, 40),)
        with pytest.raises(FileNotFoundError):
            read_leader_epoch_checkpoint(tmp_path / "missing")


class TestEpochEntriesInRange:
    """LeaderEpochFileCache.epochEntriesInRange, as RLM uses it for segment metadata."""

    @pytest.mark.parametrize(
        ("entries", "start", "end", "expected"),
        [
            pytest.param(EPOCHS, 0, 100, (E(0, 0),), id="first-epoch-only"),
            pytest.param(EPOCHS, 50, 150, (E(0, 50), E(1, 100)), id="straddles-one-change"),
            pytest.param(EPOCHS, 100, 200, (E(1, 100),), id="starts-on-epoch-boundary"),
            pytest.param(EPOCHS, 150, 250, (E(1, 150), E(2, 200)), id="runs-into-last-epoch"),
            pytest.param(EPOCHS, 250, 300, (E(2, 250),), id="inside-last-epoch"),
            pytest.param(EPOCHS, -1, 150, (E(0, 0), E(1, 100)), id="checkpoint-upload-range"),
            pytest.param(EPOCHS, 0, -1, EPOCHS, id="no-end"),
            pytest.param((), 0, 100, (), id="empty-cache"),
            pytest.param(
                (E(0, 0), E(2, 100), E(1, 150)),
                0,
                1000,
                (E(0, 0), E(1, 150)),
                id="non-monotonic-load",
            ),
            pytest.param((E(0, 0), E(0, 5)), 0, 10, (E(0, 0),), id="same-epoch-later"),
            pytest.param((E(0, 5), E(0, 0)), 0, 10, (E(0, 0),), id="same-epoch-earlier"),
            pytest.param((E(3, 10), E(5, 10)), 10, 20, (E(5, 10),), id="epoch-without-records"),
        ],
    )
    def test_vectors(
        self,
        entries: tuple[EpochEntry, ...],
        start: int,
        end: int,
        expected: tuple[EpochEntry, ...],
    ) -> None:
        """Entries before start collapse onto start; entries at or after end are dropped."""
        assert epoch_entries_in_range(entries, start, end) == expected

    def test_segment_checkpoint_text(self) -> None:
        """The uploaded LEADER_EPOCH index covers every epoch up to the segment's end."""
        assert leader_epoch_checkpoint_for_segment(EPOCHS, 150) == b"0\n2\n0 0\n1 100\n"
        assert leader_epoch_checkpoint_for_segment(EPOCHS, 100) == b"0\n1\n0 0\n"


class TestPartitionMetadata:
    """``partition.metadata``: version and topic id."""

    def test_golden(self) -> None:
        """The exact file Kafka writes parses, and format reproduces it byte for byte."""
        data = f"version: 0\ntopic_id: {TOPIC_ID}".encode()
        parsed = parse_partition_metadata(data)
        assert parsed == PartitionMetadata(0, TOPIC_ID)
        assert parsed.topic_uuid == TOPIC_UUID
        assert format_partition_metadata(TOPIC_UUID) == data
        assert format_partition_metadata(TOPIC_ID) == data

    def test_trailing_newline_and_other_keys(self) -> None:
        """Like Kafka's reader, a trailing newline is fine and key names are not checked."""
        assert parse_partition_metadata(f"v: 0\nid:  {TOPIC_ID}\n".encode()).topic_id == TOPIC_ID

    @pytest.mark.parametrize(
        ("text", "fragment", "position"),
        [
            pytest.param(
                b"version: 1\ntopic_id: " + TOPIC_ID.encode(),
                "unrecognized version",
                0,
                id="version-1",
            ),
            pytest.param(
                b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", "zero Uuid", 11, id="zero-uuid"
            ),
            pytest.param(b"version: 0\ntopic_id: AAAA", "invalid topic id", 11, id="short-uuid"),
            pytest.param(b"version: 0\ntopic_id: !!", "invalid topic id", 11, id="not-base64"),
            pytest.param(
                b"version:0\ntopic_id: " + TOPIC_ID.encode(), "malformed line", 0, id="no-space"
            ),
            pytest.param(
                b"version: 0\ntopic_id " + TOPIC_ID.encode(), "malformed line", 11, id="no-colon"
            ),
            pytest.param(b"version: 0\n", "needs a version line and a topic_id", 11, id="one-line"),
            pytest.param(
                b"version: x\ntopic_id: " + TOPIC_ID.encode(),
                "malformed number",
                0,
                id="bad-version",
            ),
        ],
    )
    def test_rejects(self, text: bytes, fragment: str, position: int) -> None:
        """Bad files raise CheckpointFormatError naming the file and the line's byte."""
        with pytest.raises(CheckpointFormatError, match=fragment) as info:
            parse_partition_metadata(text, path="/d/t-0/partition.metadata")
        assert (info.value.path, info.value.position) == ("/d/t-0/partition.metadata", position)

    def test_read(self, tmp_path: Path) -> None:
        """read parses the file, and a missing one is FileNotFoundError."""
        path = tmp_path / "partition.metadata"
        path.write_bytes(format_partition_metadata(TOPIC_UUID))
        assert read_partition_metadata(path).topic_id == TOPIC_ID
        with pytest.raises(FileNotFoundError):
            read_partition_metadata(tmp_path / "nope")


KRAFT_META = b"""#
#Sat Nov 21 23:00:00 UTC 2026
node.id=3
directory.id=ASNFZ4mrze_-3LqYdlQyEA
version=1
cluster.id=MkU3OEVBNTcwNTJENDM2Qg
"""


class TestMetaProperties:
    """``meta.properties``: java.util.Properties text, read like MetaProperties.Builder."""

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            pytest.param(
                KRAFT_META, MetaProperties(1, 3, "MkU3OEVBNTcwNTJENDM2Qg", TOPIC_ID), id="kraft"
            ),
            pytest.param(
                b"version=0\nbroker.id=5\ncluster.id=abc\n",
                MetaProperties(0, 5, "abc", None),
                id="zookeeper",
            ),
            pytest.param(
                b"broker.id=7\n", MetaProperties(0, 7, None, None), id="no-version-means-0"
            ),
            pytest.param(
                b"version=0\n", MetaProperties(0, None, None, None), id="v0-without-broker-id"
            ),
            pytest.param(
                b"version : 1\nnode.id 4\ncluster.id:x\\=y\n",
                MetaProperties(1, 4, "x=y", None),
                id="separators-and-escapes",
            ),
            pytest.param(
                b"! comment\nversion=1\nnode.id=4\ncluster.id=ab\\\n    cd\n",
                MetaProperties(1, 4, "abcd", None),
                id="continuation",
            ),
        ],
    )
    def test_parse(self, text: bytes, expected: MetaProperties) -> None:
        """Both the KRaft and the ZooKeeper-era forms parse."""
        assert parse_meta_properties(text) == expected

    @pytest.mark.parametrize(
        ("text", "fragment", "position"),
        [
            pytest.param(b"version=1\ncluster.id=x\n", "no node.id", 23, id="v1-without-node-id"),
            pytest.param(
                b"version=1\nnode.id=1\n", "no cluster.id", 20, id="v1-without-cluster-id"
            ),
            pytest.param(
                b"version=2\nnode.id=1\n", "unknown meta.properties version 2", 0, id="version-2"
            ),
            pytest.param(
                b"version=1\nnode.id=one\ncluster.id=x\n", "malformed number", 10, id="bad-node-id"
            ),
            pytest.param(
                b"version=1\nnode.id=1\ncluster.id=x\ndirectory.id=zz\n",
                "invalid directory.id",
                33,
                id="bad-directory-id",
            ),
        ],
    )
    def test_rejects(self, text: bytes, fragment: str, position: int) -> None:
        """Invalid files raise CheckpointFormatError naming the file and byte."""
        with pytest.raises(CheckpointFormatError, match=fragment) as info:
            parse_meta_properties(text, path="/d/meta.properties")
        assert (info.value.path, info.value.position) == ("/d/meta.properties", position)

    def test_read(self, tmp_path: Path) -> None:
        """read parses the file from a log dir."""
        (tmp_path / "meta.properties").write_bytes(KRAFT_META)
        assert read_meta_properties(tmp_path / "meta.properties").node_id == 3


ENTRY = ProducerSnapshotEntry(
    producer_id=1000,
    epoch=2,
    last_sequence=41,
    last_offset=900,
    offset_delta=4,
    timestamp=1_700_000_000_000,
    coordinator_epoch=-1,
    current_txn_first_offset=-1,
)


class TestProducerSnapshot:
    """``<offset>.snapshot``: version 1 with a CRC-32C over everything after the CRC."""

    def test_crc32c_is_castagnoli(self) -> None:
        """The crc32c package computes CRC-32C (the standard check value of '123456789')."""
        assert crc32c.crc32c(b"123456789") == 0xE3069283

    def test_golden_layout(self) -> None:
        """version int16, crc uint32, count int32, then 46-byte entries, all big-endian."""
        body = struct.pack(">i", 1) + struct.pack(
            ">qhiqiqiq", 1000, 2, 41, 900, 4, 1_700_000_000_000, -1, -1
        )
        golden = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
        assert PRODUCER_SNAPSHOT_ENTRY.size == 46
        assert format_producer_snapshot([ENTRY]) == golden
        parsed = parse_producer_snapshot(golden)
        assert parsed.version == 1
        assert parsed.entries == (ENTRY,)

    def test_empty_snapshot(self) -> None:
        """A snapshot with no producers is 10 bytes and valid."""
        data = format_producer_snapshot([])
        assert len(data) == 10
        assert parse_producer_snapshot(data).entries == ()

    def test_open_transactions_and_last_stable_offset(self) -> None:
        """Producers with a current transaction give their first offsets; the last stable
        offset is the lowest of them, None when no transaction is open."""
        snapshot = parse_producer_snapshot(
            format_producer_snapshot(
                [
                    ENTRY,
                    ENTRY._replace(producer_id=7, current_txn_first_offset=880),
                    ENTRY._replace(producer_id=8, current_txn_first_offset=870),
                ]
            )
        )
        assert snapshot.open_transactions() == {7: 880, 8: 870}
        assert snapshot.last_stable_offset() == 870
        assert (
            parse_producer_snapshot(format_producer_snapshot([ENTRY])).last_stable_offset() is None
        )

    @pytest.mark.parametrize(
        ("mutate", "error", "fragment", "position"),
        [
            pytest.param(
                lambda d: b"\x00\x02" + d[2:],
                SnapshotFormatError,
                "unknown file version 2",
                0,
                id="version-2",
            ),
            pytest.param(
                lambda d: d[:-1] + bytes([d[-1] ^ 1]),
                SnapshotFormatError,
                "CRC is no longer valid",
                2,
                id="bad-crc",
            ),
            pytest.param(
                lambda d: d[:8],
                TruncatedFileError,
                "shorter than its 10-byte header",
                8,
                id="short-header",
            ),
            pytest.param(lambda d: b"", TruncatedFileError, "shorter than", 0, id="empty-file"),
        ],
    )
    @pytest.mark.parametrize("check", [parse_producer_snapshot, check_producer_snapshot])
    def test_rejects(self, mutate, error, fragment: str, position: int, check) -> None:  # type: ignore[no-untyped-def]
        """Bad snapshots raise a typed error naming the file and byte (parsed, or only checked
        as the log-dir scan does)."""
        data = mutate(format_producer_snapshot([ENTRY]))
        with pytest.raises(error, match=fragment) as info:
            check(data, path="/d/t-0/00000000000000000010.snapshot")
        assert info.value.path == "/d/t-0/00000000000000000010.snapshot"
        assert info.value.position == position

    @pytest.mark.parametrize(
        ("count", "extra", "error", "position"),
        [
            pytest.param(2, b"", TruncatedFileError, 56, id="fewer-entries-than-count"),
            pytest.param(1, b"\x00", SnapshotFormatError, 56, id="trailing-bytes"),
            pytest.param(-1, b"", SnapshotFormatError, 6, id="negative-count"),
        ],
    )
    @pytest.mark.parametrize("check", [parse_producer_snapshot, check_producer_snapshot])
    def test_count_mismatch(
        self, count: int, extra: bytes, error: type[Exception], position: int, check: Any
    ) -> None:
        """A count that does not match the bytes (with a valid CRC) is reported where it breaks."""
        body = struct.pack(">i", count) + PRODUCER_SNAPSHOT_ENTRY.pack(*ENTRY) + extra
        data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
        with pytest.raises(error) as info:
            check(data)
        assert info.value.position == position  # type: ignore[attr-defined]

    def test_read_with_deleted_fallback(self, tmp_path: Path) -> None:
        """read follows the rename to .deleted that precedes asynchronous deletion."""
        (tmp_path / "00000000000000000010.snapshot.deleted").write_bytes(
            format_producer_snapshot([ENTRY])
        )
        assert read_producer_snapshot(tmp_path / "00000000000000000010.snapshot").entries == (
            ENTRY,
        )
        verify_producer_snapshot(tmp_path / "00000000000000000010.snapshot")


class TestSmallFiles:
    """Small files are read whole up to a limit, and no more is allocated than they hold."""

    @pytest.mark.parametrize("size", [0, 1, 99, 100])
    def test_up_to_the_limit_reads_the_whole_file(self, tmp_path: Path, size: int) -> None:
        path = tmp_path / "f"
        path.write_bytes(bytes(range(size % 256)) * (size // 256) + bytes(range(size % 256)))
        assert read_small_file(path, deleted_fallback=False, limit=100) == path.read_bytes()

    def test_over_the_limit_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "f"
        path.write_bytes(b"x" * 101)
        with pytest.raises(TruncatedFileError, match="larger than the 100-byte limit"):
            read_small_file(path, deleted_fallback=False, limit=100)

    def test_a_file_that_grows_while_read_is_read_to_the_limit(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Its size is taken before the read: bytes appended after that are read too (up to
        the limit, past which it is refused)."""
        path = tmp_path / "f"
        path.write_bytes(b"a" * 10)
        real_fstat = os.fstat

        def fstat_then_grow(fd: int) -> os.stat_result:
            result = real_fstat(fd)
            with path.open("ab") as out:
                out.write(b"b" * 20)
            return result

        monkeypatch.setattr(io_module.os, "fstat", fstat_then_grow)
        assert read_small_file(path, deleted_fallback=False, limit=100) == b"a" * 10 + b"b" * 20
        with pytest.raises(TruncatedFileError, match="limit"):
            read_small_file(path, deleted_fallback=False, limit=40)
