"""The small per-partition and per-log-dir files: ``leader-epoch-checkpoint``,
``partition.metadata``, ``meta.properties`` and producer-state snapshots (``<offset>.snapshot``),
plus the leader-epoch arithmetic Kafka's RemoteLogManager does when it builds segment metadata.

Upstream: ``server-common/src/main/java/org/apache/kafka/server/common/CheckpointFile.java``,
``storage/src/main/java/org/apache/kafka/storage/internals/checkpoint/{LeaderEpochCheckpointFile,
PartitionMetadataFile,PartitionMetadataReadBuffer}.java``,
``storage/src/main/java/org/apache/kafka/storage/internals/epoch/LeaderEpochFileCache.java``,
``storage/src/main/java/org/apache/kafka/storage/internals/log/ProducerStateManager.java``,
``storage/src/main/resources/message/ProducerSnapshot.json``,
``metadata/src/main/java/org/apache/kafka/metadata/properties/MetaProperties.java``
(https://github.com/apache/kafka).

Pure and synchronous, and it never writes into a log dir. Parsers accept what Kafka's readers
accept and reject what they reject, with ``CheckpointFormatError``/``SnapshotFormatError`` naming
the file and byte. The ``format_*`` functions produce byte-exact Kafka files for upload and tests.
"""

from __future__ import annotations

import base64
import re
import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import crc32c

from sidecar.errors import CheckpointFormatError, SnapshotFormatError, TruncatedFileError
from sidecar.kafka._io import read_small_file

__all__ = [
    "PRODUCER_SNAPSHOT_ENTRY",
    "PRODUCER_SNAPSHOT_HEADER",
    "EpochEntry",
    "MetaProperties",
    "PartitionMetadata",
    "ProducerSnapshot",
    "ProducerSnapshotEntry",
    "check_producer_snapshot",
    "decode_kafka_uuid",
    "encode_kafka_uuid",
    "epoch_entries_in_range",
    "format_leader_epoch_checkpoint",
    "format_partition_metadata",
    "format_producer_snapshot",
    "leader_epoch_checkpoint_for_segment",
    "load_epoch_cache",
    "parse_leader_epoch_checkpoint",
    "parse_meta_properties",
    "parse_partition_metadata",
    "parse_producer_snapshot",
    "read_leader_epoch_checkpoint",
    "read_meta_properties",
    "read_partition_metadata",
    "read_producer_snapshot",
    "verify_producer_snapshot",
]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
# Java's Integer.parseInt / Long.parseLong accept an optional sign and ASCII digits only
_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")
# BufferedReader.readLine ends a line at \n, \r or \r\n
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# LeaderEpochCheckpointFile splits entries on \s+ (Java's \s: space, \t, \n, \x0b, \f, \r)
_JAVA_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]+")
# PartitionMetadataReadBuffer splits "key: value" on :\s+
_COLON_WHITESPACE = re.compile(r":[ \t\n\x0b\f\r]+")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}\Z")

# ---------------------------------------------------------------------------------------------
# Kafka Uuid (topic ids, directory ids): 16 bytes, shown as URL-safe base64 without padding.


def decode_kafka_uuid(text: str) -> uuid.UUID:
    """Parse a Kafka ``Uuid.toString()`` (22 chars of URL-safe base64), as ``Uuid.fromString``.

    Raises ``ValueError`` for anything that does not decode to exactly 16 bytes.
    """
    if len(text) > 24 or not _BASE64URL.match(text):
        raise ValueError(f"{text!r} is not a base64url Kafka Uuid")
    padded = text.rstrip("=")
    try:
        raw = base64.urlsafe_b64decode(padded + "=" * (-len(padded) % 4))
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a base64url Kafka Uuid") from exc
    if len(raw) != 16:
        raise ValueError(f"{text!r} decodes to {len(raw)} bytes, not the 16 of a Kafka Uuid")
    return uuid.UUID(bytes=raw)


