"""CRC-32C helpers for S3 checksums: the wire form, S3's composite multipart checksum, and
combining per-part CRCs into the whole-object CRC without reading the bytes twice.

Pure and synchronous; no I/O, no client imports.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterable

import crc32c as _crc32c

__all__ = [
    "composite_checksum",
    "crc32c",
    "crc32c_combine",
    "decode_checksum",
    "encode_checksum",
]

# CRC-32C (Castagnoli), reflected polynomial, as used by S3's x-amz-checksum-crc32c
_POLY = 0x82F63B78


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C of ``data`` (hardware accelerated; releases the GIL for large buffers)."""
    return int(_crc32c.crc32c(data, value=value))


def encode_checksum(value: int) -> str:
    """The ``x-amz-checksum-crc32c`` form: base64 of the 4-byte big-endian CRC."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def decode_checksum(text: str | None) -> int | None:
    """The CRC of a full-object ``x-amz-checksum-crc32c`` value; None for a composite
    (``...-N``, a CRC of part CRCs) or a missing or malformed value."""
    if not text or "-" in text:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def composite_checksum(part_crcs: Iterable[int]) -> str:
    """S3's checksum of a multipart object: CRC-32C over the parts' 4-byte CRCs, then ``-N``."""
    crcs = list(part_crcs)
    joined = b"".join(c.to_bytes(4, "big") for c in crcs)
    return f"{encode_checksum(crc32c(joined))}-{len(crcs)}"


def _gf2_times(matrix: tuple[int, ...], vector: int) -> int:
    total = 0
    row = 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_gf2_times(matrix, matrix[n]) for n in range(32))


@functools.cache
def _zero_operators() -> tuple[tuple[int, ...], ...]:
    """Operators that advance a CRC over 2**k zero bytes, k = 0..63 (zlib's crc32_combine)."""
    one_bit = (_POLY, *(1 << n for n in range(31)))
    matrix = _gf2_square(_gf2_square(_gf2_square(one_bit)))  # 8 zero bits = one zero byte
    operators = [matrix]
    for _ in range(63):
        matrix = _gf2_square(matrix)
        operators.append(matrix)
    return tuple(operators)


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32C of ``a + b`` from ``crc32c(a)``, ``crc32c(b)`` and ``len(b)``, in O(log len2)."""
    if len2 < 0:
        raise ValueError("len2 must be >= 0")
    operators = _zero_operators()  # built once, about 5 ms
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(operators[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2
