"""A plain-Python walk of a record batch's records, for the one input aiokafka's compiled decoder
refuses that Kafka's Java client reads: a header key that is not valid UTF-8. Java's producer
cannot write one (its header keys are Strings), but other clients write bytes, the broker stores
them as they come, and Java's consumer decodes them replacing what is not UTF-8 (U+FFFD). This
walk does the same; it is used only after the compiled decoder failed on such a key, so its
speed does not matter.

Each record (``DefaultRecord``): length varint, attributes int8, timestampDelta varlong,
offsetDelta varint, key (length varint, -1 = null), value (the same), header count varint, then
per header a key (length varint, UTF-8) and a value (length varint, -1 = null). Varints are
zig-zag encoded.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RawRecord", "walk_records"]

#: a varint or varlong of more bytes than this is malformed (Java's ByteUtils says the same)
_MAX_VARLONG_BYTES = 10


class RawRecord(NamedTuple):
    """One record as the batch stores it (deltas from the batch's base offset and timestamp)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        value = shift = 0
        for _ in range(_MAX_VARLONG_BYTES):
            if self.pos >= len(self.data):
                raise ValueError("a varint runs past the end of the records")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise ValueError(f"a varint is longer than {_MAX_VARLONG_BYTES} bytes")

    def take(self, length: int) -> bytes:
        end = self.pos + length
        if length < 0 or end > len(self.data):
            raise ValueError(f"a field of {length} bytes runs past the end of the records")
        found = bytes(self.data[self.pos : end])
        self.pos = end
        return found

    def nullable(self) -> bytes | None:
        length = self.varint()
        return None if length < 0 else self.take(length)


def walk_records(records: bytes | bytearray | memoryview, count: int) -> list[RawRecord]:
    """The ``count`` records in ``records`` (a batch's bytes after its 61-byte header,
    decompressed). Raises ValueError for anything malformed; header keys that are not valid
    UTF-8 are decoded with U+FFFD in place of the bad bytes."""
    reader = _Reader(memoryview(records).cast("B"))
    found: list[RawRecord] = []
    for _ in range(count):
        length = reader.varint()
        end = reader.pos + length
        if length < 0 or end > len(reader.data):
            raise ValueError(f"a record of {length} bytes runs past the end of the records")
        reader.take(1)  # attributes: unused
        timestamp_delta = reader.varint()
        offset_delta = reader.varint()
        key = reader.nullable()
        value = reader.nullable()
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(reader.varint()):
            name = reader.take(reader.varint()).decode("utf-8", "replace")
            headers.append((name, reader.nullable()))
        if reader.pos != end:
            raise ValueError(f"a record's fields end at {reader.pos}, its length says {end}")
        found.append(RawRecord(offset_delta, timestamp_delta, key, value, headers))
    if reader.pos != len(reader.data):
        raise ValueError(f"{len(reader.data) - reader.pos} bytes follow the batch's records")
    return found
