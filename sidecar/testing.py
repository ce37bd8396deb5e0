"""Builders for tests and benchmarks: Kafka record batches and whole broker log dirs, written byte
for byte the way a Kafka 4.x broker writes them (CRC-32C, 20-digit names, trimmed indexes on rolled
segments, preallocated zero tails on the active one, v1 producer snapshots, checkpoint text).

For tests only: nothing in the daemon imports this module. It writes files only under the
directory it is given. Codecs other than gzip use aiokafka's codec functions (the Java client's
framing: xerial snappy, KIP-57 lz4), which need the ``cramjam`` package.
"""

from __future__ import annotations

import gzip
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from sidecar.kafka.checkpoints import (
    EpochEntry,
    ProducerSnapshotEntry,
    encode_kafka_uuid,
    format_leader_epoch_checkpoint,
    format_partition_metadata,
    format_producer_snapshot,
)
from sidecar.kafka.indexes import (
    ABORTED_TXN_ENTRY,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    AbortedTxn,
)
from sidecar.kafka.logdir import FileKind, segment_file_name
from sidecar.kafka.records import (
    BATCH_HEADER,
    Compression,
    ControlRecordType,
    TimestampType,
    parse_batch_header,
)

__all__ = [
    "TestRecord",
    "build_batch",
    "build_control_batch",
    "encode_varint",
    "rebase_batch",
    "write_log_dir",
    "write_meta_properties",
    "write_partition",
    "write_segment",
]

_CRC_START = 21


@dataclass(frozen=True)
class TestRecord:
    """One record to put in a batch; ``timestamp`` defaults to the batch's base timestamp."""

    __test__ = False  # not a pytest test class

    key: bytes | None = None
    value: bytes | None = b""
    headers: Sequence[tuple[str | bytes, bytes | None]] = ()
    """(key, value); a key given as bytes is written as is (not UTF-8, say, as non-Java
    producers can write)"""
    timestamp: int | None = None


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (``ByteUtils.writeVarint``/``writeVarlong``)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _encode_bytes(data: bytes | None) -> bytes:
    return encode_varint(-1) if data is None else encode_varint(len(data)) + data


def _encode_record(record: TestRecord, offset_delta: int, timestamp_delta: int) -> bytes:
    body = bytearray(b"\x00")  # attributes: unused
    body += encode_varint(timestamp_delta)
    body += encode_varint(offset_delta)
    body += _encode_bytes(record.key)
    body += _encode_bytes(record.value)
    body += encode_varint(len(record.headers))
    for key, value in record.headers:
        body += _encode_bytes(key if isinstance(key, bytes) else key.encode())
        body += _encode_bytes(value)
    return encode_varint(len(body)) + bytes(body)


def _compress(data: bytes, compression: Compression, *, xerial: bool) -> bytes:
    if compression is Compression.NONE:
        return data
    if compression is Compression.GZIP:
        return gzip.compress(data)
    from aiokafka import codec  # needs cramjam for everything but gzip

    if compression is Compression.SNAPPY:
        return bytes(codec.snappy_encode(data, xerial_compatible=xerial))
    if compression is Compression.LZ4:
        return bytes(codec.lz4_encode(data))
    return bytes(codec.zstd_encode(data))


