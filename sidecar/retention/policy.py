"""Which remote segments to delete, chosen exactly as Kafka's RLM expiration task chooses them.

Pure functions over the facts of one partition (kafka-kip405-internals.md §3.5; upstream
``RemoteLogManager.RLMExpirationTask.cleanupExpiredRemoteLogSegments``,
``isRemoteSegmentWithinLeaderEpochs`` and ``buildFilteredLeaderEpochMap`` in
``core/src/main/java/kafka/log/remote/RemoteLogManager.java``):

1. the lineage is the partition's leader-epoch cache (the broker's ``leader-epoch-checkpoint``),
   without the epochs that hold no records (an entry whose start equals the next one's);
2. size: with ``retention.bytes > -1``, the breach is ``onlyLocalLogSegmentsSize`` (local
   segments at or past the highest remote offset) plus the bytes of the remote segments within
   the lineage, minus ``retention.bytes``; time: with ``retention.ms > -1``, a segment whose
   max timestamp is ``< now - retention.ms`` is breached;
3. epochs are walked in ascending order and each epoch's segments by start offset: a segment
   being copied stops the walk; a DELETE_SEGMENT_STARTED one is queued again (retry); a segment
   whose epochs are all ``<=`` the lineage's first epoch and that ends below the log start
   offset is deleted (DeleteRecords, or the broker's own retention); otherwise a segment within
   the lineage is deleted when breached by time, else by size (consuming the breach while it
   stays ``>= 0``); a segment deleted by time consumes the size breach too (down to 0). The
   walk goes on while segments are deleted or lie outside the lineage and stops at the first
   valid segment that is kept;
4. segments whose epochs are all below the lineage's earliest epoch are deleted too
   (unreferenced epochs: unclean leader election, truncated lineage).

**Sidecar overrides** (``[[retention.overrides]]``, ``PartitionFacts.override``): the broker runs
without KIP-405, so its log start offset is its *local* log start, moved by its own retention,
and its leader-epoch cache is truncated there too. For such a topic

* the log-start rule applies only when ``delete_records_offset`` is set: the caller sets it when
  the log start offset moved while the broker leads the partition and lies strictly inside a
  local segment (a DeleteRecords; local retention always leaves it on a segment's base offset,
  see :func:`delete_records_offset`);
* the lineage is extended below the local one with the epochs of the remote segments
  (:func:`extended_lineage`), so remote data older than the local log is not taken for
  unreferenced epochs; it goes by the override's time and size rules.

No I/O, no clock, no store: the caller passes every fact. Must not await.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata

__all__ = [
    "DeleteReason",
    "Expiry",
    "PartitionFacts",
    "RetentionPlan",
    "delete_records_offset",
    "extended_lineage",
    "filtered_lineage",
    "is_within_lineage",
    "only_local_bytes",
    "plan_expiry",
]

_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED


class DeleteReason(enum.StrEnum):
    """Why a remote segment is deleted (the ``reason`` label of the deletion metrics)."""

    #: max timestamp at or before now - retention.ms
    RETENTION_MS = "retention_ms"
    #: local-only plus remote bytes over retention.bytes
    RETENTION_BYTES = "retention_bytes"
    #: ends below the partition's log start offset (DeleteRecords, broker retention)
    LOG_START_OFFSET = "log_start_offset"
    #: every epoch of the segment is below the lineage's earliest epoch
    LINEAGE = "lineage"
    #: an earlier deletion (DELETE_SEGMENT_STARTED) that did not finish
    RETRY = "retry"
    #: the topic id is gone from the cluster
    TOPIC_DELETED = "topic_deleted"
    #: a KIP-405 partition deletion (DELETE_PARTITION_MARKED)
    PARTITION_DELETED = "partition_deleted"


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    """What the broker says about one partition, as of one retention pass."""

    #: ``(leader epoch, start offset)`` ascending: the broker's leader-epoch cache
    lineage: Sequence[tuple[int, int]]
    #: the broker's log start offset (ListOffsets earliest)
    log_start_offset: int
    #: the log end offset (or a lower bound of it, e.g. the last stable offset)
    log_end_offset: int
    #: bytes of the local segments at or past the highest remote offset (active one included)
    only_local_bytes: int
    #: topic ``retention.ms`` (-1 = forever)
    retention_ms: int
    #: topic ``retention.bytes`` (-1 = unlimited)
    retention_bytes: int
    #: the time of the pass, epoch milliseconds
    now_ms: int
    #: the topic has a sidecar retention override: ``retention_*`` are the override's, the
    #: lineage is extended with remote epochs and the log-start rule uses
    #: ``delete_records_offset`` only
    override: bool = False
    #: with ``override``: a log start offset a DeleteRecords set (None = none detectable)
    delete_records_offset: int | None = None


@dataclass(frozen=True, slots=True)
class Expiry:
    """One segment to delete, and why."""

    segment: SegmentMetadata
    reason: DeleteReason


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """The outcome of one pass over one partition."""

    deletions: tuple[Expiry, ...]
    #: Kafka's new remote log start offset: max(end + 1) over the time and size deletions
    new_log_start_offset: int | None
    #: bytes of the remote segments within the lineage (the size rule's remote part)
    remote_bytes: int
    #: total - retention.bytes when positive, else 0
    breached_bytes: int


def filtered_lineage(entries: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``buildFilteredLeaderEpochMap``: drop the epochs with no records (an entry whose start
    offset equals the next entry's)."""
    items = sorted((int(e), int(s)) for e, s in entries)
    kept = [
        (epoch, start)
        for i, (epoch, start) in enumerate(items)
        if i + 1 >= len(items) or items[i + 1][1] != start
    ]
    return kept


