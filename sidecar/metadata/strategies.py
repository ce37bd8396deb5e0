"""Hypothesis strategies for remote log metadata events, shared by the property tests of this
package and of its users (the store, the publisher) and by the cross-check against Kafka's serde.

Needs the ``test`` extra (hypothesis); ``sidecar.metadata`` does not import this module, and no
runtime code may. Values span the full Java field widths, not only realistic ones.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from hypothesis import strategies as st

from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    PublishableMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
)

__all__ = [
    "int32s",
    "int64s",
    "leader_epochs",
    "mutations",
    "partition_delete_metadata",
    "publishable_metadata",
    "remote_log_metadata",
    "remote_log_segment_ids",
    "segment_metadata",
    "segment_metadata_snapshots",
    "segment_metadata_updates",
    "topic_id_partitions",
    "topic_names",
    "uuids",
]

_START = RemoteLogSegmentState.COPY_SEGMENT_STARTED


def int32s() -> st.SearchStrategy[int]:
    """Any Java int."""
    return st.integers(-(2**31), 2**31 - 1)


def int64s() -> st.SearchStrategy[int]:
    """Any Java long."""
    return st.integers(-(2**63), 2**63 - 1)


def uuids() -> st.SearchStrategy[uuid.UUID]:
    """Any 128 bits, the nil UUID included (Kafka's ``Uuid`` is two arbitrary longs)."""
    return st.integers(0, 2**128 - 1).map(lambda n: uuid.UUID(int=n))


def topic_names() -> st.SearchStrategy[str]:
    """Kafka-legal topic names, and any short text (the wire format accepts every string)."""
    return st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True) | st.text(max_size=30)


def topic_id_partitions() -> st.SearchStrategy[TopicIdPartition]:
    """A topic id, name and partition, each over its full range."""
    return st.builds(TopicIdPartition, uuids(), topic_names(), int32s())


def remote_log_segment_ids() -> st.SearchStrategy[RemoteLogSegmentId]:
    """A partition plus a segment id."""
    return st.builds(RemoteLogSegmentId, topic_id_partitions(), uuids())


def leader_epochs() -> st.SearchStrategy[tuple[tuple[int, int], ...]]:
    """One to six ``(epoch, start offset)`` pairs, ascending by epoch."""
    return st.dictionaries(int32s(), int64s(), min_size=1, max_size=6).map(
        lambda epochs: tuple(sorted(epochs.items()))
    )


def _custom_metadata() -> st.SearchStrategy[bytes | None]:
    return st.none() | st.binary(max_size=64)


@st.composite
def _offsets(draw: st.DrawFn) -> tuple[int, int]:
    start = draw(st.integers(0, 2**63 - 1))
    return start, draw(st.integers(start, 2**63 - 1))


def segment_metadata(*, publishable: bool = True) -> st.SearchStrategy[SegmentMetadata]:
    """apiKey-0 events; only COPY_SEGMENT_STARTED when ``publishable``, else any state."""
    states = st.just(_START) if publishable else st.sampled_from(RemoteLogSegmentState)
    return st.builds(
        lambda offsets, **fields: SegmentMetadata(
            start_offset=offsets[0], end_offset=offsets[1], **fields
        ),
        _offsets(),
        segment_id=remote_log_segment_ids(),
        broker_id=int32s(),
        max_timestamp_ms=int64s(),
        event_timestamp_ms=int64s(),
        segment_leader_epochs=leader_epochs(),
        segment_size_in_bytes=int32s(),
        custom_metadata=_custom_metadata(),
        state=states,
        txn_index_empty=st.booleans(),
    )


def segment_metadata_updates(
    *, publishable: bool = True
) -> st.SearchStrategy[SegmentMetadataUpdate]:
    """apiKey-1 events; never COPY_SEGMENT_STARTED when ``publishable``, else any state."""
    states = st.sampled_from(
        [state for state in RemoteLogSegmentState if not publishable or state is not _START]
    )
    return st.builds(
        SegmentMetadataUpdate,
        segment_id=remote_log_segment_ids(),
        broker_id=int32s(),
        event_timestamp_ms=int64s(),
        custom_metadata=_custom_metadata(),
        state=states,
    )


def partition_delete_metadata() -> st.SearchStrategy[PartitionDeleteMetadata]:
    """apiKey-2 events in any state."""
    return st.builds(
        PartitionDeleteMetadata,
        topic_id_partition=topic_id_partitions(),
        broker_id=int32s(),
        event_timestamp_ms=int64s(),
        state=st.sampled_from(RemotePartitionDeleteState),
    )


def segment_metadata_snapshots() -> st.SearchStrategy[SegmentMetadataSnapshot]:
    """apiKey-3 events (decode only); Kafka does not check their offsets, so neither do these."""
    return st.builds(
        SegmentMetadataSnapshot,
        segment_id=uuids(),
        start_offset=int64s(),
        end_offset=int64s(),
        broker_id=int32s(),
        max_timestamp_ms=int64s(),
        event_timestamp_ms=int64s(),
        segment_leader_epochs=leader_epochs(),
        segment_size_in_bytes=int32s(),
        custom_metadata=_custom_metadata(),
        state=st.sampled_from(RemoteLogSegmentState),
        txn_index_empty=st.booleans(),
    )


def publishable_metadata() -> st.SearchStrategy[PublishableMetadata]:
    """Every event ``serde.encode`` accepts."""
    return st.one_of(segment_metadata(), segment_metadata_updates(), partition_delete_metadata())


def remote_log_metadata() -> st.SearchStrategy[RemoteLogMetadata]:
    """Every event ``serde.decode`` can return, the unpublishable ones included."""
    return st.one_of(
        segment_metadata(publishable=False),
        segment_metadata_updates(publishable=False),
        partition_delete_metadata(),
        segment_metadata_snapshots(),
    )


def mutations(values: Sequence[bytes], *, max_mutations: int = 4) -> st.SearchStrategy[bytes]:
    """One of ``values`` with one to ``max_mutations`` byte-level mutations: set or flip a byte,
    insert or delete a few bytes, truncate. For fuzzing decoders from valid input."""

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        value = bytearray(draw(st.sampled_from(values)))
        for _ in range(draw(st.integers(1, max_mutations))):
            kind = draw(st.sampled_from(["set", "flip", "insert", "delete", "truncate"]))
            at = draw(st.integers(0, len(value)))
            if kind == "set" and at < len(value):
                value[at] = draw(st.integers(0, 255))
            elif kind == "flip" and at < len(value):
                value[at] ^= 1 << draw(st.integers(0, 7))
            elif kind == "insert":
                value[at:at] = draw(st.binary(min_size=1, max_size=8))
            elif kind == "delete":
                del value[at : at + draw(st.integers(1, 8))]
            elif kind == "truncate":
                del value[at:]
        return bytes(value)

    return mutated()
