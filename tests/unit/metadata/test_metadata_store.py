"""RemoteSegmentStore: Kafka's RemoteLogMetadataCache rules (transitions, leader-epoch duplicates,
deletes, partition deletes), the queries built on them, persistence across a reopen, and a
property test against a line-by-line Python model of Kafka's cache."""

from __future__ import annotations

import importlib
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import sidecar.metadata
import sidecar.metadata.store as store_module
from sidecar.metadata import (
    MetadataStoreError,
    PartitionDeleteMetadata,
    RejectReason,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    RemoteSegmentStore,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    StoreCounters,
    TopicIdPartition,
    is_valid_segment_transition,
)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

TP = TopicIdPartition(uuid.UUID(int=0xA1), "orders", 0)
OTHER = TopicIdPartition(uuid.UUID(int=0xB2), "payments", 3)


def sid(n: int, tp: TopicIdPartition = TP) -> RemoteLogSegmentId:
    """Segment id number ``n`` of ``tp``."""
    return RemoteLogSegmentId(tp, uuid.UUID(int=n))


def started(
    n: int,
    start: int,
    end: int,
    epochs: tuple[tuple[int, int], ...] | None = None,
    *,
    tp: TopicIdPartition = TP,
    size: int = 100,
) -> SegmentMetadata:
    """COPY_SEGMENT_STARTED for segment ``n`` (one epoch, 0, unless given)."""
    return SegmentMetadata(
        segment_id=sid(n, tp),
        start_offset=start,
        end_offset=end,
        broker_id=1,
        max_timestamp_ms=1000 + end,
        event_timestamp_ms=5,
        segment_leader_epochs=epochs or ((0, start),),
        segment_size_in_bytes=size,
    )


def update(
    n: int,
    state: RemoteLogSegmentState,
    *,
    tp: TopicIdPartition = TP,
    broker_id: int = 1,
    custom: bytes | None = None,
) -> SegmentMetadataUpdate:
    """An update of segment ``n`` to ``state``."""
    return SegmentMetadataUpdate(
        segment_id=sid(n, tp),
        broker_id=broker_id,
        event_timestamp_ms=6,
        custom_metadata=custom,
        state=state,
    )


def copied(
    n: int, start: int, end: int, epochs=None, *, tp: TopicIdPartition = TP, size: int = 100
) -> list[RemoteLogMetadata]:
    """STARTED then FINISHED for segment ``n``."""
    return [started(n, start, end, epochs, tp=tp, size=size), update(n, FINISHED, tp=tp)]


def partition_delete(state: RemotePartitionDeleteState, tp=TP) -> PartitionDeleteMetadata:
    """A partition-delete event for ``tp``."""
    return PartitionDeleteMetadata(
        topic_id_partition=tp, broker_id=1, event_timestamp_ms=9, state=state
    )


def ids(segments) -> list[int]:
    """The segment numbers of segments or spans, in order."""
    return [getattr(s, "segment", s).segment_id.id.int for s in segments]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RemoteSegmentStore]:
    """An empty store in a temporary state dir."""
    with RemoteSegmentStore(tmp_path) as opened:
        yield opened


