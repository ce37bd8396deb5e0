"""RemoteSegmentStore: the sidecar's local view of the remote segments, built from the events of
``__remote_log_metadata`` and kept in SQLite (``<state_dir>/metadata.sqlite3``, WAL mode) so that a
restart resumes where it stopped instead of replaying the topic from offset 0 as Kafka's
``TopicBasedRemoteLogMetadataManager`` does.

Events are applied exactly as Kafka's ``RemoteLogMetadataCache`` and ``RemoteLogLeaderEpochState``
apply them (kafka-kip405-internals.md §2.6; upstream
``storage/src/main/java/org/apache/kafka/server/log/remote/metadata/storage/``):

* only valid state transitions (``is_valid_segment_transition``); an apiKey-0 record must be in
  COPY_SEGMENT_STARTED and an apiKey-1 record must not be; an update for an unknown segment is
  dropped; apiKey-3 snapshot records are ignored. Each dropped event is counted by reason and
  returned to the caller in ``ApplyResult.rejected``; none is applied.
* per user partition and leader epoch, ``offsetToId`` (the COPY_SEGMENT_FINISHED segments keyed by
  the epoch's start offset in the segment) and ``highestLogOffset``. On COPY_SEGMENT_FINISHED the
  entries at or after the segment's epoch start are superseded (they become unreferenced) when the
  epoch's highest offset does not exceed the new segment's epoch end: a re-upload after a leader
  change wins. DELETE_SEGMENT_STARTED removes the segment's entries, DELETE_SEGMENT_FINISHED
  removes the segment. ``highestLogOffset`` never decreases.
* Kafka's ``unreferencedSegmentIds`` is not stored: for an epoch it is exactly the live segments
  that carry the epoch and are not in its ``offsetToId``, so listing by epoch reads the segments.
* partition deletes are not validated (as in Kafka); the latest one is kept, and
  DELETE_PARTITION_FINISHED drops the partition: its segments, epoch state, remote floor, delete
  marker and the partition row itself (``partitions`` no longer lists it), so the store holds the
  partitions that exist now. ``forget_partition`` drops a partition left without segments after
  its topic was deleted (topic deletion goes segment by segment and never finishes a partition
  delete).

Layout: ``_apply_event`` is the state machine, written against the small ``_StateAccess`` protocol
and free of SQL; ``_Writer`` implements that protocol over the writer connection with a per-batch
write-back overlay, so a batch of events costs a few statements per event and one transaction.
Queries run on a second, read-only connection and see committed batches only (WAL readers).
Opening reads no events: only the schema version, the consumed offsets and the counters.

The store is synchronous and never awaits; it is safe to call from one writer thread (the tailer
applies batches through ``asyncio.to_thread``) while other threads or the event loop query it.
Durability: ``synchronous=NORMAL`` in WAL mode survives a process crash; after a power loss the
last batches may be lost together with their consumed offsets, so they are simply read again.
The remote floor, which is on no topic, is written with ``synchronous=FULL``.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import sqlite3
import struct
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final, Protocol, Self, TypeVar

from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.metadata.errors import MetadataStoreError
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
    is_valid_segment_transition,
)

__all__ = [
    "ApplyResult",
    "RejectReason",
    "Rejection",
    "RemoteSegmentStore",
    "SegmentSpan",
    "StoreCounters",
]

#: the store's file inside the sidecar's state dir
STORE_FILE_NAME: Final = "metadata.sqlite3"
#: the states a stored segment can be in (DELETE_SEGMENT_FINISHED segments are removed)
LIVE_STATES: Final = frozenset(
    {
        RemoteLogSegmentState.COPY_SEGMENT_STARTED,
        RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
    }
)
#: ``RemoteLogLeaderEpochState`` / Kafka's NO_PARTITION_LEADER_EPOCH

_STATES: Final = tuple(RemoteLogSegmentState)  # by id
_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

# One (leader epoch, start offset) pair of a segment's epoch map, as stored in ``segment.epochs``.
_EPOCH_ENTRY = struct.Struct(
    ">"
    "i"  # leader epoch
    "q"  # the epoch's first offset in the segment
)


class RejectReason(enum.StrEnum):
    """Why an event was not applied (also the counter names)."""

    #: the segment's state cannot go to the event's state (Kafka: "Dropping the event")
    INVALID_TRANSITION = "invalid_transition"
    #: an update for a segment the store does not have (Kafka: RemoteResourceNotFoundException)
    UNKNOWN_SEGMENT = "unknown_segment"
    #: apiKey 0 not in COPY_SEGMENT_STARTED, or apiKey 1 in it (Kafka: IllegalArgumentException)
    WRONG_RECORD_TYPE = "wrong_record_type"
    #: an apiKey-3 snapshot record, which only ever belonged in a broker's local snapshot file
    SNAPSHOT_RECORD = "snapshot_record"


@dataclass(frozen=True, slots=True)
class Rejection:
    """One event of a batch that was not applied."""

    #: its position in the batch given to ``apply``
    index: int
    event: RemoteLogMetadata
    reason: RejectReason
    #: e.g. ``COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED``
    detail: str


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one ``apply`` call did."""

    #: events applied (idempotent repeats included)
    applied: int
    rejected: tuple[Rejection, ...]


@dataclass(frozen=True, slots=True)
class StoreCounters:
    """Events applied and dropped since the store was created (persisted with the state)."""

    applied: int = 0
    invalid_transition: int = 0
    unknown_segment: int = 0
    wrong_record_type: int = 0
    snapshot_record: int = 0

    @property
    def rejected(self) -> int:
        """All dropped events, snapshot records included."""
        return (
            self.invalid_transition
            + self.unknown_segment
            + self.wrong_record_type
            + self.snapshot_record
        )


@dataclass(frozen=True, slots=True)
class SegmentSpan:
    """The offsets a lineage reads from one COPY_SEGMENT_FINISHED segment: ``start_offset`` to
    ``end_offset`` inclusive, a sub-range of the segment when another segment overlaps it."""

    segment: SegmentMetadata
    start_offset: int
    end_offset: int


# ---------------------------------------------------------------------------------------------
# the state machine (pure: no SQL, no I/O)


@dataclass(slots=True)
class _Row:
    """A stored segment: its metadata as of the latest applied event."""

    sid: bytes
    pid: int
    start: int
    end: int
    state: RemoteLogSegmentState
    epochs: tuple[tuple[int, int], ...]
    size: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    custom_metadata: bytes | None
    txn_index_empty: bool

    def epoch_ends(self) -> list[tuple[int, int, int]]:
        """``(epoch, its start offset, its end offset)`` within the segment, like Kafka's
        ``highestOffsetForEpoch(epoch, segment)``: the next epoch's start - 1, or the end."""
        epochs = self.epochs
        ends = [start - 1 for _epoch, start in epochs[1:]]
        ends.append(self.end)
        return [(epoch, start, end) for (epoch, start), end in zip(epochs, ends, strict=True)]


class _StateAccess(Protocol):
    """What the state machine reads and writes; ``pid`` is a user partition's store id."""

    def pid(self, tp: TopicIdPartition) -> int | None: ...
    def add_partition(self, tp: TopicIdPartition) -> int: ...
    def segment(self, pid: int, sid: bytes) -> _Row | None: ...
    def put_segment(self, row: _Row) -> None: ...
    def remove_segment(self, row: _Row) -> None: ...
    def highest(self, pid: int, epoch: int) -> int | None: ...
    def set_highest(self, pid: int, epoch: int, offset: int) -> None: ...
    def entry(self, pid: int, epoch: int, start: int) -> bytes | None: ...
    def entries_from(self, pid: int, epoch: int, start: int) -> list[int]: ...
    def set_entry(self, pid: int, epoch: int, start: int, sid: bytes | None) -> None: ...
    def put_partition_delete(self, pid: int, event: PartitionDeleteMetadata) -> None: ...
    def drop_partition(self, pid: int, *, deleted_ms: int | None = None) -> None: ...


