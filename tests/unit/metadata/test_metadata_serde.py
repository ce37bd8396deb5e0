"""The ``__remote_log_metadata`` value format: Kafka's golden bytes both ways, round trips, what
Kafka tolerates, and hostile input that must only ever raise MetadataFormatError."""

from __future__ import annotations

import dataclasses
import json
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import FormatError, SidecarError
from sidecar.metadata import (
    InvalidMetadataEventError,
    MetadataFormatError,
    PartitionDeleteMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
    decode,
    encode,
)
from sidecar.metadata.strategies import (
    mutations,
    partition_delete_metadata,
    publishable_metadata,
    segment_metadata,
    segment_metadata_snapshots,
    segment_metadata_updates,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "metadata-vectors.json").read_text(encoding="utf-8")
)
RECORD_VECTORS = {vector["name"]: vector for vector in VECTORS["recordVectors"]}
BASE = bytes.fromhex(RECORD_VECTORS["segment_metadata_base"]["expectedHex"])
UPDATE = bytes.fromhex(RECORD_VECTORS["segment_metadata_update_copy_finished"]["expectedHex"])
DELETE = bytes.fromhex(RECORD_VECTORS["partition_delete_marked"]["expectedHex"])

# Offsets in BASE (kafka-kip405-internals.md §1.5).
BASE_TOPIC_NAME = 3  # compact string length byte
BASE_TOPIC_ID_PARTITION_TAGS = 27
BASE_SEGMENT_ID_TAGS = 44
BASE_START_OFFSET = 45
BASE_END_OFFSET = 53
BASE_EPOCHS = 81  # compact array length byte
BASE_EPOCH_ENTRY_TAGS = 94
BASE_CUSTOM_METADATA = 99
BASE_STATE = 100
BASE_TAGS = 101
# Offsets in UPDATE and DELETE.
UPDATE_CUSTOM_METADATA = 57
UPDATE_STATE = 58
UPDATE_TAGS = 59
DELETE_STATE = 40
DELETE_TAGS = 41

# Snapshot records (apiKey 3) as Kafka 4.3.1's RemoteLogMetadataSerde.serialize writes them for a
# RemoteLogSegmentMetadataSnapshot; the vectors file has none because they are never published.
SNAPSHOT_BASE = bytes.fromhex(
    "01030011111111111111112222222222222222000000000000000000000000000000630000000100"
    "00018bcfe568000000018bcfe56be8020000000000000000000000000000000400000000"
)
SNAPSHOT_FULL = bytes.fromhex(
    "01030011111111111111112222222222222222000000000000000000000000000000630000000100"
    "00018bcfe568000000018bcfe56be803000000000000000000000000000000000300000000000000"
    "320000000400040102030101000101"
)
# Offsets in SNAPSHOT_BASE.
SNAPSHOT_EPOCHS = 55
SNAPSHOT_STATE = 74

TOPIC_ID = uuid.UUID("0123456789abcdef-fedcba9876543210".replace("-", ""))
SEGMENT_UUID = uuid.UUID("11111111111111112222222222222222")
TP = TopicIdPartition(TOPIC_ID, "foo", 0)
SEGMENT_ID = RemoteLogSegmentId(TP, SEGMENT_UUID)


