"""sidecar.metadata against Apache Kafka's own code on the real jars (no broker needed).

``java/MetadataSerdeCheck.java`` is compiled against Kafka's jars and kept running as one JVM that
answers a line per request: it decodes values with ``RemoteLogMetadataSerde.deserialize``, builds
events and serializes them with ``RemoteLogMetadataSerde.serialize``, and asks
``RemoteLogMetadataTopicPartitioner`` for partitions. We check that Kafka decodes every value we
encode to the same fields, that Kafka writes the very same bytes for the same event, that we decode
whatever Kafka writes (snapshots and unpublishable states included), that both partitioners agree,
and that on mutated bytes we never accept a value Kafka rejects.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from sidecar.metadata import (
    MetadataFormatError,
    PartitionDeleteMetadata,
    RemoteLogMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    decode,
    encode,
    metadata_partition,
)
from sidecar.metadata.strategies import (
    int32s,
    mutations,
    publishable_metadata,
    remote_log_metadata,
    topic_id_partitions,
)
from tests.kafka_serde import KafkaSerde, check_values, fields

pytestmark = pytest.mark.integration

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "metadata-vectors.json").read_text(encoding="utf-8")
)
VECTOR_VALUES = [bytes.fromhex(vector["expectedHex"]) for vector in VECTORS["recordVectors"]]

#: a fixed seed: the same examples on every run, e.g. 200 events per property
CROSS_CHECK = settings(max_examples=200, derandomize=True, database=None, deadline=None)

# Our decoder rejects one thing Kafka's accepts (see sidecar/metadata/serde.py); this is the only
# reason a value Kafka accepts may be rejected here.
NARROWER_THAN_KAFKA = ("invalid UTF-8",)


class TestGoldenVectors:
    """Kafka 4.x reads and writes the vectors exactly as we do."""

    @pytest.mark.parametrize(
        "vector", [pytest.param(v, id=v["name"]) for v in VECTORS["recordVectors"]]
    )
    def test_both_ways(self, kafka_serde: KafkaSerde, vector: dict[str, Any]) -> None:
        """Kafka decodes the vector to our fields and re-serializes it to the vector's bytes."""
        value = bytes.fromhex(vector["expectedHex"])
        event = decode(value)
        kafka_fields, to_string = kafka_serde.decode(value)
        assert kafka_fields == fields(event), to_string
        assert kafka_serde.encode(event) == value

    @pytest.mark.parametrize(
        "case",
        [
            pytest.param(case, id=f"partition-{case['partition']}")
            for case in VECTORS["partitionerVectors"]["cases"]
        ],
    )
    def test_partitioner(self, kafka_serde: KafkaSerde, case: dict[str, Any]) -> None:
        """Kafka's partitioner gives the vector's metadata partitions."""
        vectors = VECTORS["partitionerVectors"]
        tp = decode(VECTOR_VALUES[0]).segment_id.topic_id_partition  # type: ignore[union-attr]
        tp = TopicIdPartition(tp.topic_id, tp.topic, case["partition"])
        num_partitions = vectors["numMetadataTopicPartitions"]
        assert kafka_serde.partition(tp, num_partitions) == case["expectedMetadataPartition"]


class TestKafkaReadsWhatWeWrite:
    """Every value our encoder produces is one Kafka decodes, and the one Kafka would write."""

    @given(event=publishable_metadata())
    @CROSS_CHECK
    def test_events(self, kafka_serde: KafkaSerde, event: Any) -> None:
        """Kafka decodes encode(event) to our fields and serializes the event to the same bytes."""
        value = encode(event)
        kafka_fields, error = kafka_serde.decode(value)
        assert kafka_fields == fields(event), error
        assert kafka_serde.encode(event) == value


class TestTheSuiteWideCheck:
    """The check every test's metadata topic goes through before deletion flags what Kafka
    refuses or reads differently, and passes what it reads as we do."""

    def test_flags_a_record_kafka_refuses_and_passes_a_good_one(
        self, kafka_serde: KafkaSerde
    ) -> None:
        good = encode(
            PartitionDeleteMetadata(
                topic_id_partition=TopicIdPartition(uuid.UUID(int=7), "orders", 3),
                state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                event_timestamp_ms=1_700_000_000_000,
                broker_id=1,
            )
        )
        assert check_values("t", [good], kafka_serde, report=False) == []
        bad = good[:-3]  # cut short: Kafka's serde throws
        problems = check_values("t", [good, bad], kafka_serde, report=False)
        assert len(problems) == 1
        assert problems[0].startswith("t record 1: Kafka cannot decode it")