def encode_kafka_uuid(value: uuid.UUID) -> str:
    """``Uuid.toString()``: URL-safe base64 of the 16 bytes (msb then lsb), without padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


# ---------------------------------------------------------------------------------------------
# leader-epoch-checkpoint


class EpochEntry(NamedTuple):
    """A leader epoch and the first offset written in it."""

    epoch: int
    start_offset: int


_CHECKPOINT_VERSION = 0


def parse_leader_epoch_checkpoint(
    data: bytes, *, path: str | None = None
) -> tuple[EpochEntry, ...]:
    """Entries of a ``leader-epoch-checkpoint`` (``CheckpointFile.CheckpointReadBuffer``).

    The format is ``0\\n<N>\\n`` then N lines ``<epoch> <startOffset>``. As in Kafka, an empty file
    or one with only the version line has no entries; any other deviation, a count that does not
    match, or a negative epoch or offset raises ``CheckpointFormatError`` at the line's byte.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(
            "checkpoint is not UTF-8 text", path=path, position=exc.start
        ) from exc
    lines = _lines(text)
    if not lines:
        return ()
    version_pos, version_line = lines[0]
    version = _java_int(version_line, _INT32, path=path, position=version_pos)
    if version != _CHECKPOINT_VERSION:
        raise CheckpointFormatError(
            f"unrecognised checkpoint version {version}, expected {_CHECKPOINT_VERSION}",
            path=path,
            position=version_pos,
        )
    if len(lines) == 1:
        return ()
    count_pos, count_line = lines[1]
    expected = _java_int(count_line, _INT32, path=path, position=count_pos)
    entries: list[EpochEntry] = []
    for pos, line in lines[2:]:
        parts = _java_split(_JAVA_WHITESPACE, line)
        if len(parts) != 2:
            raise CheckpointFormatError(
                f"malformed line {line[:80]!r}: expected '<epoch> <startOffset>'",
                path=path,
                position=pos,
            )
        epoch = _java_int(parts[0], _INT32, path=path, position=pos)
        start = _java_int(parts[1], _INT64, path=path, position=pos)
        if epoch < 0 or start < 0:
            raise CheckpointFormatError(
                f"invalid leader epoch entry (epoch {epoch}, start offset {start})",
                path=path,
                position=pos,
            )
        entries.append(EpochEntry(epoch, start))
    if len(entries) != expected:
        raise CheckpointFormatError(
            f"expected {expected} entries in checkpoint, found {len(entries)}",
            path=path,
            position=count_pos,
        )
    return tuple(entries)


def read_leader_epoch_checkpoint(path: Path) -> tuple[EpochEntry, ...]:
    """Read a partition's ``leader-epoch-checkpoint`` (``FileNotFoundError`` if absent)."""
    return parse_leader_epoch_checkpoint(
        read_small_file(path, deleted_fallback=False, error=CheckpointFormatError), path=str(path)
    )


def format_leader_epoch_checkpoint(entries: Iterable[EpochEntry]) -> bytes:
    """The checkpoint text Kafka writes (and RLM uploads as the LEADER_EPOCH index): version 0."""
    items = list(entries)
    body = "".join(f"{e.epoch} {e.start_offset}\n" for e in items)
    return f"{_CHECKPOINT_VERSION}\n{len(items)}\n{body}".encode()


def epoch_entries_in_range(
    entries: Iterable[EpochEntry], start_offset: int, end_offset: int
) -> tuple[EpochEntry, ...]:
    """``LeaderEpochFileCache.epochEntriesInRange(start, end)``: the epochs of the offsets
    [start, end), each with the first offset it covers there.

    The entries are first loaded the way the broker loads its checkpoint (``assign`` of each entry,
    dropping non-monotonic ones); then entries starting at or before ``start_offset`` collapse into
    the last of them, moved to ``start_offset`` (``truncateFromStart``), and entries starting at or
    after ``end_offset`` are dropped (``truncateFromEnd``). For a segment, RLM passes its base
    offset and the next segment's base offset, so the result begins at the base offset.
    """
    epochs = load_epoch_cache(entries)
    if start_offset >= 0:
        removed = [e for e in epochs if e.start_offset <= start_offset]
        # removeFromStart stops at the first entry that does not match; offsets are increasing
        if removed:
            epochs = [EpochEntry(removed[-1].epoch, start_offset), *epochs[len(removed) :]]
    if end_offset >= 0 and epochs and epochs[-1].start_offset >= end_offset:
        while epochs and epochs[-1].start_offset >= end_offset:
            epochs.pop()
    return tuple(epochs)


def leader_epoch_checkpoint_for_segment(
    entries: Iterable[EpochEntry], next_segment_base_offset: int
) -> bytes:
    """The LEADER_EPOCH index RLM uploads with a segment: the checkpoint text of
    ``epochEntriesInRange(-1, nextSegmentBaseOffset)``, i.e. every epoch up to the segment end."""
    return format_leader_epoch_checkpoint(
        epoch_entries_in_range(entries, -1, next_segment_base_offset)
    )