class TestTransitions:
    """Only Kafka's valid segment transitions apply; the rest are counted and reported."""

    def test_copy_then_delete(self, store):
        """STARTED, FINISHED, DELETE_STARTED are visible in turn; DELETE_FINISHED removes."""
        for event, state in [
            (started(1, 0, 9), STARTED),
            (update(1, FINISHED), FINISHED),
            (update(1, DELETE_STARTED), DELETE_STARTED),
        ]:
            result = store.apply([event])
            assert (result.applied, result.rejected) == (1, ())
            assert store.segment(sid(1)).state == state
        store.apply([update(1, DELETE_FINISHED)])
        assert store.segment(sid(1)) is None
        assert store.segments(TP) == []
        assert store.counters() == StoreCounters(applied=4)

    def test_update_takes_the_updates_fields(self, store):
        """An update replaces broker, event time and custom metadata, and keeps the rest."""
        store.apply([started(1, 10, 19, size=777), update(1, FINISHED, broker_id=3, custom=b"x")])
        segment = store.segment(sid(1))
        assert (segment.broker_id, segment.event_timestamp_ms, segment.custom_metadata) == (
            3,
            6,
            b"x",
        )
        assert (segment.start_offset, segment.end_offset, segment.segment_size_in_bytes) == (
            10,
            19,
            777,
        )
        assert segment.segment_leader_epochs == ((0, 10),)

    def test_repeats_are_idempotent(self, store):
        """A repeated STARTED or FINISHED (a retried publish) applies and changes nothing."""
        result = store.apply([started(1, 0, 9), started(1, 0, 9), *[update(1, FINISHED)] * 2])
        assert result.applied == 4
        assert [(s.segment_id, s.state) for s in store.segments(TP)] == [(sid(1), FINISHED)]

    @pytest.mark.parametrize(
        ("events", "reason", "detail", "state"),
        [
            pytest.param(
                [*copied(1, 0, 9), started(1, 0, 9)],
                RejectReason.INVALID_TRANSITION,
                "COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED",
                FINISHED,
                id="finished-to-started",
            ),
            pytest.param(
                [started(1, 0, 9), update(1, DELETE_FINISHED)],
                RejectReason.INVALID_TRANSITION,
                "COPY_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED",
                STARTED,
                id="started-to-delete-finished",
            ),
            pytest.param(
                [*copied(1, 0, 9), update(1, DELETE_STARTED), update(1, FINISHED)],
                RejectReason.INVALID_TRANSITION,
                "DELETE_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED",
                DELETE_STARTED,
                id="delete-started-to-finished",
            ),
            pytest.param(
                [started(1, 0, 9), update(1, STARTED)],
                RejectReason.WRONG_RECORD_TYPE,
                "apiKey 1 in COPY_SEGMENT_STARTED",
                STARTED,
                id="update-to-started",
            ),
            pytest.param(
                [
                    started(1, 0, 9),
                    SegmentMetadata(
                        segment_id=sid(1),
                        start_offset=0,
                        end_offset=9,
                        broker_id=1,
                        max_timestamp_ms=0,
                        event_timestamp_ms=0,
                        segment_leader_epochs=((0, 0),),
                        segment_size_in_bytes=1,
                        state=FINISHED,
                    ),
                ],
                RejectReason.WRONG_RECORD_TYPE,
                "apiKey 0 in COPY_SEGMENT_FINISHED",
                STARTED,
                id="segment-record-finished",
            ),
            pytest.param(
                [started(1, 0, 9), update(2, FINISHED)],
                RejectReason.UNKNOWN_SEGMENT,
                "no segment",
                STARTED,
                id="unknown-segment",
            ),
            pytest.param(
                [started(1, 0, 9), update(1, FINISHED, tp=OTHER)],
                RejectReason.UNKNOWN_SEGMENT,
                "no segment",
                STARTED,
                id="same-id-other-partition",
            ),
        ],
    )
    def test_invalid_events_are_dropped(self, store, events, reason, detail, state):
        """The last event is dropped: reported with its reason and counted; state is unchanged."""
        result = store.apply(events)
        assert result.applied == len(events) - 1
        (rejection,) = result.rejected
        assert (rejection.index, rejection.event, rejection.reason) == (
            len(events) - 1,
            events[-1],
            reason,
        )
        assert detail in rejection.detail
        assert store.segment(sid(1)).state == state
        counters = store.counters()
        assert getattr(counters, reason.value) == 1
        assert counters.rejected == 1

    def test_nothing_after_delete_finished(self, store):
        """After DELETE_SEGMENT_FINISHED the segment is gone: further updates are unknown."""
        events = [*copied(1, 0, 9), update(1, DELETE_STARTED), update(1, DELETE_FINISHED)]
        store.apply(events)
        result = store.apply([update(1, DELETE_FINISHED), update(1, FINISHED)])
        assert [r.reason for r in result.rejected] == [RejectReason.UNKNOWN_SEGMENT] * 2

    def test_snapshot_records_are_ignored(self, store):
        """apiKey-3 snapshot records change nothing and are counted."""
        snapshot = SegmentMetadataSnapshot(
            segment_id=uuid.UUID(int=1),
            start_offset=0,
            end_offset=9,
            broker_id=1,
            max_timestamp_ms=0,
            event_timestamp_ms=0,
            segment_leader_epochs=((0, 0),),
            segment_size_in_bytes=1,
            state=FINISHED,
        )
        result = store.apply([snapshot, snapshot])
        assert [r.reason for r in result.rejected] == [RejectReason.SNAPSHOT_RECORD] * 2
        assert store.counters() == StoreCounters(snapshot_record=2)
        assert store.partitions() == []


class TestLeaderEpochs:
    """FINISHED segments are indexed per leader epoch; re-uploads after a leader change win."""

    def test_reupload_after_leader_change_supersedes(self, store):
        """L0 copied 0-100 in epoch 0; L1 copies 0-200 (epochs 0 and 1): L1's copy serves 0-200."""
        store.apply(copied(1, 0, 100))
        store.apply(copied(2, 0, 200, ((0, 0), (1, 101))))
        assert ids([store.segment_for_offset(TP, 0, 50)]) == [2]
        assert ids([store.segment_for_offset(TP, 1, 150)]) == [2]
        # the superseded copy is still listed (it must be deleted some day), not served
        assert ids(store.segments(TP, leader_epoch=0)) == [1, 2]
        assert ids(store.finished_lineage(TP, [(0, 0), (1, 101)])) == [2]
        assert store.highest_offset_for_epoch(TP, 0) == 100
        assert store.highest_offset_for_epoch(TP, 1) == 200

    def test_overlapping_reupload(self, store):
        """L0 copied 10-90, L1 copies 5-100 of the same epoch: offset 95 is served by L1's."""
        store.apply(copied(1, 10, 90))
        store.apply(copied(2, 5, 100))
        assert ids([store.segment_for_offset(TP, 0, 95)]) == [2]
        assert ids([store.segment_for_offset(TP, 0, 50)]) == [2]
        assert ids(store.finished_lineage(TP, [(0, 0)])) == [2]

    def test_shorter_reupload_takes_the_start_offset(self, store):
        """As in Kafka, a copy starting at the same offset replaces the entry even if shorter."""
        store.apply(copied(1, 0, 100))
        store.apply(copied(2, 0, 50))
        assert ids([store.segment_for_offset(TP, 0, 20)]) == [2]
        assert store.segment_for_offset(TP, 0, 70) is None
        assert store.highest_offset_for_epoch(TP, 0) == 100

    def test_later_overlap_splits_the_lineage(self, store):
        """A (0-100) then B (50-150): offsets 0-49 come from A and 50-150 from B, once each."""
        store.apply(copied(1, 0, 100))
        store.apply(copied(2, 50, 150))
        spans = store.finished_lineage(TP, [(0, 0)])
        assert [(s.segment.segment_id.id.int, s.start_offset, s.end_offset) for s in spans] == [
            (1, 0, 49),
            (2, 50, 150),
        ]

    def test_lineage_follows_the_leader_epoch_history(self, store):
        """Epochs outside the history (a diverged leader) are left out; spans are in order."""
        store.apply(copied(1, 0, 99, ((0, 0),)))
        store.apply(copied(2, 100, 199, ((1, 100),)))  # epoch 1 was truncated away
        store.apply(copied(3, 100, 149, ((2, 100),)))
        store.apply(copied(4, 150, 260, ((2, 150), (3, 200))))
        spans = store.finished_lineage(TP, [(0, 0), (2, 100), (3, 200)])
        assert [(s.segment.segment_id.id.int, s.start_offset, s.end_offset) for s in spans] == [
            (1, 0, 99),
            (3, 100, 149),
            (4, 150, 260),
        ]
        # without a history, the finished segments' own epochs give the same lineage
        assert ids(store.finished_lineage(TP)) == [1, 3, 4]
        assert store.finished_lineage(OTHER, [(0, 0)]) == []

    def test_lineage_rejects_unordered_epochs(self, store):
        """Leader epochs must ascend, with non-decreasing start offsets."""
        with pytest.raises(ValueError, match="ascending"):
            store.finished_lineage(TP, [(1, 0), (0, 10)])

    def test_highest_offset_survives_deletes(self, store):
        """highestOffsetForEpoch does not decrease when the segment is deleted (as in Kafka)."""
        store.apply([*copied(1, 0, 99), update(1, DELETE_STARTED), update(1, DELETE_FINISHED)])
        assert store.highest_offset_for_epoch(TP, 0) == 99
        assert store.highest_offset_for_epoch(TP, 1) is None
        assert store.segment_for_offset(TP, 0, 10) is None