_Verdict = tuple[RejectReason, str] | None


def _apply_event(state: _StateAccess, event: RemoteLogMetadata) -> _Verdict:
    """Apply one event as Kafka's ``RemotePartitionMetadataStore`` would; return why not, if not."""
    if isinstance(event, SegmentMetadataUpdate):
        return _apply_update(state, event)
    if isinstance(event, SegmentMetadata):
        return _apply_copy_started(state, event)
    if isinstance(event, PartitionDeleteMetadata):
        pid = state.add_partition(event.topic_id_partition)
        state.put_partition_delete(pid, event)
        if event.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            state.drop_partition(pid, deleted_ms=event.event_timestamp_ms)
        return None
    if isinstance(event, SegmentMetadataSnapshot):
        return RejectReason.SNAPSHOT_RECORD, "apiKey 3 is not a topic record"
    raise TypeError(f"not a remote log metadata event: {type(event).__name__}")


def _apply_copy_started(state: _StateAccess, event: SegmentMetadata) -> _Verdict:
    """``RemoteLogMetadataCache.addCopyInProgressSegment``."""
    if event.state is not _STARTED:
        return RejectReason.WRONG_RECORD_TYPE, f"apiKey 0 in {event.state.name}"
    pid = state.add_partition(event.topic_id_partition)
    sid = event.segment_id.id.bytes
    existing = state.segment(pid, sid)
    source = None if existing is None else existing.state
    if not is_valid_segment_transition(source, _STARTED):
        return RejectReason.INVALID_TRANSITION, f"{_name(source)} -> {_STARTED.name}"
    # A repeated COPY_SEGMENT_STARTED replaces the metadata, as Kafka's idToSegmentMetadata.put
    # does. Unreferenced per epoch is derived, so there is nothing else to record.
    state.put_segment(
        _Row(
            sid=sid,
            pid=pid,
            start=event.start_offset,
            end=event.end_offset,
            state=_STARTED,
            epochs=event.segment_leader_epochs,
            size=event.segment_size_in_bytes,
            max_timestamp_ms=event.max_timestamp_ms,
            broker_id=event.broker_id,
            event_timestamp_ms=event.event_timestamp_ms,
            custom_metadata=event.custom_metadata,
            txn_index_empty=event.txn_index_empty,
        )
    )
    return None


def _apply_update(state: _StateAccess, event: SegmentMetadataUpdate) -> _Verdict:
    """``RemoteLogMetadataCache.updateRemoteLogSegmentMetadata``."""
    target = event.state
    pid = state.pid(event.topic_id_partition)
    row = None if pid is None else state.segment(pid, event.segment_id.id.bytes)
    # Kafka's order of checks: the segment exists, the transition is valid, the record type fits.
    if row is None:
        return RejectReason.UNKNOWN_SEGMENT, f"no segment {event.segment_id}"
    source = row.state
    if not is_valid_segment_transition(source, target):
        return RejectReason.INVALID_TRANSITION, f"{source.name} -> {target.name}"
    if target is _STARTED:
        return RejectReason.WRONG_RECORD_TYPE, "apiKey 1 in COPY_SEGMENT_STARTED"
    # RemoteLogSegmentMetadata.createWithUpdates: the update's broker, time, custom metadata, state
    row.state = target
    row.broker_id = event.broker_id
    row.event_timestamp_ms = event.event_timestamp_ms
    row.custom_metadata = event.custom_metadata
    if target is _FINISHED:
        for epoch, start, epoch_end in row.epoch_ends():
            _copy_finished_in_epoch(state, row, epoch, start, epoch_end)
        state.put_segment(row)
    elif target is _DELETE_STARTED:
        for epoch, start in row.epochs:
            # offsetToId.remove(startOffset, id): only while the entry is still this segment
            if state.entry(row.pid, epoch, start) == row.sid:
                state.set_entry(row.pid, epoch, start, None)
        state.put_segment(row)
    else:  # DELETE_SEGMENT_FINISHED: Kafka forgets the segment entirely
        state.remove_segment(row)
    return None


def _copy_finished_in_epoch(
    state: _StateAccess, row: _Row, epoch: int, start: int, epoch_end: int
) -> None:
    """``RemoteLogLeaderEpochState.handleSegmentWithCopySegmentFinishedState``."""
    highest = state.highest(row.pid, epoch)
    # Duplicates from a leader change: entries at or after this start are superseded while the
    # epoch's highest offset is within this segment's epoch range. (An entry's start never
    # exceeds the highest offset, so there is nothing to look for when highest < start.)
    if highest is not None and start <= highest <= epoch_end:
        for key in state.entries_from(row.pid, epoch, start):
            state.set_entry(row.pid, epoch, key, None)
    # A different segment at the same start is replaced (and becomes unreferenced).
    state.set_entry(row.pid, epoch, start, row.sid)
    if highest is None or epoch_end > highest:
        state.set_highest(row.pid, epoch, epoch_end)


def _name(state: RemoteLogSegmentState | None) -> str:
    return "no segment" if state is None else state.name


# ---------------------------------------------------------------------------------------------
# persistence

_SCHEMA_VERSION: Final = 1
#: meta key prefix of :meth:`RemoteSegmentStore.record_history_gap`
_HISTORY_GAP: Final = "history_gap:"