def load_epoch_cache(entries: Iterable[EpochEntry]) -> list[EpochEntry]:
    """The broker's epoch cache after ``assign`` of each checkpoint entry in order
    (non-monotonic entries dropped, as the broker does when it loads the checkpoint)."""
    epochs: list[EpochEntry] = []
    for entry in entries:
        if epochs:
            latest = epochs[-1]
            # isUpdateNeeded: a new epoch, or the same epoch starting earlier
            if entry.epoch == latest.epoch and entry.start_offset >= latest.start_offset:
                continue
        # maybeTruncateNonMonotonicEntries: drop trailing entries not strictly below the new one
        while epochs and (
            epochs[-1].epoch >= entry.epoch or epochs[-1].start_offset >= entry.start_offset
        ):
            epochs.pop()
        epochs.append(entry)
    return epochs


# ---------------------------------------------------------------------------------------------
# partition.metadata


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """A partition's ``partition.metadata``: its topic id."""

    version: int
    topic_id: str
    """The topic id as Kafka prints it (22-char base64url); see :meth:`topic_uuid`."""

    @property
    def topic_uuid(self) -> uuid.UUID:
        return decode_kafka_uuid(self.topic_id)


_PARTITION_METADATA_VERSION = 0


def parse_partition_metadata(data: bytes, *, path: str | None = None) -> PartitionMetadata:
    """Parse ``version: 0\\ntopic_id: <uuid>`` as ``PartitionMetadataReadBuffer`` does (it splits
    each line on ``:\\s+`` and rejects the zero Uuid)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(
            "partition.metadata is not UTF-8 text", path=path, position=exc.start
        ) from exc
    lines = _lines(text)
    if len(lines) < 2:
        raise CheckpointFormatError(
            "partition.metadata needs a version line and a topic_id line",
            path=path,
            position=len(data),
        )
    (version_pos, version_line), (topic_pos, topic_line) = lines[0], lines[1]
    version_parts = _java_split(_COLON_WHITESPACE, version_line)
    if len(version_parts) != 2:
        raise CheckpointFormatError(
            f"malformed line {version_line[:80]!r}", path=path, position=version_pos
        )
    version = _java_int(version_parts[1], _INT32, path=path, position=version_pos)
    if version != _PARTITION_METADATA_VERSION:
        raise CheckpointFormatError(
            f"unrecognized version of partition metadata file: {version}",
            path=path,
            position=version_pos,
        )
    topic_parts = _java_split(_COLON_WHITESPACE, topic_line)
    if len(topic_parts) != 2:
        raise CheckpointFormatError(
            f"malformed line {topic_line[:80]!r}", path=path, position=topic_pos
        )
    try:
        topic_uuid = decode_kafka_uuid(topic_parts[1])
    except ValueError as exc:
        raise CheckpointFormatError(
            f"invalid topic id: {exc}", path=path, position=topic_pos
        ) from exc
    if topic_uuid.int == 0:
        raise CheckpointFormatError(
            "invalid topic id: the zero Uuid", path=path, position=topic_pos
        )
    return PartitionMetadata(version, encode_kafka_uuid(topic_uuid))


def read_partition_metadata(path: Path) -> PartitionMetadata:
    """Read a partition's ``partition.metadata`` (``FileNotFoundError`` if absent)."""
    return parse_partition_metadata(
        read_small_file(path, deleted_fallback=False, error=CheckpointFormatError), path=str(path)
    )


def format_partition_metadata(topic_id: str | uuid.UUID) -> bytes:
    """The file Kafka writes: ``version: 0\\ntopic_id: <id>``, no trailing newline."""
    text = topic_id if isinstance(topic_id, str) else encode_kafka_uuid(topic_id)
    return f"version: {_PARTITION_METADATA_VERSION}\ntopic_id: {text}".encode()


# ---------------------------------------------------------------------------------------------
# meta.properties


@dataclass(frozen=True, slots=True)
class MetaProperties:
    """A log dir's ``meta.properties``: who owns it."""

    version: int
    """0 for ZooKeeper-era dirs (``broker.id``), 1 for KRaft (``node.id``)."""
    node_id: int | None
    """``node.id`` (version 1) or ``broker.id`` (version 0, may be absent)."""
    cluster_id: str | None
    directory_id: str | None
    """The log dir's Uuid (JBOD, KIP-858), as Kafka prints it."""