def is_within_lineage(
    segment: SegmentMetadata, log_end_offset: int, lineage: Sequence[tuple[int, int]]
) -> bool:
    """``isRemoteSegmentWithinLeaderEpochs``: the segment's epochs (without empty ones) are a
    run of the lineage, each within its lineage range, and it ends below the log end offset.
    ``lineage`` must already be filtered (:func:`filtered_lineage`)."""
    if not lineage:
        return False
    epochs = dict(lineage)
    keys = [e for e, _ in lineage]
    seg = filtered_lineage(segment.segment_leader_epochs)
    seg_epochs = [e for e, _ in seg]
    seg_map = dict(seg)
    last = seg_epochs[-1]
    if last < keys[0] or last > keys[-1]:
        return False
    ceiling = [e for e in seg_epochs if e >= keys[0]]
    if not ceiling:
        return False
    first = ceiling[0]
    for epoch, offset in seg:
        if epoch < first:
            continue
        if epoch not in epochs:
            return False
        lower = [k for k in keys if k < epoch]
        if epoch == first and lower and offset < epochs[epoch]:
            return False
        higher_lineage = next(((k, epochs[k]) for k in keys if k > epoch), None)
        if epoch == last:
            if higher_lineage is not None and segment.end_offset > higher_lineage[1] - 1:
                return False
        else:
            higher_segment = next(((k, seg_map[k]) for k in seg_epochs if k > epoch), None)
            if higher_lineage != higher_segment:
                return False
    return segment.end_offset < log_end_offset


def extended_lineage(
    lineage: Sequence[tuple[int, int]], segments: Iterable[SegmentMetadata]
) -> list[tuple[int, int]]:
    """The filtered local lineage preceded by the epochs of the tiered segments below it.

    The broker truncates its leader-epoch cache at its (local) log start offset; the tiered
    segments' own epoch maps still say where each older epoch began. Each epoch below the local
    lineage's first one starts at the lowest offset a COPY_SEGMENT_FINISHED segment gives it (the
    first local epoch too, when a segment saw it start earlier); an older epoch is kept only if
    it starts below the next kept one (a diverged copy cannot reorder the lineage)."""
    local = filtered_lineage(lineage)
    if not local:
        return local
    first_epoch, first_start = local[0]
    starts: dict[int, int] = {}
    for segment in segments:
        if segment.state is not _FINISHED:
            continue
        for epoch, offset in segment.segment_leader_epochs:
            if epoch <= first_epoch and offset < first_start:
                starts[epoch] = min(starts.get(epoch, offset), offset)
    head = min(first_start, starts.pop(first_epoch, first_start))
    older: list[tuple[int, int]] = []
    ceiling = head
    for epoch in sorted(starts, reverse=True):
        if starts[epoch] < ceiling:
            older.append((epoch, starts[epoch]))
            ceiling = starts[epoch]
    return [*reversed(older), (first_epoch, head), *local[1:]]


def delete_records_offset(log_start_offset: int, local_base_offsets: Iterable[int]) -> int | None:
    """``log_start_offset`` if it lies strictly inside a local segment, else None.

    Kafka's own retention (time, size) deletes whole segments and sets the log start offset to
    the next segment's base offset; on the leader, only DeleteRecords leaves it past the base
    offset of the segment that holds it. A follower takes the leader's log start offset, which
    may lie inside one of its own segments whatever moved it: the caller must not take the log
    start a broker brought along when it became leader for a DeleteRecords.
    ``local_base_offsets`` must be listed *after* the log start offset was read, so that a
    segment the broker deleted meanwhile cannot make a base offset look like an inner one. A
    DeleteRecords exactly at a segment boundary is not told apart from local retention."""
    below = [b for b in local_base_offsets if b <= log_start_offset]
    if not below:
        return None
    return log_start_offset if max(below) < log_start_offset else None


