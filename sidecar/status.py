"""The daemon's status document (``GET /v1/status`` on the metrics port, ``sidecar status``).

Per partition in the broker's log dirs: how it is tiered (``mode``: ``standalone``,
``broker-driven``, ``copy-disabled``, or None; ``selected`` when it is tiered at all), local
segments, tiered segments (COPY_SEGMENT_FINISHED in the metadata store) with their bytes
(``tiered_bytes``, the remote bytes that remote retention counts) and offset range
(``remote_start_offset`` is the remote log start offset: remote retention deletes from the
oldest segment on, so it moves up as segments are deleted), copy lag (segments, bytes, seconds;
null where nothing is copied: copy-disabled or untiered), leadership, quarantined segments and
the last tiering error. Built on the event loop from in-memory views plus a few indexed store
queries (run in a thread); it changes nothing.

Quarantined segments (corrupt bytes, :mod:`sidecar.tiering.quarantine`) are listed by the
partition's current topic id: ``quarantined`` holds their base offsets, ``quarantined_segments``
the details, with ``local`` saying whether the segment is still in the log dir (its only copy:
it was never tiered). The text table lists them below, each with the command that clears it.
"""

from __future__ import annotations

import datetime
import functools
import shlex
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.kafka.logdir import PartitionScan
from sidecar.metadata.events import RemoteLogSegmentState, TopicIdPartition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.tiering.cluster import ClusterView
from sidecar.tiering.planner import segments_behind
from sidecar.tiering.quarantine import QuarantineEntry
from sidecar.tiering.workers import remote_coverage

__all__ = ["partition_status", "render_status"]

_FINISHED = (RemoteLogSegmentState.COPY_SEGMENT_FINISHED,)
#: the modes whose segments are copied: the sidecar's own, or the broker's through the plugin
_COPIED = ("standalone", "broker-driven")


