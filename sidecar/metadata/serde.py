"""The value bytes of ``__remote_log_metadata`` records, byte-identical to Kafka's
``RemoteLogMetadataSerde``; the record key is always null.

Upstream (apache/kafka, 4.x):
``storage/src/main/java/org/apache/kafka/server/log/remote/metadata/storage/serialization/RemoteLogMetadataSerde.java``,
``server-common/src/main/java/org/apache/kafka/server/common/serialization/AbstractApiMessageSerde.java``
and the schemas in ``storage/src/main/resources/message/Remote*Record.json``.

A value is ``uvarint(frame version = 1) uvarint(apiKey) uvarint(version = 0)`` followed by the
record in Kafka's flexible-version encoding (every struct ends with a tagged-field section).

``decode`` accepts what Kafka's serde accepts and reads it to the same event: frame version 1,
apiKeys 0-3, a version that Kafka's nested structs take (0, or a negative short that a wrapped
5-byte varint gives), no trailing bytes, known state ids, start offset >= 0, end >= start, a
non-empty epoch map. It is as lenient as Kafka where Kafka is: unknown tagged fields are skipped,
epochs may come in any order (a repeated epoch keeps its last offset), varints wrap as Java ints
do, and TxnIndexEmpty is one byte read whatever its tag's size says (any non-zero byte is true).
It rejects one thing Kafka lets through: invalid UTF-8 in a topic name (Kafka substitutes U+FFFD
with Java's decoder, whose replacements Python's codec does not reproduce byte for byte). Any
failure is a MetadataFormatError naming the byte offset; nothing else escapes.

``encode`` writes only what a broker's metadata consumer (``ConsumerTask``) can apply, because any
exception there stops the consumer for every partition it serves: no snapshot records (apiKey 3),
apiKey 0 only in COPY_SEGMENT_STARTED (``RemoteLogMetadataCache.addCopyInProgressSegment``), and no
apiKey 1 in COPY_SEGMENT_STARTED (``RemoteLogMetadataCache.updateRemoteLogSegmentMetadata``).

Pure and synchronous: bytes in, events out. No Kafka client here (that is publisher.py).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import TypeVar

from sidecar.metadata._wire import (
    EMPTY_TAGGED_FIELDS,
    INT8,
    INT32,
    Reader,
    compact_nullable_bytes,
    compact_string,
    tagged_fields,
    uvarint,
)
from sidecar.metadata.errors import InvalidMetadataEventError
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    PublishableMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
)

__all__ = ["decode", "encode"]

#: ``AbstractApiMessageSerde.DEFAULT_FRAME_VERSION``; 0 and anything else are rejected on read
FRAME_VERSION = 1
#: the only version of the four schemas (``validVersions: "0"``)
RECORD_VERSION = 0

SEGMENT_METADATA = 0  # RemoteLogSegmentMetadataRecord
SEGMENT_METADATA_UPDATE = 1  # RemoteLogSegmentMetadataUpdateRecord
PARTITION_DELETE_METADATA = 2  # RemotePartitionDeleteMetadataRecord
SEGMENT_METADATA_SNAPSHOT = 3  # RemoteLogSegmentMetadataSnapshotRecord

_RECORD_NAMES = {
    SEGMENT_METADATA: "RemoteLogSegmentMetadataRecord",
    SEGMENT_METADATA_UPDATE: "RemoteLogSegmentMetadataUpdateRecord",
    PARTITION_DELETE_METADATA: "RemotePartitionDeleteMetadataRecord",
    SEGMENT_METADATA_SNAPSHOT: "RemoteLogSegmentMetadataSnapshotRecord",
}

# TopicIdPartitionEntry, after its compact string Name:
_TOPIC_ID_PARTITION = struct.Struct(
    ">"
    "16s"  # Id (uuid)
    "i"  # Partition (int32)
)
# RemoteLogSegmentMetadataRecord, after RemoteLogSegmentIdEntry:
_SEGMENT = struct.Struct(
    ">"
    "q"  # StartOffset (int64)
    "q"  # EndOffset (int64)
    "i"  # BrokerId (int32)
    "q"  # MaxTimestampMs (int64)
    "q"  # EventTimestampMs (int64)
)
# SegmentLeaderEpochEntry, before its tagged fields:
_EPOCH_ENTRY = struct.Struct(
    ">"
    "i"  # LeaderEpoch (int32)
    "q"  # Offset (int64): the epoch's start offset
)
# RemoteLogSegmentMetadataUpdateRecord, after RemoteLogSegmentIdEntry:
_UPDATE = struct.Struct(
    ">"
    "i"  # BrokerId (int32)
    "q"  # EventTimestampMs (int64)
)
# RemotePartitionDeleteMetadataRecord, after TopicIdPartitionEntry:
_PARTITION_DELETE = struct.Struct(
    ">"
    "i"  # BrokerId (int32)
    "q"  # EventTimestampMs (int64)
    "b"  # RemotePartitionDeleteState (int8)
)
# RemoteLogSegmentMetadataSnapshotRecord, up to SegmentLeaderEpochs:
_SNAPSHOT = struct.Struct(
    ">"
    "16s"  # SegmentId (uuid)
    "q"  # StartOffset (int64)
    "q"  # EndOffset (int64)
    "i"  # BrokerId (int32)
    "q"  # MaxTimestampMs (int64)
    "q"  # EventTimestampMs (int64)
)
#: the tagged field ``TxnIndexEmpty`` (KIP-1058) of apiKeys 0 and 3
_TXN_INDEX_EMPTY_TAG = 0
#: the top-level tagged section with ``TxnIndexEmpty = true``: one field, tag 0, size 1, value 1
_TXN_INDEX_EMPTY_TRUE = tagged_fields({_TXN_INDEX_EMPTY_TAG: b"\x01"})
#: the known one-byte tags of that section, read as one byte whatever their size says
_BYTE_TAGS = frozenset((_TXN_INDEX_EMPTY_TAG,))


def _header(api_key: int) -> bytes:
    return uvarint(FRAME_VERSION) + uvarint(api_key) + uvarint(RECORD_VERSION)


_HEADERS = {api_key: _header(api_key) for api_key in _RECORD_NAMES}

_Event = TypeVar("_Event", bound=RemoteLogMetadata)


# --- encoding -------------------------------------------------------------------------------


def encode(event: PublishableMetadata) -> bytes:
    """The record value Kafka's ``RemoteLogMetadataSerde.serialize`` writes for ``event``.

    Raises InvalidMetadataEventError for events that must never be published: a snapshot, an
    apiKey-0 record in a state other than COPY_SEGMENT_STARTED, an update to COPY_SEGMENT_STARTED.
    """
    if isinstance(event, SegmentMetadata):
        if event.state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            raise InvalidMetadataEventError(
                f"SegmentMetadata (apiKey 0) is published only in COPY_SEGMENT_STARTED, not"
                f" {event.state.name}: brokers' metadata consumers stop on it; publish a"
                " SegmentMetadataUpdate instead"
            )
        return _encode_segment(event)
    if isinstance(event, SegmentMetadataUpdate):
        if event.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            raise InvalidMetadataEventError(
                "SegmentMetadataUpdate (apiKey 1) cannot carry COPY_SEGMENT_STARTED: brokers'"
                " metadata consumers stop on it; publish a SegmentMetadata instead"
            )
        return _encode_update(event)
    if isinstance(event, PartitionDeleteMetadata):
        return _encode_partition_delete(event)
    if isinstance(event, SegmentMetadataSnapshot):
        raise InvalidMetadataEventError(
            "SegmentMetadataSnapshot (apiKey 3) is never published: a broker's metadata consumer"
            " cannot apply it and stops reading its metadata partitions"
        )
    raise TypeError(f"not a remote log metadata event: {type(event).__name__}")


def _topic_id_partition_entry(tp: TopicIdPartition) -> bytes:
    return (
        compact_string(tp.topic.encode("utf-8"))
        + _TOPIC_ID_PARTITION.pack(tp.topic_id.bytes, tp.partition)
        + EMPTY_TAGGED_FIELDS
    )


def _segment_id_entry(segment_id: RemoteLogSegmentId) -> bytes:
    return (
        _topic_id_partition_entry(segment_id.topic_id_partition)
        + segment_id.id.bytes
        + EMPTY_TAGGED_FIELDS
    )


def _epoch_entries(epochs: tuple[tuple[int, int], ...]) -> bytes:
    parts = [uvarint(len(epochs) + 1)]
    for epoch, offset in epochs:
        parts += (_EPOCH_ENTRY.pack(epoch, offset), EMPTY_TAGGED_FIELDS)
    return b"".join(parts)


def _encode_segment(event: SegmentMetadata) -> bytes:
    return b"".join(
        (
            _HEADERS[SEGMENT_METADATA],
            _segment_id_entry(event.segment_id),
            _SEGMENT.pack(
                event.start_offset,
                event.end_offset,
                event.broker_id,
                event.max_timestamp_ms,
                event.event_timestamp_ms,
            ),
            _epoch_entries(event.segment_leader_epochs),
            INT32.pack(event.segment_size_in_bytes),
            compact_nullable_bytes(event.custom_metadata),
            INT8.pack(event.state),
            _TXN_INDEX_EMPTY_TRUE if event.txn_index_empty else EMPTY_TAGGED_FIELDS,
        )
    )


def _encode_update(event: SegmentMetadataUpdate) -> bytes:
    return b"".join(
        (
            _HEADERS[SEGMENT_METADATA_UPDATE],
            _segment_id_entry(event.segment_id),
            _UPDATE.pack(event.broker_id, event.event_timestamp_ms),
            compact_nullable_bytes(event.custom_metadata),
            INT8.pack(event.state),
            EMPTY_TAGGED_FIELDS,
        )
    )


def _encode_partition_delete(event: PartitionDeleteMetadata) -> bytes:
    return b"".join(
        (
            _HEADERS[PARTITION_DELETE_METADATA],
            _topic_id_partition_entry(event.topic_id_partition),
            _PARTITION_DELETE.pack(event.broker_id, event.event_timestamp_ms, event.state),
            EMPTY_TAGGED_FIELDS,
        )
    )


# --- decoding -------------------------------------------------------------------------------


def decode(value: bytes | bytearray | memoryview) -> RemoteLogMetadata:
    """The event in a record value, as Kafka's ``RemoteLogMetadataSerde.deserialize`` reads it.

    Raises MetadataFormatError (with ``position``, the offset in ``value``) for anything Kafka's
    serde rejects, and for invalid UTF-8 in a topic name.
    """
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"a record value is bytes, not {type(value).__name__}")
    reader = Reader(bytes(value))
    frame_version = reader.short("frame version")
    if frame_version != FRAME_VERSION:
        reader.fail(f"frame version {frame_version} is not supported (only {FRAME_VERSION})", 0)
    api_key_at = reader.pos
    api_key = reader.short("apiKey")
    read_record = _READERS.get(api_key)
    if read_record is None:
        reader.fail(f"unknown apiKey {api_key} (known: 0-3)", api_key_at)
    version_at = reader.pos
    version = reader.short("version")
    # Kafka's serde passes the version on unchecked; every nested struct's read (the first field
    # of apiKeys 0-2, the epoch entries of apiKey 3, which must not be empty) refuses one above 0.
    if version > RECORD_VERSION:
        reader.fail(
            f"{_RECORD_NAMES[api_key]} version {version} is not supported (only {RECORD_VERSION})",
            version_at,
        )
    event = read_record(reader)
    if reader.remaining:
        reader.fail(f"{reader.remaining} byte(s) of garbage after {_RECORD_NAMES[api_key]}")
    return event


def _uuid(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


def _build(reader: Reader, at: int, factory: Callable[[], _Event]) -> _Event:
    """Construct the event; a check of the event class that the reader did not already make is
    reported at the start of the record body."""
    try:
        return factory()
    except InvalidMetadataEventError as exc:
        reader.fail(str(exc), at)


def _read_topic_id_partition(reader: Reader, what: str) -> TopicIdPartition:
    name = reader.compact_string(f"{what}.Name")
    topic_id, partition = reader.unpack(_TOPIC_ID_PARTITION, f"{what}.Id and Partition")
    reader.tagged_fields(what)  # no tagged fields are defined; unknown ones are skipped
    return TopicIdPartition(_uuid(topic_id), name, partition)


def _read_segment_id(reader: Reader, what: str) -> RemoteLogSegmentId:
    tp = _read_topic_id_partition(reader, f"{what}.TopicIdPartition")
    segment_id = reader.uuid(f"{what}.Id")
    reader.tagged_fields(what)
    return RemoteLogSegmentId(tp, segment_id)


def _read_epochs(reader: Reader, what: str) -> tuple[tuple[int, int], ...]:
    """``SegmentLeaderEpochs`` as Kafka's transform rebuilds them: a HashMap (a repeated epoch keeps
    the last offset) sorted into a TreeMap. May be empty; the caller decides."""
    epochs: dict[int, int] = {}
    for _ in range(reader.compact_array_length(what)):
        epoch, offset = reader.unpack(_EPOCH_ENTRY, f"{what} entry")
        reader.tagged_fields(f"{what} entry")
        epochs[epoch] = offset
    return tuple(sorted(epochs.items()))


def _read_txn_index_empty(reader: Reader, what: str) -> bool:
    """The top-level tagged section of apiKeys 0 and 3; tag 0 is ``TxnIndexEmpty`` (bool), which
    Kafka's generated ``read`` takes as ``readByte() != 0`` without looking at the tag's size."""
    field = reader.tagged_fields(what, _BYTE_TAGS).get(_TXN_INDEX_EMPTY_TAG)
    return field is not None and field[1][0] != 0


def _segment_state(reader: Reader, state_id: int, at: int, what: str) -> RemoteLogSegmentState:
    try:
        return RemoteLogSegmentState(state_id)
    except ValueError:
        reader.fail(f"{what}.RemoteLogSegmentState: unknown state id {state_id}", at)


def _read_segment(reader: Reader) -> SegmentMetadata:
    at = reader.pos
    what = _RECORD_NAMES[SEGMENT_METADATA]
    segment_id = _read_segment_id(reader, f"{what}.RemoteLogSegmentId")
    fixed_at = reader.pos
    start, end, broker_id, max_ts, event_ts = reader.unpack(
        _SEGMENT, f"{what}.StartOffset..EventTimestampMs"
    )
    epochs_at = reader.pos
    epochs = _read_epochs(reader, f"{what}.SegmentLeaderEpochs")
    (size,) = reader.unpack(INT32, f"{what}.SegmentSizeInBytes")
    custom = reader.compact_nullable_bytes(f"{what}.CustomMetadata")
    state_at = reader.pos
    (state_id,) = reader.unpack(INT8, f"{what}.RemoteLogSegmentState")
    txn_index_empty = _read_txn_index_empty(reader, what)
    # What Kafka's RemoteLogSegmentMetadata constructor and RemoteLogSegmentState.forId reject:
    state = _segment_state(reader, state_id, state_at, what)
    if start < 0:
        reader.fail(f"{what}.StartOffset {start} is negative", fixed_at)
    if end < start:
        reader.fail(f"{what}.EndOffset {end} is less than StartOffset {start}", fixed_at + 8)
    if not epochs:
        reader.fail(f"{what}.SegmentLeaderEpochs is empty", epochs_at)
    return _build(
        reader,
        at,
        lambda: SegmentMetadata(
            segment_id=segment_id,
            start_offset=start,
            end_offset=end,
            broker_id=broker_id,
            max_timestamp_ms=max_ts,
            event_timestamp_ms=event_ts,
            segment_leader_epochs=epochs,
            segment_size_in_bytes=size,
            custom_metadata=custom,
            state=state,
            txn_index_empty=txn_index_empty,
        ),
    )


def _read_update(reader: Reader) -> SegmentMetadataUpdate:
    at = reader.pos
    what = _RECORD_NAMES[SEGMENT_METADATA_UPDATE]
    segment_id = _read_segment_id(reader, f"{what}.RemoteLogSegmentId")
    broker_id, event_ts = reader.unpack(_UPDATE, f"{what}.BrokerId and EventTimestampMs")
    custom = reader.compact_nullable_bytes(f"{what}.CustomMetadata")
    state_at = reader.pos
    (state_id,) = reader.unpack(INT8, f"{what}.RemoteLogSegmentState")
    reader.tagged_fields(what)
    state = _segment_state(reader, state_id, state_at, what)
    return _build(
        reader,
        at,
        lambda: SegmentMetadataUpdate(
            segment_id=segment_id,
            broker_id=broker_id,
            event_timestamp_ms=event_ts,
            custom_metadata=custom,
            state=state,
        ),
    )


def _read_partition_delete(reader: Reader) -> PartitionDeleteMetadata:
    at = reader.pos
    what = _RECORD_NAMES[PARTITION_DELETE_METADATA]
    tp = _read_topic_id_partition(reader, f"{what}.TopicIdPartition")
    fixed_at = reader.pos
    broker_id, event_ts, state_id = reader.unpack(
        _PARTITION_DELETE, f"{what}.BrokerId..RemotePartitionDeleteState"
    )
    reader.tagged_fields(what)
    try:
        state = RemotePartitionDeleteState(state_id)
    except ValueError:
        state_at = fixed_at + 12  # after BrokerId and EventTimestampMs
        reader.fail(f"{what}.RemotePartitionDeleteState: unknown state id {state_id}", state_at)
    return _build(
        reader,
        at,
        lambda: PartitionDeleteMetadata(
            topic_id_partition=tp, broker_id=broker_id, event_timestamp_ms=event_ts, state=state
        ),
    )


def _read_snapshot(reader: Reader) -> SegmentMetadataSnapshot:
    at = reader.pos
    what = _RECORD_NAMES[SEGMENT_METADATA_SNAPSHOT]
    segment_id, start, end, broker_id, max_ts, event_ts = reader.unpack(
        _SNAPSHOT, f"{what}.SegmentId..EventTimestampMs"
    )
    epochs_at = reader.pos
    epochs = _read_epochs(reader, f"{what}.SegmentLeaderEpochs")
    (size,) = reader.unpack(INT32, f"{what}.SegmentSizeInBytes")
    custom = reader.compact_nullable_bytes(f"{what}.CustomMetadata")
    state_at = reader.pos
    (state_id,) = reader.unpack(INT8, f"{what}.RemoteLogSegmentState")
    txn_index_empty = _read_txn_index_empty(reader, what)
    # Kafka's RemoteLogSegmentMetadataSnapshot constructor checks the state and the epochs only.
    state = _segment_state(reader, state_id, state_at, what)
    if not epochs:
        reader.fail(f"{what}.SegmentLeaderEpochs is empty", epochs_at)
    return _build(
        reader,
        at,
        lambda: SegmentMetadataSnapshot(
            segment_id=_uuid(segment_id),
            start_offset=start,
            end_offset=end,
            broker_id=broker_id,
            max_timestamp_ms=max_ts,
            event_timestamp_ms=event_ts,
            segment_leader_epochs=epochs,
            segment_size_in_bytes=size,
            custom_metadata=custom,
            state=state,
            txn_index_empty=txn_index_empty,
        ),
    )


_READERS: dict[int, Callable[[Reader], RemoteLogMetadata]] = {
    SEGMENT_METADATA: _read_segment,
    SEGMENT_METADATA_UPDATE: _read_update,
    PARTITION_DELETE_METADATA: _read_partition_delete,
    SEGMENT_METADATA_SNAPSHOT: _read_snapshot,
}