def event_from_vector(vector: dict[str, Any]) -> RemoteLogMetadata:
    """The event a record vector describes, built from its ``inputs``."""
    inputs = vector["inputs"]
    tp = TopicIdPartition(
        uuid.UUID(hex=inputs["topicIdMsbHex"] + inputs["topicIdLsbHex"]),
        inputs["topicName"],
        inputs["partition"],
    )
    custom_hex = inputs.get("customMetadataHex")
    custom = None if custom_hex is None else bytes.fromhex(custom_hex)
    if vector["recordType"] == "RemotePartitionDeleteMetadataRecord":
        return PartitionDeleteMetadata(
            topic_id_partition=tp,
            broker_id=inputs["brokerId"],
            event_timestamp_ms=inputs["eventTimestampMs"],
            state=RemotePartitionDeleteState[inputs["state"]],
        )
    segment_id = RemoteLogSegmentId(
        tp, uuid.UUID(hex=inputs["segmentIdMsbHex"] + inputs["segmentIdLsbHex"])
    )
    if vector["recordType"] == "RemoteLogSegmentMetadataUpdateRecord":
        return SegmentMetadataUpdate(
            segment_id=segment_id,
            broker_id=inputs["brokerId"],
            event_timestamp_ms=inputs["eventTimestampMs"],
            custom_metadata=custom,
            state=RemoteLogSegmentState[inputs["state"]],
        )
    assert vector["recordType"] == "RemoteLogSegmentMetadataRecord"
    return SegmentMetadata(
        segment_id=segment_id,
        start_offset=inputs["startOffset"],
        end_offset=inputs["endOffset"],
        broker_id=inputs["brokerId"],
        max_timestamp_ms=inputs["maxTimestampMs"],
        event_timestamp_ms=inputs["eventTimestampMs"],
        segment_leader_epochs=tuple(
            (entry["leaderEpoch"], entry["offset"]) for entry in inputs["segmentLeaderEpochs"]
        ),
        segment_size_in_bytes=inputs["segmentSizeInBytes"],
        custom_metadata=custom,
        state=RemoteLogSegmentState[inputs["state"]],
        txn_index_empty=inputs["txnIndexEmpty"],
    )


def splice(value: bytes, at: int, replacement: bytes, width: int = 1) -> bytes:
    """``value`` with ``width`` bytes at ``at`` replaced."""
    return value[:at] + replacement + value[at + width :]


def publishable(event: RemoteLogMetadata) -> bool:
    """Whether encode() accepts the event (see the serde module docstring)."""
    if isinstance(event, SegmentMetadata):
        return event.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED
    if isinstance(event, SegmentMetadataUpdate):
        return event.state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED
    return isinstance(event, PartitionDeleteMetadata)


def decode_or_none(value: bytes) -> RemoteLogMetadata | None:
    """Decode, turning only a MetadataFormatError (with a sane position) into None."""
    try:
        return decode(value)
    except MetadataFormatError as exc:
        position = exc.position
    assert 0 <= position <= len(value)
    return None


RECORD_PARAMS = [pytest.param(vector, id=vector["name"]) for vector in VECTORS["recordVectors"]]

_base_event = event_from_vector(RECORD_VECTORS["segment_metadata_base"])
assert isinstance(_base_event, SegmentMetadata)
BASE_EVENT: SegmentMetadata = _base_event


