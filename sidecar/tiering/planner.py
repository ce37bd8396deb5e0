"""Pure planning: which local segments of one partition to upload next, in order.

The sidecar plans from what is actually remote: the FINISHED copies along the partition's
leader-epoch lineage (``RemoteCoverage``). A local segment is uploaded when some offset of it
at or above the coverage's *floor* is not covered: past the last copy (new data), or in a hole
between copies, however the hole arose (a copy deleted by a race with another broker, a lost
write). Below the floor, remote data was deleted on purpose (remote retention, DeleteRecords)
and is never uploaded again. The floor is recorded by the sidecar's own retention; where it is
unknown (a store that did not see the partition's first copy), the first copy of the lineage
stands in for it, and where nothing is covered at all, Kafka's monotone highest offset does.

Kafka's own rules, which the monotone variant (no coverage given) follows exactly
(RemoteLogManager, kafka-kip405-internals.md §3.2-3.3):

* the starting point is the highest offset already in remote storage for the partition's
  leader-epoch lineage (``findHighestRemoteOffset``): walk the local leader-epoch cache from the
  latest epoch down, ask the metadata store for the highest remote offset of that epoch, and clamp
  it by the epoch's end offset;
* candidates are the local segments that end after that offset, in base-offset order;
* a segment is copied only when it is not active and its end offset (next base - 1) is below the
  last stable offset; here it must also be *ready* (indexes trimmed, ``<nextBase>.snapshot``
  valid) and not quarantined. A quarantine entry names one segment by its base offset, end
  offset and size: a segment rebuilt at the same base offset (a replica fetched again from the
  leader) is another segment, checked anew.

Segments are uploaded in order: planning stops at the first candidate that cannot go yet (not
ready, not below the LSO). One exception: a segment whose ``<nextBase>.snapshot`` is an older
snapshot that fails its CRC (``SNAPSHOT_CORRUPT``) is uploaded with that file as it is, as
Kafka's RLM uploads it unchecked: it never heals, and waiting for it would stop the partition
until local retention deletes the segment's records untiered. A quarantined segment (corrupt
bytes) is skipped with coverage, since the gap stays visible to the next plan; without coverage
it stops the plan, since a later upload would move the monotone highest offset past it and
hide it.

No I/O, no clock, no awaits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sidecar.kafka.checkpoints import EpochEntry, load_epoch_cache
from sidecar.kafka.logdir import NotReadyReason, PartitionScan, Segment

__all__ = [
    "Plan",
    "RemoteCoverage",
    "find_highest_remote_offset",
    "plan_partition",
    "segments_behind",
]


def find_highest_remote_offset(
    epochs: Sequence[EpochEntry],
    log_end_offset: int,
    highest_for_epoch: Callable[[int], int | None],
) -> int:
    """Kafka's ``findHighestRemoteOffset``: -1 when nothing of this lineage is remote.

    ``epochs`` is the local leader-epoch cache (ascending); ``log_end_offset`` bounds the last
    epoch; ``highest_for_epoch`` is the metadata store's ``highestOffsetForEpoch``.
    """
    for index in range(len(epochs) - 1, -1, -1):
        epoch = epochs[index].epoch
        highest = highest_for_epoch(epoch)
        if highest is None:
            continue
        end_offset = epochs[index + 1].start_offset if index + 1 < len(epochs) else log_end_offset
        # cache.endOffsetFor(epoch): the start of the next epoch, or the log end
        return end_offset - 1 if end_offset <= highest else highest
    return -1


@dataclass(frozen=True, slots=True)
class RemoteCoverage:
    """The offsets of one partition's lineage that FINISHED copies hold, and the floor below
    which nothing needs to be remote."""

    spans: tuple[tuple[int, int], ...]
    """Inclusive ``(start, end)`` offset ranges of FINISHED copies along the lineage, ascending
    and non-overlapping."""
    floor: int
    """Offsets below it are not uploaded (deleted on purpose, or assumed so)."""

    @classmethod
    def of(
        cls,
        spans: Sequence[tuple[int, int]],
        *,
        floor: int | None,
        highest: int,
    ) -> RemoteCoverage:
        """Coverage from the lineage's FINISHED spans. ``floor``: the recorded floor, or None
        when unknown: then the first span's start, or ``highest + 1`` (Kafka's monotone highest
        remote offset) when there is no span."""
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        if floor is None:
            floor = merged[0][0] if merged else highest + 1
        return cls(tuple(merged), floor)

    def uncovered(self, start: int, end: int) -> bool:
        """Whether some offset of ``[start, end]`` at or above the floor is not covered."""
        cursor = max(start, self.floor)
        if cursor > end:
            return False
        for span_start, span_end in self.spans:
            if span_end < cursor:
                continue
            if span_start > cursor:
                return True
            cursor = span_end + 1
            if cursor > end:
                return False
        return True

    @property
    def end(self) -> int:
        """The last covered offset (-1 when nothing is)."""
        return self.spans[-1][1] if self.spans else -1


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do next for one partition."""

    uploads: tuple[Segment, ...]
    """Segments to upload now, in order."""
    highest_remote_offset: int
    waiting: str | None
    """Why the next candidate cannot go yet (not ready, at or above LSO, quarantined)."""
    waiting_for_lso: bool = False
    """The next candidate is rolled and ready but not below ``lso`` (a fresher LSO may free it)."""
    lso: int | None = None
    stalled_on: Segment | None = None
    """The rolled segment that is not ready and holds the plan up: for a moment after a roll,
    or for good (a missing snapshot, a file that cannot be read)."""