def parse_meta_properties(data: bytes, *, path: str | None = None) -> MetaProperties:
    """Parse ``meta.properties`` (``java.util.Properties`` text) the way ``MetaProperties.Builder``
    reads it: ``version`` defaults to 0; version 1 requires ``node.id`` and ``cluster.id``."""
    props = _parse_properties(data, path=path)

    def int_prop(key: str) -> int:
        position, text = props[key]
        return _java_int(text.strip(), _INT32, path=path, position=position)

    version = int_prop("version") if "version" in props else 0
    if version not in (0, 1):
        raise CheckpointFormatError(
            f"unknown meta.properties version {version}",
            path=path,
            position=props["version"][0],
        )
    if version == 0:
        node_id = int_prop("broker.id") if "broker.id" in props else None
    else:
        if "node.id" not in props:
            raise CheckpointFormatError(
                "meta.properties version 1 has no node.id", path=path, position=len(data)
            )
        node_id = int_prop("node.id")
    cluster_id = props["cluster.id"][1] if "cluster.id" in props else None
    if version == 1 and cluster_id is None:
        raise CheckpointFormatError(
            "meta.properties version 1 has no cluster.id", path=path, position=len(data)
        )
    directory_id = None
    if "directory.id" in props:
        position, text = props["directory.id"]
        try:
            directory_id = encode_kafka_uuid(decode_kafka_uuid(text))
        except ValueError as exc:
            raise CheckpointFormatError(
                f"invalid directory.id: {exc}", path=path, position=position
            ) from exc
    return MetaProperties(version, node_id, cluster_id, directory_id)


def read_meta_properties(path: Path) -> MetaProperties:
    """Read a log dir's ``meta.properties`` (``FileNotFoundError`` if absent)."""
    return parse_meta_properties(
        read_small_file(path, deleted_fallback=False, error=CheckpointFormatError), path=str(path)
    )


def _parse_properties(data: bytes, *, path: str | None) -> dict[str, tuple[int, str]]:
    """``java.util.Properties.load`` for the files Kafka writes: ``#``/``!`` comments, ``key=value``
    or ``key: value`` or ``key value``, backslash escapes. Values keep the byte they start at."""
    text = data.decode("latin-1")  # Properties.load(InputStream) reads ISO-8859-1
    props: dict[str, tuple[int, str]] = {}
    logical = ""
    logical_pos = 0
    for pos, raw in _lines(text, utf8=False):
        line = raw.lstrip(" \t\f")
        if not logical and (not line or line[0] in "#!"):
            continue
        if not logical:
            logical_pos = pos
        # a line ending in an odd number of backslashes continues on the next one
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            logical += line[:-1]
            continue
        logical += line
        key, value = _split_property(logical)
        props[_unescape(key)] = (logical_pos, _unescape(value))
        logical = ""
    if logical:
        key, value = _split_property(logical)
        props[_unescape(key)] = (logical_pos, _unescape(value))
    return props


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# producer-state snapshot (<offset>.snapshot), version 1

#: snapshot header; the CRC covers every byte after it, from producerEntries' count to the end
PRODUCER_SNAPSHOT_HEADER = struct.Struct(
    ">"
    "h"  # version: 1
    "I"  # crc: CRC-32C of bytes [6, end)
    "i"  # producerEntries: count of the (classic, non-compact) array that follows
)
#: one ``ProducerEntry`` of ``ProducerSnapshot.json``
PRODUCER_SNAPSHOT_ENTRY = struct.Struct(
    ">"
    "q"  # producerId
    "h"  # epoch
    "i"  # lastSequence
    "q"  # lastOffset
    "i"  # offsetDelta
    "q"  # timestamp
    "i"  # coordinatorEpoch
    "q"  # currentTxnFirstOffset: -1 when no transaction is open
)
_SNAPSHOT_VERSION = 1
_SNAPSHOT_CRC_START = 6


class ProducerSnapshotEntry(NamedTuple):
    """One producer's state in a snapshot."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """A parsed, CRC-checked ``<offset>.snapshot``."""

    version: int
    crc: int
    entries: tuple[ProducerSnapshotEntry, ...]

    def open_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its transaction still open at the snapshot's offset
        (no COMMIT/ABORT marker below it yet)."""
        return {
            e.producer_id: e.current_txn_first_offset
            for e in self.entries
            if e.current_txn_first_offset >= 0
        }

    def last_stable_offset(self) -> int | None:
        """The first offset of a transaction open at the snapshot's offset, None when none is:
        of a log that ends at the snapshot's offset, a read_committed consumer reads nothing
        from there on (Kafka's last stable offset; above it the outcome is not known yet)."""
        return min(self.open_transactions().values(), default=None)


