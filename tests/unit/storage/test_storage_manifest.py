"""Segment manifests: index packing, JSON round trip, typed errors for bad documents."""

from __future__ import annotations

import json
import uuid

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.storage.manifest import (
    IndexKind,
    ManifestFormatError,
    ObjectEntry,
    SegmentManifest,
    pack_indexes,
)


def _manifest() -> SegmentManifest:
    blob, ranges = pack_indexes(
        {IndexKind.OFFSET_INDEX: b"o" * 16, IndexKind.TIME_INDEX: b"t" * 12}
    )
    return SegmentManifest(
        topic="orders",
        topic_id=uuid.uuid4(),
        partition=3,
        segment_id=uuid.uuid4(),
        start_offset=100,
        end_offset=199,
        max_timestamp_ms=1_700_000_000_000,
        size_bytes=4096,
        leader_epochs=((0, 100), (2, 150)),
        txn_index_empty=True,
        broker_id=1,
        event_timestamp_ms=1_700_000_000_123,
        log=ObjectEntry("k.log", 4096, 7),
        indexes=ObjectEntry("k.indexes", len(blob), crc32c.crc32c(blob), ranges),
        created_by="test",
    )


class TestPackIndexes:
    @given(st.dictionaries(st.sampled_from(list(IndexKind)), st.binary(max_size=64)))
    def test_each_file_is_byte_exact_at_its_range(self, files):
        """Every packed file is found unchanged at its recorded range, with its CRC-32C."""
        blob, ranges = pack_indexes(files)
        assert set(ranges) == set(files)
        for kind, data in files.items():
            r = ranges[kind]
            assert blob[r.start : r.start + r.length] == data
            assert r.crc32c == crc32c.crc32c(data)
        assert len(blob) == sum(len(d) for d in files.values())

    def test_absent_files_are_skipped(self):
        """A missing transaction index takes no range (the read path answers 404 for it)."""
        _, ranges = pack_indexes({IndexKind.OFFSET_INDEX: b"x", IndexKind.TXN_INDEX: None})
        assert IndexKind.TXN_INDEX not in ranges


class TestSegmentManifest:
    def test_round_trip(self):
        """A manifest parses back to an equal object."""
        manifest = _manifest()
        assert SegmentManifest.from_json(manifest.to_json()) == manifest

    @pytest.mark.parametrize(
        ("mutate", "message"),
        [
            pytest.param(
                lambda d: d.update(format="other"), "unknown manifest format", id="format"
            ),
            pytest.param(lambda d: d.update(version=99), "unsupported manifest version", id="ver"),
            pytest.param(lambda d: d["segment"].pop("end_offset"), "end_offset", id="missing"),
            pytest.param(lambda d: d["segment"].update(partition="x"), "malformed", id="type"),
            pytest.param(lambda d: d["segment"].update(topic_id="nope"), "malformed", id="uuid"),
            pytest.param(
                lambda d: d["objects"]["indexes"]["ranges"]["time_index"].update(start=10**6),
                "time_index .* outside the object",
                id="range-past-end",
            ),
            pytest.param(
                lambda d: d["objects"]["indexes"]["ranges"]["offset_index"].update(length=-1),
                "offset_index .* outside the object",
                id="negative-length",
            ),
            pytest.param(
                lambda d: d["objects"]["indexes"]["ranges"]["offset_index"].update(start=-4),
                "offset_index .* outside the object",
                id="negative-start",
            ),
            pytest.param(lambda d: d["objects"]["log"].update(size=-1), "negative size", id="size"),
        ],
    )
    def test_bad_documents_raise_typed_errors(self, mutate, message):
        """Broken manifests raise ManifestFormatError naming the problem and the key."""
        doc = json.loads(_manifest().to_json())
        mutate(doc)
        with pytest.raises(ManifestFormatError, match=message) as info:
            SegmentManifest.from_json(json.dumps(doc).encode(), key="a/b.manifest.json")
        assert "a/b.manifest.json" in str(info.value)

    @given(st.binary(max_size=200))
    def test_garbage_raises_only_typed_errors(self, data):
        """Random bytes never escape as anything but ManifestFormatError."""
        with pytest.raises(ManifestFormatError):
            SegmentManifest.from_json(data)