class TestGoldenVectors:
    """Every vector in metadata-vectors.json, produced by Kafka's generated message classes."""

    @pytest.mark.parametrize("vector", RECORD_PARAMS)
    def test_vector_halves_agree(self, vector: dict[str, Any]) -> None:
        """The signed and the hex halves of each UUID in a vector describe the same bits."""
        inputs = vector["inputs"]
        for name in ("topicId", "segmentId"):
            if f"{name}Msb" in inputs:
                for half in ("Msb", "Lsb"):
                    as_hex = int(inputs[f"{name}{half}Hex"], 16)
                    assert inputs[f"{name}{half}"] & (2**64 - 1) == as_hex

    @pytest.mark.parametrize("vector", RECORD_PARAMS)
    def test_encode_writes_kafkas_bytes(self, vector: dict[str, Any]) -> None:
        """Encoding the vector's inputs gives exactly the expected value bytes."""
        value = encode(event_from_vector(vector))  # type: ignore[arg-type]
        assert value.hex() == vector["expectedHex"]
        assert len(value) == vector["expectedLength"]

    @pytest.mark.parametrize("vector", RECORD_PARAMS)
    def test_decode_reads_kafkas_bytes(self, vector: dict[str, Any]) -> None:
        """Decoding the expected bytes gives the vector's inputs."""
        assert decode(bytes.fromhex(vector["expectedHex"])) == event_from_vector(vector)

    @pytest.mark.parametrize("vector", RECORD_PARAMS)
    def test_header(self, vector: dict[str, Any]) -> None:
        """Each value starts with frame version 1, the apiKey and version 0, one byte each."""
        value = bytes.fromhex(vector["expectedHex"])
        assert value[:3] == bytes((vector["frameVersion"], vector["apiKey"], vector["version"]))

    def test_txn_index_empty_false_is_the_snapshot_schema(self) -> None:
        """TxnIndexEmpty=false writes no tag, so 4.0 bytes equal the pre-4.0 bytes."""
        assert encode(dataclasses.replace(BASE_EVENT, txn_index_empty=False)) == BASE

    def test_txn_index_empty_true_is_tag_zero(self) -> None:
        """TxnIndexEmpty=true replaces the empty top-level tag section with 01 00 01 01."""
        value = encode(dataclasses.replace(BASE_EVENT, txn_index_empty=True))
        assert value == BASE[:-1] + bytes.fromhex("01000101")

    def test_custom_metadata_is_compact_bytes(self) -> None:
        """Custom metadata is a compact nullable bytes field: length + 1, then the bytes."""
        value = encode(dataclasses.replace(BASE_EVENT, custom_metadata=bytes(200)))
        assert value[BASE_CUSTOM_METADATA : BASE_CUSTOM_METADATA + 2] == b"\xc9\x01"
        assert len(value) == len(BASE) + 201

    def test_empty_custom_metadata_is_not_null(self) -> None:
        """Empty custom metadata is written as 01 and read back as b'', not None."""
        value = encode(dataclasses.replace(BASE_EVENT, custom_metadata=b""))
        assert value[BASE_CUSTOM_METADATA] == 0x01
        assert decode(value) == dataclasses.replace(BASE_EVENT, custom_metadata=b"")

    def test_epochs_are_written_in_ascending_order(self) -> None:
        """Several leader epochs become a compact array of entries, each with its tag section."""
        event = dataclasses.replace(BASE_EVENT, segment_leader_epochs=((3, 10), (7, 40)))
        value = encode(event)
        assert value[BASE_EPOCHS : BASE_EPOCHS + 27].hex() == (
            "03" + "00000003" + "000000000000000a" + "00" + "00000007" + "0000000000000028" + "00"
        )

    def test_multibyte_topic_name(self) -> None:
        """The topic name's length prefix counts UTF-8 bytes, and long names take two bytes."""
        name = "é" * 100  # 200 bytes of UTF-8
        event = dataclasses.replace(
            BASE_EVENT,
            segment_id=RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, name, 0), SEGMENT_UUID),
        )
        value = encode(event)
        assert value[3:5] == b"\xc9\x01"
        assert value[5:205] == name.encode()
        assert decode(value) == event


class TestSnapshotRecords:
    """apiKey 3 is decoded like Kafka's serde does, and never encoded."""

    def test_decode_kafkas_snapshot_bytes(self) -> None:
        """Kafka's bytes for a snapshot of the base segment decode to that snapshot."""
        assert decode(SNAPSHOT_BASE) == SegmentMetadataSnapshot(
            segment_id=SEGMENT_UUID,
            start_offset=0,
            end_offset=99,
            broker_id=1,
            max_timestamp_ms=1700000000000,
            event_timestamp_ms=1700000001000,
            segment_leader_epochs=((0, 0),),
            segment_size_in_bytes=1024,
            custom_metadata=None,
            state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
        )

    def test_decode_snapshot_with_every_field(self) -> None:
        """Epochs, custom metadata, a later state and TxnIndexEmpty all come through."""
        assert decode(SNAPSHOT_FULL) == SegmentMetadataSnapshot(
            segment_id=SEGMENT_UUID,
            start_offset=0,
            end_offset=99,
            broker_id=1,
            max_timestamp_ms=1700000000000,
            event_timestamp_ms=1700000001000,
            segment_leader_epochs=((0, 0), (3, 50)),
            segment_size_in_bytes=1024,
            custom_metadata=b"\x01\x02\x03",
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            txn_index_empty=True,
        )

    def test_snapshot_offsets_are_not_checked(self) -> None:
        """Kafka's snapshot constructor does not check offsets, so a negative start decodes."""
        value = splice(SNAPSHOT_BASE, 19, struct.pack(">q", -5), width=8)
        event = decode(value)
        assert isinstance(event, SegmentMetadataSnapshot)
        assert event.start_offset == -5

    @given(snapshot=segment_metadata_snapshots())
    def test_encode_refuses_snapshots(self, snapshot: SegmentMetadataSnapshot) -> None:
        """No snapshot is ever encoded: a broker's metadata consumer stops on apiKey 3."""
        with pytest.raises(InvalidMetadataEventError, match="apiKey 3"):
            encode(snapshot)  # type: ignore[arg-type]