class TestQueries:
    """What the uploader, retention and crash repair ask."""

    def test_unfinished_copies_and_deletes(self, store):
        """STARTED copies and DELETE_STARTED segments are listed, per partition or all."""
        store.apply([started(1, 0, 9), *copied(2, 10, 19), update(2, DELETE_STARTED)])
        store.apply([started(3, 0, 9, tp=OTHER)])
        assert ids(store.unfinished_copies()) == [1, 3]
        assert ids(store.unfinished_copies(TP)) == [1]
        assert store.unfinished_copies(OTHER)[0].segment_id == sid(3, OTHER)
        assert ids(store.unfinished_deletes()) == [2]
        assert store.unfinished_deletes(OTHER) == []

    def test_aborted_copy_can_be_deleted(self, store):
        """A STARTED copy goes straight to DELETE_SEGMENT_STARTED (crash repair)."""
        result = store.apply([started(1, 0, 9), update(1, DELETE_STARTED)])
        assert result.rejected == ()
        assert ids(store.unfinished_deletes()) == [1]

    def test_is_tiered(self, store):
        """Only a FINISHED segment with that start (and end, when given) counts as tiered."""
        store.apply([*copied(1, 0, 99), started(2, 100, 199)])
        assert store.is_tiered(TP, 0)
        assert store.is_tiered(TP, 0, 99)
        assert not store.is_tiered(TP, 0, 98)
        assert not store.is_tiered(TP, 100)
        assert not store.is_tiered(OTHER, 0)

    def test_segments_sorted_and_filtered(self, store):
        """segments() sorts by start offset and filters by state."""
        store.apply([*copied(2, 100, 199), started(1, 0, 99), *copied(3, 50, 60)])
        assert ids(store.segments(TP)) == [1, 3, 2]
        assert ids(store.segments(TP, states={FINISHED})) == [3, 2]
        assert store.segments(OTHER) == []

    def test_segment_count_is_the_live_segments_of_every_partition(self, store):
        store.apply([*copied(1, 0, 9), started(2, 10, 19), *copied(3, 20, 29)])
        store.apply([update(3, DELETE_STARTED), *copied(4, 0, 9, tp=OTHER)])
        store.apply([update(4, DELETE_STARTED, tp=OTHER), update(4, DELETE_FINISHED, tp=OTHER)])
        expected = sum(len(store.segments(tp)) for tp in store.partitions())
        assert store.segment_count() == expected == 3

    def test_remote_log_size(self, store):
        """Sizes of live segments, optionally of some states only."""
        store.apply([*copied(1, 0, 9, size=10), started(2, 10, 19, size=5)])
        assert store.remote_log_size(TP) == 15
        assert store.remote_log_size(TP, states={FINISHED}) == 10
        assert store.remote_log_size(TP, states=()) == 0
        assert store.remote_log_size(OTHER) == 0