def check_producer_snapshot(data: bytes, *, path: str | None = None) -> None:
    """The checks of :func:`parse_producer_snapshot` (version, CRC, size), without building
    an entry per producer: what deciding whether a segment may be tiered needs."""
    if len(data) < PRODUCER_SNAPSHOT_HEADER.size:
        raise TruncatedFileError(
            f"producer snapshot of {len(data)} bytes is shorter than its "
            f"{PRODUCER_SNAPSHOT_HEADER.size}-byte header",
            path=path,
            position=len(data),
        )
    version, crc, count = PRODUCER_SNAPSHOT_HEADER.unpack_from(data)
    if version != _SNAPSHOT_VERSION:
        raise SnapshotFormatError(
            f"snapshot contained an unknown file version {version}", path=path, position=0
        )
    computed = int(crc32c.crc32c(memoryview(data)[_SNAPSHOT_CRC_START:]))
    if computed != crc:
        raise SnapshotFormatError(
            f"snapshot is corrupt (CRC is no longer valid): stored crc {crc:#010x}, "
            f"computed crc {computed:#010x}",
            path=path,
            position=2,
        )
    if count < 0:
        raise SnapshotFormatError(
            f"snapshot has a negative producer count {count}", path=path, position=6
        )
    expected = PRODUCER_SNAPSHOT_HEADER.size + count * PRODUCER_SNAPSHOT_ENTRY.size
    if len(data) < expected:
        raise TruncatedFileError(
            f"producer snapshot with {count} entries needs {expected} bytes, has {len(data)}",
            path=path,
            position=len(data),
        )
    if len(data) > expected:
        raise SnapshotFormatError(
            f"{len(data) - expected} unexpected bytes after the last producer entry",
            path=path,
            position=expected,
        )


def parse_producer_snapshot(data: bytes, *, path: str | None = None) -> ProducerSnapshot:
    """Parse and CRC-check a producer snapshot, as ``ProducerStateManager.readSnapshot``.

    Raises ``TruncatedFileError`` for a file shorter than its header or entry count says (an
    in-place write in progress looks like this too), ``SnapshotFormatError`` for a version other
    than 1, a CRC mismatch, a negative count or bytes after the last entry.
    """
    check_producer_snapshot(data, path=path)
    version, crc, _ = PRODUCER_SNAPSHOT_HEADER.unpack_from(data)
    entries = tuple(
        ProducerSnapshotEntry(*fields)
        for fields in PRODUCER_SNAPSHOT_ENTRY.iter_unpack(
            memoryview(data)[PRODUCER_SNAPSHOT_HEADER.size :]
        )
    )
    return ProducerSnapshot(version, crc, entries)


def read_producer_snapshot(path: Path) -> ProducerSnapshot:
    """Read and check a ``<offset>.snapshot`` (with the ``.deleted`` fallback)."""
    return parse_producer_snapshot(
        read_small_file(path, deleted_fallback=True, error=SnapshotFormatError), path=str(path)
    )


def verify_producer_snapshot(path: Path) -> None:
    """Read a ``<offset>.snapshot`` (with the ``.deleted`` fallback) and check it as
    :func:`read_producer_snapshot` does, without parsing its entries."""
    check_producer_snapshot(
        read_small_file(path, deleted_fallback=True, error=SnapshotFormatError), path=str(path)
    )


def format_producer_snapshot(entries: Sequence[ProducerSnapshotEntry]) -> bytes:
    """A version-1 snapshot with its CRC-32C, byte-exact with ``ProducerStateManager``."""
    body = struct.pack(">i", len(entries)) + b"".join(
        PRODUCER_SNAPSHOT_ENTRY.pack(*entry) for entry in entries
    )
    return struct.pack(">hI", _SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


# ---------------------------------------------------------------------------------------------
# helpers


def _lines(text: str, *, utf8: bool = True) -> list[tuple[int, str]]:
    """Lines as ``BufferedReader.readLine`` returns them, each with its byte position in the
    UTF-8 (or, with ``utf8=False``, single-byte) encoded file."""
    lines: list[tuple[int, str]] = []
    start = 0
    for match in _LINE_BREAK.finditer(text):
        lines.append((start, text[start : match.start()]))
        start = match.end()
    if start < len(text):
        lines.append((start, text[start:]))
    # positions so far are character positions; convert for non-ASCII text
    if utf8 and not text.isascii():
        lines = [(len(text[:pos].encode("utf-8")), line) for pos, line in lines]
    return lines


def _java_split(pattern: re.Pattern[str], text: str) -> list[str]:
    """``String.split(regex)``: like ``re.split`` but trailing empty strings are dropped."""
    parts = pattern.split(text)
    while parts and not parts[-1]:
        parts.pop()
    return parts


def _java_int(text: str, bounds: tuple[int, int], *, path: str | None, position: int) -> int:
    if not _JAVA_INT.match(text):
        raise CheckpointFormatError(f"malformed number {text[:40]!r}", path=path, position=position)
    value = int(text)
    if not bounds[0] <= value <= bounds[1]:
        raise CheckpointFormatError(
            f"number {text[:40]} is out of range", path=path, position=position
        )
    return value