class TestRoundTrips:
    """Every publishable event survives encode then decode, and the encoding is canonical."""

    @pytest.mark.parametrize(
        "strategy",
        [
            pytest.param(segment_metadata(), id="segment-metadata"),
            pytest.param(segment_metadata_updates(), id="segment-metadata-update"),
            pytest.param(partition_delete_metadata(), id="partition-delete"),
        ],
    )
    @given(data=st.data())
    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
    def test_decode_inverts_encode(
        self, strategy: st.SearchStrategy[Any], data: st.DataObject
    ) -> None:
        """decode(encode(event)) == event for each encodable event type."""
        event = data.draw(strategy)
        value = encode(event)
        assert decode(value) == event
        assert encode(decode(value)) == value  # type: ignore[arg-type]

    @given(event=publishable_metadata())
    def test_decode_accepts_memoryview_and_bytearray(self, event: Any) -> None:
        """Values may arrive as bytearray or memoryview (consumer buffers)."""
        value = encode(event)
        assert decode(bytearray(value)) == event
        assert decode(memoryview(value)) == event


class TestEncodeRefusals:
    """encode() refuses the events that stop brokers' metadata consumers."""

    @pytest.mark.parametrize(
        "state",
        [
            pytest.param(state, id=state.name)
            for state in RemoteLogSegmentState
            if state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED
        ],
    )
    def test_segment_metadata_only_when_copy_starts(self, state: RemoteLogSegmentState) -> None:
        """apiKey 0 in a state other than COPY_SEGMENT_STARTED is refused."""
        with pytest.raises(InvalidMetadataEventError, match="COPY_SEGMENT_STARTED"):
            encode(dataclasses.replace(BASE_EVENT, state=state))

    def test_update_never_to_copy_started(self) -> None:
        """apiKey 1 carrying COPY_SEGMENT_STARTED is refused."""
        event = SegmentMetadataUpdate(
            segment_id=SEGMENT_ID,
            broker_id=1,
            event_timestamp_ms=0,
            state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
        )
        with pytest.raises(InvalidMetadataEventError):
            encode(event)

    def test_not_an_event(self) -> None:
        """Anything that is not an event is a TypeError (a programming error)."""
        with pytest.raises(TypeError):
            encode(TP)  # type: ignore[arg-type]

    def test_decode_needs_bytes(self) -> None:
        """decode() of a str is a TypeError, not a format error."""
        with pytest.raises(TypeError):
            decode(BASE.hex())  # type: ignore[arg-type]

    def test_refusal_is_a_value_error(self) -> None:
        """InvalidMetadataEventError is both a SidecarError and a ValueError."""
        assert issubclass(InvalidMetadataEventError, SidecarError)
        assert issubclass(InvalidMetadataEventError, ValueError)


TAG_5 = bytes.fromhex("010502abcd")  # one unknown tagged field: tag 5, two bytes


