"""Metadata events: Kafka's state ids and transition rules, and construction-time validation."""

from __future__ import annotations

import dataclasses
import importlib
import uuid
from typing import Any

import pytest

import sidecar.metadata
from sidecar.errors import SidecarError
from sidecar.metadata import (
    InvalidMetadataEventError,
    PartitionDeleteMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
    is_valid_partition_delete_transition,
    is_valid_segment_transition,
)

TOPIC_ID = uuid.UUID("0123456789abcdeffedcba9876543210")
SEGMENT_UUID = uuid.UUID("11111111111111112222222222222222")
TP = TopicIdPartition(TOPIC_ID, "foo", 0)
SEGMENT_ID = RemoteLogSegmentId(TP, SEGMENT_UUID)

S = RemoteLogSegmentState
P = RemotePartitionDeleteState


def segment(**changes: Any) -> SegmentMetadata:
    """The base vector's segment metadata, with ``changes``."""
    fields: dict[str, Any] = {
        "segment_id": SEGMENT_ID,
        "start_offset": 0,
        "end_offset": 99,
        "broker_id": 1,
        "max_timestamp_ms": 1700000000000,
        "event_timestamp_ms": 1700000001000,
        "segment_leader_epochs": ((0, 0),),
        "segment_size_in_bytes": 1024,
    }
    return SegmentMetadata(**(fields | changes))


def snapshot(**changes: Any) -> SegmentMetadataSnapshot:
    """A snapshot of the base vector's segment, with ``changes``."""
    fields: dict[str, Any] = {
        "segment_id": SEGMENT_UUID,
        "start_offset": 0,
        "end_offset": 99,
        "broker_id": 1,
        "max_timestamp_ms": 0,
        "event_timestamp_ms": 0,
        "segment_leader_epochs": ((0, 0),),
        "segment_size_in_bytes": 1024,
        "state": S.COPY_SEGMENT_STARTED,
    }
    return SegmentMetadataSnapshot(**(fields | changes))


class TestStateIds:
    """The enums carry Kafka's numeric ids, which are what the wire format stores."""

    def test_segment_state_ids(self) -> None:
        """RemoteLogSegmentState ids are 0-3 in Kafka's order."""
        assert {state.name: int(state) for state in S} == {
            "COPY_SEGMENT_STARTED": 0,
            "COPY_SEGMENT_FINISHED": 1,
            "DELETE_SEGMENT_STARTED": 2,
            "DELETE_SEGMENT_FINISHED": 3,
        }

    def test_partition_delete_state_ids(self) -> None:
        """RemotePartitionDeleteState ids are 0-2 in Kafka's order."""
        assert {state.name: int(state) for state in P} == {
            "DELETE_PARTITION_MARKED": 0,
            "DELETE_PARTITION_STARTED": 1,
            "DELETE_PARTITION_FINISHED": 2,
        }


# Kafka's RemoteLogSegmentState.isValidTransition, written out case by case (source, target).
SEGMENT_TRANSITIONS = {
    (None, S.COPY_SEGMENT_STARTED): True,
    (None, S.COPY_SEGMENT_FINISHED): False,
    (None, S.DELETE_SEGMENT_STARTED): False,
    (None, S.DELETE_SEGMENT_FINISHED): False,
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_STARTED): True,
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED): True,
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED): True,
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED): False,
    (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_STARTED): False,
    (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED): True,
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED): True,
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_FINISHED): False,
    (S.DELETE_SEGMENT_STARTED, S.COPY_SEGMENT_STARTED): False,
    (S.DELETE_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED): False,
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED): True,
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED): True,
    (S.DELETE_SEGMENT_FINISHED, S.COPY_SEGMENT_STARTED): False,
    (S.DELETE_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED): False,
    (S.DELETE_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED): False,
    (S.DELETE_SEGMENT_FINISHED, S.DELETE_SEGMENT_FINISHED): True,
}

