"""How far a compressed record batch may expand, and bounded inflation when that is unknown.

A zstd batch can expand 32,000 times (a 1 MiB batch of RLE blocks is 32 GiB), gzip 1,000 times,
lz4 250 times; aiokafka's decoder decompresses a whole batch at once. Before it does, we compute an
upper bound of the decompressed size from the stream's own framing, without decompressing:

* zstd (RFC 8878): raw and RLE blocks state their size, a compressed block regenerates at most
  128 KiB; skippable frames are skipped;
* lz4 frames (the format of Kafka's ``KafkaLZ4BlockOutputStream`` and of cramjam): uncompressed
  blocks state their size, a compressed block regenerates at most the frame's block maximum;
* snappy, raw or in the Java client's xerial framing: every raw block starts with its exact
  uncompressed length.

When that bound is within the limit, aiokafka decompresses as usual (the fast path). When the
sizes the stream states exactly (raw and RLE blocks, snappy lengths) already exceed the limit, the
batch is refused without decompressing anything. Otherwise (gzip, which has no such framing;
zstd or lz4 between the two bounds; framing we cannot walk) the payload is inflated here into at
most ``limit`` bytes, and what does not fit is corrupt for our purposes. Pure functions over
bytes; this module must not read files, and never allocates more than the limit.
"""

from __future__ import annotations

import mmap
import zlib
from collections.abc import Callable

__all__ = [
    "MAX_DECOMPRESSED_BATCH_BYTES",
    "BatchTooLargeError",
    "Bounds",
    "decompressed_bounds",
    "inflate",
]

#: default ceiling on one batch's decompressed payload (Kafka's default max.message.bytes is
#: 1 MiB compressed; producers' batches are well below this uncompressed)
MAX_DECOMPRESSED_BATCH_BYTES = 256 * 1024 * 1024

_GZIP, _SNAPPY, _LZ4, _ZSTD = 1, 2, 3, 4
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_MAX_BLOCK = 128 * 1024
_LZ4_MAGIC = 0x184D2204
_LZ4_BLOCK_MAX = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}
_XERIAL_HEADER = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16


class BatchTooLargeError(ValueError):
    """A batch would decompress to more than the limit."""


def _u32(data: memoryview, pos: int) -> int:
    return int.from_bytes(data[pos : pos + 4], "little")


Bounds = tuple[int, int]
"""(at least, at most) decompressed bytes."""


def _zstd_bounds(data: memoryview) -> Bounds | None:
    low = high = 0
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < 8:
            return None
        magic = _u32(data, pos)
        if magic in _SKIPPABLE:
            pos += 8 + _u32(data, pos + 4)
            continue
        if magic != _ZSTD_MAGIC:
            return None
        descriptor = data[pos + 4]
        if descriptor & 0x08:  # reserved bit
            return None
        single_segment = descriptor & 0x20
        pos += 5
        pos += 0 if single_segment else 1  # Window_Descriptor
        pos += (0, 1, 2, 4)[descriptor & 0x03]  # Dictionary_ID
        pos += (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]  # Frame_Content_Size
        while True:
            if end - pos < 3:
                return None
            block = int.from_bytes(data[pos : pos + 3], "little")
            pos += 3
            kind = (block >> 1) & 0x03
            size = block >> 3
            if kind == 0:  # raw
                low += size
                high += size
                pos += size
            elif kind == 1:  # RLE: one byte repeated size times
                low += size
                high += size
                pos += 1
            elif kind == 2:  # compressed: regenerates at most Block_Maximum_Size
                high += _ZSTD_MAX_BLOCK
                pos += size
            else:
                return None
            if block & 0x01:  # Last_Block
                break
        pos += 4 if descriptor & 0x04 else 0  # Content_Checksum
    return (low, high) if pos == end else None


def _lz4_bounds(data: memoryview) -> Bounds | None:
    low = high = 0
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < 8:
            return None
        magic = _u32(data, pos)
        if magic in _SKIPPABLE:
            pos += 8 + _u32(data, pos + 4)
            continue
        if magic != _LZ4_MAGIC:
            return None
        flags, block_descriptor = data[pos + 4], data[pos + 5]
        block_max = _LZ4_BLOCK_MAX.get((block_descriptor >> 4) & 0x07)
        if block_max is None or flags >> 6 != 0x01:
            return None
        # FLG, BD, [content size], [dictionary id], header checksum
        pos += 6 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0) + 1
        block_checksum = 4 if flags & 0x10 else 0
        while True:
            if end - pos < 4:
                return None
            size = _u32(data, pos)
            pos += 4
            if size == 0:  # EndMark
                break
            if size & 0x80000000:  # stored uncompressed
                size &= 0x7FFFFFFF
                low += size
                high += size
            else:
                high += block_max
            pos += size + block_checksum
        pos += 4 if flags & 0x04 else 0  # content checksum
    return (low, high) if pos == end else None