_SCHEMA: Final = """
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
-- user partitions (TopicIdPartition: Kafka compares topic id, name and partition)
CREATE TABLE partition (
    pid INTEGER PRIMARY KEY,
    topic_id BLOB NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    UNIQUE (topic_id, partition, topic)
);
-- live segments (RemoteLogMetadataCache.idToSegmentMetadata), as of their latest event
CREATE TABLE segment (
    sid BLOB NOT NULL,
    pid INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    state INTEGER NOT NULL,
    epochs BLOB NOT NULL,
    size INTEGER NOT NULL,
    max_timestamp_ms INTEGER NOT NULL,
    broker_id INTEGER NOT NULL,
    event_timestamp_ms INTEGER NOT NULL,
    custom_metadata BLOB,
    txn_index_empty INTEGER NOT NULL,
    PRIMARY KEY (pid, start_offset, sid)
) WITHOUT ROWID;
CREATE UNIQUE INDEX segment_by_id ON segment (sid, pid);
CREATE INDEX segment_unfinished ON segment (state, pid) WHERE state <> 1;
-- RemoteLogLeaderEpochState.offsetToId per user partition and leader epoch
CREATE TABLE epoch_entry (
    pid INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    sid BLOB NOT NULL,
    PRIMARY KEY (pid, epoch, start_offset)
) WITHOUT ROWID;
-- RemoteLogLeaderEpochState.highestLogOffset
CREATE TABLE epoch_highest (
    pid INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    highest_offset INTEGER NOT NULL,
    PRIMARY KEY (pid, epoch)
) WITHOUT ROWID;
-- the latest RemotePartitionDeleteMetadata per user partition
CREATE TABLE partition_delete (
    pid INTEGER PRIMARY KEY,
    broker_id INTEGER NOT NULL,
    event_timestamp_ms INTEGER NOT NULL,
    state INTEGER NOT NULL
);
-- the last offset applied per metadata-topic partition
CREATE TABLE consumed (
    metadata_partition INTEGER PRIMARY KEY,
    last_offset INTEGER NOT NULL
);
CREATE TABLE counter (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
"""
# The sidecar's own knowledge, not the topic's: per user partition, the offset below which
# remote data was deleted on purpose (remote retention, DeleteRecords). Tiering never uploads
# below it again; above it, any range the lineage's FINISHED copies do not cover is a hole.
_REMOTE_FLOOR_TABLE: Final = """
CREATE TABLE IF NOT EXISTS remote_floor (
    topic_id BLOB NOT NULL,
    partition INTEGER NOT NULL,
    floor_offset INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID
"""
# The sidecar's own knowledge too: user partitions dropped because they were deleted from the
# cluster (DELETE_PARTITION_FINISHED, or forgotten after their topic's deletion), not because
# they left a scope. Objects written under such a partition after its deletion (a copy that
# raced it) are the cluster's own garbage, which the orphan scrub may delete.
_DELETED_PARTITION_TABLE: Final = """
CREATE TABLE IF NOT EXISTS deleted_partition (
    topic_id BLOB NOT NULL,
    partition INTEGER NOT NULL,
    deleted_ms INTEGER NOT NULL,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID
"""
#: how long a deleted partition is remembered: objects a copy wrote after the deletion appear
#: within minutes, and the scrub removes them once past its grace period (a day by default)
DELETED_PARTITION_MEMORY_MS: Final = 30 * 24 * 3600 * 1000
# Which user partitions' events the store applies, per metadata partition (selective tailing:
# a sidecar keeps only its broker's partitions). A row with an empty topic id and partition -1
# means every user partition; a metadata partition without rows that has a consumed offset was
# read whole (stores from before scopes, and sidecars that read everything).
_SCOPE_TABLE: Final = """
CREATE TABLE IF NOT EXISTS scope (
    metadata_partition INTEGER NOT NULL,
    topic_id BLOB NOT NULL,
    partition INTEGER NOT NULL,
    PRIMARY KEY (metadata_partition, topic_id, partition)
) WITHOUT ROWID
"""
#: a metadata partition's scope: the (topic id, partition) pairs whose events are applied, or
#: None for every user partition
Scope = frozenset[tuple[uuid.UUID, int]] | None
_ALL_ROW: Final = (b"", -1)
#: the row of a scope that keeps no partition (narrowed to nothing): without it, a metadata
#: partition with a consumed offset and no rows reads as read whole (stores from before
#: scopes), and a partition wanted there later would not have its history read again
_NONE_ROW: Final = (b"", -2)
_SEGMENT_COLUMNS: Final = (
    "sid, pid, start_offset, end_offset, state, epochs, size, max_timestamp_ms, broker_id,"
    " event_timestamp_ms, custom_metadata, txn_index_empty"
)
# The queries below interpolate module constants only (never input): hence the S608 waivers.
_SELECT_SEGMENTS: Final = f"SELECT {_SEGMENT_COLUMNS} FROM segment"  # noqa: S608
_SELECT_SEGMENTS_WITH_PARTITION: Final = (
    f"SELECT {', '.join('s.' + column.strip() for column in _SEGMENT_COLUMNS.split(','))},"  # noqa: S608
    " p.topic_id, p.topic, p.partition FROM segment s JOIN partition p USING (pid)"
)
#: Kafka's ``offsetToId.floorEntry(offset)`` of one epoch; parameters pid, epoch, offset
_FLOOR_ENTRY: Final = (
    "(SELECT sid FROM epoch_entry WHERE pid = ? AND epoch = ? AND start_offset <= ?"
    " ORDER BY start_offset DESC LIMIT 1)"
)
_UPSERT_SEGMENT: Final = (
    f"INSERT INTO segment ({_SEGMENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"  # noqa: S608
    " ON CONFLICT (sid, pid) DO UPDATE SET start_offset = excluded.start_offset,"
    " end_offset = excluded.end_offset, state = excluded.state, epochs = excluded.epochs,"
    " size = excluded.size, max_timestamp_ms = excluded.max_timestamp_ms,"
    " broker_id = excluded.broker_id, event_timestamp_ms = excluded.event_timestamp_ms,"
    " custom_metadata = excluded.custom_metadata, txn_index_empty = excluded.txn_index_empty"
)
_COUNTER_NAMES: Final = ("applied", *(reason.value for reason in RejectReason))
_T = TypeVar("_T")
_SegmentTuple = tuple[bytes, int, int, int, int, bytes, int, int, int, int, bytes | None, int]


def _pack_epochs(epochs: tuple[tuple[int, int], ...]) -> bytes:
    return b"".join(_EPOCH_ENTRY.pack(epoch, start) for epoch, start in epochs)


def _unpack_epochs(blob: bytes) -> tuple[tuple[int, int], ...]:
    return tuple(_EPOCH_ENTRY.iter_unpack(blob))


def _row_values(row: _Row) -> _SegmentTuple:
    return (
        row.sid,
        row.pid,
        row.start,
        row.end,
        row.state,
        _pack_epochs(row.epochs),
        row.size,
        row.max_timestamp_ms,
        row.broker_id,
        row.event_timestamp_ms,
        row.custom_metadata,
        int(row.txn_index_empty),
    )


def _row_from(values: _SegmentTuple) -> _Row:
    sid, pid, start, end, state, epochs, size, max_ts, broker, event_ts, custom, txn = values
    epoch_map = _unpack_epochs(epochs)
    return _Row(
        sid, pid, start, end, _STATES[state], epoch_map, size, max_ts, broker, event_ts, custom,
        bool(txn),
    )  # fmt: skip


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=64)
    db.execute("PRAGMA busy_timeout = 5000")
    return db