class TestPartitionDelete:
    """Partition deletes are kept (latest) and FINISHED forgets the partition."""

    def test_latest_is_kept_and_finished_drops_the_partition(self, store):
        """MARKED, STARTED: each replaces the last; FINISHED drops every segment, the marker and
        the partition itself (the store holds the partitions that exist now)."""
        store.apply([*copied(1, 0, 9), *copied(2, 0, 9, tp=OTHER)])
        for state in (
            RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
            RemotePartitionDeleteState.DELETE_PARTITION_STARTED,
        ):
            store.apply([partition_delete(state)])
            assert store.partition_delete(TP).state == state
            assert store.partition_deletes() == {TP: store.partition_delete(TP)}  # OTHER: none
        store.apply([partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)])
        assert store.partition_delete(TP) is None
        assert store.partition_deletes() == {}
        assert store.partitions() == [OTHER]
        assert store.segments(TP) == []
        assert store.highest_offset_for_epoch(TP, 0) is None
        assert ids(store.segments(OTHER)) == [2]
        assert store.partition_delete(OTHER) is None

    def test_a_dropped_partition_id_is_not_served_for_another_partition(self, store):
        """The newest partition's id is given again after it is dropped: a partition looked up
        before the drop must not read the next partition's segments under that id."""
        third = TopicIdPartition(uuid.UUID(int=99), "third", 0)
        store.apply(copied(1, 0, 9))
        store.apply(copied(2, 0, 9, tp=OTHER))
        assert ids(store.segments(OTHER)) == [2]  # the reader knows OTHER's id
        store.apply([partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, OTHER)])
        store.apply(copied(3, 0, 9, tp=third))
        assert store.segments(OTHER) == []
        assert ids(store.segments(third)) == [3]
        assert sorted(store.partitions(), key=str) == sorted([TP, third], key=str)

    def test_forget_partition_only_when_nothing_is_left(self, store):
        """A partition whose topic was deleted segment by segment is dropped once no segment
        and no partition delete under way is left; a later event adds it again."""
        store.apply(copied(1, 0, 9))
        assert store.forget_partition(TP) is False  # a segment is left
        store.apply([update(1, DELETE_STARTED)])
        assert store.forget_partition(TP) is False
        store.apply([update(1, DELETE_FINISHED)])
        store.apply([partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_MARKED)])
        assert store.forget_partition(TP) is False  # a partition delete is under way
        store.apply([partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)])
        store.apply(copied(2, 0, 9, tp=OTHER))
        store.apply([update(2, DELETE_STARTED, tp=OTHER), update(2, DELETE_FINISHED, tp=OTHER)])
        assert store.highest_offset_for_epoch(OTHER, 0) == 9
        assert store.partitions() == [OTHER]
        assert store.forget_partition(OTHER) is True
        assert store.partitions() == []
        assert store.highest_offset_for_epoch(OTHER, 0) is None
        assert store.forget_partition(OTHER) is False  # already gone
        store.apply(copied(3, 0, 9, tp=OTHER))
        assert ids(store.segments(OTHER)) == [3]

    def test_a_forgotten_partition_keeps_no_version_and_never_shows_an_old_one(self, store):
        """The per-partition change versions do not grow with every topic created and
        deleted; a forgotten partition's version differs from every one it had, so no cache
        of it is taken for current."""
        store.apply(copied(1, 0, 9))
        store.apply([update(1, DELETE_STARTED), update(1, DELETE_FINISHED)])
        seen = store.partition_version(TP)
        assert store.forget_partition(TP) is True
        assert TP not in store._changes._versions
        assert store.partition_version(TP) != seen
        store.apply(copied(2, 0, 9))  # a later event adds it again
        assert store.partition_version(TP) not in (seen, 0)

    def test_transitions_are_not_validated(self, store):
        """Like Kafka's store, any partition-delete state is accepted in any order."""
        finished = partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)
        marked = partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_MARKED)
        assert store.apply([finished, marked]).rejected == ()
        assert store.partition_delete(TP) == marked


class TestScopes:
    """Which user partitions a metadata partition's events were applied for."""

    def test_read_whole_unless_a_scope_was_set(self, tmp_path):
        """A metadata partition with a consumed offset and no scope was read whole (stores
        from before scopes); one never read has none."""
        with RemoteSegmentStore(tmp_path) as store:
            store.apply(copied(1, 0, 100), consumed={3: 10})
            assert store.scopes() == {3: None}
            store.set_scope(4, frozenset({(TP.topic_id, 0)}))
            store.set_scope(3, None)
        with RemoteSegmentStore(tmp_path) as store:
            assert store.scopes() == {3: None, 4: frozenset({(TP.topic_id, 0)})}

    def test_a_scope_narrowed_to_nothing_stays_empty_after_a_reopen(self, tmp_path):
        """A metadata partition whose every partition was narrowed away keeps its consumed
        offset: after a restart its scope is still empty, not "read whole" (a partition
        wanted there later must have its history read again)."""
        with RemoteSegmentStore(tmp_path) as store:
            store.apply([*copied(1, 0, 9), *copied(2, 0, 9, tp=OTHER)], consumed={0: 41})
            store.set_scope(0, frozenset(), drop=[TP, OTHER])
            assert store.scopes() == {0: frozenset()}
        with RemoteSegmentStore(tmp_path) as store:
            assert store.consumed_offsets() == {0: 41}
            assert store.scopes() == {0: frozenset()}
            store.set_scope(0, frozenset({(TP.topic_id, TP.partition)}))  # wanted again
            assert store.scopes() == {0: frozenset({(TP.topic_id, TP.partition)})}

    def test_setting_a_scope_drops_the_partitions_given_whatever_their_state(self, tmp_path):
        with RemoteSegmentStore(tmp_path) as store:
            store.apply([*copied(1, 0, 100), started(2, 101, 200)], consumed={0: 2})
            store.apply(copied(3, 0, 50, tp=OTHER), consumed={0: 4})
            before = store.partition_version(TP)
            store.set_scope(0, frozenset({(OTHER.topic_id, OTHER.partition)}), drop=[TP])
            assert store.partitions() == [OTHER]
            assert store.segments(TP) == []
            assert store.partition_version(TP) != before  # caches of TP are stale
            assert ids(store.segments(OTHER)) == [3]
            assert store.consumed_offsets() == {0: 4}  # the reading position is kept
            assert store.scopes() == {0: frozenset({(OTHER.topic_id, OTHER.partition)})}


class TestTwoProcesses:
    """A read server alone opens the daemon's store too: it never serves one partition's
    segments under another's name, nor misses a partition read again, after the daemon
    dropped partitions (SQLite may give a dropped partition's id to the next new one)."""

    def test_a_dropped_partitions_id_given_to_another(self, tmp_path):
        third = TopicIdPartition(uuid.UUID(int=99), "third", 0)
        with RemoteSegmentStore(tmp_path) as daemon, RemoteSegmentStore(tmp_path) as reader:
            daemon.apply(copied(1, 0, 9))
            daemon.apply(copied(2, 0, 9, tp=OTHER))
            assert ids(reader.segments(OTHER)) == [2]  # the reader looked OTHER's id up
            daemon.apply(
                [partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, OTHER)]
            )
            daemon.apply(copied(3, 0, 9, tp=third))  # may get OTHER's id
            assert ids(reader.segments(OTHER)) == []
            assert ids(reader.segments(third)) == [3]

    def test_a_partition_read_again(self, tmp_path):
        with RemoteSegmentStore(tmp_path) as daemon, RemoteSegmentStore(tmp_path) as reader:
            daemon.apply(copied(1, 0, 9))
            daemon.apply(copied(2, 0, 9, tp=OTHER))
            assert ids(reader.segments(TP)) == [1]
            daemon.set_scope(0, frozenset(), drop=[TP])  # a re-read drops TP's state
            daemon.apply(copied(1, 0, 9))  # and reads it again: a new id
            assert ids(reader.segments(TP)) == [1]


