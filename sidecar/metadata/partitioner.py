"""Which ``__remote_log_metadata`` partition carries a user partition's events, exactly as Kafka's
``RemoteLogMetadataTopicPartitioner`` picks it; a broker only reads the metadata partitions of the
user partitions it hosts, so an event on any other partition is never seen.

Upstream (apache/kafka):
``storage/src/main/java/org/apache/kafka/server/log/remote/metadata/storage/RemoteLogMetadataTopicPartitioner.java``
and ``Utils.murmur2``/``Utils.toPositive`` in
``clients/src/main/java/org/apache/kafka/common/utils/Utils.java``::

    int hash = Objects.hash(topicId.getLeastSignificantBits(), topicId.getMostSignificantBits(),
                            partition);
    byte[] b = {(byte) (hash >> 24), (byte) (hash >> 16), (byte) (hash >> 8), (byte) hash};
    return Utils.toPositive(Utils.murmur2(b)) % numMetadataTopicPartitions;

The topic name is not hashed. Pure integer arithmetic; no I/O.
"""

from __future__ import annotations

from sidecar.metadata.events import TopicIdPartition

__all__ = ["metadata_partition"]

_MASK32 = 0xFFFF_FFFF
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF


def _int32(value: int) -> int:
    """Wrap to a signed 32-bit int, as Java int arithmetic does."""
    value &= _MASK32
    return value - (1 << 32) if value & 0x8000_0000 else value


def _long_hash(value: int) -> int:
    """``Long.hashCode``: ``(int) (v ^ (v >>> 32))`` over the 64-bit pattern of ``value``."""
    value &= _MASK64
    return _int32(value ^ (value >> 32))


def _objects_hash(*values: int) -> int:
    """``Objects.hash`` over ints that are already hash codes: ``31 * result + h``, from 1."""
    result = 1
    for value in values:
        result = _int32(31 * result + value)
    return result


def _murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (seed 0x9747b28c), as a signed 32-bit int."""
    m, r = 0x5BD1_E995, 24
    length = len(data)
    h = (0x9747_B28C ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & _MASK32
        k ^= k >> r
        k = (k * m) & _MASK32
        h = ((h * m) & _MASK32) ^ k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return _int32(h)


def _hash_bytes(tp: TopicIdPartition) -> bytes:
    """The 4 bytes Kafka feeds to murmur2: the big-endian ``Objects.hash`` of the partition."""
    msb = tp.topic_id.int >> 64
    lsb = tp.topic_id.int & _MASK64
    hashed = _objects_hash(_long_hash(lsb), _long_hash(msb), tp.partition)
    return (hashed & _MASK32).to_bytes(4, "big")


def metadata_partition(topic_id_partition: TopicIdPartition, num_partitions: int) -> int:
    """The metadata-topic partition for ``topic_id_partition`` when the metadata topic has
    ``num_partitions`` partitions (Kafka's default is 50; it must never change)."""
    if num_partitions <= 0:
        raise ValueError(f"the metadata topic needs at least one partition, not {num_partitions}")
    return (_murmur2(_hash_bytes(topic_id_partition)) & 0x7FFF_FFFF) % num_partitions