class TestDecodeToleratesWhatKafkaTolerates:
    """What Kafka's generated readers and transforms accept is accepted here too."""

    @pytest.mark.parametrize(
        ("value", "at"),
        [
            pytest.param(BASE, BASE_TOPIC_ID_PARTITION_TAGS, id="TopicIdPartitionEntry"),
            pytest.param(BASE, BASE_SEGMENT_ID_TAGS, id="RemoteLogSegmentIdEntry"),
            pytest.param(BASE, BASE_EPOCH_ENTRY_TAGS, id="SegmentLeaderEpochEntry"),
            pytest.param(BASE, BASE_TAGS, id="RemoteLogSegmentMetadataRecord"),
            pytest.param(UPDATE, UPDATE_TAGS, id="RemoteLogSegmentMetadataUpdateRecord"),
            pytest.param(DELETE, DELETE_TAGS, id="RemotePartitionDeleteMetadataRecord"),
            pytest.param(SNAPSHOT_BASE, len(SNAPSHOT_BASE) - 1, id="SnapshotRecord"),
        ],
    )
    def test_unknown_tagged_fields_are_skipped(self, value: bytes, at: int) -> None:
        """An unknown tag in any struct's tag section is skipped, as Kafka keeps it aside."""
        assert value[at] == 0
        assert decode(splice(value, at, TAG_5)) == decode(value)

    def test_kip_1266_broker_leader_epoch_tag(self) -> None:
        """A future BrokerLeaderEpoch (tag 1, int32) beside TxnIndexEmpty is tolerated."""
        value = splice(BASE, BASE_TAGS, bytes.fromhex("02000101010400000007"))
        assert decode(value) == dataclasses.replace(BASE_EVENT, txn_index_empty=True)

    @pytest.mark.parametrize(
        ("byte", "expected"),
        [
            pytest.param(0, False, id="zero"),
            pytest.param(1, True, id="one"),
            pytest.param(7, True, id="seven"),
        ],
    )
    def test_txn_index_empty_is_any_nonzero_byte(self, byte: int, expected: bool) -> None:
        """Kafka reads TxnIndexEmpty as ``readByte() != 0``."""
        value = splice(BASE, BASE_TAGS, bytes((1, 0, 1, byte)))
        event = decode(value)
        assert isinstance(event, SegmentMetadata)
        assert event.txn_index_empty is expected

    def test_repeated_tag_keeps_the_last(self) -> None:
        """A tag that appears twice keeps its last value, as the generated read loop does."""
        value = splice(BASE, BASE_TAGS, bytes.fromhex("02000101000100"))
        assert decode(value) == BASE_EVENT

    def test_epochs_in_any_order_are_sorted(self) -> None:
        """Entries out of epoch order are sorted, as Kafka's TreeMap does."""
        entries = b"\x03" + struct.pack(">iqB", 5, 50, 0) + struct.pack(">iqB", 2, 20, 0)
        value = splice(BASE, BASE_EPOCHS, entries, width=14)
        assert decode(value) == dataclasses.replace(
            BASE_EVENT, segment_leader_epochs=((2, 20), (5, 50))
        )

    def test_repeated_epoch_keeps_the_last_offset(self) -> None:
        """A repeated epoch keeps the last offset, as Kafka's HashMap.put does."""
        entries = b"\x03" + struct.pack(">iqB", 4, 10, 0) + struct.pack(">iqB", 4, 30, 0)
        value = splice(BASE, BASE_EPOCHS, entries, width=14)
        assert decode(value) == dataclasses.replace(BASE_EVENT, segment_leader_epochs=((4, 30),))

    def test_overlong_varint_is_read_by_value(self) -> None:
        """A non-minimal varint (81 00 for 1) is read by value, as ByteUtils does."""
        assert decode(b"\x81\x00" + BASE[1:]) == BASE_EVENT

    def test_five_byte_varint_below_2_pow_31(self) -> None:
        """A five-byte varint that fits a non-negative int is accepted."""
        assert decode(splice(BASE, BASE_TAGS, b"\x80\x80\x80\x80\x00")) == BASE_EVENT

    @pytest.mark.parametrize(
        "tags",
        [
            pytest.param("010002", id="size-2-one-byte-left"),
            pytest.param("010000", id="size-0"),
            pytest.param("0100ffffffff0f", id="size-negative"),
            pytest.param("0100ffffffff07", id="size-2-pow-31-minus-1"),
        ],
    )
    def test_txn_index_empty_is_one_byte_whatever_its_size(self, tags: str) -> None:
        """Kafka reads TxnIndexEmpty with ``readByte()`` and never looks at the tag's size."""
        value = splice(BASE, BASE_TAGS, bytes.fromhex(tags) + b"\x01")
        assert decode(value) == dataclasses.replace(BASE_EVENT, txn_index_empty=True)

    def test_txn_index_empty_size_2_with_one_byte_left_kafka_accepts(self) -> None:
        """The exact value a randomized parity run found: tag 0 says size 2 and one byte follows.
        Kafka's serde reads it (one byte, true, nothing left over), so we read it the same way."""
        value = bytes.fromhex(
            "01000004666f6f0123456789abcdeffedcba9876543210000000000011111111"
            "1111111122222222222222220000000000000000000000000000000063000000"
            "010000018bcfe568000000018bcfe56be8020000000000000000000000000000"
            "000400000001000201"
        )
        assert value == splice(BASE, BASE_TAGS, bytes.fromhex("01000201"))
        event = decode(value)
        assert event == dataclasses.replace(BASE_EVENT, txn_index_empty=True)

    @pytest.mark.parametrize(
        ("at", "varint", "why"),
        [
            pytest.param(0, "8180fcff0f", "0xffff0001 narrows to short 1", id="frame-version"),
            pytest.param(2, "8080808008", "0x80000000 narrows to short 0", id="version-0"),
            pytest.param(2, "ffffffff0f", "-1: nested structs refuse only > 0", id="version"),
            pytest.param(
                BASE_CUSTOM_METADATA, "ffffffff0f", "-1 minus 1 is null", id="custom-null"
            ),
            pytest.param(BASE_TAGS, "ffffffff0f", "a negative count reads no tag", id="count"),
            pytest.param(
                BASE_TAGS, "01ffffffff0f0107", "a negative tag is unknown", id="tag-negative"
            ),
            pytest.param(
                BASE_SEGMENT_ID_TAGS,
                "01808080801001ff",
                "nested: 2**32 is unknown tag 0",
                id="nested-tag-0",
            ),
        ],
    )
    def test_varints_wrap_as_java_ints(self, at: int, varint: str, why: str) -> None:
        """A varint is read into a Java int, as ``ByteUtils.readUnsignedVarint`` does (bits past
        the 32nd are lost, 2**31 and above are negative), and then used as Kafka's code uses it."""
        value = splice(BASE, at, bytes.fromhex(varint))
        assert decode(value) == BASE_EVENT, why

    def test_wrapped_varint_tag_0_is_txn_index_empty(self) -> None:
        """``80 80 80 80 10`` is 2**32, which Kafka's int keeps as 0: the TxnIndexEmpty tag."""
        value = splice(BASE, BASE_TAGS, bytes.fromhex("01808080801001") + b"\x01")
        assert decode(value) == dataclasses.replace(BASE_EVENT, txn_index_empty=True)

    def test_wrapped_api_key(self) -> None:
        """An apiKey of 0x80000002 narrows to short 2 in ``unsignedIntToShort``."""
        assert decode(splice(DELETE, 1, bytes.fromhex("8280808008"))) == decode(DELETE)

    @pytest.mark.parametrize(
        "state",
        [pytest.param(state, id=state.name) for state in RemoteLogSegmentState],
    )
    def test_segment_metadata_in_any_state_decodes(self, state: RemoteLogSegmentState) -> None:
        """Kafka's serde reads apiKey 0 in any state; only encode() is stricter."""
        event = decode(splice(BASE, BASE_STATE, bytes((state,))))
        assert event == dataclasses.replace(BASE_EVENT, state=state)

    def test_update_to_copy_started_decodes(self) -> None:
        """Kafka's serde reads an update to COPY_SEGMENT_STARTED; the store must handle it."""
        event = decode(splice(UPDATE, UPDATE_STATE, b"\x00"))
        assert isinstance(event, SegmentMetadataUpdate)
        assert event.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED

    @pytest.mark.parametrize(
        "state",
        [pytest.param(state, id=state.name) for state in RemotePartitionDeleteState],
    )
    def test_partition_delete_states(self, state: RemotePartitionDeleteState) -> None:
        """Every partition-delete state id decodes."""
        event = decode(splice(DELETE, DELETE_STATE, bytes((state,))))
        assert isinstance(event, PartitionDeleteMetadata)
        assert event.state is state

    def test_negative_ints_and_empty_topic(self) -> None:
        """Negative broker ids, timestamps, sizes and partitions, and an empty name, decode."""
        event = dataclasses.replace(
            BASE_EVENT,
            segment_id=RemoteLogSegmentId(TopicIdPartition(TOPIC_ID, "", -1), SEGMENT_UUID),
            broker_id=-1,
            max_timestamp_ms=-1,
            event_timestamp_ms=-(2**63),
            segment_size_in_bytes=-(2**31),
            segment_leader_epochs=((-5, -7),),
        )
        assert decode(encode(event)) == event