class TestWeReadWhatKafkaWrites:
    """Whatever Kafka serializes, we decode to the same event, including decode-only ones."""

    @given(event=remote_log_metadata())
    @CROSS_CHECK
    def test_events(self, kafka_serde: KafkaSerde, event: RemoteLogMetadata) -> None:
        """decode(Kafka's bytes for event) == event, for snapshots and every state too."""
        assert decode(kafka_serde.encode(event)) == event


class TestPartitioner:
    """Our metadata partitioner is Kafka's."""

    @given(
        tp=topic_id_partitions(),
        num_partitions=st.one_of(
            st.just(50), st.integers(1, 1000), int32s().filter(lambda n: n > 0)
        ),
    )
    @CROSS_CHECK
    def test_same_partition(
        self, kafka_serde: KafkaSerde, tp: TopicIdPartition, num_partitions: int
    ) -> None:
        """Both pick the same metadata partition for any topic id, partition and count."""
        assert metadata_partition(tp, num_partitions) == kafka_serde.partition(tp, num_partitions)


def decode_or_error(value: bytes) -> tuple[RemoteLogMetadata | None, str]:
    """Our decoding of ``value``: (event, "") or (None, the MetadataFormatError's message)."""
    try:
        return decode(value), ""
    except MetadataFormatError as exc:
        return None, str(exc)


def _splice(value: bytes, at: int, replacement: bytes, width: int = 1) -> bytes:
    return value[:at] + replacement + value[at + width :]


BASE, UPDATE = VECTOR_VALUES[0], VECTOR_VALUES[3]
assert VECTORS["recordVectors"][0]["name"] == "segment_metadata_base"
assert VECTORS["recordVectors"][3]["name"] == "segment_metadata_update_copy_finished"
# Offsets in BASE: name length 3, name bytes 4-6, segment id tags 44, epochs 81, custom metadata 99,
# state 100, top-level tags 101. In UPDATE: state 58.
EPOCH = bytes.fromhex("00000004000000000000000a00")  # epoch 4 starts at offset 10
TRICKY = [
    # (id, value, Kafka accepts, we accept)
    ("unknown-tag", _splice(BASE, 44, bytes.fromhex("0105020000")), True, True),
    ("overlong-varint", b"\x81\x00" + BASE[1:], True, True),
    ("txn-flag-7", _splice(BASE, 101, bytes.fromhex("01000107")), True, True),
    (
        "repeated-epoch",
        _splice(BASE, 81, b"\x03" + EPOCH + EPOCH[:4] + bytes(8) + b"\0", 14),
        True,
        True,
    ),
    ("segment-finished", _splice(BASE, 100, b"\x01"), True, True),
    ("update-started", _splice(UPDATE, 58, b"\x00"), True, True),
    ("invalid-utf8", _splice(BASE, 5, b"\xff"), True, False),
    # Varints are Java ints: 2**31 and above wrap negative, bits past the 32nd are lost.
    ("custom-varint-wraps-to-null", _splice(BASE, 99, b"\xff\xff\xff\xff\x0f"), True, True),
    ("custom-length-2-pow-31", _splice(BASE, 99, b"\x80\x80\x80\x80\x08"), False, False),
    ("frame-version-wraps-to-1", _splice(BASE, 0, bytes.fromhex("8180fcff0f")), True, True),
    ("version-wraps-to-0", _splice(BASE, 2, bytes.fromhex("8080808008")), True, True),
    ("version-minus-1", _splice(BASE, 2, bytes.fromhex("ffffffff0f")), True, True),
    ("version-32768", _splice(BASE, 2, bytes.fromhex("808002")), False, False),
    ("api-key-wraps-to-1", _splice(UPDATE, 1, bytes.fromhex("8180808008")), True, True),
    ("tag-count-negative", _splice(BASE, 101, bytes.fromhex("ffffffff0f")), True, True),
    ("tag-negative", _splice(BASE, 101, bytes.fromhex("01ffffffff0f0107")), True, True),
    ("tag-2-pow-32-is-txn", _splice(BASE, 101, bytes.fromhex("0180808080100101")), True, True),
    ("unknown-tag-size-negative", _splice(BASE, 44, bytes.fromhex("0105ffffffff0f")), False, False),
    # TxnIndexEmpty is readByte() != 0, whatever its tag's size says.
    ("txn-tag-size-0", _splice(BASE, 101, bytes.fromhex("010000") + b"\x01"), True, True),
    ("txn-tag-size-2-one-byte-left", _splice(BASE, 101, bytes.fromhex("01000201")), True, True),
    (
        "txn-tag-size-2-two-bytes-left",
        _splice(BASE, 101, bytes.fromhex("0100020101")),
        False,
        False,
    ),
    ("txn-tag-size-negative", _splice(BASE, 101, bytes.fromhex("0100ffffffff0f01")), True, True),
    ("txn-tag-no-byte", _splice(BASE, 101, bytes.fromhex("010000")), False, False),
    ("version-1", _splice(BASE, 2, b"\x01"), False, False),
    ("frame-version-0", _splice(BASE, 0, b"\x00"), False, False),
    ("api-key-4", _splice(BASE, 1, b"\x04"), False, False),
    ("trailing-byte", BASE + b"\x00", False, False),
    ("no-epochs", BASE[:81] + b"\x01" + BASE[95:], False, False),
    ("negative-start", _splice(BASE, 45, b"\xff" * 8, 8), False, False),
    ("state-4", _splice(BASE, 100, b"\x04"), False, False),
    ("name-too-long", _splice(BASE, 3, b"\x81\x80\x02"), False, False),
]


