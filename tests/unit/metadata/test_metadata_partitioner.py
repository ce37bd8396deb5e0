"""The metadata-topic partition of a user partition, as Kafka's RemoteLogMetadataTopicPartitioner
computes it (vectors from metadata-vectors.json and from Kafka 4.3.1's ``Utils.murmur2``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.metadata import TopicIdPartition, metadata_partition
from sidecar.metadata.partitioner import _hash_bytes, _long_hash, _murmur2, _objects_hash
from sidecar.metadata.strategies import topic_id_partitions, topic_names

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "metadata-vectors.json").read_text(encoding="utf-8")
)["partitionerVectors"]
TOPIC_ID = uuid.UUID(hex=VECTORS["topicIdMsbHex"] + VECTORS["topicIdLsbHex"])


class TestVectors:
    """The Java-verified partitioner vectors."""

    @pytest.mark.parametrize(
        "case",
        [pytest.param(case, id=f"partition-{case['partition']}") for case in VECTORS["cases"]],
    )
    def test_metadata_partition(self, case: dict[str, Any]) -> None:
        """Each user partition of the vector topic maps to the expected metadata partition."""
        tp = TopicIdPartition(TOPIC_ID, "foo", case["partition"])
        expected = case["expectedMetadataPartition"]
        assert metadata_partition(tp, VECTORS["numMetadataTopicPartitions"]) == expected

    def test_intermediate_values(self) -> None:
        """Partition 0's Objects.hash, hashed bytes and murmur2 match the recorded values."""
        (case,) = (case for case in VECTORS["cases"] if "objectsHash" in case)
        tp = TopicIdPartition(TOPIC_ID, "foo", case["partition"])
        lsb, msb = VECTORS["topicIdLsb"], VECTORS["topicIdMsb"]
        assert _objects_hash(_long_hash(lsb), _long_hash(msb), tp.partition) == case["objectsHash"]
        assert _hash_bytes(tp).hex() == case["hashBytesHex"]
        assert _murmur2(_hash_bytes(tp)) == case["murmur2"]

    def test_topic_id_halves(self) -> None:
        """The vector's signed halves are the UUID's two big-endian longs."""
        assert TOPIC_ID.int >> 64 == VECTORS["topicIdMsb"]
        assert TOPIC_ID.int & (2**64 - 1) == VECTORS["topicIdLsb"] % 2**64


class TestMurmur2:
    """_murmur2 is Kafka's Utils.murmur2, tail handling included."""

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            pytest.param(b"", 275646681, id="empty"),
            pytest.param(b"a", -1563381124, id="tail-1"),
            pytest.param(b"ab", 316155434, id="tail-2"),
            pytest.param(b"abc", 479470107, id="tail-3"),
            pytest.param(b"21", -973932308, id="21"),
            pytest.param(b"foobar", -790332482, id="foobar"),
            pytest.param(b"a-little-bit-long-string", -985981536, id="long"),
            pytest.param(b"a-little-bit-longer-string", -1486304829, id="longer"),
            pytest.param(
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, id="longest"
            ),
            pytest.param(bytes.fromhex("1111835f"), 1817281361, id="vector-bytes"),
        ],
    )
    def test_kafka_values(self, data: bytes, expected: int) -> None:
        """Values computed by Kafka 4.3.1's Utils.murmur2 on the same bytes."""
        assert _murmur2(data) == expected


class TestJavaIntArithmetic:
    """The Java hash helpers wrap like Java ints and longs."""

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            pytest.param(0, 0, id="zero"),
            pytest.param(-1, 0, id="minus-one"),
            pytest.param(1 << 32, 1, id="high-word-one"),
            pytest.param(2**63 - 1, -(2**31), id="long-max"),
            pytest.param(-(2**63), -(2**31), id="long-min"),
            pytest.param(0x7FFF_FFFF, 0x7FFF_FFFF, id="int-max"),
        ],
    )
    def test_long_hash(self, value: int, expected: int) -> None:
        """_long_hash is Long.hashCode: ``(int) (v ^ (v >>> 32))``."""
        assert _long_hash(value) == expected

    @pytest.mark.parametrize(
        ("values", "expected"),
        [
            pytest.param((), 1, id="empty"),
            pytest.param((2**31 - 1,), -2147483618, id="int-max"),
            pytest.param((-(2**31),), -2147483617, id="int-min"),
            pytest.param((_long_hash(-1), _long_hash(2**63 - 1), 2**31 - 1), 29790, id="mixed"),
        ],
    )
    def test_objects_hash(self, values: tuple[int, ...], expected: int) -> None:
        """_objects_hash wraps like Java's Objects.hash (values from a JVM)."""
        assert _objects_hash(*values) == expected


class TestMetadataPartition:
    """General properties of metadata_partition."""

    @given(tp=topic_id_partitions(), num_partitions=st.integers(1, 10_000))
    def test_in_range(self, tp: TopicIdPartition, num_partitions: int) -> None:
        """The result is a valid partition of the metadata topic."""
        assert 0 <= metadata_partition(tp, num_partitions) < num_partitions

    @given(tp=topic_id_partitions(), name=topic_names())
    def test_topic_name_is_not_hashed(self, tp: TopicIdPartition, name: str) -> None:
        """Only the topic id and partition number decide; a renamed topic maps the same."""
        renamed = TopicIdPartition(tp.topic_id, name, tp.partition)
        assert metadata_partition(renamed, 50) == metadata_partition(tp, 50)

    def test_one_partition(self) -> None:
        """A one-partition metadata topic takes everything on partition 0."""
        assert metadata_partition(TopicIdPartition(TOPIC_ID, "foo", 7), 1) == 0

    @pytest.mark.parametrize("num_partitions", [0, -50])
    def test_needs_partitions(self, num_partitions: int) -> None:
        """A non-positive partition count is a ValueError (Java would divide by zero)."""
        with pytest.raises(ValueError, match="at least one partition"):
            metadata_partition(TopicIdPartition(TOPIC_ID, "foo", 0), num_partitions)
