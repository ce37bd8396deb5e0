"""Kafka's remote retention rules (RLMExpirationTask) as pure functions: time, size, log start
offset, lineage and the walk's stopping rule. Expected sets are written out by hand from the
segments' facts in each test."""

from __future__ import annotations

import uuid

import pytest

from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    TopicIdPartition,
)
from sidecar.retention.policy import (
    DeleteReason,
    PartitionFacts,
    filtered_lineage,
    is_within_lineage,
    only_local_bytes,
    plan_expiry,
)

TP = TopicIdPartition(uuid.UUID(int=7), "orders", 0)
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
NOW = 10_000_000


def seg(
    start: int,
    end: int,
    *,
    epochs: tuple[tuple[int, int], ...] | None = None,
    ts: int = NOW,
    size: int = 100,
    state: RemoteLogSegmentState = FINISHED,
) -> SegmentMetadata:
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(TP, uuid.uuid4()),
        start_offset=start,
        end_offset=end,
        broker_id=1,
        max_timestamp_ms=ts,
        event_timestamp_ms=NOW,
        segment_leader_epochs=epochs or ((0, start),),
        segment_size_in_bytes=size,
        state=state,
    )


def facts(**kw: object) -> PartitionFacts:
    base: dict[str, object] = {
        "lineage": [(0, 0)],
        "log_start_offset": 0,
        "log_end_offset": 10_000,
        "only_local_bytes": 0,
        "retention_ms": -1,
        "retention_bytes": -1,
        "now_ms": NOW,
    }
    base.update(kw)
    return PartitionFacts(**base)  # type: ignore[arg-type]


def chosen(plan, segments) -> list[tuple[int, DeleteReason]]:
    index = {s.segment_id: i for i, s in enumerate(segments)}
    return sorted((index[e.segment.segment_id], e.reason) for e in plan.deletions)


class TestLineage:
    """buildFilteredLeaderEpochMap and isRemoteSegmentWithinLeaderEpochs."""

    def test_epochs_without_records_are_dropped(self):
        assert filtered_lineage([(0, 0), (1, 10), (2, 10), (3, 20)]) == [(0, 0), (2, 10), (3, 20)]

    def test_kafka_overlap_example(self):
        # RemoteLogManager's comment: cache {(5,10),(7,15),(9,100)}; after segment1 went the cache
        # is {(7,51),(9,100)} and segment2 {(5,14),(7,15),(9,100)} ending at 150 stays valid
        lineage = [(7, 51), (9, 100)]
        segment2 = seg(14, 150, epochs=((5, 14), (7, 15), (9, 100)))
        assert is_within_lineage(segment2, 200, lineage)
        assert not is_within_lineage(segment2, 150, lineage)  # must end below the LEO

    @pytest.mark.parametrize(
        ("epochs", "end", "valid"),
        [
            pytest.param(((0, 0),), 99, True, id="first-epoch"),
            pytest.param(((0, 0), (1, 100)), 199, True, id="two-epochs"),
            pytest.param(((0, 0),), 120, False, id="past-the-epoch-end"),
            pytest.param(((3, 0),), 50, False, id="epoch-above-lineage"),
            pytest.param(((0, 0), (2, 100)), 150, False, id="epoch-not-in-lineage"),
            pytest.param(((1, 90),), 150, False, id="starts-before-its-epoch"),
            pytest.param(((0, 0), (1, 90)), 150, False, id="next-entry-differs"),
        ],
    )
    def test_within_lineage(self, epochs, end, valid):
        lineage = [(0, 0), (1, 100), (2, 200)]
        start = epochs[0][1]
        assert is_within_lineage(seg(start, end, epochs=epochs), 1000, lineage) is valid

    def test_only_local_bytes(self):
        assert only_local_bytes([(0, 10), (100, 20), (200, 5)], 100) == 25
        assert only_local_bytes([(0, 10), (100, 20)], -1) == 30


class TestTime:
    """A segment is breached when its max timestamp is before now - retention.ms."""

    def test_prefix_is_deleted_and_the_walk_stops_at_the_first_kept(self):
        segments = [
            seg(0, 99, ts=NOW - 5000),
            seg(100, 199, ts=NOW - 4001),
            seg(200, 299, ts=NOW - 1000),
            seg(300, 399, ts=NOW - 4500),  # old again, but after a kept segment
        ]
        plan = plan_expiry(segments, facts(retention_ms=4000))
        assert chosen(plan, segments) == [
            (0, DeleteReason.RETENTION_MS),
            (1, DeleteReason.RETENTION_MS),
        ]
        assert plan.new_log_start_offset == 200

    def test_forever_deletes_nothing(self):
        segments = [seg(0, 99, ts=0)]
        assert plan_expiry(segments, facts()).deletions == ()