class _Writer:
    """``_StateAccess`` over the writer connection, for one batch (transaction) at a time.

    Per kind (segments, epoch entries, epoch highest offsets) it keeps the values known in this
    batch, read or written, and the keys written; ``flush`` writes those with ``executemany``.
    ``prefetch`` loads what a batch of events will read with a few ``IN`` queries, so a batch
    costs a handful of statements rather than several per event.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._pids: dict[TopicIdPartition, int] = {}  # committed ids, kept across batches
        self._new_pids: dict[TopicIdPartition, int] = {}  # ids created in this batch
        self._segments: dict[tuple[bytes, int], _Row | None] = {}
        self._dirty_segments: set[tuple[bytes, int]] = set()
        self._entries: dict[tuple[int, int, int], bytes | None] = {}
        self._dirty_entries: set[tuple[int, int, int]] = set()
        self._highest: dict[tuple[int, int], int | None] = {}
        self._dirty_highest: set[tuple[int, int]] = set()
        self._highest_loaded: set[int] = set()  # pids whose epoch_highest rows are all loaded
        self._absent_sids: set[bytes] = set()  # segment ids known to be in no stored segment
        self.dropped = False  # a partition row was deleted: pid caches must be forgotten

    # --- _StateAccess

    def pid(self, tp: TopicIdPartition) -> int | None:
        pid = self._pids.get(tp)
        if pid is None:
            pid = self._new_pids.get(tp)
        if pid is None:
            found = self.db.execute(
                "SELECT pid FROM partition WHERE topic_id = ? AND partition = ? AND topic = ?",
                (tp.topic_id.bytes, tp.partition, tp.topic),
            ).fetchone()
            if found is None:
                return None
            pid = self._pids[tp] = int(found[0])
        return pid

    def add_partition(self, tp: TopicIdPartition) -> int:
        pid = self.pid(tp)
        if pid is None:
            (pid,) = self.db.execute(
                "INSERT INTO partition (topic_id, topic, partition) VALUES (?, ?, ?) RETURNING pid",
                (tp.topic_id.bytes, tp.topic, tp.partition),
            ).fetchone()
            self._new_pids[tp] = pid
        return int(pid)

    def segment(self, pid: int, sid: bytes) -> _Row | None:
        key = (sid, pid)
        if key in self._segments:
            return self._segments[key]
        if sid in self._absent_sids:
            return None
        found = self.db.execute(_SELECT_SEGMENTS + " WHERE sid = ? AND pid = ?", key).fetchone()
        row = self._segments[key] = None if found is None else _row_from(found)
        return row

    def put_segment(self, row: _Row) -> None:
        key = (row.sid, row.pid)
        self._segments[key] = row
        self._dirty_segments.add(key)

    def remove_segment(self, row: _Row) -> None:
        key = (row.sid, row.pid)
        self._segments[key] = None
        self._dirty_segments.add(key)

    def highest(self, pid: int, epoch: int) -> int | None:
        key = (pid, epoch)
        if key in self._highest or pid in self._highest_loaded:
            return self._highest.get(key)
        found = self.db.execute(
            "SELECT highest_offset FROM epoch_highest WHERE pid = ? AND epoch = ?", key
        ).fetchone()
        value = self._highest[key] = None if found is None else int(found[0])
        return value

    def set_highest(self, pid: int, epoch: int, offset: int) -> None:
        key = (pid, epoch)
        self._highest[key] = offset
        self._dirty_highest.add(key)

    def entry(self, pid: int, epoch: int, start: int) -> bytes | None:
        key = (pid, epoch, start)
        if key in self._entries:
            return self._entries[key]
        found = self.db.execute(
            "SELECT sid FROM epoch_entry WHERE pid = ? AND epoch = ? AND start_offset = ?", key
        ).fetchone()
        sid = self._entries[key] = None if found is None else bytes(found[0])
        return sid

    def entries_from(self, pid: int, epoch: int, start: int) -> list[int]:
        self._flush_entries()
        return [
            int(key)
            for (key,) in self.db.execute(
                "SELECT start_offset FROM epoch_entry"
                " WHERE pid = ? AND epoch = ? AND start_offset >= ?",
                (pid, epoch, start),
            )
        ]

    def set_entry(self, pid: int, epoch: int, start: int, sid: bytes | None) -> None:
        key = (pid, epoch, start)
        self._entries[key] = sid
        self._dirty_entries.add(key)

    def put_partition_delete(self, pid: int, event: PartitionDeleteMetadata) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO partition_delete VALUES (?, ?, ?, ?)",
            (pid, event.broker_id, event.event_timestamp_ms, int(event.state)),
        )

    def drop_partition(self, pid: int, *, deleted_ms: int | None = None) -> None:
        self.flush()
        self._forget_values()  # simpler than removing the partition's keys from every cache
        if deleted_ms is not None:  # deleted from the cluster, not only out of scope
            self.db.execute(
                "INSERT OR REPLACE INTO deleted_partition"
                " SELECT topic_id, partition, ? FROM partition WHERE pid = ?",
                (deleted_ms, pid),
            )
            self.db.execute(
                "DELETE FROM deleted_partition WHERE deleted_ms < ?",
                (deleted_ms - DELETED_PARTITION_MEMORY_MS,),
            )
        for table in ("segment", "epoch_entry", "epoch_highest", "partition_delete"):
            self.db.execute(f"DELETE FROM {table} WHERE pid = ?", (pid,))  # noqa: S608
        self.db.execute(
            "DELETE FROM remote_floor WHERE (topic_id, partition) IN"
            " (SELECT topic_id, partition FROM partition WHERE pid = ?)",
            (pid,),
        )
        self.db.execute("DELETE FROM partition WHERE pid = ?", (pid,))  # after remote_floor's
        # the id may be given to the next new partition: no cache may map a partition to it
        for pids in (self._pids, self._new_pids):
            for tp in [tp for tp, known in pids.items() if known == pid]:
                del pids[tp]
        self.dropped = True

    # --- batches

    def begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def prefetch(self, events: Sequence[RemoteLogMetadata]) -> None:
        """Load the segments and epoch highest offsets that ``events`` will read."""
        sids: set[bytes] = set()
        pids: set[int] = set()
        seen: dict[TopicIdPartition, int | None] = {}
        for event in events:
            if isinstance(event, SegmentMetadata | SegmentMetadataUpdate):
                sids.add(event.segment_id.id.bytes)
                tp = event.segment_id.topic_id_partition
                if tp not in seen:
                    pid = seen[tp] = self.pid(tp)
                    if pid is not None:
                        pids.add(pid)
        found: set[bytes] = set()
        for sid_chunk in _chunks(list(sids)):
            marks = ",".join("?" * len(sid_chunk))
            for values in self.db.execute(_SELECT_SEGMENTS + f" WHERE sid IN ({marks})", sid_chunk):
                row = _row_from(values)
                self._segments.setdefault((row.sid, row.pid), row)
                found.add(row.sid)
        self._absent_sids = sids - found
        for pid_chunk in _chunks([pid for pid in pids if pid not in self._highest_loaded]):
            marks = ",".join("?" * len(pid_chunk))
            for pid, epoch, offset in self.db.execute(
                "SELECT pid, epoch, highest_offset FROM epoch_highest"  # noqa: S608
                f" WHERE pid IN ({marks})",
                pid_chunk,
            ):
                self._highest.setdefault((pid, epoch), offset)
            self._highest_loaded.update(pid_chunk)

    def flush(self) -> None:
        """Write what this batch changed (inside the open transaction)."""
        if self._dirty_segments:
            upserts, removed = [], []
            for key in self._dirty_segments:
                row = self._segments[key]
                if row is None:
                    removed.append(key)
                else:
                    upserts.append(_row_values(row))
            self.db.executemany(_UPSERT_SEGMENT, upserts)
            self.db.executemany("DELETE FROM segment WHERE sid = ? AND pid = ?", removed)
            self._dirty_segments.clear()
        self._flush_entries()
        if self._dirty_highest:
            self.db.executemany(
                "INSERT OR REPLACE INTO epoch_highest VALUES (?, ?, ?)",
                [(*key, self._highest[key]) for key in self._dirty_highest],
            )
            self._dirty_highest.clear()

    def _flush_entries(self) -> None:
        if not self._dirty_entries:
            return
        upserts, removed = [], []
        for key in self._dirty_entries:
            sid = self._entries[key]
            if sid is None:
                removed.append(key)
            else:
                upserts.append((*key, sid))
        self.db.executemany("INSERT OR REPLACE INTO epoch_entry VALUES (?, ?, ?, ?)", upserts)
        self.db.executemany(
            "DELETE FROM epoch_entry WHERE pid = ? AND epoch = ? AND start_offset = ?", removed
        )
        self._dirty_entries.clear()

    def commit(self) -> None:
        self.flush()
        self.db.execute("COMMIT")
        self._pids.update(self._new_pids)
        self._new_pids.clear()
        self._forget_values()

    def rollback(self) -> None:
        self._pids.clear()  # may hold an id read back inside the rolled-back transaction
        self._new_pids.clear()
        self.dropped = False
        self._forget_values()
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def _forget_values(self) -> None:
        """Drop the batch's known values (the next batch reads the database again)."""
        self._absent_sids = set()
        self._segments.clear()
        self._dirty_segments.clear()
        self._entries.clear()
        self._dirty_entries.clear()
        self._highest.clear()
        self._dirty_highest.clear()
        self._highest_loaded.clear()