def _error_cases() -> list[Any]:
    base_no_epochs = BASE[:BASE_EPOCHS] + b"\x01" + BASE[BASE_EPOCH_ENTRY_TAGS + 1 :]
    snapshot_no_epochs = (
        SNAPSHOT_BASE[:SNAPSHOT_EPOCHS] + b"\x01" + SNAPSHOT_BASE[SNAPSHOT_EPOCHS + 14 :]
    )
    cases = [
        ("empty", b"", 0, "truncated"),
        ("frame-version-0", b"\x00" + BASE[1:], 0, "frame version 0"),
        ("frame-version-2", b"\x02" + BASE[1:], 0, "frame version 2"),
        ("frame-version-only", b"\x01", 1, "truncated"),
        ("unknown-api-key-4", splice(BASE, 1, b"\x04"), 1, "unknown apiKey 4"),
        ("unknown-api-key-300", splice(BASE, 1, b"\xac\x02"), 1, "unknown apiKey 300"),
        ("segment-version-1", splice(BASE, 2, b"\x01"), 2, "version 1"),
        ("update-version-1", splice(UPDATE, 2, b"\x01"), 2, "version 1"),
        ("delete-version-1", splice(DELETE, 2, b"\x01"), 2, "version 1"),
        ("snapshot-version-1", splice(SNAPSHOT_BASE, 2, b"\x01"), 2, "version 1"),
        ("trailing-garbage", BASE + b"\x00", len(BASE), "1 byte(s) of garbage"),
        ("trailing-garbage-delete", DELETE + b"\xff\xff", len(DELETE), "2 byte(s) of garbage"),
        ("null-topic-name", splice(BASE, BASE_TOPIC_NAME, b"\x00"), 3, "serialized as null"),
        ("topic-name-too-long", splice(BASE, BASE_TOPIC_NAME, b"\x81\x80\x02"), 3, "32768"),
        ("topic-name-past-end", splice(BASE, BASE_TOPIC_NAME, b"\x7f"), 4, "truncated"),
        ("invalid-utf8", splice(BASE, 5, b"\xff"), 5, "invalid UTF-8"),
        ("varint-6-bytes", b"\x81\x80\x80\x80\x80\x00" + BASE[1:], 0, "longer than 5 bytes"),
        (
            "custom-metadata-length-2-pow-31",  # wraps to Integer.MIN_VALUE; minus 1 is MAX_VALUE
            splice(BASE, BASE_CUSTOM_METADATA, b"\x80\x80\x80\x80\x08"),
            BASE_CUSTOM_METADATA + 5,
            "needs 2147483647 byte(s)",
        ),
        ("version-32768", splice(BASE, 2, b"\x80\x80\x02"), 2, "version: 32768 is too large"),
        ("api-key-65536", splice(BASE, 1, b"\x80\x80\x04"), 1, "apiKey: 65536 is too large"),
        (
            "unknown-tag-negative-size",
            splice(BASE, BASE_TAGS, bytes.fromhex("0105ffffffff0f")),
            BASE_TAGS + 2,
            "negative size -1",
        ),
        ("truncated-varint", BASE[:BASE_TAGS] + b"\x80", BASE_TAGS, "inside a varint"),
        (
            "negative-start-offset",
            splice(BASE, BASE_START_OFFSET, struct.pack(">q", -1), width=8),
            BASE_START_OFFSET,
            "StartOffset -1 is negative",
        ),
        (
            "end-before-start",
            splice(BASE, BASE_START_OFFSET, struct.pack(">q", 100), width=8),
            BASE_END_OFFSET,
            "EndOffset 99 is less than StartOffset 100",
        ),
        ("no-epochs", base_no_epochs, BASE_EPOCHS, "SegmentLeaderEpochs is empty"),
        ("null-epochs", splice(BASE, BASE_EPOCHS, b"\x00"), BASE_EPOCHS, "serialized as null"),
        ("too-many-epochs", splice(BASE, BASE_EPOCHS, b"\x7f"), BASE_EPOCHS, "cannot fit"),
        ("segment-state-4", splice(BASE, BASE_STATE, b"\x04"), BASE_STATE, "unknown state id 4"),
        ("segment-state-minus-1", splice(BASE, BASE_STATE, b"\xff"), BASE_STATE, "id -1"),
        ("update-state-9", splice(UPDATE, UPDATE_STATE, b"\x09"), UPDATE_STATE, "state id 9"),
        ("delete-state-3", splice(DELETE, DELETE_STATE, b"\x03"), DELETE_STATE, "state id 3"),
        (
            "txn-index-empty-size-2-then-garbage",  # Kafka reads one byte; the other is left over
            splice(BASE, BASE_TAGS, bytes.fromhex("0100020101")),
            len(BASE) + 3,
            "1 byte(s) of garbage",
        ),
        (
            "txn-index-empty-no-byte",
            splice(BASE, BASE_TAGS, bytes.fromhex("010000")),
            len(BASE) + 2,
            "truncated",
        ),
        (
            "unknown-tag-past-end",
            splice(BASE, BASE_TAGS, bytes.fromhex("010509")),
            len(BASE) + 2,
            "truncated",
        ),
        (
            "tag-count-past-end",
            splice(UPDATE, UPDATE_TAGS, b"\x05"),
            len(UPDATE),
            "truncated",
        ),
        (
            "custom-metadata-past-end",
            splice(UPDATE, UPDATE_CUSTOM_METADATA, b"\x10"),
            UPDATE_CUSTOM_METADATA + 1,
            "truncated",
        ),
        ("snapshot-no-epochs", snapshot_no_epochs, SNAPSHOT_EPOCHS, "SegmentLeaderEpochs is empty"),
        (
            "snapshot-state-5",
            splice(SNAPSHOT_BASE, SNAPSHOT_STATE, b"\x05"),
            SNAPSHOT_STATE,
            "unknown state id 5",
        ),
    ]
    return [pytest.param(value, position, text, id=name) for name, value, position, text in cases]


