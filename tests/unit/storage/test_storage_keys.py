"""Object keys: layout, parse round trip, and refusal of foreign keys."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.storage.keys import KeyLayout, ObjectSuffix

TOPIC_ID = decode_kafka_uuid("ASNFZ4mrze_-3LqYdlQyEA")
SEGMENT_ID = uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF)


class TestKeyLayout:
    def test_layout_matches_the_design(self):
        """Keys are <prefix><topic>-<topicId>/<partition>/<20-digit base>-<segmentId>.<suffix>."""
        key = KeyLayout(prefix="prod/").segment_key(
            topic="orders",
            topic_id=TOPIC_ID,
            partition=7,
            base_offset=1024,
            segment_id=SEGMENT_ID,
            suffix=ObjectSuffix.LOG,
        )
        assert (
            key == "prod/orders-ASNFZ4mrze_-3LqYdlQyEA/7/"
            "00000000000000001024-ASNFZ4mrze8BI0VniavN7w.log"
        )

    def test_hash_prefix_spreads_partitions(self):
        """With hash prefixes, partitions of one topic land under different 4-hex prefixes."""
        layout = KeyLayout(prefix="p/", hash_prefix=True)
        heads = {layout.partition_prefix("orders", TOPIC_ID, p).split("/")[1] for p in range(64)}
        assert len(heads) > 32
        assert all(len(h) == 4 for h in heads)

    @given(
        topic=st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True),
        partition=st.integers(0, 100_000),
        base=st.integers(0, 2**63 - 1),
        topic_id=st.uuids(),
        segment_id=st.uuids(),
        suffix=st.sampled_from(list(ObjectSuffix)),
        hashed=st.booleans(),
    )
    def test_parse_round_trips(self, topic, partition, base, topic_id, segment_id, suffix, hashed):
        """Every key the layout writes parses back to the same fields."""
        layout = KeyLayout(prefix="x/y/", hash_prefix=hashed)
        key = layout.segment_key(
            topic=topic,
            topic_id=topic_id,
            partition=partition,
            base_offset=base,
            segment_id=segment_id,
            suffix=suffix,
        )
        parsed = layout.parse(key)
        assert parsed is not None
        assert (parsed.topic, parsed.topic_id, parsed.partition) == (topic, topic_id, partition)
        assert (parsed.base_offset, parsed.segment_id, parsed.suffix) == (base, segment_id, suffix)

    @pytest.mark.parametrize(
        "key",
        [
            pytest.param(
                "other/orders-ASNFZ4mrze_-3LqYdlQyEA/0/00000000000000000000-ASNFZ4mrze8BI0VniavN7w.log",
                id="other-prefix",
            ),
            pytest.param(
                "p/orders-ASNFZ4mrze_-3LqYdlQyEA/0/0-ASNFZ4mrze8BI0VniavN7w.log", id="short-offset"
            ),
            pytest.param(
                "p/orders-ASNFZ4mrze_-3LqYdlQyEA/0/00000000000000000000-ASNFZ4mrze8BI0VniavN7w.tmp",
                id="suffix",
            ),
            pytest.param("p/random-junk", id="junk"),
        ],
    )
    def test_foreign_keys_do_not_parse(self, key):
        """Keys the layout did not write are not mistaken for segment objects."""
        assert KeyLayout(prefix="p/").parse(key) is None

    def test_negative_offset_is_refused(self):
        """A negative base offset cannot name an object."""
        with pytest.raises(ValueError, match="base offset"):
            KeyLayout().segment_key(
                topic="t",
                topic_id=TOPIC_ID,
                partition=0,
                base_offset=-1,
                segment_id=SEGMENT_ID,
                suffix=ObjectSuffix.LOG,
            )