# Kafka's RemotePartitionDeleteState.isValidTransition.
PARTITION_DELETE_TRANSITIONS = {
    (None, P.DELETE_PARTITION_MARKED): True,
    (None, P.DELETE_PARTITION_STARTED): False,
    (None, P.DELETE_PARTITION_FINISHED): False,
    (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_MARKED): True,
    (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED): True,
    (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_FINISHED): False,
    (P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_MARKED): False,
    (P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_STARTED): True,
    (P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED): True,
    (P.DELETE_PARTITION_FINISHED, P.DELETE_PARTITION_MARKED): False,
    (P.DELETE_PARTITION_FINISHED, P.DELETE_PARTITION_STARTED): False,
    (P.DELETE_PARTITION_FINISHED, P.DELETE_PARTITION_FINISHED): True,
}


def _transition_id(source: Any, target: Any) -> str:
    return f"{source.name if source else 'None'}->{target.name}"


class TestSegmentTransitions:
    """is_valid_segment_transition matches Kafka's table for every pair of states."""

    @pytest.mark.parametrize(
        ("source", "target", "valid"),
        [
            pytest.param(source, target, valid, id=_transition_id(source, target))
            for (source, target), valid in SEGMENT_TRANSITIONS.items()
        ],
    )
    def test_table(self, source: S | None, target: S, valid: bool) -> None:
        """Each (source, target) pair is valid exactly when Kafka says so."""
        assert is_valid_segment_transition(source, target) is valid

    def test_table_is_complete(self) -> None:
        """The table covers every source (None included) and every target."""
        assert len(SEGMENT_TRANSITIONS) == (len(S) + 1) * len(S)


class TestPartitionDeleteTransitions:
    """is_valid_partition_delete_transition matches Kafka's table for every pair of states."""

    @pytest.mark.parametrize(
        ("source", "target", "valid"),
        [
            pytest.param(source, target, valid, id=_transition_id(source, target))
            for (source, target), valid in PARTITION_DELETE_TRANSITIONS.items()
        ],
    )
    def test_table(self, source: P | None, target: P, valid: bool) -> None:
        """Each (source, target) pair is valid exactly when Kafka says so."""
        assert is_valid_partition_delete_transition(source, target) is valid

    def test_table_is_complete(self) -> None:
        """The table covers every source (None included) and every target."""
        assert len(PARTITION_DELETE_TRANSITIONS) == (len(P) + 1) * len(P)


class TestTopicIdPartition:
    """TopicIdPartition accepts what Kafka can carry and prints like Kafka."""

    def test_str_is_kafkas(self) -> None:
        """str() is Kafka's ``<base64 topic id>:<topic>-<partition>``."""
        assert str(TP) == "ASNFZ4mrze_-3LqYdlQyEA:foo-0"
        assert str(SEGMENT_ID) == "ASNFZ4mrze_-3LqYdlQyEA:foo-0:EREREREREREiIiIiIiIiIg"

    def test_longest_topic_name(self) -> None:
        """A name of exactly 32767 UTF-8 bytes is accepted."""
        assert TopicIdPartition(TOPIC_ID, "x" * 32767, 0).topic == "x" * 32767

    @pytest.mark.parametrize(
        ("fields", "text"),
        [
            pytest.param((TOPIC_ID, "x" * 32768, 0), "32768 bytes", id="name-too-long"),
            pytest.param((TOPIC_ID, "é" * 16384, 0), "32768 bytes", id="name-too-long-utf8"),
            pytest.param((TOPIC_ID, "a\udc80", 0), "UTF-8", id="lone-surrogate"),
            pytest.param((TOPIC_ID, b"foo", 0), "must be str", id="bytes-name"),
            pytest.param((str(TOPIC_ID), "foo", 0), "must be UUID", id="str-topic-id"),
            pytest.param((TOPIC_ID, "foo", 2**31), "int32", id="partition-too-big"),
            pytest.param((TOPIC_ID, "foo", True), "must be an int", id="bool-partition"),
        ],
    )
    def test_rejects(self, fields: tuple[Any, ...], text: str) -> None:
        """Values Kafka cannot represent raise InvalidMetadataEventError."""
        with pytest.raises(InvalidMetadataEventError, match=text):
            TopicIdPartition(*fields)

    def test_segment_id_needs_a_uuid(self) -> None:
        """A RemoteLogSegmentId's id is a uuid.UUID."""
        with pytest.raises(InvalidMetadataEventError, match="must be UUID"):
            RemoteLogSegmentId(TP, "EREREREREREiIiIiIiIiIg")  # type: ignore[arg-type]