class TestDecodeRejectsWhatKafkaRejects:
    """Undecodable values raise MetadataFormatError naming the byte offset of the problem."""

    @pytest.mark.parametrize(("value", "position", "text"), _error_cases())
    def test_error_names_the_offset(self, value: bytes, position: int, text: str) -> None:
        """Each malformed value fails at the expected offset with a telling message."""
        with pytest.raises(MetadataFormatError, match="metadata record value at byte") as info:
            decode(value)
        assert info.value.position == position
        assert text in str(info.value)
        assert isinstance(info.value, FormatError)

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(value, id=name)
            for name, value in [
                *((name, bytes.fromhex(v["expectedHex"])) for name, v in RECORD_VECTORS.items()),
                ("snapshot", SNAPSHOT_FULL),
            ]
        ],
    )
    def test_every_truncation_fails(self, value: bytes) -> None:
        """Every proper prefix of a valid value is rejected, at or before its end."""
        for size in range(len(value)):
            with pytest.raises(MetadataFormatError) as info:
                decode(value[:size])
            assert info.value.position <= size


VALID_VALUES = [
    *(bytes.fromhex(vector["expectedHex"]) for vector in VECTORS["recordVectors"]),
    SNAPSHOT_BASE,
    SNAPSHOT_FULL,
    splice(BASE, BASE_EPOCH_ENTRY_TAGS, TAG_5),
    splice(UPDATE, UPDATE_CUSTOM_METADATA, b"\x03\xaa\xbb"),
]


