"""Pure planning: which local segments of one partition to upload next, in order.

Kafka's rules (RemoteLogManager, kafka-kip405-internals.md §3.2-3.3):

* the starting point is the highest offset already in remote storage for the partition's
  leader-epoch lineage (``findHighestRemoteOffset``): walk the local leader-epoch cache from the
  latest epoch down, ask the metadata store for the highest remote offset of that epoch, and clamp
  it by the epoch's end offset;
* candidates are the local segments that end after that offset, in base-offset order;
* a segment is copied only when it is not active and its end offset (next base - 1) is below the
  last stable offset; here it must also be *ready* (indexes trimmed, ``<nextBase>.snapshot``
  valid) and not quarantined.

Segments are uploaded strictly in order: planning stops at the first candidate that cannot go
yet, so the remote log never has a hole that a later upload would paper over.

No I/O, no clock, no awaits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sidecar.kafka.checkpoints import EpochEntry
from sidecar.kafka.logdir import PartitionScan, Segment

__all__ = ["Plan", "find_highest_remote_offset", "plan_partition", "segments_behind"]


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


def plan_partition(
    scan: PartitionScan,
    *,
    lso: int | None,
    highest_for_epoch: Callable[[int], int | None],
    quarantined: Collection[int] = (),
    limit: int = 1,
) -> Plan:
    """Plan the next uploads (at most ``limit``) of one partition this broker leads."""
    active = scan.active_segment
    # The log end offset bounds the latest epoch. Files do not tell it without reading the active
    # segment, but it is at least the active segment's base and at least the LSO.
    log_end = max(active.base_offset if active is not None else 0, lso or 0)
    highest = find_highest_remote_offset(scan.leader_epochs, log_end, highest_for_epoch)
    if lso is None:
        return Plan((), highest, "last stable offset unknown")
    uploads: list[Segment] = []
    waiting: str | None = None
    for segment in scan.segments:
        end = segment.end_offset
        if end is None:  # the active segment is never a candidate
            waiting = "only the active segment is left"
            break
        if end <= highest:
            continue  # already remote in this lineage
        if segment.base_offset in quarantined:
            waiting = f"segment {segment.base_offset} is quarantined"
            break
        if not segment.ready:
            waiting = f"segment {segment.base_offset} not ready: {segment.not_ready}"
            break
        if end >= lso:
            waiting = f"segment {segment.base_offset} ends at {end}, not below the LSO {lso}"
            if not uploads:
                return Plan((), highest, waiting, waiting_for_lso=True, lso=lso)
            break
        uploads.append(segment)
        if len(uploads) >= limit:
            break
    return Plan(tuple(uploads), highest, waiting if not uploads else None)


def segments_behind(
    scan: PartitionScan,
    *,
    lso: int | None,
    highest_for_epoch: Callable[[int], int | None],
) -> list[Segment]:
    """Copy lag: the rolled segments that end past the highest remote offset of the lineage."""
    highest = plan_partition(
        scan, lso=lso, highest_for_epoch=highest_for_epoch, limit=0
    ).highest_remote_offset
    return [s for s in scan.segments if s.end_offset is not None and s.end_offset > highest]
