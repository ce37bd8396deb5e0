"""Kafka's flexible-version ("compact") encoding primitives, as its generated message classes use
them: unsigned varints, compact strings, nullable bytes and arrays, and tagged-field sections.

Upstream (apache/kafka): ``clients/src/main/java/org/apache/kafka/common/protocol/Writable.java``,
``Readable.java``, ``ByteBufferAccessor.java`` and ``clients/.../common/utils/ByteUtils.java``;
the reading rules of ``generator/src/main/java/org/apache/kafka/message/MessageDataGenerator.java``.

Reading follows Kafka's rules exactly, Java int arithmetic included: an unsigned varint is read
into a 32-bit int the way ``ByteUtils.readUnsignedVarint`` does (bits beyond 32 of a fifth byte are
shifted out, values of 2**31 and above wrap to negative ints), and each caller then treats a
negative value as the generated code does (a nullable length of -1 or less is null, a negative
tagged-field count is an empty section, a negative tag is an unknown tag). So this reader accepts
what Kafka's reader accepts and reads it to the same values, with one deliberate narrowing: a string
must be valid UTF-8 (Kafka's ``new String(bytes, UTF_8)`` substitutes U+FFFD, with replacement rules
Python's codec does not reproduce byte for byte). Pure and synchronous; no Kafka client, no I/O.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping
from typing import Any, NoReturn

from sidecar.metadata.errors import MetadataFormatError

#: the longest string Kafka reads or writes (``0x7fff`` bytes of UTF-8)
MAX_STRING_BYTES = 0x7FFF
#: the largest value ``AbstractApiMessageSerde.unsignedIntToShort`` lets through
_MAX_SHORT = 0x7FFF
#: an empty tagged-field section: ``uvarint(0)``
EMPTY_TAGGED_FIELDS = b"\x00"

INT8 = struct.Struct(">b")
INT32 = struct.Struct(">i")


def java_int(value: int) -> int:
    """``value`` wrapped to a Java int (two's complement, 32 bits), as Java arithmetic does."""
    return ((value + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def java_short(value: int) -> int:
    """``value`` narrowed to a Java short (``(short) value``: the low 16 bits, signed)."""
    return ((value + (1 << 15)) & 0xFFFF) - (1 << 15)


def uvarint(value: int) -> bytes:
    """Encode a non-negative int as Kafka's unsigned varint (``ByteUtils.writeUnsignedVarint``)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(raw: bytes) -> bytes:
    """A compact string from its UTF-8 bytes: ``uvarint(len + 1)`` then the bytes."""
    return uvarint(len(raw) + 1) + raw


def compact_nullable_bytes(value: bytes | None) -> bytes:
    """Compact nullable bytes: ``00`` for null, else ``uvarint(len + 1)`` then the bytes."""
    if value is None:
        return b"\x00"
    return uvarint(len(value) + 1) + value


def tagged_fields(fields: Mapping[int, bytes]) -> bytes:
    """A tagged-field section: count, then ``uvarint(tag) uvarint(size) value`` by ascending tag."""
    if not fields:
        return EMPTY_TAGGED_FIELDS
    out = [uvarint(len(fields))]
    for tag in sorted(fields):
        out += (uvarint(tag), uvarint(len(fields[tag])), fields[tag])
    return b"".join(out)


class Reader:
    """A cursor over one record value; every failure names the offset where the bad item starts."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def fail(self, message: str, position: int | None = None) -> NoReturn:
        """Raise MetadataFormatError at ``position`` (default: the cursor)."""
        raise MetadataFormatError(message, position=self.pos if position is None else position)

    @property
    def remaining(self) -> int:
        """Bytes left after the cursor."""
        return len(self.buf) - self.pos

    def take(self, size: int, what: str) -> bytes:
        """The next ``size`` bytes."""
        end = self.pos + size
        if end > len(self.buf):
            self.fail(f"truncated: {what} needs {size} byte(s), {self.remaining} left")
        data = self.buf[self.pos : end]
        self.pos = end
        return data

    def unpack(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        """Fixed-width fields with ``layout``."""
        pos = self.pos
        if pos + layout.size > len(self.buf):
            self.fail(f"truncated: {what} needs {layout.size} byte(s), {self.remaining} left")
        self.pos = pos + layout.size
        return layout.unpack_from(self.buf, pos)

    def uvarint(self, what: str) -> int:
        """An unsigned varint read into a Java int, as ``ByteUtils.readUnsignedVarint`` does: at
        most 5 bytes, the fifth byte's bits above the 32nd are lost, and values of 2**31 and above
        come back negative. Callers handle negative values as Kafka's generated code does."""
        buf, start = self.buf, self.pos
        if start < len(buf) and buf[start] < 0x80:  # the common one-byte case
            self.pos = start + 1
            return buf[start]
        value = shift = 0
        pos = start
        while True:
            if pos >= len(buf):
                self.fail(f"truncated: {what} ends inside a varint", start)
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > 28:
                self.fail(f"{what}: varint is longer than 5 bytes", start)
        self.pos = pos
        return java_int(value)

    def short(self, what: str) -> int:
        """A header field (frame version, apiKey, version) as ``AbstractApiMessageSerde``'s
        ``unsignedIntToShort`` reads it: a varint of at most 0x7fff as a Java int (so any negative
        int passes), narrowed to a short."""
        start = self.pos
        value = self.uvarint(what)
        if value > _MAX_SHORT:
            self.fail(f"{what}: {value} is too large (at most {_MAX_SHORT})", start)
        return java_short(value)

    def uuid(self, what: str) -> uuid.UUID:
        """A UUID: most significant 8 bytes, then least significant 8 bytes, big-endian."""
        return uuid.UUID(bytes=self.take(16, what))

    def compact_string(self, what: str) -> str:
        """A non-nullable compact string of at most 0x7fff bytes of valid UTF-8."""
        start = self.pos
        size = java_int(self.uvarint(what) - 1)
        if size < 0:
            self.fail(f"{what}: non-nullable string was serialized as null", start)
        if size > MAX_STRING_BYTES:
            self.fail(f"{what}: string length {size} exceeds {MAX_STRING_BYTES}", start)
        data_start = self.pos
        raw = self.take(size, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.fail(f"{what}: invalid UTF-8 ({exc.reason})", data_start + exc.start)

    def compact_nullable_bytes(self, what: str) -> bytes | None:
        """Compact nullable bytes; any length below 0 (in Java int arithmetic) is null."""
        size = java_int(self.uvarint(what) - 1)
        if size < 0:
            return None
        return self.take(size, what)

    def compact_array_length(self, what: str) -> int:
        """The element count of a non-nullable compact array, checked as Kafka does."""
        start = self.pos
        count = java_int(self.uvarint(what) - 1)
        if count < 0:
            self.fail(f"{what}: non-nullable array was serialized as null", start)
        if count > self.remaining:
            self.fail(f"{what}: {count} elements cannot fit in {self.remaining} byte(s)", start)
        return count

    def tagged_fields(
        self, what: str, byte_tags: frozenset[int] = frozenset()
    ) -> dict[int, tuple[int, bytes]]:
        """A tagged-field section as ``{tag: (offset of the tag, value)}``, read as Kafka's
        generated ``read`` does: a negative count is an empty section, a repeated tag keeps the
        last value, and the fields come in any order. ``byte_tags`` are the struct's known tags of
        type bool or int8: Kafka reads exactly one byte for them, whatever their size says, and
        goes on from there. Every other tag is unknown and skipped by its size (the caller
        ignores it)."""
        buf, pos = self.buf, self.pos
        if pos < len(buf) and buf[pos] == 0:  # the common empty section
            self.pos = pos + 1
            return {}
        fields: dict[int, tuple[int, bytes]] = {}
        for _ in range(self.uvarint(f"{what} tagged field count")):
            tag_pos = self.pos
            tag = self.uvarint(f"{what} tag")
            size_pos = self.pos
            size = self.uvarint(f"{what} tag {tag} size")
            if tag in byte_tags:
                fields[tag] = (tag_pos, self.take(1, f"{what} tag {tag}"))
                continue
            if size < 0:
                self.fail(f"{what} tag {tag}: negative size {size}", size_pos)
            fields[tag] = (tag_pos, self.take(size, f"{what} tag {tag}"))
        return fields
