"""CRC-32C helpers: S3's wire form, composite multipart checksums, combining part CRCs."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.storage._crc import (
    composite_checksum,
    crc32c,
    crc32c_combine,
    decode_checksum,
    encode_checksum,
)
from sidecar.storage._parts import combine_parts, plan_parts
from sidecar.storage.base import MAX_PARTS, MIN_PART_SIZE


class TestChecksumText:
    def test_known_value(self) -> None:
        """The wire form is base64 of the big-endian CRC (RFC 3720's check value)."""
        assert crc32c(b"123456789") == 0xE3069283
        assert encode_checksum(0xE3069283) == base64.b64encode(bytes.fromhex("e3069283")).decode()

    @given(st.integers(min_value=0, max_value=2**32 - 1))
    def test_round_trip(self, value: int) -> None:
        """Every CRC survives encoding and decoding."""
        assert decode_checksum(encode_checksum(value)) == value

    @pytest.mark.parametrize(
        "text",
        [
            pytest.param(None, id="missing"),
            pytest.param("", id="empty"),
            pytest.param("QgGWvw==-2", id="composite"),
            pytest.param("not base64!", id="garbage"),
            pytest.param("AAAAAAAA", id="six-bytes"),
        ],
    )
    def test_not_a_full_object_checksum(self, text: str | None) -> None:
        """Composite, missing or malformed values decode to None."""
        assert decode_checksum(text) is None

    def test_composite(self) -> None:
        """S3's multipart checksum is the CRC of the part CRCs' bytes, then -N (checked
        against SeaweedFS's answer for these two CRCs)."""
        parts = [0x61B5FB81, 0xB41ACDEA]
        joined = b"".join(p.to_bytes(4, "big") for p in parts)
        assert composite_checksum(parts) == f"{encode_checksum(crc32c(joined))}-2"


class TestCombine:
    @given(st.binary(max_size=3000), st.binary(max_size=3000))
    def test_combine_equals_crc_of_concatenation(self, a: bytes, b: bytes) -> None:
        """Combining the CRCs of two pieces gives the CRC of the whole."""
        assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)

    @given(st.lists(st.binary(max_size=500), max_size=8))
    def test_combine_parts(self, pieces: list[bytes]) -> None:
        """Folding part CRCs in order gives the whole object's CRC."""
        assert combine_parts([(crc32c(p), len(p)) for p in pieces]) == crc32c(b"".join(pieces))

    def test_large_lengths(self) -> None:
        """Combining with a gigabyte-sized second piece is fast and matches zero-padding math."""
        zeros = bytes(1 << 20)
        head = crc32c(b"head")
        assert crc32c_combine(head, crc32c(zeros), len(zeros)) == crc32c(b"head" + zeros)

    def test_negative_length(self) -> None:
        """A negative length is a programming error."""
        with pytest.raises(ValueError, match="len2"):
            crc32c_combine(0, 0, -1)


class TestPlanParts:
    def test_parts_cover_the_file(self) -> None:
        """Parts are numbered from 1, contiguous, and only the last is short."""
        parts = plan_parts(12 * 1024 * 1024 + 5, MIN_PART_SIZE)
        assert [(p.number, p.offset, p.length) for p in parts] == [
            (1, 0, MIN_PART_SIZE),
            (2, MIN_PART_SIZE, MIN_PART_SIZE),
            (3, 2 * MIN_PART_SIZE, 2 * 1024 * 1024 + 5),
        ]

    def test_up_to_two_parts_worth_is_one_put(self) -> None:
        """A file up to twice the part size is one part (one PUT instead of four requests); an
        empty file has none; a byte more and it is cut into parts of the part size."""
        assert [
            (p.number, p.offset, p.length) for p in plan_parts(2 * MIN_PART_SIZE, MIN_PART_SIZE)
        ] == [(1, 0, 2 * MIN_PART_SIZE)]
        assert plan_parts(0, MIN_PART_SIZE) == []
        parts = plan_parts(2 * MIN_PART_SIZE + 1, MIN_PART_SIZE)
        assert [p.length for p in parts] == [MIN_PART_SIZE, MIN_PART_SIZE, 1]

    def test_part_size_grows_to_respect_max_parts(self) -> None:
        """A file too large for the part size gets bigger parts, never more than MAX_PARTS."""
        size = MAX_PARTS * MIN_PART_SIZE + 1
        parts = plan_parts(size, MIN_PART_SIZE)
        assert len(parts) <= MAX_PARTS
        assert sum(p.length for p in parts) == size