class TestSegmentMetadata:
    """SegmentMetadata checks what Kafka's RemoteLogSegmentMetadata constructor checks."""

    def test_defaults(self) -> None:
        """A new segment is COPY_SEGMENT_STARTED, with no custom metadata and a txn index."""
        event = segment()
        assert event.state is S.COPY_SEGMENT_STARTED
        assert event.custom_metadata is None
        assert event.txn_index_empty is False
        assert event.topic_id_partition == TP

    def test_frozen_and_slotted(self) -> None:
        """Events are immutable and carry no instance dict."""
        event = segment()
        with pytest.raises(dataclasses.FrozenInstanceError):
            event.start_offset = 5  # type: ignore[misc]
        assert not hasattr(event, "__dict__")

    def test_keyword_only(self) -> None:
        """Events take keyword arguments only, so offsets cannot be swapped by position."""
        with pytest.raises(TypeError):
            SegmentMetadata(SEGMENT_ID, 0, 99)  # type: ignore[call-arg]

    def test_single_offset_segment(self) -> None:
        """end_offset may equal start_offset."""
        assert segment(start_offset=7, end_offset=7).end_offset == 7

    def test_epochs_list_becomes_tuple(self) -> None:
        """Epochs given as a list of lists are stored as a tuple of pairs (hashable)."""
        event = segment(segment_leader_epochs=[[0, 0], [2, 50]])
        assert event.segment_leader_epochs == ((0, 0), (2, 50))
        assert hash(event) == hash(segment(segment_leader_epochs=((0, 0), (2, 50))))

    @pytest.mark.parametrize(
        ("changes", "text"),
        [
            pytest.param(
                {"start_offset": -1}, "start_offset = -1 is negative", id="negative-start"
            ),
            pytest.param({"end_offset": -1}, "less than start_offset", id="end-before-start"),
            pytest.param({"segment_leader_epochs": ()}, "must not be empty", id="no-epochs"),
            pytest.param(
                {"segment_leader_epochs": ((2, 0), (1, 5))}, "strictly ascending", id="unsorted"
            ),
            pytest.param(
                {"segment_leader_epochs": ((2, 0), (2, 5))}, "strictly ascending", id="repeated"
            ),
            pytest.param({"segment_leader_epochs": ((2**31, 0),)}, "int32", id="epoch-too-big"),
            pytest.param({"segment_leader_epochs": ((0, 0, 0),)}, "pairs", id="epoch-not-a-pair"),
            pytest.param({"end_offset": 2**63}, "int64", id="end-too-big"),
            pytest.param({"broker_id": -(2**31) - 1}, "int32", id="broker-too-small"),
            pytest.param({"segment_size_in_bytes": 2**31}, "int32", id="size-too-big"),
            pytest.param({"max_timestamp_ms": 1.5}, "must be an int", id="float-timestamp"),
            pytest.param({"custom_metadata": "abc"}, "bytes or None", id="str-custom-metadata"),
            pytest.param({"state": 1}, "must be RemoteLogSegmentState", id="int-state"),
            pytest.param(
                {"state": P.DELETE_PARTITION_MARKED}, "RemoteLogSegmentState", id="wrong-enum"
            ),
            pytest.param({"txn_index_empty": 1}, "must be bool", id="int-txn-flag"),
            pytest.param({"segment_id": TP}, "must be RemoteLogSegmentId", id="wrong-segment-id"),
        ],
    )
    def test_rejects(self, changes: dict[str, Any], text: str) -> None:
        """Fields Kafka rejects, or cannot represent, raise InvalidMetadataEventError."""
        with pytest.raises(InvalidMetadataEventError, match=text):
            segment(**changes)

    def test_error_is_a_sidecar_error(self) -> None:
        """Validation errors belong to the sidecar's error tree."""
        with pytest.raises(SidecarError):
            segment(start_offset=-1)


