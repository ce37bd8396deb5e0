"""KIP-405 remote log metadata events: the four record types of ``__remote_log_metadata``.

Frozen, slotted dataclasses mirroring Kafka's ``RemoteLogSegmentMetadata`` (apiKey 0),
``RemoteLogSegmentMetadataUpdate`` (1), ``RemotePartitionDeleteMetadata`` (2) and
``RemoteLogSegmentMetadataSnapshot`` (3, decode only), plus the two state enums and their transition
rules. Upstream (apache/kafka):
``storage/api/src/main/java/org/apache/kafka/server/log/remote/storage/`` and
``storage/src/main/java/org/apache/kafka/server/log/remote/metadata/storage/``.

Construction checks the Java field widths and exactly what Kafka's constructors check when its
serde rebuilds an event (start offset >= 0, end >= start, a non-empty epoch map), so every event
here can be represented by Kafka; it raises InvalidMetadataEventError. What may be *published* is
narrower and is checked by ``serde.encode``. Pure data: no bytes (serde.py), no I/O, no client.
"""

from __future__ import annotations

import base64
import enum
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from sidecar.metadata._wire import MAX_STRING_BYTES
from sidecar.metadata.errors import InvalidMetadataEventError

__all__ = [
    "PartitionDeleteMetadata",
    "PublishableMetadata",
    "RemoteLogMetadata",
    "RemoteLogSegmentId",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteState",
    "SegmentMetadata",
    "SegmentMetadataSnapshot",
    "SegmentMetadataUpdate",
    "TopicIdPartition",
    "is_valid_partition_delete_transition",
    "is_valid_segment_transition",
]


class RemoteLogSegmentState(enum.IntEnum):
    """A remote segment's life; the values are Kafka's ``RemoteLogSegmentState.id()``."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class RemotePartitionDeleteState(enum.IntEnum):
    """A partition's remote deletion; the values are Kafka's ``RemotePartitionDeleteState.id()``."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


_SEGMENT_NEXT: dict[RemoteLogSegmentState, frozenset[RemoteLogSegmentState]] = {
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: frozenset(
        {RemoteLogSegmentState.COPY_SEGMENT_FINISHED, RemoteLogSegmentState.DELETE_SEGMENT_STARTED}
    ),
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: frozenset(
        {RemoteLogSegmentState.DELETE_SEGMENT_STARTED}
    ),
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: frozenset(
        {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED}
    ),
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: frozenset(),
}

_PARTITION_DELETE_NEXT: dict[RemotePartitionDeleteState, frozenset[RemotePartitionDeleteState]] = {
    RemotePartitionDeleteState.DELETE_PARTITION_MARKED: frozenset(
        {RemotePartitionDeleteState.DELETE_PARTITION_STARTED}
    ),
    RemotePartitionDeleteState.DELETE_PARTITION_STARTED: frozenset(
        {RemotePartitionDeleteState.DELETE_PARTITION_FINISHED}
    ),
    RemotePartitionDeleteState.DELETE_PARTITION_FINISHED: frozenset(),
}


def is_valid_segment_transition(
    source: RemoteLogSegmentState | None, target: RemoteLogSegmentState
) -> bool:
    """Kafka's ``RemoteLogSegmentState.isValidTransition``: ``None`` (no segment yet) may only go
    to COPY_SEGMENT_STARTED, any state may "go" to itself, and otherwise COPY_SEGMENT_STARTED ->
    COPY_SEGMENT_FINISHED | DELETE_SEGMENT_STARTED, COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_STARTED,
    DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED."""
    if source is None:
        return target is RemoteLogSegmentState.COPY_SEGMENT_STARTED
    return source is target or target in _SEGMENT_NEXT[source]


def is_valid_partition_delete_transition(
    source: RemotePartitionDeleteState | None, target: RemotePartitionDeleteState
) -> bool:
    """Kafka's ``RemotePartitionDeleteState.isValidTransition``: ``None`` may only go to MARKED,
    any state may "go" to itself, and otherwise MARKED -> STARTED -> FINISHED."""
    if source is None:
        return target is RemotePartitionDeleteState.DELETE_PARTITION_MARKED
    return source is target or target in _PARTITION_DELETE_NEXT[source]


def _kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