def plan_partition(
    scan: PartitionScan,
    *,
    lso: int | None,
    highest_for_epoch: Callable[[int], int | None],
    quarantined: Collection[tuple[int, int | None, int]] = (),
    limit: int = 1,
    coverage: RemoteCoverage | None = None,
) -> Plan:
    """Plan the next uploads (at most ``limit``) of one partition this broker leads: with
    ``coverage``, every segment with an uncovered offset; without, Kafka's monotone rule.
    ``quarantined`` holds the ``(base offset, end offset, size)`` of each quarantined segment
    (a rolled segment never changes them)."""
    active = scan.active_segment
    # The log end offset bounds the latest epoch. Files do not tell it without reading the active
    # segment, but it is at least the active segment's base and at least the LSO.
    log_end = max(active.base_offset if active is not None else 0, lso or 0)
    # the broker's epoch cache (non-monotonic checkpoint entries dropped, as at its load)
    epochs = load_epoch_cache(scan.leader_epochs)
    highest = find_highest_remote_offset(epochs, log_end, highest_for_epoch)
    if lso is None:
        return Plan((), highest, "last stable offset unknown")
    uploads: list[Segment] = []
    waiting: str | None = None
    stalled_on: Segment | None = None
    for segment in scan.segments:
        end = segment.end_offset
        if end is None:  # the active segment is never a candidate
            waiting = "only the active segment is left"
            break
        if coverage is None:
            if end <= highest:
                continue  # already remote in this lineage
        elif not coverage.uncovered(segment.base_offset, end):
            continue  # its offsets are remote (or below the floor)
        if (segment.base_offset, end, segment.size) in quarantined:
            waiting = f"segment {segment.base_offset} is quarantined"
            if coverage is not None:
                continue  # the gap stays visible to the next plan
            break
        if not segment.ready and segment.not_ready is not NotReadyReason.SNAPSHOT_CORRUPT:
            waiting = f"segment {segment.base_offset} not ready: {segment.not_ready}"
            stalled_on = segment
            break
        if end >= lso:
            waiting = f"segment {segment.base_offset} ends at {end}, not below the LSO {lso}"
            if not uploads:
                return Plan((), highest, waiting, waiting_for_lso=True, lso=lso)
            break
        uploads.append(segment)
        if len(uploads) >= limit:
            break
    if uploads:
        return Plan(tuple(uploads), highest, None)
    return Plan((), highest, waiting, stalled_on=stalled_on)


def segments_behind(
    scan: PartitionScan,
    *,
    lso: int | None,
    highest_for_epoch: Callable[[int], int | None],
    coverage: RemoteCoverage | None = None,
) -> list[Segment]:
    """Copy lag: the rolled segments not yet remote: with ``coverage``, those with an uncovered
    offset; without, those that end past the highest remote offset of the lineage."""
    if coverage is not None:
        return [
            s
            for s in scan.segments
            if s.end_offset is not None and coverage.uncovered(s.base_offset, s.end_offset)
        ]
    highest = plan_partition(
        scan, lso=lso, highest_for_epoch=highest_for_epoch, limit=0
    ).highest_remote_offset
    return [s for s in scan.segments if s.end_offset is not None and s.end_offset > highest]