def _chunks(items: Sequence[_T], size: int = 900) -> Iterator[Sequence[_T]]:
    """Slices of at most ``size`` items (SQLite limits the parameters of one statement)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _partition_delete(
    tp: TopicIdPartition, broker_id: int, event_timestamp_ms: int, state: int
) -> PartitionDeleteMetadata:
    """A ``partition_delete`` row as the event it keeps."""
    return PartitionDeleteMetadata(
        topic_id_partition=tp,
        broker_id=broker_id,
        event_timestamp_ms=event_timestamp_ms,
        state=RemotePartitionDeleteState(state),
    )


class _ChangeClock:
    """Per-partition versions of the store's own commits, and a count of other processes'
    commits (SQLite's ``data_version`` moved while this process committed nothing)."""

    def __init__(self) -> None:
        self._clock = 0
        self._versions: dict[TopicIdPartition, int] = {}
        #: the version of every partition with no entry: moved past every version given out
        #: whenever an entry is dropped, so a dropped partition never shows a version seen before
        self._floor = 0
        self.commits = 0
        self._data_version: int | None = None
        self._seen_commits = 0
        self._external = 0

    def version(self, tp: TopicIdPartition) -> int:
        return self._versions.get(tp, self._floor)

    def forgot(self, tp: TopicIdPartition) -> None:
        """(under the write lock) ``tp`` was dropped from the store: its entry goes (one per
        partition ever applied would grow with every topic created and deleted)."""
        if self._versions.pop(tp, None) is not None:
            self._clock += 1
            self._floor = self._clock

    def committed(self, partitions: Iterable[TopicIdPartition]) -> None:
        """(under the write lock) One commit that applied events of ``partitions``."""
        self._clock += 1
        for tp in partitions:
            self._versions[tp] = self._clock
        self.commits += 1

    def seen(self, data_version: int, commits: int) -> int:
        """(under the read lock) The reader's data version now, and this process's commits
        read before it. A move with no commit of ours since the last call is someone else's
        (one of ours racing the read counts too: a needless refresh, never a missed one)."""
        moved = self._data_version is not None and data_version != self._data_version
        if moved and commits == self._seen_commits:
            self._external += 1
        self._data_version = data_version
        self._seen_commits = commits
        return self._external

    @property
    def external(self) -> int:
        """Other processes' commits seen so far."""
        return self._external


class RemoteSegmentStore:
    """The remote segments of every user partition whose metadata partition the sidecar reads.

    ``RemoteSegmentStore(state_dir)`` opens (or creates) ``<state_dir>/metadata.sqlite3``; use it
    as a context manager or call ``close()``. Segments are returned as ``SegmentMetadata`` whose
    ``state`` and update fields (broker, event time, custom metadata) are the latest applied.
    """

    #: the store's file name inside the state dir
    FILE_NAME: ClassVar[str] = STORE_FILE_NAME
    #: the states a stored segment can be in (the default of ``segments`` and others)
    LIVE_STATES: ClassVar[frozenset[RemoteLogSegmentState]] = LIVE_STATES

    def __init__(self, state_dir: Path | str) -> None:
        self.path = Path(state_dir) / STORE_FILE_NAME
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = _connect(self.path)
            try:
                self._writer = _Writer(db)
                self._init_schema(db)
                self._consumed: dict[int, int] = {
                    int(p): int(o)
                    for p, o in db.execute("SELECT metadata_partition, last_offset FROM consumed")
                }
                stored = dict(db.execute("SELECT name, value FROM counter").fetchall())
                self._counters = StoreCounters(
                    **{name: int(stored.get(name, 0)) for name in _COUNTER_NAMES}
                )
                self._reader = _connect(self.path)
                self._reader.execute("PRAGMA query_only = 1")
            except BaseException:
                db.close()
                raise
        except (sqlite3.Error, OSError) as exc:
            raise MetadataStoreError(f"cannot open the metadata store {self.path}: {exc}") from exc
        self._reader_pids: dict[TopicIdPartition, int] = {}
        self._changes = _ChangeClock()

    @staticmethod
    def _init_schema(db: sqlite3.Connection) -> None:
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"cannot switch to WAL mode (got {mode})")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA cache_size = -32768")  # 32 MiB
        # Checkpoint every ~40 MiB of WAL rather than 4 MiB: replays write pages all over the
        # file, and each checkpoint syncs; keep the WAL file itself from staying that large.
        db.execute("PRAGMA wal_autocheckpoint = 10000")
        db.execute("PRAGMA journal_size_limit = 16777216")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            db.executescript(
                f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA user_version = {_SCHEMA_VERSION};COMMIT;"
            )
        elif version != _SCHEMA_VERSION:
            raise MetadataStoreError(
                f"the metadata store has schema version {version}; this sidecar reads"
                f" {_SCHEMA_VERSION} (a newer sidecar wrote it)"
            )
        # added within version 1: older stores get them on open (nothing else reads them)
        db.execute(_REMOTE_FLOOR_TABLE)
        db.execute(_SCOPE_TABLE)
        db.execute(_DELETED_PARTITION_TABLE)

    # --- lifecycle

    def close(self) -> None:
        """Close the store; idempotent. Later calls raise MetadataStoreError."""
        with self._write_lock, self._read_lock:
            if self._closed:
                return
            self._closed = True
            self._reader.close()
            self._writer.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError(f"the metadata store {self.path} is closed")

    # --- writing

    def claim_topic(self, topic: str) -> None:
        """Bind the store to the metadata topic it follows (first call), or check that it is the
        same: consumed offsets of another topic would silently skip its events."""
        claimed = self._claim_meta("metadata_topic", topic)
        if claimed != topic:
            raise MetadataStoreError(
                f"the metadata store {self.path} follows topic {claimed!r}, not {topic!r};"
                " use another state dir or remove the store to rebuild it from the topic"
            )

    def claim_topic_id(self, topic_id: uuid.UUID) -> None:
        """Bind the store to the metadata topic's id (first call), or check that it is the
        same: a topic deleted and re-created under the same name starts its offsets again, and
        the consumed offsets of the old one would skip the new one's first events."""
        shown = encode_kafka_uuid(topic_id)  # as Kafka's tools show topic ids
        claimed = self._claim_meta("metadata_topic_id", shown)
        if claimed != shown:
            raise MetadataStoreError(
                f"the metadata store {self.path} was read from a metadata topic with id"
                f" {claimed}, but the topic is now {shown}: it was deleted and re-created, and"
                " the offsets read no longer match; remove the store to rebuild it from the topic"
            )

    def record_history_gap(self, metadata_partition: int, first_offset: int) -> None:
        """Records of ``metadata_partition`` below ``first_offset`` were deleted (the topic's
        retention, DeleteRecords) before this store read them: the events they held are
        missing from it for good. Kept until the store is removed (the first gap recorded)."""
        self._claim_meta(f"{_HISTORY_GAP}{metadata_partition}", str(first_offset))

    def history_gaps(self) -> dict[int, int]:
        """Metadata partition -> the offset its records begin at in this store, for those
        whose earlier records were deleted unread (:meth:`record_history_gap`)."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT key, value FROM meta WHERE key GLOB ?", (f"{_HISTORY_GAP}*",)
            ).fetchall()
        return {int(key[len(_HISTORY_GAP) :]): int(value) for key, value in rows}

    def _claim_meta(self, key: str, value: str) -> str:
        """The value stored under ``key``, stored as ``value`` if there was none."""
        with self._write_lock, self._translate_errors():
            self._check_open()
            db = self._writer.db
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
                return value
            return str(row[0])

    def apply(
        self,
        events: Iterable[RemoteLogMetadata],
        *,
        consumed: Mapping[int, int] | None = None,
    ) -> ApplyResult:
        """Apply ``events`` in order and record ``consumed`` (metadata partition -> last offset
        read), all in one transaction. Events that Kafka would drop are counted and returned in
        ``rejected``; nothing else about them is stored."""
        with self._write_lock, self._translate_errors():
            self._check_open()
            writer = self._writer
            applied = 0
            rejected: list[Rejection] = []
            counts = dict.fromkeys(RejectReason, 0)
            batch = events if isinstance(events, Sequence) else list(events)
            writer.begin()
            try:
                writer.prefetch(batch)
                for index, event in enumerate(batch):
                    verdict = _apply_event(writer, event)
                    if verdict is None:
                        applied += 1
                    else:
                        reason, detail = verdict
                        counts[reason] += 1
                        rejected.append(Rejection(index, event, reason, detail))
                old = self._counters
                counters = StoreCounters(
                    applied=old.applied + applied,
                    **{r.value: getattr(old, r.value) + counts[r] for r in RejectReason},
                )
                self._write_counters(counters)
                if consumed:
                    writer.db.executemany(
                        "INSERT OR REPLACE INTO consumed VALUES (?, ?)", consumed.items()
                    )
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            self._forget_dropped_pids()
            self._counters = counters
            if consumed:
                self._consumed.update(consumed)
            skipped = {r.index for r in rejected}
            self._changes.committed(
                event.topic_id_partition
                for index, event in enumerate(batch)
                if index not in skipped and not isinstance(event, SegmentMetadataSnapshot)
            )
            return ApplyResult(applied, tuple(rejected))

    def forget_partition(self, tp: TopicIdPartition, *, now_ms: int | None = None) -> bool:
        """Drop ``tp`` from the store if nothing of it is left: no segment in any state and no
        partition delete under way (its topic was deleted and its segments deleted one by one),
        and remember it as deleted at ``now_ms`` (default: now; :meth:`deleted_partitions`).
        Returns whether it was dropped. A later event for ``tp`` simply adds it again."""
        with self._write_lock, self._translate_errors():
            self._check_open()
            writer = self._writer
            writer.begin()
            try:
                pid = writer.pid(tp)
                if pid is None:
                    writer.rollback()
                    return False
                busy = writer.db.execute(
                    "SELECT EXISTS (SELECT 1 FROM segment WHERE pid = ?)"
                    " OR EXISTS (SELECT 1 FROM partition_delete WHERE pid = ? AND state <> ?)",
                    (pid, pid, int(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)),
                ).fetchone()[0]
                if busy:
                    writer.rollback()
                    return False
                writer.drop_partition(
                    pid, deleted_ms=int(time.time() * 1000) if now_ms is None else now_ms
                )
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            self._changes.forgot(tp)
            self._forget_dropped_pids()
            return True

    def _forget_dropped_pids(self) -> None:
        """After a commit that deleted partition rows: readers look partition ids up again."""
        if self._writer.dropped:
            with self._read_lock:
                self._reader_pids.clear()
            self._writer.dropped = False

    def scopes(self) -> dict[int, Scope]:
        """Per metadata partition ever read, which user partitions' events were applied: a set
        of (topic id, partition), or None for all of them."""
        with self._read_lock, self._translate_errors():
            self._check_open()
            rows = self._reader.execute(
                "SELECT metadata_partition, topic_id, partition FROM scope"
            ).fetchall()
        found: dict[int, set[tuple[uuid.UUID, int]] | None] = {}
        for mp, topic_id, partition in rows:
            if (bytes(topic_id), partition) == _ALL_ROW:
                found[mp] = None
                continue
            if (bytes(topic_id), partition) == _NONE_ROW:
                found.setdefault(mp, set())
                continue
            members = found.setdefault(mp, set())
            if members is not None:
                members.add((uuid.UUID(bytes=bytes(topic_id)), partition))
        scopes: dict[int, Scope] = {mp: None for mp in self._consumed}  # read whole
        scopes.update({mp: None if m is None else frozenset(m) for mp, m in found.items()})
        return scopes

    def set_scope(
        self, metadata_partition: int, scope: Scope, *, drop: Iterable[TopicIdPartition] = ()
    ) -> None:
        """Record ``metadata_partition``'s scope and drop every ``drop`` partition with all its
        state (segments in any state included), in one transaction: partitions that leave the
        scope, or whose partial state a re-read is about to rebuild."""
        doomed = list(drop)
        with self._write_lock, self._translate_errors():
            self._check_open()
            writer = self._writer
            writer.begin()
            try:
                db = writer.db
                db.execute("DELETE FROM scope WHERE metadata_partition = ?", (metadata_partition,))
                if scope is None:
                    rows = [_ALL_ROW]
                elif not scope:
                    rows = [_NONE_ROW]
                else:
                    rows = [(topic_id.bytes, partition) for topic_id, partition in sorted(scope)]
                db.executemany(
                    "INSERT INTO scope VALUES (?, ?, ?)",
                    [(metadata_partition, t, p) for t, p in rows],
                )
                for tp in doomed:
                    pid = writer.pid(tp)
                    if pid is not None:
                        writer.drop_partition(pid)
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            self._forget_dropped_pids()
            self._changes.committed(doomed)

    def raise_remote_floor(self, tp: TopicIdPartition, offset: int) -> int:
        """Record that remote data below ``offset`` of ``tp`` was deleted on purpose (remote
        retention, DeleteRecords), so tiering does not upload it again; the floor never goes
        down. Call it before such a delete is published. Returns the floor now in force."""
        with self._write_lock, self._translate_errors():
            self._check_open()
            db = self._writer.db
            # the floor is the one state not on the topic: on disk before the delete it
            # guards is published, power loss included (else the deleted range would look
            # like a hole, and be uploaded again)
            db.execute("PRAGMA synchronous = FULL")
            try:
                db.execute(
                    "INSERT INTO remote_floor VALUES (?, ?, ?) ON CONFLICT (topic_id, partition)"
                    " DO UPDATE SET floor_offset = MAX(floor_offset, excluded.floor_offset)",
                    (tp.topic_id.bytes, tp.partition, offset),
                )
            finally:
                db.execute("PRAGMA synchronous = NORMAL")
            (floor,) = db.execute(
                "SELECT floor_offset FROM remote_floor WHERE topic_id = ? AND partition = ?",
                (tp.topic_id.bytes, tp.partition),
            ).fetchone()
            self._changes.committed((tp,))  # the floor bounds what is derived from it
            return int(floor)

    def remote_floor(self, tp: TopicIdPartition) -> int | None:
        """The offset below which remote data of ``tp`` was deleted on purpose; 0 when this
        sidecar tiered the partition from its first copy; None when it does not know (it did
        not see the partition's first copy and never deleted any of it)."""
        with self._reading() as db:
            found = db.execute(
                "SELECT floor_offset FROM remote_floor WHERE topic_id = ? AND partition = ?",
                (tp.topic_id.bytes, tp.partition),
            ).fetchone()
        return None if found is None else int(found[0])

    def deleted_partitions(self) -> set[tuple[uuid.UUID, int]]:
        """(topic id, partition) of the partitions dropped in the last
        :data:`DELETED_PARTITION_MEMORY_MS` because they were deleted from the cluster (not
        those that only left a scope)."""
        with self._reading() as db:
            return {
                (uuid.UUID(bytes=bytes(topic_id)), int(partition))
                for topic_id, partition in db.execute(
                    "SELECT topic_id, partition FROM deleted_partition"
                )
            }

    def set_consumed(self, consumed: Mapping[int, int]) -> None:
        """Record the last offset read per metadata partition (for batches with no events)."""
        self.apply((), consumed=consumed)

    def _write_counters(self, counters: StoreCounters) -> None:
        self._writer.db.executemany(
            "INSERT OR REPLACE INTO counter VALUES (?, ?)",
            [(name, getattr(counters, name)) for name in _COUNTER_NAMES],
        )

    @contextmanager
    def _translate_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise MetadataStoreError(f"metadata store {self.path}: {exc}") from exc

    # --- reading: offsets and counters (kept in memory, as of the last commit)

    def consumed_offset(self, metadata_partition: int) -> int | None:
        """The last offset applied from ``metadata_partition``, or None if none was."""
        self._check_open()
        return self._consumed.get(metadata_partition)

    def consumed_offsets(self) -> dict[int, int]:
        """The last offset applied per metadata partition."""
        self._check_open()
        return dict(self._consumed)

    def counters(self) -> StoreCounters:
        """Applied and dropped events since the store was created."""
        self._check_open()
        return self._counters

    # --- change tracking, for caches of what is derived from one partition's segments

    def partition_version(self, tp: TopicIdPartition) -> int:
        """A number that changes whenever this store applies an event of ``tp`` (and only
        then): a cache of something derived from the partition's segments is current while it
        stays the same. Changes made by another process are :meth:`external_changes`."""
        return self._changes.version(tp)

    def external_changes(self) -> int:
        """(blocking) A number that changes when another process (a daemon on the same state
        dir, for a read server alone) has committed changes since the last call: they may be to
        any partition."""
        with self._read_lock, self._translate_errors():
            self._check_open()
            commits = self._changes.commits
            data_version = int(self._reader.execute("PRAGMA data_version").fetchone()[0])
            return self._changes.seen(data_version, commits)

    # --- reading: segments (a read-only connection: committed batches only)

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The reader connection in one read transaction (one consistent snapshot)."""
        with self._read_lock, self._translate_errors():
            self._check_open()
            db = self._reader
            db.execute("BEGIN")
            try:
                self._check_external(db)
                yield db
            finally:
                db.execute("COMMIT")

    def _check_external(self, db: sqlite3.Connection) -> None:
        """(under the read lock) Another process (the daemon, for a read server alone) may
        have dropped partitions since the last read, and SQLite may have given a dropped
        partition's id to a new one: the partition ids looked up are forgotten whenever
        another process has committed."""
        external = self._changes.external
        data_version = int(db.execute("PRAGMA data_version").fetchone()[0])
        if self._changes.seen(data_version, self._changes.commits) != external:
            self._reader_pids.clear()

    def _pid(self, db: sqlite3.Connection, tp: TopicIdPartition) -> int | None:
        pid = self._reader_pids.get(tp)
        if pid is None:
            found = db.execute(
                "SELECT pid FROM partition WHERE topic_id = ? AND partition = ? AND topic = ?",
                (tp.topic_id.bytes, tp.partition, tp.topic),
            ).fetchone()
            if found is None:
                return None
            pid = self._reader_pids[tp] = int(found[0])
        return pid

    @staticmethod
    def _metadata(tp: TopicIdPartition, row: _Row) -> SegmentMetadata:
        return SegmentMetadata(
            segment_id=RemoteLogSegmentId(tp, uuid.UUID(bytes=row.sid)),
            start_offset=row.start,
            end_offset=row.end,
            broker_id=row.broker_id,
            max_timestamp_ms=row.max_timestamp_ms,
            event_timestamp_ms=row.event_timestamp_ms,
            segment_leader_epochs=row.epochs,
            segment_size_in_bytes=row.size,
            custom_metadata=row.custom_metadata,
            state=row.state,
            txn_index_empty=row.txn_index_empty,
        )

    def _rows(
        self, db: sqlite3.Connection, pid: int, where: str = "", params: Sequence[object] = ()
    ) -> list[_Row]:
        cursor = db.execute(
            _SELECT_SEGMENTS
            + " WHERE pid = ? "
            + where
            + " ORDER BY start_offset, end_offset, sid",
            (pid, *params),
        )
        return [_row_from(values) for values in cursor]

    def knows(self, tp: TopicIdPartition) -> bool:
        """Whether any event of ``tp`` was ever applied (its segments may all be gone)."""
        with self._reading() as db:
            return self._pid(db, tp) is not None

    def partitions(self) -> list[TopicIdPartition]:
        """Every user partition the store has seen an event for."""
        with self._reading() as db:
            return [
                TopicIdPartition(uuid.UUID(bytes=topic_id), topic, partition)
                for topic_id, topic, partition in db.execute(
                    "SELECT topic_id, topic, partition FROM partition ORDER BY pid"
                )
            ]

    def segments(
        self,
        tp: TopicIdPartition,
        *,
        states: Collection[RemoteLogSegmentState] = LIVE_STATES,
        leader_epoch: int | None = None,
    ) -> list[SegmentMetadata]:
        """The partition's segments in ``states``, sorted by start offset (then end offset).

        With ``leader_epoch``, only segments that carry that epoch: Kafka's
        ``listRemoteLogSegments(tp, epoch)`` (its offsetToId plus unreferenced entries).
        """
        wanted = {int(state) for state in states}
        with self._reading() as db:
            pid = self._pid(db, tp)
            rows = [] if pid is None else self._rows(db, pid)
        return [
            self._metadata(tp, row)
            for row in rows
            if row.state in wanted
            and (leader_epoch is None or any(e == leader_epoch for e, _ in row.epochs))
        ]

    def segment_count(self) -> int:
        """Live segments of every partition (what :meth:`segments` would list for each, summed),
        counted without reading them."""
        with self._reading() as db:
            # the table holds live segments only (a DELETE_SEGMENT_FINISHED removes the row)
            row = db.execute("SELECT COUNT(*) FROM segment").fetchone()
        return int(row[0])

    def segment(self, segment_id: RemoteLogSegmentId) -> SegmentMetadata | None:
        """One segment as of its latest event, or None (never seen, or DELETE_SEGMENT_FINISHED)."""
        tp = segment_id.topic_id_partition
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return None
            found = db.execute(
                _SELECT_SEGMENTS + " WHERE sid = ? AND pid = ?",
                (segment_id.id.bytes, pid),
            ).fetchone()
        return None if found is None else self._metadata(tp, _row_from(found))

    def segment_for_offset(
        self, tp: TopicIdPartition, leader_epoch: int, offset: int
    ) -> SegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment that serves ``offset`` of ``leader_epoch``: Kafka's
        ``remoteLogSegmentMetadata(tp, epoch, offset)`` (floor entry, within the epoch's range)."""
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return None
            found = db.execute(
                _SELECT_SEGMENTS + " WHERE pid = ? AND sid = " + _FLOOR_ENTRY,
                (pid, pid, leader_epoch, offset),
            ).fetchone()
        if found is None:
            return None
        row = _row_from(found)
        for epoch, _start, epoch_end in row.epoch_ends():
            if epoch == leader_epoch:
                return self._metadata(tp, row) if offset <= epoch_end else None
        return None  # pragma: no cover - an entry exists only for the segment's own epochs

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        """The highest offset of ``leader_epoch`` ever copied (COPY_SEGMENT_FINISHED), or None:
        Kafka's ``highestOffsetForEpoch``; it does not decrease when segments are deleted."""
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return None
            found = db.execute(
                "SELECT highest_offset FROM epoch_highest WHERE pid = ? AND epoch = ?",
                (pid, leader_epoch),
            ).fetchone()
        return None if found is None else int(found[0])

    def is_tiered(
        self, tp: TopicIdPartition, start_offset: int, end_offset: int | None = None
    ) -> bool:
        """Whether a COPY_SEGMENT_FINISHED segment starts at ``start_offset`` (and ends at
        ``end_offset`` when given): the uploader's "already tiered" check."""
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return False
            query = "SELECT 1 FROM segment WHERE pid = ? AND start_offset = ? AND state = 1"
            params: tuple[int, ...] = (pid, start_offset)
            if end_offset is not None:
                query += " AND end_offset = ?"
                params += (end_offset,)
            return db.execute(query + " LIMIT 1", params).fetchone() is not None

    def unfinished_copies(self, tp: TopicIdPartition | None = None) -> list[SegmentMetadata]:
        """COPY_SEGMENT_STARTED segments (a copy that crashed or is running): crash repair deletes
        and redoes them."""
        return self._in_state(_STARTED, tp)

    def unfinished_deletes(self, tp: TopicIdPartition | None = None) -> list[SegmentMetadata]:
        """DELETE_SEGMENT_STARTED segments: crash repair finishes deleting them."""
        return self._in_state(_DELETE_STARTED, tp)

    def _in_state(
        self, state: RemoteLogSegmentState, tp: TopicIdPartition | None
    ) -> list[SegmentMetadata]:
        query = _SELECT_SEGMENTS_WITH_PARTITION + " WHERE s.state <> 1 AND s.state = ?"
        params: tuple[int, ...] = (int(state),)
        with self._reading() as db:
            if tp is not None:
                pid = self._pid(db, tp)
                if pid is None:
                    return []
                query += " AND s.pid = ?"
                params += (pid,)
            found = db.execute(query + " ORDER BY s.pid, s.start_offset, s.sid", params).fetchall()
        partitions: dict[int, TopicIdPartition] = {}
        result = []
        for values in found:
            row = _row_from(values[:12])
            owner = partitions.get(row.pid)
            if owner is None:
                owner = partitions[row.pid] = TopicIdPartition(
                    uuid.UUID(bytes=values[12]), values[13], values[14]
                )
            result.append(self._metadata(owner, row))
        return result

    def remote_log_size(
        self, tp: TopicIdPartition, *, states: Collection[RemoteLogSegmentState] = LIVE_STATES
    ) -> int:
        """Bytes of the partition's segments in ``states`` (default: every live segment, as
        Kafka's RemoteLogSizeBytes metric counts them)."""
        wanted = sorted({int(state) for state in states})
        if not wanted:
            return 0
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return 0
            marks = ",".join("?" * len(wanted))
            (total,) = db.execute(
                f"SELECT COALESCE(SUM(size), 0) FROM segment"  # noqa: S608
                f" WHERE pid = ? AND state IN ({marks})",
                (pid, *wanted),
            ).fetchone()
        return int(total)

    def partition_delete(self, tp: TopicIdPartition) -> PartitionDeleteMetadata | None:
        """The latest partition-delete event for ``tp``, or None."""
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return None
            found = db.execute(
                "SELECT broker_id, event_timestamp_ms, state FROM partition_delete WHERE pid = ?",
                (pid,),
            ).fetchone()
        return None if found is None else _partition_delete(tp, *found)

    def partition_deletes(self) -> dict[TopicIdPartition, PartitionDeleteMetadata]:
        """The latest partition-delete event of every partition that has one (one query: a
        pass over thousands of partitions, most with none)."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT p.topic_id, p.topic, p.partition, d.broker_id, d.event_timestamp_ms,"
                " d.state FROM partition_delete d JOIN partition p ON p.pid = d.pid"
            ).fetchall()
        found: dict[TopicIdPartition, PartitionDeleteMetadata] = {}
        for topic_id, topic, partition, *event in rows:
            tp = TopicIdPartition(uuid.UUID(bytes=topic_id), topic, partition)
            found[tp] = _partition_delete(tp, *event)
        return found

    def finished_lineage(
        self,
        tp: TopicIdPartition,
        leader_epochs: Sequence[tuple[int, int]] | None = None,
    ) -> list[SegmentSpan]:
        """The COPY_SEGMENT_FINISHED segments that hold the partition's log along its leader-epoch
        lineage, as non-overlapping spans in offset order.

        ``leader_epochs`` is the partition's ``(epoch, start offset)`` history (its
        leader-epoch-checkpoint), ascending. Each offset is served the way Kafka's read path
        serves it: from the floor entry of the epoch the lineage gives for the offset, if the
        offset is within that segment's part of the epoch. Superseded duplicates, segments of
        epochs outside the lineage, and overlaps are thereby left out; a segment that two other
        segments overlap may appear as a shorter span. Without ``leader_epochs`` the lineage is
        derived from the finished segments' own epoch maps (best effort: epochs whose start is
        not below a later epoch's start are dropped as truncated).
        """
        checked = None if leader_epochs is None else _checked_lineage(leader_epochs)
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return []
            rows = {row.sid: row for row in self._rows(db, pid, "AND state = 1")}
            per_epoch = self._epoch_keys(db, pid)
        lineage = _derived_lineage(rows.values()) if checked is None else checked
        return [
            SegmentSpan(self._metadata(tp, row), start, end)
            for row, start, end in _lineage_walk(lineage, per_epoch, rows.get)
        ]

    def finished_coverage(
        self, tp: TopicIdPartition, leader_epochs: Sequence[tuple[int, int]], from_offset: int
    ) -> list[tuple[int, int]]:
        """The offsets :meth:`finished_lineage` gives for ``leader_epochs``, as inclusive
        ``(start, end)`` ranges: the first range, then every offset from ``from_offset`` on
        (what lies between is left out).

        Planning asks this for a partition's local segments, which start at ``from_offset``,
        and needs the first range only for its floor: so it reads the segments that hold
        those offsets instead of the partition's whole remote history (tens of thousands of
        segments for a long retention), each offset decided exactly as the full walk decides
        it."""
        lineage = _checked_lineage(leader_epochs)
        with self._reading() as db:
            pid = self._pid(db, tp)
            if pid is None:
                return []
            per_epoch = self._epoch_keys(db, pid)
            loaded: dict[bytes, _Row | None] = {}

            def row_of(sid: bytes) -> _Row | None:
                if sid not in loaded:
                    found = self._rows(db, pid, "AND sid = ? AND state = 1", (sid,))
                    loaded[sid] = found[0] if found else None
                return loaded[sid]

            return [
                (start, end)
                for _row, start, end in _lineage_walk(lineage, per_epoch, row_of, from_offset)
            ]

    @staticmethod
    def _epoch_keys(db: sqlite3.Connection, pid: int) -> dict[int, tuple[list[int], list[bytes]]]:
        """Per leader epoch, its entries' start offsets (ascending) and segment ids."""
        per_epoch: dict[int, tuple[list[int], list[bytes]]] = {}
        for epoch, start, sid in db.execute(
            "SELECT epoch, start_offset, sid FROM epoch_entry WHERE pid = ?"
            " ORDER BY epoch, start_offset",
            (pid,),
        ):
            keys, sids = per_epoch.setdefault(epoch, ([], []))
            keys.append(start)
            sids.append(bytes(sid))
        return per_epoch