def _framed_garbage() -> st.SearchStrategy[bytes]:
    """A valid header for some apiKey followed by random bytes."""
    return st.builds(
        lambda api_key, body: bytes((1, api_key, 0)) + body,
        st.integers(0, 3),
        st.binary(max_size=120),
    )


class TestFuzz:
    """Whatever the bytes, decode returns an event or raises MetadataFormatError, nothing else."""

    @given(value=st.binary(max_size=200))
    @settings(max_examples=300)
    def test_random_bytes(self, value: bytes) -> None:
        """Random bytes never raise anything but MetadataFormatError."""
        decode_or_none(value)

    @given(value=_framed_garbage())
    @settings(max_examples=300)
    def test_random_bodies(self, value: bytes) -> None:
        """Random bodies behind a valid header never raise anything but MetadataFormatError."""
        decode_or_none(value)

    @given(value=mutations(VALID_VALUES))
    @settings(max_examples=500)
    def test_mutated_vectors(self, value: bytes) -> None:
        """Mutated valid values fail only with MetadataFormatError, and what decodes round-trips."""
        event = decode_or_none(value)
        if event is None:
            return
        if not publishable(event):
            with pytest.raises(InvalidMetadataEventError):
                encode(event)  # type: ignore[arg-type]
            return
        assert decode(encode(event)) == event  # type: ignore[arg-type]
