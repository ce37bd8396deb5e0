"""Local-retention safety: segments the broker may delete (or did delete) before they were tiered.

The broker deletes local segments by its *local* retention: ``local.retention.ms/bytes`` when the
topic has ``remote.storage.enable=true`` and not ``remote.log.copy.disable=true`` (a value of -2
means "use ``retention.*``"), otherwise ``retention.ms/bytes`` (``UnifiedLog.localRetentionMs/Size``
with ``remoteLogEnabledAndRemoteCopyEnabled``, kafka-kip405-internals.md §3.7). A
broker without tiered storage does not wait for the sidecar, so a lagging sidecar can lose data:

* **lost**: a rolled segment that disappeared from the log dir while its end offset was past
  the highest tiered offset of its lineage (it was never tiered), or, given the lineage's
  FINISHED coverage, while some offset of it above the floor was not covered (a hole);
* **at risk**: a segment not yet tiered that the broker will delete soon: its age (now - max
  timestamp) is past ``fraction`` of the local ``retention.ms``, or the partition's local bytes
  are past the point where the broker deletes it less ``(1 - fraction)`` of the local
  ``retention.bytes`` (Kafka deletes the oldest segment while ``size - retention.bytes >=
  segment.size``).

Pure: the caller passes the scans, the highest tiered offset and the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.kafka.logdir import Segment
from sidecar.tiering.planner import RemoteCoverage

__all__ = ["LocalRetention", "at_risk_segments", "lost_segments"]


@dataclass(frozen=True, slots=True)
class LocalRetention:
    """The broker's local retention of one topic (-1 = none)."""

    ms: int
    bytes: int

    @classmethod
    def of(
        cls,
        *,
        remote_storage_enable: bool,
        retention_ms: int,
        retention_bytes: int,
        local_retention_ms: int,
        local_retention_bytes: int,
        remote_log_copy_disable: bool = False,
    ) -> LocalRetention:
        """Kafka's ``localRetentionMs``/``localRetentionSize`` for a topic's configs."""
        if not remote_storage_enable or remote_log_copy_disable:
            return cls(retention_ms, retention_bytes)
        ms = retention_ms if local_retention_ms == -2 else local_retention_ms
        size = retention_bytes if local_retention_bytes == -2 else local_retention_bytes
        return cls(ms, size)


def at_risk_segments(
    segments: Sequence[Segment],
    *,
    highest_tiered_offset: int,
    retention: LocalRetention,
    now_ms: int,
    fraction: float,
    coverage: RemoteCoverage | None = None,
) -> list[Segment]:
    """The rolled segments past ``highest_tiered_offset`` (with ``coverage``: not covered) that
    the broker's local retention will delete soon (see the module docstring)."""
    total = sum(s.size for s in segments)
    risky: list[Segment] = []
    before = 0  # bytes of the older segments, which the broker deletes first
    for segment in segments:
        end = segment.end_offset
        upto = before + segment.size
        before = upto
        if end is None or not _untiered(segment, end, highest_tiered_offset, coverage):
            continue
        by_time = (
            retention.ms >= 0
            and segment.max_timestamp_ms is not None
            and now_ms - segment.max_timestamp_ms >= fraction * retention.ms
        )
        by_size = retention.bytes >= 0 and (
            total - retention.bytes + (1 - fraction) * retention.bytes >= upto
        )
        if by_time or by_size:
            risky.append(segment)
    return risky


def _untiered(
    segment: Segment, end: int, highest_tiered_offset: int, coverage: RemoteCoverage | None
) -> bool:
    if coverage is None:
        return end > highest_tiered_offset
    return coverage.uncovered(segment.base_offset, end)


def lost_segments(
    old: Sequence[Segment],
    new: Sequence[Segment],
    *,
    highest_tiered_offset: int,
    coverage: RemoteCoverage | None = None,
) -> list[Segment]:
    """The rolled segments of ``old`` that are gone from ``new`` (the broker deleted them)
    although they end past ``highest_tiered_offset`` (with ``coverage``: although some offset
    of them is not covered): they were never tiered."""
    remaining = {s.base_offset for s in new}
    first = min(remaining) if remaining else None
    return [
        s
        for s in old
        if s.end_offset is not None
        and s.base_offset not in remaining
        and (first is None or s.base_offset < first)
        and _untiered(s, s.end_offset, highest_tiered_offset, coverage)
    ]