def _check_int(owner: str, name: str, value: object, bits: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMetadataEventError(
            f"{owner}.{name} must be an int, not {type(value).__name__}"
        )
    limit = 1 << (bits - 1)
    if not -limit <= value < limit:
        raise InvalidMetadataEventError(
            f"{owner}.{name} = {value} does not fit a Java int{bits} [{-limit}, {limit - 1}]"
        )


def _check_type(owner: str, name: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise InvalidMetadataEventError(
            f"{owner}.{name} must be {kind.__name__}, not {type(value).__name__}"
        )


def _check_custom_metadata(owner: str, value: object) -> None:
    if value is not None and not isinstance(value, bytes):
        raise InvalidMetadataEventError(
            f"{owner}.custom_metadata must be bytes or None, not {type(value).__name__}"
        )


def _check_epochs(owner: str, value: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Non-empty ``(leader epoch, start offset)`` pairs, strictly ascending by epoch (a TreeMap)."""
    try:
        epochs = tuple((epoch, offset) for epoch, offset in value)
    except (TypeError, ValueError) as exc:
        raise InvalidMetadataEventError(
            f"{owner}.segment_leader_epochs must be (epoch, start offset) pairs"
        ) from exc
    if not epochs:
        raise InvalidMetadataEventError(
            f"{owner}.segment_leader_epochs must not be empty (Kafka: 'segmentLeaderEpochs can not"
            " be null or empty')"
        )
    previous: int | None = None
    for epoch, offset in epochs:
        _check_int(owner, "segment_leader_epochs epoch", epoch, 32)
        _check_int(owner, "segment_leader_epochs start offset", offset, 64)
        if previous is not None and epoch <= previous:
            raise InvalidMetadataEventError(
                f"{owner}.segment_leader_epochs must be strictly ascending by epoch,"
                f" got {epoch} after {previous}"
            )
        previous = epoch
    return epochs


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    """A user topic partition and its topic id (Kafka's ``TopicIdPartition``)."""

    topic_id: uuid.UUID
    topic: str
    partition: int

    def __post_init__(self) -> None:
        _check_type("TopicIdPartition", "topic_id", self.topic_id, uuid.UUID)
        _check_type("TopicIdPartition", "topic", self.topic, str)
        try:
            size = len(self.topic.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise InvalidMetadataEventError(
                f"TopicIdPartition.topic {self.topic!r} is not encodable as UTF-8"
            ) from exc
        if size > MAX_STRING_BYTES:
            raise InvalidMetadataEventError(
                f"TopicIdPartition.topic is {size} bytes of UTF-8; Kafka allows {MAX_STRING_BYTES}"
            )
        _check_int("TopicIdPartition", "partition", self.partition, 32)

    def __str__(self) -> str:
        return f"{_kafka_uuid(self.topic_id)}:{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """One copy attempt of one segment: the partition plus a fresh random id per attempt."""

    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    def __post_init__(self) -> None:
        _check_type(
            "RemoteLogSegmentId", "topic_id_partition", self.topic_id_partition, TopicIdPartition
        )
        _check_type("RemoteLogSegmentId", "id", self.id, uuid.UUID)

    def __str__(self) -> str:
        return f"{self.topic_id_partition}:{_kafka_uuid(self.id)}"


def _check_segment_fields(owner: str, event: SegmentMetadata | SegmentMetadataSnapshot) -> None:
    _check_int(owner, "start_offset", event.start_offset, 64)
    _check_int(owner, "end_offset", event.end_offset, 64)
    _check_int(owner, "broker_id", event.broker_id, 32)
    _check_int(owner, "max_timestamp_ms", event.max_timestamp_ms, 64)
    _check_int(owner, "event_timestamp_ms", event.event_timestamp_ms, 64)
    epochs = _check_epochs(owner, event.segment_leader_epochs)
    object.__setattr__(event, "segment_leader_epochs", epochs)
    _check_int(owner, "segment_size_in_bytes", event.segment_size_in_bytes, 32)
    _check_custom_metadata(owner, event.custom_metadata)
    _check_type(owner, "state", event.state, RemoteLogSegmentState)
    _check_type(owner, "txn_index_empty", event.txn_index_empty, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentMetadata:
    """apiKey 0, ``RemoteLogSegmentMetadataRecord``: a segment's full metadata, published when its
    copy starts (Kafka's ``RemoteLogSegmentMetadata``)."""

    segment_id: RemoteLogSegmentId
    #: first offset in the segment (inclusive)
    start_offset: int
    #: last offset in the segment (inclusive): the next segment's base offset - 1
    end_offset: int
    #: the broker that generated the event
    broker_id: int
    #: the largest record timestamp in the segment
    max_timestamp_ms: int
    #: when the event was generated
    event_timestamp_ms: int
    #: ``(leader epoch, its start offset in the segment)``, non-empty, ascending by epoch
    segment_leader_epochs: tuple[tuple[int, int], ...]
    #: size of the ``.log`` file
    segment_size_in_bytes: int
    #: opaque bytes returned by the storage plugin, if any
    custom_metadata: bytes | None = None
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    #: KIP-1058 (Kafka 4.0): the segment has no aborted transactions; tag 0, written only when true
    txn_index_empty: bool = False

    def __post_init__(self) -> None:
        _check_type("SegmentMetadata", "segment_id", self.segment_id, RemoteLogSegmentId)
        _check_segment_fields("SegmentMetadata", self)
        if self.start_offset < 0:
            raise InvalidMetadataEventError(
                f"SegmentMetadata.start_offset = {self.start_offset} is negative"
            )
        if self.end_offset < self.start_offset:
            raise InvalidMetadataEventError(
                f"SegmentMetadata.end_offset = {self.end_offset} is less than"
                f" start_offset = {self.start_offset}"
            )

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        """The user partition this event is about (it picks the metadata-topic partition)."""
        return self.segment_id.topic_id_partition


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentMetadataUpdate:
    """apiKey 1, ``RemoteLogSegmentMetadataUpdateRecord``: a segment's new state (Kafka's
    ``RemoteLogSegmentMetadataUpdate``)."""

    segment_id: RemoteLogSegmentId
    broker_id: int
    event_timestamp_ms: int
    #: carried again on updates; readers keep the latest value
    custom_metadata: bytes | None = None
    state: RemoteLogSegmentState

    def __post_init__(self) -> None:
        owner = "SegmentMetadataUpdate"
        _check_type(owner, "segment_id", self.segment_id, RemoteLogSegmentId)
        _check_int(owner, "broker_id", self.broker_id, 32)
        _check_int(owner, "event_timestamp_ms", self.event_timestamp_ms, 64)
        _check_custom_metadata(owner, self.custom_metadata)
        _check_type(owner, "state", self.state, RemoteLogSegmentState)

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        """The user partition this event is about (it picks the metadata-topic partition)."""
        return self.segment_id.topic_id_partition


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionDeleteMetadata:
    """apiKey 2, ``RemotePartitionDeleteMetadataRecord``: a partition's remote data is being deleted
    (Kafka's ``RemotePartitionDeleteMetadata``)."""

    topic_id_partition: TopicIdPartition
    broker_id: int
    event_timestamp_ms: int
    state: RemotePartitionDeleteState

    def __post_init__(self) -> None:
        owner = "PartitionDeleteMetadata"
        _check_type(owner, "topic_id_partition", self.topic_id_partition, TopicIdPartition)
        _check_int(owner, "broker_id", self.broker_id, 32)
        _check_int(owner, "event_timestamp_ms", self.event_timestamp_ms, 64)
        _check_type(owner, "state", self.state, RemotePartitionDeleteState)


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentMetadataSnapshot:
    """apiKey 3, ``RemoteLogSegmentMetadataSnapshotRecord``: a segment's metadata without its
    partition, once written only to a broker's local snapshot file. Decode only: on the topic it
    stops every broker's metadata consumer, so ``serde.encode`` refuses it."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    broker_id: int
    max_timestamp_ms: int
    event_timestamp_ms: int
    segment_leader_epochs: tuple[tuple[int, int], ...]
    segment_size_in_bytes: int
    custom_metadata: bytes | None = None
    state: RemoteLogSegmentState
    txn_index_empty: bool = False

    def __post_init__(self) -> None:
        # Kafka's snapshot constructor checks only the epochs and the state, not the offsets.
        _check_type("SegmentMetadataSnapshot", "segment_id", self.segment_id, uuid.UUID)
        _check_segment_fields("SegmentMetadataSnapshot", self)


#: any event of the metadata topic's format
RemoteLogMetadata: TypeAlias = (
    SegmentMetadata | SegmentMetadataUpdate | PartitionDeleteMetadata | SegmentMetadataSnapshot
)
#: the events that ``serde.encode`` accepts (subject to state rules, see there)
PublishableMetadata: TypeAlias = SegmentMetadata | SegmentMetadataUpdate | PartitionDeleteMetadata