class TestPersistence:
    """The state, the consumed offsets and the counters survive a reopen without replaying."""

    def test_reopen(self, tmp_path):
        """Close and reopen: same segments, epochs, offsets and counters."""
        with RemoteSegmentStore(tmp_path) as store:
            store.apply(copied(1, 0, 100), consumed={3: 10})
            store.apply(copied(2, 0, 200, ((0, 0), (1, 101))), consumed={3: 12, 4: 0})
            store.apply([update(9, FINISHED)], consumed={4: 1})
            before = (
                store.segments(TP),
                store.finished_lineage(TP, [(0, 0), (1, 101)]),
                store.highest_offset_for_epoch(TP, 1),
                store.counters(),
            )
        assert (tmp_path / "metadata.sqlite3").exists()
        with RemoteSegmentStore(tmp_path) as store:
            assert store.consumed_offsets() == {3: 12, 4: 1}
            assert store.consumed_offset(4) == 1
            assert store.consumed_offset(5) is None
            after = (
                store.segments(TP),
                store.finished_lineage(TP, [(0, 0), (1, 101)]),
                store.highest_offset_for_epoch(TP, 1),
                store.counters(),
            )
        assert after == before
        assert before[3] == StoreCounters(applied=4, unknown_segment=1)

    def test_open_applies_no_events(self, tmp_path, monkeypatch):
        """Opening reads the stored state, never events: the state machine is not called."""
        with RemoteSegmentStore(tmp_path) as store:
            store.apply(copied(1, 0, 9), consumed={0: 1})

        def forbidden(*args):
            raise AssertionError("an event was applied while opening")

        monkeypatch.setattr(store_module, "_apply_event", forbidden)
        with RemoteSegmentStore(tmp_path) as store:
            assert ids(store.segments(TP)) == [1]
            assert store.counters().applied == 2

    def test_wal_mode(self, store):
        """The store file is in WAL mode (readers never block the writer)."""
        with sqlite3.connect(store.path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.close()

    def test_batch_is_one_transaction(self, store):
        """A batch that fails half-way leaves no trace: no events, offsets or counters."""
        store.apply(copied(1, 0, 9), consumed={0: 1})
        with pytest.raises(TypeError):
            store.apply([update(1, DELETE_STARTED), "not an event"], consumed={0: 3})
        assert store.segment(sid(1)).state == FINISHED
        assert store.consumed_offsets() == {0: 1}
        assert store.counters() == StoreCounters(applied=2)
        store.apply([update(1, DELETE_STARTED)], consumed={0: 2})  # still usable
        assert store.segment(sid(1)).state == DELETE_STARTED

    def test_set_consumed(self, store):
        """Offsets can advance without events (a fetch of undecodable records)."""
        store.set_consumed({7: 41})
        assert store.consumed_offset(7) == 41

    def test_claim_topic(self, tmp_path):
        """A store follows one metadata topic; another one is refused."""
        with RemoteSegmentStore(tmp_path) as store:
            store.claim_topic("__remote_log_metadata")
            store.claim_topic("__remote_log_metadata")
        with RemoteSegmentStore(tmp_path) as store, pytest.raises(MetadataStoreError):
            store.claim_topic("other")

    def test_claim_topic_id(self, tmp_path):
        """A store follows one incarnation of its metadata topic: the same name re-created
        (a new topic id) is refused, since its offsets start again."""
        first, second = uuid.UUID(int=1), uuid.UUID(int=2)
        with RemoteSegmentStore(tmp_path) as store:
            store.claim_topic_id(first)
            store.claim_topic_id(first)
        with RemoteSegmentStore(tmp_path) as store:
            with pytest.raises(MetadataStoreError, match="deleted and re-created"):
                store.claim_topic_id(second)
            store.claim_topic_id(first)

    def test_closed_store_refuses_use(self, tmp_path):
        """After close (idempotent), every call raises MetadataStoreError."""
        store = RemoteSegmentStore(tmp_path)
        store.close()
        store.close()
        with pytest.raises(MetadataStoreError, match="closed"):
            store.segments(TP)
        with pytest.raises(MetadataStoreError, match="closed"):
            store.apply([])

    def test_unknown_schema_is_refused(self, tmp_path):
        """A store written by a newer schema is not opened."""
        RemoteSegmentStore(tmp_path).close()
        with sqlite3.connect(tmp_path / "metadata.sqlite3") as db:
            db.execute("PRAGMA user_version = 99")
        db.close()
        with pytest.raises(MetadataStoreError, match="schema version 99"):
            RemoteSegmentStore(tmp_path)

    def test_corrupt_file_is_refused(self, tmp_path):
        """A file that is not a SQLite database raises MetadataStoreError."""
        (tmp_path / "metadata.sqlite3").write_bytes(b"definitely not sqlite" * 100)
        with pytest.raises(MetadataStoreError, match="cannot open"):
            RemoteSegmentStore(tmp_path)


class TestRemoteFloor:
    """The offset below which remote data was deleted on purpose: it never goes down, it
    survives a reopen, and it is synced to disk before the delete it guards is published."""

    def test_never_lower_and_kept(self, tmp_path):
        with RemoteSegmentStore(tmp_path) as store:
            assert store.remote_floor(TP) is None
            assert store.raise_remote_floor(TP, 100) == 100
            assert store.raise_remote_floor(TP, 50) == 100
        with RemoteSegmentStore(tmp_path) as store:
            assert store.remote_floor(TP) == 100

    def test_written_with_a_full_sync(self, tmp_path):
        with RemoteSegmentStore(tmp_path) as store:
            statements: list[str] = []
            store._writer.db.set_trace_callback(statements.append)
            store.raise_remote_floor(TP, 100)
            store._writer.db.set_trace_callback(None)
            insert = next(i for i, s in enumerate(statements) if "remote_floor VALUES" in s)
            assert statements[insert - 1] == "PRAGMA synchronous = FULL"
            assert statements[insert + 1] == "PRAGMA synchronous = NORMAL"
            mode = store._writer.db.execute("PRAGMA synchronous").fetchone()[0]
            assert mode == 1  # NORMAL again for the batches of events


class TestDeletedPartitions:
    """Partitions dropped because they were deleted are remembered (for the orphan scrub) for
    a while, across reopens; those that only left a scope are not."""

    def test_a_finished_partition_delete_is_remembered_and_a_scope_drop_is_not(self, tmp_path):
        with RemoteSegmentStore(tmp_path) as store:
            store.apply(
                [
                    partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_MARKED),
                    partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_MARKED, OTHER),
                ]
            )
            store.set_scope(0, frozenset(), drop=[OTHER])
            assert store.deleted_partitions() == set()
            store.apply([partition_delete(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)])
            assert store.partitions() == []
        with RemoteSegmentStore(tmp_path) as store:
            assert store.deleted_partitions() == {(TP.topic_id, TP.partition)}

    def test_forgotten_after_a_month(self, tmp_path):
        with RemoteSegmentStore(tmp_path) as store:
            day = 24 * 3600 * 1000
            for tp, at in ((TP, 0), (OTHER, 31 * day)):
                store.apply([started(1, 0, 9, tp=tp), update(1, DELETE_STARTED, tp=tp)])
                store.apply([update(1, DELETE_FINISHED, tp=tp)])
                assert store.forget_partition(tp, now_ms=at)
            assert store.deleted_partitions() == {(OTHER.topic_id, OTHER.partition)}