class TestTrickyValues:
    """Hand-made edge cases, with the documented answer of each decoder."""

    @pytest.mark.parametrize(
        ("value", "kafka_accepts", "we_accept"),
        [pytest.param(value, kafka, ours, id=name) for name, value, kafka, ours in TRICKY],
    )
    def test_case(
        self, kafka_serde: KafkaSerde, value: bytes, kafka_accepts: bool, we_accept: bool
    ) -> None:
        """Kafka and we accept or reject as documented; when both accept, the fields agree."""
        kafka_fields, kafka_answer = kafka_serde.decode(value)
        assert (kafka_fields is not None) is kafka_accepts, kafka_answer
        ours, our_error = decode_or_error(value)
        assert (ours is not None) is we_accept, our_error
        if ours is None:
            assert not kafka_accepts or any(reason in our_error for reason in NARROWER_THAN_KAFKA)
        else:
            assert kafka_fields == fields(ours), kafka_answer


class TestRejectionParity:
    """On hostile bytes we never accept what Kafka rejects, and agree on what both accept."""

    @given(
        value=st.one_of(
            mutations(VECTOR_VALUES),
            st.builds(
                lambda api_key, body: bytes((1, api_key, 0)) + body,
                st.integers(0, 3),
                st.binary(max_size=80),
            ),
        )
    )
    # Tag 0 (TxnIndexEmpty) says size 2 with one byte left: Kafka reads one byte and accepts it.
    @example(value=_splice(BASE, 101, bytes.fromhex("01000201")))
    @settings(max_examples=600, derandomize=True, database=None, deadline=None)
    def test_mutated_values(self, kafka_serde: KafkaSerde, value: bytes) -> None:
        """Kafka rejects => we reject; we reject => Kafka rejects or a documented narrowing."""
        kafka_fields, kafka_answer = kafka_serde.decode(value)
        ours, our_error = decode_or_error(value)
        event(
            f"kafka {'accepts' if kafka_fields else 'rejects'}, we {'accept' if ours else 'reject'}"
        )
        if ours is None:
            if kafka_fields is not None:
                narrowing = any(reason in our_error for reason in NARROWER_THAN_KAFKA)
                assert narrowing, f"we reject ({our_error}) what Kafka accepts: {kafka_answer}"
            return
        assert kafka_fields is not None, f"we accept {ours!r}; Kafka rejects: {kafka_answer}"
        assert kafka_fields == fields(ours), kafka_answer
