"""Object keys, derivable from segment metadata alone.

Layout (docs/design.md, section 6)::

    <prefix>[<hash>/]<topic>-<topicId>/<partition>/<20-digit base offset>-<segmentId>.<suffix>

``topicId`` and ``segmentId`` are Kafka's ``Uuid.toString()`` (22 characters of base64url), so a
key names the same ids an operator sees in Kafka's tools. Suffixes: ``log`` (the segment bytes),
``indexes`` (offset, time and transaction indexes, producer snapshot and leader-epoch checkpoint,
each byte-exact at the byte range the manifest records: one PUT instead of five), and
``manifest.json``, written last as the commit point. The optional hash prefix (4 hex digits of a
hash of topic id and partition) spreads load across S3 key partitions.

Staged segments (a broker-driven segment uploaded on roll, before the broker's copy call gives
it a segment id) live apart, under ``<prefix>staging/``::

    <prefix>staging/<topic>-<topicId>/<partition>/<20-digit base offset>-<size>-<crc32c>.log

named by their content (size and CRC-32C of the ``.log``), so a copy call that finds its file's
key there knows the bytes are the same. ``staging/`` never collides with a segment key (those
always start with ``<topic>-<22 characters>/`` or a 4-hex-digit hash).

Pure: no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import re
import uuid
from dataclasses import dataclass

from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid

__all__ = ["KeyLayout", "ObjectSuffix", "ParsedKey", "StagedKey"]


class ObjectSuffix(enum.StrEnum):
    """The objects of one remote segment."""

    LOG = "log"
    INDEXES = "indexes"
    MANIFEST = "manifest.json"


_KEY = re.compile(
    r"(?P<topic>[a-zA-Z0-9._-]+)-(?P<topic_id>[A-Za-z0-9_-]{22})/(?P<partition>[0-9]+)/"
    r"(?P<base>[0-9]{20})-(?P<segment_id>[A-Za-z0-9_-]{22})\.(?P<suffix>log|indexes|manifest\.json)\Z"
)


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """What a segment object key says about itself."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    base_offset: int
    segment_id: uuid.UUID
    suffix: ObjectSuffix


_STAGED = re.compile(
    r"staging/(?P<topic>[a-zA-Z0-9._-]+)-(?P<topic_id>[A-Za-z0-9_-]{22})/(?P<partition>[0-9]+)/"
    r"(?P<base>[0-9]{20})-(?P<size>[0-9]+)-(?P<crc>[0-9a-f]{8})\.log\Z"
)


@dataclass(frozen=True, slots=True)
class StagedKey:
    """What a staged segment's key says about itself."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    base_offset: int
    size: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Builds and parses object keys under one bucket prefix."""

    prefix: str = ""
    hash_prefix: bool = False

    def partition_prefix(self, topic: str, topic_id: uuid.UUID, partition: int) -> str:
        """The key prefix of every object of one partition (ends with '/')."""
        return f"{self.topic_prefix(topic, topic_id, partition)}{partition}/"

    def topic_prefix(self, topic: str, topic_id: uuid.UUID, partition: int | None = None) -> str:
        """The key prefix of a topic; with hash prefixes it is per partition."""
        spread = ""
        if self.hash_prefix:
            if partition is None:
                raise ValueError("with hash prefixes, a topic prefix needs the partition")
            digest = hashlib.blake2b(
                topic_id.bytes + partition.to_bytes(4, "big"), digest_size=2
            ).hexdigest()
            spread = f"{digest}/"
        return f"{self.prefix}{spread}{topic}-{encode_kafka_uuid(topic_id)}/"

    def segment_key(
        self,
        *,
        topic: str,
        topic_id: uuid.UUID,
        partition: int,
        base_offset: int,
        segment_id: uuid.UUID,
        suffix: ObjectSuffix,
    ) -> str:
        """The key of one object of one remote segment."""
        if base_offset < 0:
            raise ValueError(f"base offset must be >= 0, not {base_offset}")
        return (
            f"{self.partition_prefix(topic, topic_id, partition)}"
            f"{base_offset:020d}-{encode_kafka_uuid(segment_id)}.{suffix.value}"
        )

    @property
    def staging_prefix(self) -> str:
        """Where staged segments live (ends with '/')."""
        return f"{self.prefix}staging/"

    def staged_key(
        self,
        *,
        topic: str,
        topic_id: uuid.UUID,
        partition: int,
        base_offset: int,
        size: int,
        crc32c: int,
    ) -> str:
        """The key of a staged ``.log``, named by its size and CRC-32C."""
        if base_offset < 0 or size < 0 or not 0 <= crc32c < 2**32:
            raise ValueError(f"bad staged segment: base {base_offset}, size {size}, crc {crc32c}")
        return (
            f"{self.staging_prefix}{topic}-{encode_kafka_uuid(topic_id)}/{partition}/"
            f"{base_offset:020d}-{size}-{crc32c:08x}.log"
        )

    def parse_staged(self, key: str) -> StagedKey | None:
        """Parse a staged segment's key; ``None`` for anything else."""
        if not key.startswith(self.prefix):
            return None
        match = _STAGED.match(key[len(self.prefix) :])
        if match is None:
            return None
        try:
            topic_id = decode_kafka_uuid(match["topic_id"])
        except ValueError:
            return None
        return StagedKey(
            topic=match["topic"],
            topic_id=topic_id,
            partition=int(match["partition"]),
            base_offset=int(match["base"]),
            size=int(match["size"]),
            crc32c=int(match["crc"], 16),
        )

    def parse(self, key: str) -> ParsedKey | None:
        """Parse a key written by this layout; ``None`` for anything else (orphan scrub)."""
        if not key.startswith(self.prefix):
            return None
        rest = key[len(self.prefix) :]
        if self.hash_prefix:
            head, sep, rest = rest.partition("/")
            if not sep or not re.fullmatch(r"[0-9a-f]{4}", head):
                return None
        match = _KEY.match(rest)
        if match is None:
            return None
        try:
            topic_id = decode_kafka_uuid(match["topic_id"])
            segment_id = decode_kafka_uuid(match["segment_id"])
        except ValueError:
            return None
        return ParsedKey(
            topic=match["topic"],
            topic_id=topic_id,
            partition=int(match["partition"]),
            base_offset=int(match["base"]),
            segment_id=segment_id,
            suffix=ObjectSuffix(match["suffix"]),
        )
