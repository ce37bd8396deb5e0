"""``sidecar quarantine list`` and ``sidecar quarantine clear``: the quarantine file in the state
dir, read and rewritten directly (the daemon need not run).

A running daemon sees a clear within about a second (it re-reads the file when it changes) and
plans the partition again: the cleared segment is read and its batch CRCs checked anew. Bytes
still corrupt are quarantined again; bytes that were repaired (or a segment that was quarantined
by mistake) are tiered. A stopped daemon sees the clear when it starts.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import TextIO

from sidecar.config import SidecarConfig
from sidecar.errors import ConfigError
from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid
from sidecar.tiering.quarantine import Quarantine, QuarantineEntry

__all__ = ["quarantine_clear_command", "quarantine_list_command"]


def _open(config: SidecarConfig, *, migrate: bool) -> Quarantine:
    """The daemon's quarantine, from its state dir."""
    return Quarantine(config.state_dir / "quarantine.json", migrate=migrate)


def _line(entry: QuarantineEntry) -> str:
    since = datetime.datetime.fromtimestamp(entry.since_ms / 1000, tz=datetime.UTC)
    return (
        f"{entry.topic}-{entry.partition:<4} {encode_kafka_uuid(entry.topic_id):<22} "
        f"{entry.base_offset:>20} {entry.end_offset if entry.end_offset is not None else '-':>20} "
        f"{entry.size_bytes:>12} {since:%Y-%m-%dT%H:%M:%SZ}  {entry.reason}"
    )


def quarantine_list_command(config: SidecarConfig, *, as_json: bool, out: TextIO) -> int:
    """Print every quarantined segment (a table, or one JSON document)."""
    quarantine = _open(config, migrate=False)  # listing changes nothing
    entries = quarantine.entries()
    status = 0
    if quarantine.damaged:
        # the daemon reads such a file as empty (and checks those segments again); the
        # listing must not look like a clean one
        print(
            f"sidecar: error: {quarantine.path} is damaged (not the quarantine's JSON, or"
            " entries that cannot be read): this listing may miss segments; the daemon"
            " checks their CRCs again and quarantines the corrupt ones anew",
            file=sys.stderr,
        )
        status = 1
    if as_json:
        document = {
            "path": str(quarantine.path),
            "segments": [e.to_json() for e in entries],
            "legacy_entries_ignored": quarantine.legacy_dropped,
            "damaged": quarantine.damaged,
        }
        print(json.dumps(document, indent=2), file=out)
        return status
    print(
        f"{'PARTITION':<30} {'TOPIC ID':<22} {'BASE OFFSET':>20} {'END OFFSET':>20} "
        f"{'BYTES':>12} {'SINCE (UTC)':<20}  REASON",
        file=out,
    )
    for entry in entries:
        print(_line(entry), file=out)
    if not entries:
        print("(no quarantined segment)", file=out)
    if quarantine.legacy_dropped:
        print(
            f"({quarantine.legacy_dropped} entries of the older format, keyed by topic name, are"
            " ignored: the daemon drops them and checks those segments again)",
            file=out,
        )
    return status


def quarantine_clear_command(
    config: SidecarConfig,
    *,
    topic: str,
    partition: int,
    offset: int | None,
    topic_id: str | None,
    out: TextIO,
    err: TextIO,
) -> int:
    """Release quarantined segments of one partition; exit 1 when none matched."""
    tid = None
    if topic_id is not None:
        try:
            tid = decode_kafka_uuid(topic_id)
        except ValueError as exc:
            raise ConfigError(f"--topic-id: {exc}") from exc
    removed = _open(config, migrate=True).clear(
        topic=topic, partition=partition, base_offset=offset, topic_id=tid
    )
    if not removed:
        which = f"{topic}-{partition}" + ("" if offset is None else f" at offset {offset}")
        print(f"sidecar: no quarantined segment of {which}", file=err)
        return 1
    for entry in removed:
        print(
            f"cleared {entry.topic}-{entry.partition} segment {entry.base_offset}"
            f" (topic id {encode_kafka_uuid(entry.topic_id)}): a running sidecar reads and"
            " checks it again within seconds",
            file=out,
        )
    return 0