class TestPublicSurface:
    """The store, publisher and tailer are part of the package surface, loaded lazily."""

    @pytest.mark.parametrize(
        "module",
        ["sidecar.metadata.store", "sidecar.metadata.publisher", "sidecar.metadata.tailer"],
    )
    def test_all_is_sorted_and_resolvable(self, module):
        """``__all__`` is sorted and every name in it exists."""
        imported = importlib.import_module(module)
        assert imported.__all__ == sorted(imported.__all__)
        assert [name for name in imported.__all__ if not hasattr(imported, name)] == []

    def test_package_reexports_every_module(self):
        """The package ``__all__`` is the union of its modules' (strategies excluded)."""
        modules = ("errors", "events", "partitioner", "serde", "store", "publisher", "tailer")
        names: set[str] = set()
        for module in modules:
            names |= set(importlib.import_module(f"sidecar.metadata.{module}").__all__)
        assert set(sidecar.metadata.__all__) == names
        assert sidecar.metadata.__all__ == sorted(sidecar.metadata.__all__)
        assert [name for name in names if not hasattr(sidecar.metadata, name)] == []

    def test_importing_the_package_does_not_load_aiokafka(self):
        """Only the publisher and tailer need aiokafka; they load on first use of their names."""
        code = (
            "import sys, sidecar.metadata as m; assert 'aiokafka' not in sys.modules;"
            " m.MetadataTailer; assert 'aiokafka' in sys.modules"
        )
        subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


# ---------------------------------------------------------------------------------------------
# A line-by-line model of Kafka's RemoteLogMetadataCache and RemoteLogLeaderEpochState (with its
# explicit unreferenced sets), to compare the store against.


@dataclass
class KafkaEpochState:
    """RemoteLogLeaderEpochState."""

    offset_to_id: dict[int, uuid.UUID] = field(default_factory=dict)
    unreferenced: set[uuid.UUID] = field(default_factory=set)
    highest: int | None = None

    def copy_finished(self, start: int, segment: uuid.UUID, epoch_end: int) -> None:
        """handleSegmentWithCopySegmentFinishedState."""
        while self.offset_to_id:
            last = max(self.offset_to_id)
            if not (last >= start and self.highest <= epoch_end):
                break
            self.unreferenced.add(self.offset_to_id.pop(last))
        old = self.offset_to_id.get(start)
        self.offset_to_id[start] = segment
        self.unreferenced.discard(segment)
        if old is not None:
            self.unreferenced.add(old)
        if self.highest is None or epoch_end > self.highest:
            self.highest = epoch_end

    def floor(self, offset: int) -> uuid.UUID | None:
        """offsetToId.floorEntry(offset)."""
        keys = [key for key in self.offset_to_id if key <= offset]
        return self.offset_to_id[max(keys)] if keys else None


