"""Decompression bombs and the codec bounds of ``sidecar.kafka._codecs``: bombs of every codec are
refused within the limit (most before anything is decompressed), legitimate batches decode right up
to the limit, the framing bounds never underestimate what an encoder produced, and generated or
mutated streams raise only the errors ``decode_records`` turns into ``CorruptRecordError``.

The generated tests run ``SIDECAR_FUZZ_EXAMPLES`` cases each (default 200), like
``test_kafka_fuzz.py``.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import os
import resource
import struct
import zlib
from collections.abc import Callable, Iterator

import cramjam
import crc32c
import pytest
from aiokafka import codec as aiokafka_codec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import CorruptRecordError, FormatError
from sidecar.kafka._codecs import (
    MAX_DECOMPRESSED_BATCH_BYTES,
    BatchTooLargeError,
    decompressed_bounds,
    inflate,
)
from sidecar.kafka.records import RECORD_BATCH_OVERHEAD, Compression, decode_records
from sidecar.testing import TestRecord, build_batch

EXAMPLES = int(os.environ.get("SIDECAR_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=datetime.timedelta(seconds=10),  # a case takes milliseconds; this is a hang
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
    print_blob=True,
)
pytestmark = pytest.mark.timeout(max(600, EXAMPLES // 10))

ENCODERS: dict[str, tuple[Compression, Callable[[bytes], bytes]]] = {
    "zstd": (Compression.ZSTD, lambda d: bytes(cramjam.zstd.compress(d))),
    "zstd-level-1": (Compression.ZSTD, lambda d: bytes(cramjam.zstd.compress(d, level=1))),
    "lz4": (Compression.LZ4, lambda d: bytes(aiokafka_codec.lz4_encode(d))),
    "snappy-xerial": (Compression.SNAPPY, lambda d: bytes(aiokafka_codec.snappy_encode(d))),
    "snappy-raw": (
        Compression.SNAPPY,
        lambda d: bytes(aiokafka_codec.snappy_encode(d, xerial_compatible=False)),
    ),
    "gzip": (Compression.GZIP, gzip.compress),
}
#: what a decoder may raise on a stream it rejects; decode_records maps them to FormatError
CODEC_ERRORS = (ValueError, EOFError, zlib.error, cramjam.DecompressionError)


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextlib.contextmanager
def _rss_grows_at_most(limit: int) -> Iterator[None]:
    before = _max_rss()
    yield
    grown = _max_rss() - before
    assert grown <= limit, f"peak RSS grew {grown >> 20} MiB"


def _batch_with_payload(codec: Compression, payload: bytes, header: bytes | None = None) -> bytes:
    """A batch with ``header`` (default: one record's) whose records section is ``payload``,
    compressed with ``codec``, with a consistent length and CRC."""
    batch = bytearray(header or build_batch([TestRecord(b"k", b"v")])[:RECORD_BATCH_OVERHEAD])
    struct.pack_into(">i", batch, 8, RECORD_BATCH_OVERHEAD - 12 + len(payload))
    batch[22] = (batch[22] & 0xF8) | int(codec)  # attributes' low byte: the codec bits
    batch += payload
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def _zstd_rle_bomb(total: int) -> bytes:
    """A zstd frame of RLE blocks regenerating ``total`` bytes from ~4 bytes per 128 KiB."""
    blocks = []
    left = total
    while left:
        size = min(left, 128 * 1024)
        left -= size
        header = (1 if not left else 0) | (1 << 1) | (size << 3)
        blocks.append(header.to_bytes(3, "little") + b"A")
    return bytes.fromhex("28b52ffd") + bytes([0x00, 0x58]) + b"".join(blocks)


class TestBombs:
    """Payloads that expand past the limit are corrupt batches, refused cheaply."""

    def test_zstd_rle_bomb_refused_before_decompressing(self) -> None:
        """A 10 KiB zstd batch stating 300 MiB of RLE output is refused without allocating it."""
        batch = _batch_with_payload(Compression.ZSTD, _zstd_rle_bomb(300 * 1024 * 1024))
        assert len(batch) < 16 * 1024
        with (
            _rss_grows_at_most(32 * 1024 * 1024),
            pytest.raises(CorruptRecordError, match="more than the 268435456-byte limit"),
        ):
            decode_records(batch)

    @pytest.mark.parametrize(
        "encoder", [pytest.param(name, id=name) for name in ("zstd", "lz4", "gzip")]
    )
    def test_compressed_bombs_stop_at_the_limit(self, encoder: str) -> None:
        """Zeros compressed a thousandfold are inflated only up to the limit, then refused."""
        codec, encode = ENCODERS[encoder]
        payload = encode(bytes(40 * 1024 * 1024))
        limit = 4 * 1024 * 1024
        with _rss_grows_at_most(3 * limit), pytest.raises(CorruptRecordError, match="limit"):
            decode_records(_batch_with_payload(codec, payload), max_decompressed_bytes=limit)

    def test_snappy_stating_a_huge_length_refused(self) -> None:
        """A snappy block claiming 4 GiB is refused from its length varint alone."""
        payload = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10
        with pytest.raises(CorruptRecordError, match="limit"):
            decode_records(_batch_with_payload(Compression.SNAPPY, payload))

    def test_default_limit(self) -> None:
        """The default limit is 256 MiB."""
        assert MAX_DECOMPRESSED_BATCH_BYTES == 256 * 1024 * 1024

    @pytest.mark.parametrize("encoder", [pytest.param(name, id=name) for name in ENCODERS])
    def test_batches_decode_up_to_the_limit(self, encoder: str) -> None:
        """A batch whose records take exactly the limit decodes; one byte less is refused."""
        codec, encode = ENCODERS[encoder]
        records = [TestRecord(b"k%d" % i, os.urandom(3000) + bytes(5000)) for i in range(30)]
        plain = build_batch(records)
        body = plain[RECORD_BATCH_OVERHEAD:]
        batch = _batch_with_payload(codec, encode(body), plain[:RECORD_BATCH_OVERHEAD])
        decoded = decode_records(batch, max_decompressed_bytes=len(body))
        assert [r.value for r in decoded] == [r.value for r in records]
        with pytest.raises(CorruptRecordError, match="limit"):
            decode_records(batch, max_decompressed_bytes=len(body) - 1)


compressible = st.lists(
    st.tuples(st.binary(min_size=1, max_size=40), st.integers(1, 300)), max_size=40
).map(lambda parts: b"".join(chunk * times for chunk, times in parts))


class TestBounds:
    """The framing bounds bracket the real decompressed size and never crash."""

    @settings(FUZZ)
    @given(compressible, st.sampled_from([n for n in ENCODERS if n != "gzip"]))
    def test_bounds_bracket_the_real_size(self, data: bytes, encoder: str) -> None:
        """low <= decompressed size <= high for every encoder's output."""
        codec, encode = ENCODERS[encoder]
        bounds = decompressed_bounds(int(codec), memoryview(encode(data)))
        assert bounds is not None
        low, high = bounds
        assert low <= len(data) <= high

    @settings(FUZZ)
    @given(st.binary(max_size=300), st.sampled_from(list(Compression)), st.integers(0, 10**6))
    def test_random_streams(self, data: bytes, codec: Compression, limit: int) -> None:
        """Random bytes never crash the bounds, and inflate raises only codec errors."""
        decompressed_bounds(int(codec), memoryview(data))
        with contextlib.suppress(*CODEC_ERRORS):
            inflate(int(codec), memoryview(data), limit)

    @settings(FUZZ)
    @given(
        compressible,
        st.sampled_from(list(ENCODERS)),
        st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
        st.integers(0, 10**6),
    )
    def test_mutated_streams(
        self, data: bytes, encoder: str, edits: list[tuple[int, int]], limit: int
    ) -> None:
        """Mutated real streams: bounds never crash, inflate and decode_records raise only the
        codec errors and FormatError respectively, and never exceed the limit."""
        codec, encode = ENCODERS[encoder]
        stream = bytearray(encode(data))
        for where, value in edits:
            if stream:
                stream[where % len(stream)] = value
        decompressed_bounds(int(codec), memoryview(stream))
        with contextlib.suppress(*CODEC_ERRORS):
            out = inflate(int(codec), memoryview(stream), limit)
            assert out is None or len(out) <= limit
        with contextlib.suppress(FormatError):
            decode_records(_batch_with_payload(codec, bytes(stream)), max_decompressed_bytes=limit)

    def test_too_large_error_is_a_value_error(self) -> None:
        """BatchTooLargeError is a ValueError, which decode_records maps to CorruptRecordError."""
        assert issubclass(BatchTooLargeError, ValueError)