class TestSegmentMetadataUpdate:
    """SegmentMetadataUpdate carries a new state for one segment id."""

    def test_fields(self) -> None:
        """An update knows its partition through its segment id."""
        update = SegmentMetadataUpdate(
            segment_id=SEGMENT_ID, broker_id=1, event_timestamp_ms=5, state=S.COPY_SEGMENT_FINISHED
        )
        assert update.topic_id_partition == TP
        assert update.custom_metadata is None

    @pytest.mark.parametrize(
        ("changes", "text"),
        [
            pytest.param({"state": None}, "RemoteLogSegmentState", id="no-state"),
            pytest.param({"broker_id": 2**31}, "int32", id="broker-too-big"),
            pytest.param({"custom_metadata": bytearray(b"x")}, "bytes or None", id="bytearray"),
        ],
    )
    def test_rejects(self, changes: dict[str, Any], text: str) -> None:
        """Invalid fields raise InvalidMetadataEventError."""
        fields: dict[str, Any] = {
            "segment_id": SEGMENT_ID,
            "broker_id": 1,
            "event_timestamp_ms": 5,
            "state": S.COPY_SEGMENT_FINISHED,
        }
        with pytest.raises(InvalidMetadataEventError, match=text):
            SegmentMetadataUpdate(**(fields | changes))


class TestPartitionDeleteMetadata:
    """PartitionDeleteMetadata carries a partition-deletion state."""

    def test_rejects_segment_state(self) -> None:
        """A segment state is not a partition-delete state."""
        with pytest.raises(InvalidMetadataEventError, match="RemotePartitionDeleteState"):
            PartitionDeleteMetadata(
                topic_id_partition=TP,
                broker_id=1,
                event_timestamp_ms=0,
                state=S.COPY_SEGMENT_STARTED,  # type: ignore[arg-type]
            )

    def test_rejects_bare_partition(self) -> None:
        """The partition must be a TopicIdPartition."""
        with pytest.raises(InvalidMetadataEventError, match="TopicIdPartition"):
            PartitionDeleteMetadata(
                topic_id_partition=("foo", 0),  # type: ignore[arg-type]
                broker_id=1,
                event_timestamp_ms=0,
                state=P.DELETE_PARTITION_MARKED,
            )


class TestSegmentMetadataSnapshot:
    """Snapshots check only what Kafka's snapshot constructor checks."""

    def test_offsets_are_unchecked(self) -> None:
        """Kafka does not check a snapshot's offsets, so neither do we."""
        assert snapshot(start_offset=-5, end_offset=-9).end_offset == -9

    def test_epochs_must_not_be_empty(self) -> None:
        """An empty epoch map is rejected, as in Kafka."""
        with pytest.raises(InvalidMetadataEventError, match="must not be empty"):
            snapshot(segment_leader_epochs=())

    def test_segment_id_is_a_bare_uuid(self) -> None:
        """A snapshot has no partition: its segment id is a plain UUID."""
        with pytest.raises(InvalidMetadataEventError, match="must be UUID"):
            snapshot(segment_id=SEGMENT_ID)


class TestPublicSurface:
    """Each module's ``__all__`` is sorted, and the package re-exports every public name."""

    @pytest.mark.parametrize(
        "module",
        [
            "sidecar.metadata",
            "sidecar.metadata.errors",
            "sidecar.metadata.events",
            "sidecar.metadata.partitioner",
            "sidecar.metadata.serde",
            "sidecar.metadata.store",
            "sidecar.metadata.publisher",
            "sidecar.metadata.tailer",
            "sidecar.metadata.strategies",
        ],
    )
    def test_all_is_sorted_and_resolvable(self, module: str) -> None:
        """``__all__`` is sorted and every name in it exists."""
        imported = importlib.import_module(module)
        assert imported.__all__ == sorted(imported.__all__)
        for name in imported.__all__:
            assert hasattr(imported, name), name

    def test_package_reexports_modules(self) -> None:
        """The package surface is the union of its modules' surfaces (strategies excluded)."""
        names: set[str] = set()
        for module in ("errors", "events", "partitioner", "serde", "store", "publisher", "tailer"):
            names |= set(importlib.import_module(f"sidecar.metadata.{module}").__all__)
        assert set(sidecar.metadata.__all__) == names