@dataclass
class KafkaCache:
    """RemoteLogMetadataCache of one partition."""

    segments: dict[uuid.UUID, tuple[SegmentMetadata, RemoteLogSegmentState]] = field(
        default_factory=dict
    )
    epochs: dict[int, KafkaEpochState] = field(default_factory=dict)

    @staticmethod
    def epoch_end(metadata: SegmentMetadata, epoch: int) -> int:
        """highestOffsetForEpoch(epoch, segment)."""
        later = [start for e, start in metadata.segment_leader_epochs if e > epoch]
        return min(later) - 1 if later else metadata.end_offset

    def add(self, event: SegmentMetadata) -> RejectReason | None:
        """addCopyInProgressSegment."""
        if event.state is not STARTED:
            return RejectReason.WRONG_RECORD_TYPE
        existing = self.segments.get(event.segment_id.id)
        if not is_valid_segment_transition(existing and existing[1], STARTED):
            return RejectReason.INVALID_TRANSITION
        for epoch, _ in event.segment_leader_epochs:
            self.epochs.setdefault(epoch, KafkaEpochState()).unreferenced.add(event.segment_id.id)
        self.segments[event.segment_id.id] = (event, STARTED)
        return None

    def update(self, event: SegmentMetadataUpdate) -> RejectReason | None:
        """updateRemoteLogSegmentMetadata."""
        segment = event.segment_id.id
        if segment not in self.segments:
            return RejectReason.UNKNOWN_SEGMENT
        metadata, state = self.segments[segment]
        if not is_valid_segment_transition(state, event.state):
            return RejectReason.INVALID_TRANSITION
        if event.state is STARTED:
            return RejectReason.WRONG_RECORD_TYPE
        for epoch, start in metadata.segment_leader_epochs:
            epoch_state = self.epochs.setdefault(epoch, KafkaEpochState())
            if event.state is FINISHED:
                epoch_state.copy_finished(start, segment, self.epoch_end(metadata, epoch))
            elif event.state is DELETE_STARTED:
                if epoch_state.offset_to_id.get(start) == segment:
                    del epoch_state.offset_to_id[start]
                epoch_state.unreferenced.add(segment)
            else:
                epoch_state.unreferenced.discard(segment)
        if event.state is DELETE_FINISHED:
            del self.segments[segment]
        else:
            self.segments[segment] = (metadata, event.state)
        return None

    def lookup(self, epoch: int, offset: int) -> uuid.UUID | None:
        """remoteLogSegmentMetadata(epoch, offset)."""
        epoch_state = self.epochs.get(epoch)
        segment = None if epoch_state is None else epoch_state.floor(offset)
        if segment is None:
            return None
        metadata, _ = self.segments[segment]
        return segment if offset <= self.epoch_end(metadata, epoch) else None


EPOCHS = range(4)
SEGMENT_NUMBERS = range(1, 11)
PARTITIONS = (TP, OTHER)


@st.composite
def segment_shapes(draw: st.DrawFn) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """(start, end, epochs) of a small segment with one or two leader epochs."""
    # offsets on a coarse grid, so that copies often start or end together (re-uploads)
    start = draw(st.sampled_from(range(0, 41, 5)) | st.integers(0, 40))
    end = start + draw(st.sampled_from((4, 9, 14)) | st.integers(0, 15))
    first = draw(st.integers(0, 2))
    if end > start and draw(st.booleans()):
        second = draw(st.integers(first + 1, 3))
        return start, end, ((first, start), (second, draw(st.integers(start + 1, end))))
    return start, end, ((first, start),)