class TestSize:
    """local-only + remote bytes over retention.bytes, consumed oldest first while >= 0."""

    def test_breach_consumed_segment_by_segment(self):
        segments = [seg(i * 100, i * 100 + 99, size=100) for i in range(5)]
        # total = 50 local + 500 remote = 550; retention 300 -> breach 250: two segments
        plan = plan_expiry(segments, facts(retention_bytes=300, only_local_bytes=50))
        assert plan.breached_bytes == 250
        assert plan.remote_bytes == 500
        assert chosen(plan, segments) == [
            (0, DeleteReason.RETENTION_BYTES),
            (1, DeleteReason.RETENTION_BYTES),
        ]

    def test_exact_fit(self):
        segments = [seg(i * 100, i * 100 + 99, size=100) for i in range(3)]
        plan = plan_expiry(segments, facts(retention_bytes=100, only_local_bytes=0))
        assert [r for _, r in chosen(plan, segments)] == [DeleteReason.RETENTION_BYTES] * 2

    def test_time_deletions_count_against_the_size_breach(self):
        # Kafka: remainingBreachedSize -= size for each segment deleted by time. Breach 200
        # (500 bytes, retention.bytes 300): the two expired segments free it, the rest stays
        segments = [seg(i * 100, i * 100 + 99, size=100, ts=NOW) for i in range(5)]
        segments[0] = seg(0, 99, size=100, ts=0)
        segments[1] = seg(100, 199, size=100, ts=0)
        plan = plan_expiry(segments, facts(retention_ms=1000, retention_bytes=300))
        assert chosen(plan, segments) == [
            (0, DeleteReason.RETENTION_MS),
            (1, DeleteReason.RETENTION_MS),
        ]
        assert plan.new_log_start_offset == 200

    def test_a_segment_at_the_time_cutoff_is_kept(self):
        # Kafka deletes only segments whose max timestamp is below now - retention.ms
        segments = [seg(0, 99, ts=NOW - 1000), seg(100, 199, ts=NOW - 1001)]
        plan = plan_expiry(segments, facts(retention_ms=1000))
        assert chosen(plan, segments) == []
        segments = [seg(0, 99, ts=NOW - 1001), seg(100, 199, ts=NOW - 1000)]
        plan = plan_expiry(segments, facts(retention_ms=1000))
        assert chosen(plan, segments) == [(0, DeleteReason.RETENTION_MS)]

    def test_time_wins_over_size(self):
        segments = [seg(0, 99, ts=0, size=100), seg(100, 199, size=100)]
        plan = plan_expiry(segments, facts(retention_ms=1000, retention_bytes=150))
        # time takes the first; the 50-byte breach is not enough for the 100-byte second
        assert chosen(plan, segments) == [(0, DeleteReason.RETENTION_MS)]


class TestLogStartOffset:
    """DeleteRecords (or the broker's own retention) moves the log start offset."""

    def test_segments_below_the_log_start_are_deleted(self):
        segments = [seg(0, 99), seg(100, 199), seg(200, 299)]
        plan = plan_expiry(segments, facts(log_start_offset=150, lineage=[(0, 150)]))
        assert chosen(plan, segments) == [(0, DeleteReason.LOG_START_OFFSET)]
        assert plan.new_log_start_offset is None


class TestWalk:
    """Unreferenced epochs, copies in flight and retried deletes."""

    def test_segments_of_epochs_below_the_lineage_are_deleted(self):
        segments = [seg(0, 99, epochs=((0, 0),)), seg(100, 199, epochs=((2, 100),))]
        plan = plan_expiry(segments, facts(lineage=[(2, 100)]))
        assert chosen(plan, segments) == [(0, DeleteReason.LINEAGE)]

    def test_a_copy_in_flight_stops_the_walk(self):
        segments = [
            seg(0, 99, ts=0),
            seg(100, 199, ts=0, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED),
            seg(200, 299, ts=0),
        ]
        plan = plan_expiry(segments, facts(retention_ms=10))
        assert chosen(plan, segments) == [(0, DeleteReason.RETENTION_MS)]

    def test_unfinished_deletes_are_retried(self):
        segments = [seg(0, 99, state=RemoteLogSegmentState.DELETE_SEGMENT_STARTED), seg(100, 199)]
        plan = plan_expiry(segments, facts())
        assert chosen(plan, segments) == [(0, DeleteReason.RETRY)]

    def test_invalid_segments_do_not_stop_the_walk(self):
        # a segment past the LEO is invalid (not deleted, not stopping); the next old one goes
        segments = [seg(0, 99, ts=0), seg(100, 299, ts=0), seg(100, 199, ts=0)]
        plan = plan_expiry(segments, facts(retention_ms=10, log_end_offset=250))
        got = {segments.index(e.segment) for e in plan.deletions}
        assert got == {0, 2}