def only_local_bytes(local_segments: Iterable[tuple[int, int]], highest_remote_offset: int) -> int:
    """``onlyLocalLogSegmentsSize``: bytes of the local ``(base offset, size)`` segments whose
    base offset is at or past the highest offset in remote storage."""
    return sum(size for base, size in local_segments if base >= highest_remote_offset)


def plan_expiry(
    segments: Sequence[SegmentMetadata],
    facts: PartitionFacts,
    *,
    copying: Iterable[object] = (),
) -> RetentionPlan:
    """Choose the partition's remote segments to delete (see the module docstring).

    ``segments``: every live segment of the partition (any state but DELETE_SEGMENT_FINISHED).
    ``copying``: segment ids being copied right now; any COPY_SEGMENT_STARTED segment is taken
    as being copied too (the tiering engine owns it).
    """
    if facts.override:
        lineage = extended_lineage(facts.lineage, segments)
        log_start = -1 if facts.delete_records_offset is None else facts.delete_records_offset
    else:
        lineage = filtered_lineage(facts.lineage)
        log_start = facts.log_start_offset
    in_copy = set(copying)
    by_epoch: dict[int, list[SegmentMetadata]] = {}
    for segment in sorted(segments, key=lambda s: (s.start_offset, s.end_offset)):
        for epoch, _ in segment.segment_leader_epochs:
            by_epoch.setdefault(epoch, []).append(segment)

    remote_bytes = 0
    breached = 0
    if facts.retention_bytes > -1:
        seen: set[object] = set()
        for epoch, _ in lineage:
            for segment in by_epoch.get(epoch, ()):
                if (
                    segment.state is _FINISHED
                    and segment.segment_id not in seen
                    and is_within_lineage(segment, facts.log_end_offset, lineage)
                ):
                    seen.add(segment.segment_id)
                    remote_bytes += segment.segment_size_in_bytes
        breached = max(0, facts.only_local_bytes + remote_bytes - facts.retention_bytes)
    remaining = breached
    cleanup_until = facts.now_ms - facts.retention_ms if facts.retention_ms > -1 else None

    chosen: dict[object, Expiry] = {}
    new_start: int | None = None
    # the epoch at the broker's log start: the first of its own (truncated) leader-epoch cache
    local = filtered_lineage(facts.lineage)
    first_epoch = local[0][0] if local else None
    can_process = True
    for epoch, _ in lineage:
        if not can_process:
            break
        for segment in by_epoch.get(epoch, ()):
            if segment.segment_id in chosen:
                continue
            if segment.segment_id in in_copy or segment.state is _STARTED:
                can_process = False
                break
            if segment.state is _DELETE_STARTED:
                chosen[segment.segment_id] = Expiry(segment, DeleteReason.RETRY)
                continue
            reason: DeleteReason | None = None
            valid = False
            if (
                first_epoch is not None
                and all(e <= first_epoch for e, _ in segment.segment_leader_epochs)
                and segment.end_offset < log_start
            ):
                reason = DeleteReason.LOG_START_OFFSET
            else:
                valid = is_within_lineage(segment, facts.log_end_offset, lineage)
                if valid:
                    # Kafka's isSegmentBreachedByRetentionTime: strictly older than the
                    # cutoff, and the bytes it frees count against the size breach too
                    if cleanup_until is not None and segment.max_timestamp_ms < cleanup_until:
                        reason = DeleteReason.RETENTION_MS
                        remaining = max(0, remaining - segment.segment_size_in_bytes)
                    elif remaining > 0 and remaining - segment.segment_size_in_bytes >= 0:
                        remaining -= segment.segment_size_in_bytes
                        reason = DeleteReason.RETENTION_BYTES
                    if reason is not None:
                        new_start = max(new_start or -1, segment.end_offset + 1)
            if reason is not None:
                chosen[segment.segment_id] = Expiry(segment, reason)
            if not (reason is not None or not valid):
                can_process = False
                break

    # unreferenced epochs: segments whose epochs all lie below the lineage's earliest epoch
    if lineage:
        earliest = min(e for e, _ in (lineage if facts.override else facts.lineage))
        for segment in sorted(segments, key=lambda s: (s.start_offset, s.end_offset)):
            if segment.segment_id in chosen or segment.segment_id in in_copy:
                continue
            if segment.state is _STARTED:
                continue
            if all(e < earliest for e, _ in segment.segment_leader_epochs):
                chosen[segment.segment_id] = Expiry(segment, DeleteReason.LINEAGE)

    return RetentionPlan(
        deletions=tuple(chosen.values()),
        new_log_start_offset=new_start,
        remote_bytes=remote_bytes,
        breached_bytes=breached,
    )