def build_batch(
    records: Sequence[TestRecord],
    *,
    base_offset: int = 0,
    base_timestamp: int = 1_700_000_000_000,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    log_append_time: int | None = None,
    leader_epoch: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    offset_deltas: Sequence[int] | None = None,
    xerial: bool = True,
) -> bytes:
    """A valid v2 record batch (CRC-32C included) holding ``records``.

    Offsets are ``base_offset + i`` unless ``offset_deltas`` says otherwise (compacted batches
    have gaps). For LogAppendTime, ``log_append_time`` becomes the maxTimestamp.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    deltas = list(offset_deltas) if offset_deltas is not None else list(range(len(records)))
    timestamps = [base_timestamp if r.timestamp is None else r.timestamp for r in records]
    first_ts = timestamps[0]
    body = b"".join(
        _encode_record(r, delta, ts - first_ts)
        for r, delta, ts in zip(records, deltas, timestamps, strict=True)
    )
    attributes = int(compression)
    max_ts = max(timestamps)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= 0x08
        max_ts = log_append_time if log_append_time is not None else max_ts
    if transactional:
        attributes |= 0x10
    if control:
        attributes |= 0x20
    payload = _compress(body, compression, xerial=xerial)
    header = bytearray(
        BATCH_HEADER.pack(
            base_offset,
            BATCH_HEADER.size - 12 + len(payload),
            leader_epoch,
            2,
            0,
            attributes,
            deltas[-1],
            first_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
    )
    batch = header + payload
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[_CRC_START:])))
    return bytes(batch)


def build_control_batch(
    kind: ControlRecordType,
    *,
    base_offset: int = 0,
    producer_id: int = 1,
    producer_epoch: int = 0,
    coordinator_epoch: int = 0,
    timestamp: int = 1_700_000_000_000,
    leader_epoch: int = 0,
) -> bytes:
    """A transaction marker batch (COMMIT or ABORT): one control record."""
    record = TestRecord(
        key=struct.pack(">hh", 0, int(kind)),
        value=struct.pack(">hi", 0, coordinator_epoch),
        timestamp=timestamp,
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        base_timestamp=timestamp,
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )


def rebase_batch(batch: bytes, base_offset: int) -> bytes:
    """The batch with another base offset (outside the CRC, as the broker assigns it)."""
    return struct.pack(">q", base_offset) + batch[8:]


def write_segment(
    partition_dir: Path,
    base_offset: int,
    batches: Sequence[bytes],
    *,
    active: bool = False,
    index_interval_bytes: int = 1,
    preallocate_bytes: int = 4096,
    aborted: Sequence[AbortedTxn] = (),
) -> tuple[int, int]:
    """Write ``<base>.log``, ``.index``, ``.timeindex`` (and ``.txnindex`` when ``aborted``).

    Batches are re-based to consecutive offsets from ``base_offset``. Index entries follow
    ``LogSegment.append`` (an entry per batch once more than ``index_interval_bytes`` were written
    since the last one). A rolled segment gets the final time-index entry and trimmed indexes; an
    ``active`` one keeps indexes preallocated to ``preallocate_bytes`` with a zero tail. Returns
    (next offset, largest timestamp).
    """
    log = bytearray()
    index = bytearray()
    timeindex = bytearray()
    offset = base_offset
    max_ts, max_ts_offset = -1, base_offset
    last_time_entry = -1
    since_last_entry = 0
    for raw in batches:
        batch = rebase_batch(raw, offset)
        header = parse_batch_header(batch)
        if header.max_timestamp > max_ts:
            max_ts, max_ts_offset = header.max_timestamp, header.last_offset
        if since_last_entry > index_interval_bytes:
            index += OFFSET_INDEX_ENTRY.pack(header.last_offset - base_offset, len(log))
            if max_ts > last_time_entry:
                timeindex += TIME_INDEX_ENTRY.pack(max_ts, max_ts_offset - base_offset)
                last_time_entry = max_ts
            since_last_entry = 0
        log += batch
        since_last_entry += len(batch)
        offset = header.next_offset
    if not active and max_ts > last_time_entry:
        timeindex += TIME_INDEX_ENTRY.pack(max_ts, max_ts_offset - base_offset)  # roll entry
    if active:
        index += bytes(max(0, preallocate_bytes // 8 * 8 - len(index)))
        timeindex += bytes(max(0, preallocate_bytes // 12 * 12 - len(timeindex)))
    partition_dir.mkdir(parents=True, exist_ok=True)
    (partition_dir / segment_file_name(base_offset, FileKind.LOG)).write_bytes(bytes(log))
    (partition_dir / segment_file_name(base_offset, FileKind.INDEX)).write_bytes(bytes(index))
    (partition_dir / segment_file_name(base_offset, FileKind.TIMEINDEX)).write_bytes(
        bytes(timeindex)
    )
    if aborted:
        (partition_dir / segment_file_name(base_offset, FileKind.TXNINDEX)).write_bytes(
            b"".join(ABORTED_TXN_ENTRY.pack(*txn) for txn in aborted)
        )
    return offset, max_ts


def write_partition(
    log_dir: Path,
    topic: str,
    partition: int,
    segments: Sequence[Sequence[bytes]],
    *,
    topic_id: uuid.UUID | None = None,
    epochs: Sequence[EpochEntry] | None = None,
    snapshots: bool = True,
    producers: Sequence[ProducerSnapshotEntry] = (),
    aborted: dict[int, Sequence[AbortedTxn]] | None = None,
    index_interval_bytes: int = 1,
) -> Path:
    """A partition directory with one segment per entry of ``segments`` (the last is active).

    The leader-epoch checkpoint is derived from the batches' partitionLeaderEpoch unless
    ``epochs`` is given; ``<nextBase>.snapshot`` is written for every rolled segment unless
    ``snapshots`` is false. ``aborted`` maps a segment index to its ``.txnindex`` entries.
    """
    path = log_dir / f"{topic}-{partition}"
    path.mkdir(parents=True, exist_ok=True)
    offset = 0
    derived: list[EpochEntry] = []
    for i, batches in enumerate(segments):
        base = offset
        for raw in batches:
            epoch = parse_batch_header(raw).partition_leader_epoch
            if epoch >= 0 and (not derived or derived[-1].epoch != epoch):
                derived.append(EpochEntry(epoch, offset))
            offset = parse_batch_header(rebase_batch(raw, offset)).next_offset
        write_segment(
            path,
            base,
            batches,
            active=i == len(segments) - 1,
            index_interval_bytes=index_interval_bytes,
            aborted=(aborted or {}).get(i, ()),
        )
        if snapshots and i < len(segments) - 1:
            (path / segment_file_name(offset, FileKind.SNAPSHOT)).write_bytes(
                format_producer_snapshot(producers)
            )
    (path / "leader-epoch-checkpoint").write_bytes(
        format_leader_epoch_checkpoint(derived if epochs is None else epochs)
    )
    (path / "partition.metadata").write_bytes(
        format_partition_metadata(topic_id or uuid.UUID(int=0x1234_5678_9ABC_DEF0 << 64 | 1))
    )
    return path


def write_meta_properties(
    log_dir: Path,
    *,
    node_id: int = 1,
    cluster_id: str = "MkU3OEVBNTcwNTJENDM2Qg",
    directory_id: uuid.UUID | None = None,
    version: int = 1,
) -> Path:
    """``meta.properties`` as ``PropertiesUtils.writePropertiesFile`` writes it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    id_key = "node.id" if version == 1 else "broker.id"
    lines = [
        "#",
        "#Sat Nov 21 23:00:00 UTC 2026",
        f"{id_key}={node_id}",
        f"directory.id={encode_kafka_uuid(directory_id or uuid.UUID(int=42))}",
        f"version={version}",
        f"cluster.id={cluster_id}",
    ]
    path = log_dir / "meta.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_log_dir(
    log_dir: Path,
    partitions: dict[tuple[str, int], Sequence[Sequence[bytes]]],
) -> Path:
    """A formatted log dir (``meta.properties``) with the given partitions' segments."""
    write_meta_properties(log_dir)
    for (topic, partition), segments in partitions.items():
        write_partition(log_dir, topic, partition, segments)
    return log_dir