def _lineage_walk(
    lineage: Sequence[tuple[int, int]],
    per_epoch: Mapping[int, tuple[list[int], list[bytes]]],
    row_of: Callable[[bytes], _Row | None],
    skip_to: int | None = None,
) -> list[tuple[_Row, int, int]]:
    """The spans ``(row, start, end)`` of the lineage: each offset from the floor entry of the
    epoch the lineage gives for it (``per_epoch``), if that FINISHED segment (``row_of``; None
    when the id is not a FINISHED segment) holds the offset in that epoch. With ``skip_to``,
    after the first span the walk goes on at ``skip_to``: every offset from there is decided
    as without it, since each is decided by its own floor entry."""
    spans: list[tuple[_Row, int, int]] = []
    covered = -1
    for i, (epoch, lineage_start) in enumerate(lineage):
        lineage_end = lineage[i + 1][1] - 1 if i + 1 < len(lineage) else 2**63 - 1
        if epoch not in per_epoch or lineage_end < lineage_start:
            continue  # an epoch with no records (Kafka's buildFilteredLeaderEpochMap)
        keys, sids = per_epoch[epoch]
        cursor = max(lineage_start, covered + 1)
        if skip_to is not None and spans:
            cursor = max(cursor, skip_to)
        while cursor <= lineage_end:
            at = bisect.bisect_right(keys, cursor) - 1
            row = row_of(sids[at]) if at >= 0 else None
            epoch_end = -1 if row is None else _epoch_end(row, epoch)
            if row is not None and cursor <= epoch_end:
                end = min(epoch_end, lineage_end)
                if at + 1 < len(keys):
                    end = min(end, keys[at + 1] - 1)
                if spans and spans[-1][0] is row and spans[-1][2] + 1 == cursor:
                    spans[-1] = (row, spans[-1][1], end)
                else:
                    spans.append((row, cursor, end))
                covered = end
                cursor = end + 1
                if skip_to is not None and len(spans) == 1:
                    cursor = max(cursor, skip_to)  # the first span is found: on from skip_to
            elif at + 1 < len(keys):
                cursor = max(cursor + 1, keys[at + 1])  # skip a gap to the next entry
            else:
                break
    return spans


def _epoch_end(row: _Row, epoch: int) -> int:
    for e, _start, end in row.epoch_ends():
        if e == epoch:
            return end
    return -1


def _checked_lineage(leader_epochs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    lineage = [(int(epoch), int(start)) for epoch, start in leader_epochs]
    for (e1, s1), (e2, s2) in itertools.pairwise(lineage):
        if e2 <= e1 or s2 < s1:
            raise ValueError(
                "leader epochs must be ascending by epoch with non-decreasing start offsets,"
                f" got ({e1}, {s1}) before ({e2}, {s2})"
            )
    return lineage


def _derived_lineage(rows: Iterable[_Row]) -> list[tuple[int, int]]:
    starts: dict[int, int] = {}
    for row in rows:
        for epoch, start in row.epochs:
            if epoch not in starts or start < starts[epoch]:
                starts[epoch] = start
    lineage: list[tuple[int, int]] = []
    floor = 2**63
    for epoch in sorted(starts, reverse=True):
        if starts[epoch] < floor:
            floor = starts[epoch]
            lineage.append((epoch, floor))
    return lineage[::-1]
