"""The per-segment manifest: a versioned JSON document, written last as the commit point.

It makes the bucket self-describing: the segment's KIP-405 metadata (offsets, epochs, size, max
timestamp), the objects with their sizes and CRC-32C checksums, and the byte range of each Kafka
file inside the combined ``indexes`` object. A reader (the read server, the Spark source, the
orphan scrub) needs nothing but the manifest to find and verify every byte.

Pure: JSON and CRC-32C, no I/O. Spark executors import it.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import crc32c

from sidecar.errors import FormatError
from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_MAX_BYTES",
    "MANIFEST_VERSION",
    "IndexKind",
    "ManifestFormatError",
    "ObjectEntry",
    "Range",
    "SegmentManifest",
    "pack_indexes",
]

MANIFEST_FORMAT = "kafka-tiered-sidecar/segment-manifest"
MANIFEST_VERSION = 1
#: the most a reader takes of an object at a manifest's key: a manifest is a few KB (one line
#: per object, one pair per leader epoch of the segment)
MANIFEST_MAX_BYTES = 1024 * 1024


class ManifestFormatError(FormatError):
    """A manifest that is not JSON, has an unknown format or version, or misses a field."""


class IndexKind(enum.StrEnum):
    """The Kafka files packed into the ``indexes`` object, in this order."""

    OFFSET_INDEX = "offset_index"
    TIME_INDEX = "time_index"
    TXN_INDEX = "txn_index"
    PRODUCER_SNAPSHOT = "producer_snapshot"
    LEADER_EPOCH_CHECKPOINT = "leader_epoch_checkpoint"


@dataclass(frozen=True, slots=True)
class Range:
    """A byte range inside an object: ``[start, start + length)``, with its CRC-32C."""

    start: int
    length: int
    crc32c: int

    @property
    def end_inclusive(self) -> int:
        return self.start + self.length - 1


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    """One object of the segment: key, size and whole-object CRC-32C."""

    key: str
    size: int
    crc32c: int
    ranges: Mapping[IndexKind, Range] = field(default_factory=dict)


def pack_indexes(files: Mapping[IndexKind, bytes | None]) -> tuple[bytes, dict[IndexKind, Range]]:
    """Concatenate the index files (absent ones are skipped) and return their ranges."""
    out = bytearray()
    ranges: dict[IndexKind, Range] = {}
    for kind in IndexKind:
        data = files.get(kind)
        if data is None:
            continue
        ranges[kind] = Range(start=len(out), length=len(data), crc32c=crc32c.crc32c(data))
        out += data
    return bytes(out), ranges


@dataclass(frozen=True, slots=True)
class SegmentManifest:
    """Everything about one remote segment, as written next to its objects."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    size_bytes: int
    leader_epochs: tuple[tuple[int, int], ...]
    """(epoch, start offset) pairs, as in the KIP-405 metadata."""
    txn_index_empty: bool
    broker_id: int
    event_timestamp_ms: int
    log: ObjectEntry
    indexes: ObjectEntry
    created_by: str = ""

    def to_json(self) -> bytes:
        def entry(e: ObjectEntry) -> dict[str, Any]:
            data: dict[str, Any] = {"key": e.key, "size": e.size, "crc32c": e.crc32c}
            if e.ranges:
                data["ranges"] = {
                    k.value: {"start": r.start, "length": r.length, "crc32c": r.crc32c}
                    for k, r in e.ranges.items()
                }
            return data

        doc = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "created_by": self.created_by,
            "segment": {
                "topic": self.topic,
                "topic_id": encode_kafka_uuid(self.topic_id),
                "partition": self.partition,
                "segment_id": encode_kafka_uuid(self.segment_id),
                "start_offset": self.start_offset,
                "end_offset": self.end_offset,
                "max_timestamp_ms": self.max_timestamp_ms,
                "size_bytes": self.size_bytes,
                "leader_epochs": [list(e) for e in self.leader_epochs],
                "txn_index_empty": self.txn_index_empty,
                "broker_id": self.broker_id,
                "event_timestamp_ms": self.event_timestamp_ms,
            },
            "objects": {"log": entry(self.log), "indexes": entry(self.indexes)},
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, key: str | None = None) -> SegmentManifest:
        """Parse a manifest; raises :class:`ManifestFormatError` naming the key and the field
        (also for a byte range that does not lie inside its object)."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestFormatError(f"manifest is not JSON: {exc}", path=key) from None
        try:
            if doc["format"] != MANIFEST_FORMAT:
                raise ManifestFormatError(f"unknown manifest format {doc['format']!r}", path=key)
            if doc["version"] != MANIFEST_VERSION:
                raise ManifestFormatError(
                    f"unsupported manifest version {doc['version']}", path=key
                )
            seg = doc["segment"]
            objects = doc["objects"]

            def entry(name: str) -> ObjectEntry:
                raw = objects[name]
                ranges = {
                    IndexKind(k): Range(int(r["start"]), int(r["length"]), int(r["crc32c"]))
                    for k, r in raw.get("ranges", {}).items()
                }
                found = ObjectEntry(str(raw["key"]), int(raw["size"]), int(raw["crc32c"]), ranges)
                _check_ranges(name, found, key)
                return found

            return cls(
                topic=str(seg["topic"]),
                topic_id=decode_kafka_uuid(seg["topic_id"]),
                partition=int(seg["partition"]),
                segment_id=decode_kafka_uuid(seg["segment_id"]),
                start_offset=int(seg["start_offset"]),
                end_offset=int(seg["end_offset"]),
                max_timestamp_ms=int(seg["max_timestamp_ms"]),
                size_bytes=int(seg["size_bytes"]),
                leader_epochs=tuple((int(e), int(o)) for e, o in seg["leader_epochs"]),
                txn_index_empty=bool(seg["txn_index_empty"]),
                broker_id=int(seg["broker_id"]),
                event_timestamp_ms=int(seg["event_timestamp_ms"]),
                log=entry("log"),
                indexes=entry("indexes"),
                created_by=str(doc.get("created_by", "")),
            )
        except KeyError as exc:
            raise ManifestFormatError(f"manifest misses field {exc.args[0]!r}", path=key) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ManifestFormatError(f"manifest has a malformed field: {exc}", path=key) from None


def _check_ranges(name: str, entry: ObjectEntry, key: str | None) -> None:
    """An object's size is not negative and each of its ranges lies inside it: a range past
    the end would be read as bytes the object does not have."""
    if entry.size < 0:
        raise ManifestFormatError(f"object {name!r} has a negative size {entry.size}", path=key)
    for kind, found in entry.ranges.items():
        if found.start < 0 or found.length < 0 or found.start + found.length > entry.size:
            raise ManifestFormatError(
                f"range of {kind.value} in object {name!r} ({found.start}+{found.length})"
                f" is outside the object ({entry.size} bytes)",
                path=key,
            )


def _check_header(doc: Any, key: str | None) -> None:
    if not isinstance(doc, dict):
        raise ManifestFormatError("manifest is not a JSON object", path=key)
    if doc.get("format") != MANIFEST_FORMAT:
        raise ManifestFormatError(f"unknown manifest format {doc.get('format')!r}", path=key)
    if doc.get("version") != MANIFEST_VERSION:
        raise ManifestFormatError(f"unsupported manifest version {doc.get('version')}", path=key)