def partition_status(
    *,
    views: Mapping[Path, PartitionScan],
    cluster: ClusterView,
    store: RemoteSegmentStore,
    mode: Callable[[str], str | None],
    last_errors: Mapping[tuple[str, int], tuple[float, str]],
    quarantined: Callable[[uuid.UUID, int], Sequence[QuarantineEntry]],
    now_ms: int | None = None,
) -> list[dict[str, Any]]:
    """One dict per partition directory, sorted by topic and partition (thread side)."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    rows = []
    for scan in sorted(views.values(), key=lambda s: (s.topic, s.partition)):
        key = (scan.topic, scan.partition)
        tiering = mode(scan.topic)
        row: dict[str, Any] = {
            "topic": scan.topic,
            "partition": scan.partition,
            "topic_id": scan.topic_id,
            "selected": tiering is not None,
            "mode": tiering,
            "leader": cluster.leads(scan.topic, scan.partition),
            "local_segments": len(scan.segments),
            "local_bytes": sum(s.size for s in scan.segments),
            "tiered_segments": 0,
            "tiered_bytes": 0,
            "remote_start_offset": None,
            "remote_end_offset": None,
            "lag_segments": 0,
            "lag_bytes": 0,
            "lag_seconds": 0.0,
            "quarantined": [],
            "quarantined_segments": [],
            "last_error": None,
        }
        if key in last_errors:
            at, message = last_errors[key]
            row["last_error"] = {"at": at, "message": message}
        if scan.topic_id is not None:
            tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition)
            local = {s.base_offset for s in scan.segments}
            entries = sorted(quarantined(tip.topic_id, scan.partition), key=lambda e: e.base_offset)
            row["quarantined"] = [e.base_offset for e in entries]
            row["quarantined_segments"] = [
                {
                    "base_offset": e.base_offset,
                    "end_offset": e.end_offset,
                    "bytes": e.size_bytes,
                    "since_ms": e.since_ms,
                    "reason": e.reason,
                    "local": e.base_offset in local,
                }
                for e in entries
            ]
            finished = store.segments(tip, states=_FINISHED)
            row["tiered_segments"] = len(finished)
            row["tiered_bytes"] = sum(m.segment_size_in_bytes for m in finished)
            if finished:
                row["remote_start_offset"] = min(m.start_offset for m in finished)
                row["remote_end_offset"] = max(m.end_offset for m in finished)
        # copy lag only where something copies: a copy-disabled or untiered partition's local
        # segments are not waiting for anything (null in the document, "-" in the table)
        if tiering not in _COPIED:
            row["lag_segments"] = row["lag_bytes"] = row["lag_seconds"] = None
        elif scan.topic_id is not None:
            tip = TopicIdPartition(decode_kafka_uuid(scan.topic_id), scan.topic, scan.partition)
            lso = cluster.lso(scan.topic, scan.partition)
            behind = segments_behind(
                scan,
                lso=lso,
                highest_for_epoch=functools.partial(store.highest_offset_for_epoch, tip),
                coverage=remote_coverage(store, scan, tip, lso),
            )
            row["lag_segments"] = len(behind)
            row["lag_bytes"] = sum(s.size for s in behind)
            oldest = min((s.max_timestamp_ms for s in behind if s.max_timestamp_ms), default=None)
            row["lag_seconds"] = 0.0 if oldest is None else max(0.0, (now - oldest) / 1000)
        rows.append(row)
    return rows


def _or_dash(value: float | None, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def render_status(
    rows: list[dict[str, Any]], *, all_partitions: bool = False, config_args: Sequence[str] = ()
) -> str:
    """A table for people: selected partitions (or all of them with ``all_partitions``)."""
    header = (
        f"{'PARTITION':<40} {'MODE':<13} {'LEADER':<6} {'LOCAL':>5} {'TIERED':>6} "
        f"{'REMOTE BYTES':>12} {'REMOTE RANGE':>21} {'LAG SEG':>7} {'LAG BYTES':>10} "
        f"{'LAG S':>7}  LAST ERROR"
    )
    lines = [header]
    for row in rows:
        if not (all_partitions or row["selected"]):
            continue
        remote = (
            "-"
            if row["remote_start_offset"] is None
            else f"{row['remote_start_offset']}..{row['remote_end_offset']}"
        )
        error = row["last_error"]["message"] if row["last_error"] else ""
        if row["quarantined"]:
            error = f"quarantined {row['quarantined']} " + error
        name = f"{row['topic']}-{row['partition']}"
        lines.append(
            f"{name:<40} {row.get('mode') or '-':<13} {'yes' if row['leader'] else 'no':<6} "
            f"{row['local_segments']:>5} "
            f"{row['tiered_segments']:>6} {row.get('tiered_bytes', 0):>12} {remote:>21} "
            f"{_or_dash(row['lag_segments']):>7} {_or_dash(row['lag_bytes']):>10} "
            f"{_or_dash(row['lag_seconds'], '.1f'):>7}  {error}"
        )
    if len(lines) == 1:
        lines.append("(no partition selected for tiering; --all shows every partition)")
    lines += _quarantine_lines(rows, all_partitions=all_partitions, config_args=config_args)
    return "\n".join(lines) + "\n"


def _quarantine_lines(
    rows: list[dict[str, Any]], *, all_partitions: bool, config_args: Sequence[str]
) -> list[str]:
    """The quarantined segments below the table, each with the command that clears it, with
    ``config_args`` (the status command's ``-c`` and ``--set``: the quarantine file lives in
    their state_dir)."""
    lines: list[str] = []
    config = "".join(f" {shlex.quote(a)}" for a in config_args)
    for row in rows:
        if not (all_partitions or row["selected"]):
            continue
        for q in row.get("quarantined_segments", []):
            since = datetime.datetime.fromtimestamp(q["since_ms"] / 1000, tz=datetime.UTC)
            where = "local only" if q["local"] else "gone from the log dir: lost"
            lines.append(
                f"  {row['topic']}-{row['partition']} segment {q['base_offset']}.."
                f"{q['end_offset']} ({q['bytes']} bytes, {where}, since"
                f" {since:%Y-%m-%dT%H:%M:%SZ}): {q['reason']}"
            )
            lines.append(
                f"    sidecar quarantine clear{config} --topic {shlex.quote(row['topic'])}"
                f" --partition {row['partition']} --offset {q['base_offset']}"
            )
    if lines:
        lines.insert(
            0,
            "\nQUARANTINED (corrupt bytes, never tiered: the remote log has a gap there; the"
            " local copy is lost when local retention deletes it)",
        )
    return lines
