"""Header keys that are not UTF-8 (non-Java producers write bytes; the broker keeps them): the
batch is read as Kafka's Java consumer reads it, the bad bytes replaced by U+FFFD, in every
codec, with the rest of each record as the compiled decoder gives it. Anything else malformed
in such a batch is still a CorruptRecordError."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.errors import CorruptRecordError
from sidecar.kafka._lenient import walk_records
from sidecar.kafka.records import Compression, TimestampType, decode_records
from sidecar.testing import TestRecord, build_batch

BAD_KEY = b"h\xff\xfe"
RECORDS = [
    TestRecord(key=b"k0", value=b"v0", headers=(("ok", b"1"),), timestamp=1_000),
    TestRecord(key=None, value=None, headers=((BAD_KEY, b"2"), ("n", None)), timestamp=1_005),
    TestRecord(key=b"k2", value=b"v" * 3000, timestamp=1_003),
]


def _with_key(key: str | bytes) -> list[TestRecord]:
    """RECORDS with the second record's first header key set to ``key``."""
    second = TestRecord(value=None, headers=((key, b"2"), ("n", None)), timestamp=1_005)
    return [RECORDS[0], second, RECORDS[2]]


@pytest.mark.parametrize("compression", list(Compression))
def test_a_key_that_is_not_utf8_is_read_with_replacement(compression):
    batch = build_batch(RECORDS, base_offset=40, base_timestamp=1_000, compression=compression)
    found = decode_records(batch)
    # the compiled decoder's reading of the same records with the key Java's consumer reads
    good = build_batch(
        _with_key("h\ufffd\ufffd"), base_offset=40, base_timestamp=1_000, compression=compression
    )
    assert found == decode_records(good)
    assert found[1].headers == [("h\ufffd\ufffd", b"2"), ("n", None)]
    assert [r.offset for r in found] == [40, 41, 42]


@pytest.mark.parametrize(
    "options",
    [
        {"timestamp_type": TimestampType.LOG_APPEND_TIME, "log_append_time": 9_999},
        {"base_timestamp": -1, "untimed": True},
    ],
    ids=["log-append-time", "no-timestamp"],
)
def test_timestamps_as_the_compiled_decoder_has_them(options):
    untimed = options.pop("untimed", False)

    def records(key: str | bytes) -> list[TestRecord]:
        found = _with_key(key)
        return [dataclasses.replace(r, timestamp=None) for r in found] if untimed else found

    found = decode_records(build_batch(records(BAD_KEY), **options))
    assert [r.timestamp for r in found] == [
        r.timestamp for r in decode_records(build_batch(records("h\ufffd\ufffd"), **options))
    ]
    assert {r.timestamp for r in found} == ({-1} if untimed else {9_999})


def test_a_batch_malformed_otherwise_is_still_corrupt():
    """A record whose length runs past the batch, in a batch with a bad key: the walk refuses
    it like the compiled decoder would."""
    batch = bytearray(build_batch(RECORDS[1:2]))
    batch[61] = 0x7E  # the record's length varint: 63 bytes, more than the batch holds
    with pytest.raises(CorruptRecordError, match="cannot decode record batch"):
        decode_records(bytes(batch), verify_crc=False)


@pytest.mark.parametrize(
    ("records", "why"),
    [
        (b"\x02", "runs past the end"),  # a record of 1 byte, none there
        (b"\xff" * 11, "longer than 10 bytes"),
        (b"\x02\x00\x00\x00\x00\x00\x00", "fields end at"),  # fields past a 1-byte record
    ],
)
def test_the_walk_refuses_malformed_records(records, why):
    with pytest.raises(ValueError, match=why):
        walk_records(records, 1)