class StoreAgainstKafka(RuleBasedStateMachine):
    """Random event streams, applied in random batches, with reopens: the store answers as the
    Kafka model does."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = RemoteSegmentStore(self.tmp.name)
        self.model: dict[TopicIdPartition, KafkaCache] = {}
        self.deletes: dict[TopicIdPartition, PartitionDeleteMetadata] = {}
        self.pending: list[RemoteLogMetadata] = []
        self.expected: list[RejectReason | None] = []
        self.counters = dict.fromkeys(["applied", *(r.value for r in RejectReason)], 0)

    def teardown(self) -> None:
        self.store.close()
        self.tmp.cleanup()

    def _model_apply(self, event: RemoteLogMetadata) -> None:
        if isinstance(event, PartitionDeleteMetadata):
            self.deletes[event.topic_id_partition] = event
            if event.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                self.model.pop(event.topic_id_partition, None)
                self.deletes.pop(event.topic_id_partition)
            reason = None
        elif isinstance(event, SegmentMetadataSnapshot):
            reason = RejectReason.SNAPSHOT_RECORD
        elif isinstance(event, SegmentMetadataUpdate):
            cache = self.model.get(event.topic_id_partition)
            reason = RejectReason.UNKNOWN_SEGMENT if cache is None else cache.update(event)
        else:
            reason = self.model.setdefault(event.topic_id_partition, KafkaCache()).add(event)
        self.pending.append(event)
        self.expected.append(reason)
        self.counters["applied" if reason is None else reason.value] += 1

    def _new_segment(
        self, tp: TopicIdPartition, number: int, shape, state=STARTED
    ) -> SegmentMetadata:
        start, end, epochs = shape
        return SegmentMetadata(
            segment_id=sid(number, tp),
            start_offset=start,
            end_offset=end,
            broker_id=1,
            max_timestamp_ms=end,
            event_timestamp_ms=1,
            segment_leader_epochs=epochs,
            segment_size_in_bytes=end - start + 1,
            state=state,
        )

    def _segments_of(self, tp: TopicIdPartition) -> list[uuid.UUID]:
        cache = self.model.get(tp)
        return sorted(cache.segments) if cache is not None else []

    @rule(
        tp=st.sampled_from(PARTITIONS),
        copies=st.lists(
            st.tuples(st.sampled_from(SEGMENT_NUMBERS), segment_shapes(), st.booleans()),
            min_size=1,
            max_size=4,
        ),
    )
    def copy(self, tp, copies):
        """Copies: apiKey 0 (a retry re-sends the same metadata), then often FINISHED."""
        for number, shape, finish in copies:
            known = self.model.get(tp, KafkaCache()).segments.get(uuid.UUID(int=number))
            self._model_apply(known[0] if known else self._new_segment(tp, number, shape))
            if finish:
                self._model_apply(update(number, FINISHED, tp=tp))

    @rule(tp=st.sampled_from(PARTITIONS), number=st.sampled_from(SEGMENT_NUMBERS))
    def wrongly_typed_segment_record(self, tp, number):
        """apiKey 0 in COPY_SEGMENT_FINISHED."""
        self._model_apply(self._new_segment(tp, number, (0, 0, ((0, 0),)), FINISHED))

    @rule(data=st.data(), tp=st.sampled_from(PARTITIONS), count=st.integers(1, 4))
    def update_records(self, data, tp, count):
        """apiKey 1: mostly the next state of an existing segment, sometimes anything."""
        for _ in range(count):
            self._update_record(data, tp)

    def _update_record(self, data: st.DataObject, tp: TopicIdPartition) -> None:
        existing = self._segments_of(tp)
        if existing and data.draw(st.integers(0, 4)) > 0:
            segment = data.draw(st.sampled_from(existing))
            state = self.model[tp].segments[segment][1]
            following = {
                STARTED: [FINISHED, FINISHED, DELETE_STARTED],
                FINISHED: [DELETE_STARTED],
                DELETE_STARTED: [DELETE_FINISHED],
            }[state]
            state = data.draw(st.sampled_from([*following * 3, *RemoteLogSegmentState]))
            number = segment.int
        else:
            number = data.draw(st.sampled_from(SEGMENT_NUMBERS))
            state = data.draw(st.sampled_from(RemoteLogSegmentState))
        self._model_apply(update(number, state, tp=tp))

    @rule(
        tp=st.sampled_from(PARTITIONS),
        state=st.sampled_from(
            [RemotePartitionDeleteState.DELETE_PARTITION_MARKED] * 3
            + [RemotePartitionDeleteState.DELETE_PARTITION_STARTED] * 3
            + [RemotePartitionDeleteState.DELETE_PARTITION_FINISHED]
        ),
    )
    def partition_delete_record(self, tp, state):
        """apiKey 2 (rarely FINISHED, which forgets the partition)."""
        self._model_apply(partition_delete(state, tp))

    @rule()
    def snapshot_record(self):
        """apiKey 3."""
        self._model_apply(
            SegmentMetadataSnapshot(
                segment_id=uuid.UUID(int=1),
                start_offset=0,
                end_offset=0,
                broker_id=1,
                max_timestamp_ms=0,
                event_timestamp_ms=0,
                segment_leader_epochs=((0, 0),),
                segment_size_in_bytes=1,
                state=STARTED,
            )
        )

    @rule()
    def apply_batch(self):
        """The pending events go to the store in one transaction; it rejects what Kafka would."""
        result = self.store.apply(self.pending, consumed={0: len(self.pending)})
        rejected = {r.index: r.reason for r in result.rejected}
        assert [rejected.get(i) for i in range(len(self.pending))] == self.expected
        self.pending, self.expected = [], []

    @precondition(lambda self: not self.pending)
    @rule()
    def reopen(self):
        """Close and reopen the store."""
        self.store.close()
        self.store = RemoteSegmentStore(self.tmp.name)

    @precondition(lambda self: not self.pending)
    @rule(
        tp=st.sampled_from(PARTITIONS),
        lineage=st.lists(st.integers(0, 25), min_size=4, max_size=4).map(
            lambda steps: [(epoch, sum(steps[: epoch + 1]) - steps[0]) for epoch in EPOCHS]
        ),
    )
    def lineage_serves_like_kafka(self, tp, lineage):
        """Every offset in a lineage span is served by that span's segment in Kafka's lookup,
        and every offset Kafka can serve along the lineage is in a span."""
        spans = self.store.finished_lineage(tp, lineage)
        covered: dict[int, uuid.UUID] = {}
        last_end = -1
        for span in spans:
            assert last_end < span.start_offset <= span.end_offset
            assert span.segment.state is FINISHED
            last_end = span.end_offset
            for offset in range(span.start_offset, span.end_offset + 1):
                covered[offset] = span.segment.segment_id.id
        cache = self.model.get(tp, KafkaCache())
        for offset in range(60):
            epoch = max(e for e, start in lineage if start <= offset)
            assert covered.get(offset) == cache.lookup(epoch, offset), offset

    @precondition(lambda self: not self.pending)
    @rule(
        tp=st.sampled_from(PARTITIONS),
        lineage=st.lists(st.integers(0, 25), min_size=4, max_size=4).map(
            lambda steps: [(epoch, sum(steps[: epoch + 1]) - steps[0]) for epoch in EPOCHS]
        ),
        from_offset=st.integers(0, 60),
    )
    def coverage_from_an_offset_is_the_lineage_there(self, tp, lineage, from_offset):
        """Planning's coverage: the lineage's first span, then exactly the lineage's offsets
        from ``from_offset`` on."""
        spans = self.store.finished_lineage(tp, lineage)
        ranges = self.store.finished_coverage(tp, lineage, from_offset)
        full = {o for span in spans for o in range(span.start_offset, span.end_offset + 1)}
        part = {o for start, end in ranges for o in range(start, end + 1)}
        assert bool(spans) == bool(ranges)
        if spans:
            assert ranges[0][0] == spans[0].start_offset
        assert part <= full
        assert {o for o in full if o >= from_offset} == {o for o in part if o >= from_offset}

    @invariant()
    def same_answers_as_kafka(self):
        """Segments, per-epoch listings, highest offsets, lookups and counters agree."""
        if self.pending:
            return
        for tp in PARTITIONS:
            cache = self.model.get(tp, KafkaCache())
            assert {(s.segment_id.id, s.state) for s in self.store.segments(tp)} == {
                (segment, state) for segment, (_, state) in cache.segments.items()
            }
            for epoch in EPOCHS:
                state = cache.epochs.get(epoch, KafkaEpochState())
                listed = {s.segment_id.id for s in self.store.segments(tp, leader_epoch=epoch)}
                assert listed == set(state.offset_to_id.values()) | state.unreferenced
                assert self.store.highest_offset_for_epoch(tp, epoch) == state.highest
                for offset in range(0, 60, 4):
                    found = self.store.segment_for_offset(tp, epoch, offset)
                    expected = cache.lookup(epoch, offset)
                    assert (found and found.segment_id.id) == expected
            assert self.store.partition_delete(tp) == self.deletes.get(tp)
        assert self.store.counters() == StoreCounters(**self.counters)


StoreAgainstKafka.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class TestAgainstKafkasCache(StoreAgainstKafka.TestCase):
    """Property: the store applies random event streams exactly as Kafka's cache does."""