def _snappy_raw_length(data: memoryview) -> int | None:
    """The uncompressed length a raw snappy block starts with (a little-endian varint32)."""
    value = 0
    for i in range(min(5, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    return None


def _snappy_bounds(data: memoryview) -> Bounds | None:
    if bytes(data[: len(_XERIAL_HEADER)]) != _XERIAL_HEADER:
        length = _snappy_raw_length(data)
        return None if length is None else (length, length)
    total = 0
    pos = _XERIAL_HEADER_SIZE
    end = len(data)
    while pos < end:
        if end - pos < 4:
            return None
        size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        pos += 4
        if size <= 0 or end - pos < size:
            return None
        length = _snappy_raw_length(data[pos : pos + size])
        if length is None:
            return None
        total += length
        pos += size
    return total, total


_BOUNDS: dict[int, Callable[[memoryview], Bounds | None]] = {
    _ZSTD: _zstd_bounds,
    _LZ4: _lz4_bounds,
    _SNAPPY: _snappy_bounds,
}


def decompressed_bounds(codec: int, payload: memoryview) -> Bounds | None:
    """(at least, at most) how many bytes ``payload`` (a batch's records, compressed with
    ``codec``) decompresses to, from its framing alone; ``None`` when the framing cannot be walked
    (gzip, or bytes that are not a well-formed stream)."""
    bounds = _BOUNDS.get(codec)
    return None if bounds is None else bounds(payload)


def inflate(codec: int, payload: memoryview, limit: int) -> bytes | None:
    """``None`` when aiokafka may decompress ``payload`` itself (its output provably fits
    ``limit``); otherwise the decompressed payload, inflated here into at most ``limit`` bytes.

    Raises ``BatchTooLargeError`` when the payload decompresses to more than ``limit`` bytes,
    ``ImportError`` when the codec library (cramjam) is missing, and the codec's own error for a
    payload it cannot decompress.
    """
    if codec == _GZIP:
        return _gunzip(payload, limit)
    bounds = decompressed_bounds(codec, payload)
    if bounds is not None:
        low, high = bounds
        if high <= limit:
            return None
        if low > limit:
            raise BatchTooLargeError(
                f"payload states {low} decompressed bytes, more than the {limit}-byte limit"
            )
    if codec == _SNAPPY:
        return None  # not a snappy stream we can walk: let the decoder say why
    return _inflate_into(codec, payload, limit)


def _gunzip(payload: memoryview, limit: int) -> bytes:
    """``GzipFile.read`` of one or more gzip members, with zero padding between or after them,
    producing at most ``limit`` bytes."""
    chunks: list[bytes] = []
    produced = 0
    data: bytes | memoryview = payload
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        chunk = inflater.decompress(data, limit - produced + 1)
        produced += len(chunk)
        if produced > limit:
            raise BatchTooLargeError(
                f"gzip payload decompresses to more than the {limit}-byte limit"
            )
        chunks.append(chunk)
        if not inflater.eof:
            raise EOFError("compressed data ended before the end-of-stream marker")
        data = inflater.unused_data.lstrip(b"\0")
        if not data:
            return b"".join(chunks)


def _inflate_into(codec: int, payload: memoryview, limit: int) -> bytes:
    import cramjam  # the codec library aiokafka uses; only needed on this rare path

    module = cramjam.zstd if codec == _ZSTD else cramjam.lz4
    # an anonymous mapping: pages that are never written cost no memory
    with mmap.mmap(-1, limit + 1) as out:
        try:
            written = int(module.decompress_into(payload, out))
        except cramjam.DecompressionError as exc:
            # cramjam says "failed to write whole buffer" when the output does not fit, and has
            # no separate type for it; either way the batch cannot be decoded within the limit
            raise BatchTooLargeError(
                f"cannot decompress within the {limit}-byte limit: {exc}"
            ) from exc
        if written > limit:
            raise BatchTooLargeError(f"payload decompresses to more than the {limit}-byte limit")
        return out[:written]
