"""Kafka's own view of a partition's files: run ``org.apache.kafka.tools.DumpLogSegments`` from the
broker's jars and parse its text output, strictly (an unknown line fails the parse, so a format
change in Kafka cannot silently turn a comparison into a no-op).

Output shapes parsed here (Kafka 4.3, ``--deep-iteration --print-data-log``)::

    Dumping <path>
    Log starting offset: <n>                                                (.log)
    baseOffset: .. lastOffset: .. count: .. baseSequence: .. lastSequence: .. producerId: ..
      producerEpoch: .. partitionLeaderEpoch: .. isTransactional: .. isControl: ..
      deleteHorizonMs: OptionalLong.empty position: .. CreateTime|LogAppendTime: .. size: ..
      magic: .. compresscodec: .. crc: .. isvalid: ..                       (one line per batch)
    | offset: .. CreateTime: .. keySize: .. valueSize: .. sequence: .. headerKeys: [a,b]
      [key: <k>] [payload: <v>] | [endTxnMarker: COMMIT coordinatorEpoch: 0]  (one per record)
    offset: <n> position: <p>                                               (.index)
    timestamp: <t> offset: <n>                                              (.timeindex)
    version: 0 producerId: .. firstOffset: .. lastOffset: .. lastStableOffset: ..  (.txnindex)
    producerId: .. producerEpoch: .. coordinatorEpoch: .. currentTxnFirstOffset: ..
      lastTimestamp: .. firstSequence: .. lastSequence: .. lastOffset: .. offsetDelta: ..
      timestamp: ..                                                         (.snapshot)

followed by the tool's own consistency reports ("Mismatches in :<path>", "Non-consecutive offsets
in <path>", ...), kept verbatim. This module only reads: it never writes into the log dir.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"

_PAIRS = re.compile(r"(\w+): (\S+)")
_RECORD_HEAD = re.compile(
    r"\| offset: (?P<offset>-?\d+) (?P<ts_type>CreateTime|LogAppendTime|NoTimestampType): "
    r"(?P<timestamp>-?\d+) keySize: (?P<key_size>-?\d+) valueSize: (?P<value_size>-?\d+) "
    r"sequence: (?P<sequence>-?\d+) headerKeys: \[(?P<header_keys>[^\]]*)\]"
)
_CONTROL_TAIL = re.compile(r" endTxnMarker: (?P<marker>\w+) coordinatorEpoch: (?P<epoch>-?\d+)$")
_REPORT_HEADS = (
    "Mismatches in ",
    "The following indexed offsets are not found in ",
    "Non-consecutive offsets in ",
    "Found timestamp mismatch in ",
    "Found out of order timestamp in ",
    "Shallow offsets not found in ",
)


@dataclass
class DumpRecord:
    """One ``| offset: ...`` line."""

    offset: int
    timestamp_type: str
    timestamp: int
    key_size: int
    value_size: int
    sequence: int
    header_keys: list[str]
    key: str | None
    payload: str | None
    end_txn_marker: str | None
    coordinator_epoch: int | None


@dataclass
class DumpBatch:
    """One ``baseOffset: ...`` line and its records."""

    base_offset: int
    last_offset: int
    count: int
    base_sequence: int
    last_sequence: int
    producer_id: int
    producer_epoch: int
    partition_leader_epoch: int
    is_transactional: bool
    is_control: bool
    delete_horizon_ms: int | None
    position: int
    timestamp_type: str
    max_timestamp: int
    size: int
    magic: int
    codec: str
    crc: int
    is_valid: bool
    records: list[DumpRecord] = field(default_factory=list)


@dataclass
class DumpedFile:
    """Everything printed under one ``Dumping <path>`` line."""

    path: Path
    log_start_offset: int | None = None
    batches: list[DumpBatch] = field(default_factory=list)
    index: list[tuple[int, int]] = field(default_factory=list)
    """(offset, position)"""
    timeindex: list[tuple[int, int]] = field(default_factory=list)
    """(timestamp, offset)"""
    txns: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    """(version, producerId, firstOffset, lastOffset, lastStableOffset)"""
    producers: list[dict[str, int]] = field(default_factory=list)
    """Snapshot entries; ``currentTxnFirstOffset`` is -1 for ``OptionalLong.empty``."""


@dataclass
class Dump:
    files: dict[str, DumpedFile]
    """By path, as given to the tool."""
    reports: list[tuple[str, list[str]]]
    """The tool's consistency reports: (heading, detail lines)."""

    def file(self, path: Path) -> DumpedFile:
        """What the tool printed for ``path``."""
        return self.files[str(path)]


def _optional_long(text: str) -> int | None:
    if text == "OptionalLong.empty":
        return None
    match = re.fullmatch(r"OptionalLong\[(-?\d+)\]", text)
    if match is None:
        raise AssertionError(f"not an OptionalLong: {text!r}")
    return int(match.group(1))


def _batch(line: str) -> DumpBatch:
    pairs = dict(_PAIRS.findall(line))
    ts_type = "LogAppendTime" if "LogAppendTime" in pairs else "CreateTime"
    return DumpBatch(
        base_offset=int(pairs["baseOffset"]),
        last_offset=int(pairs["lastOffset"]),
        count=int(pairs["count"]),
        base_sequence=int(pairs["baseSequence"]),
        last_sequence=int(pairs["lastSequence"]),
        producer_id=int(pairs["producerId"]),
        producer_epoch=int(pairs["producerEpoch"]),
        partition_leader_epoch=int(pairs["partitionLeaderEpoch"]),
        is_transactional=pairs["isTransactional"] == "true",
        is_control=pairs["isControl"] == "true",
        delete_horizon_ms=_optional_long(pairs["deleteHorizonMs"]),
        position=int(pairs["position"]),
        timestamp_type=ts_type,
        max_timestamp=int(pairs[ts_type]),
        size=int(pairs["size"]),
        magic=int(pairs["magic"]),
        codec=pairs["compresscodec"],
        crc=int(pairs["crc"]),
        is_valid=pairs["isvalid"] == "true",
    )


def _record(line: str) -> DumpRecord:
    head = _RECORD_HEAD.match(line)
    if head is None:
        raise AssertionError(f"unparsed record line: {line[:200]!r}")
    rest = line[head.end() :]
    key_size = int(head["key_size"])
    value_size = int(head["value_size"])
    marker = _CONTROL_TAIL.fullmatch(rest)
    key = payload = None
    if marker is None:
        # keys and values in these tests are ASCII, so keySize characters are keySize bytes
        if key_size >= 0:
            assert rest.startswith(" key: "), line[:200]
            key = rest[6 : 6 + key_size]
            rest = rest[6 + key_size :]
        if value_size >= 0:
            assert rest.startswith(" payload: "), line[:200]
            payload = rest[10:]
            rest = ""
        assert rest == "", f"unparsed end of record line: {rest[:200]!r}"
    keys = head["header_keys"]
    return DumpRecord(
        offset=int(head["offset"]),
        timestamp_type=head["ts_type"],
        timestamp=int(head["timestamp"]),
        key_size=key_size,
        value_size=value_size,
        sequence=int(head["sequence"]),
        header_keys=keys.split(",") if keys else [],
        key=key,
        payload=payload,
        end_txn_marker=None if marker is None else marker["marker"],
        coordinator_epoch=None if marker is None else int(marker["epoch"]),
    )


def _ints(line: str, names: tuple[str, ...]) -> list[int] | None:
    pairs = _PAIRS.findall(line)
    if tuple(k for k, _ in pairs) != names:
        return None
    return [int(v) for _, v in pairs]


def parse_dump(text: str) -> Dump:
    """Parse DumpLogSegments output; any line that fits no known shape fails the parse."""
    files: dict[str, DumpedFile] = {}
    reports: list[tuple[str, list[str]]] = []
    current: DumpedFile | None = None
    for line in text.splitlines():
        if line.startswith("Dumping "):
            current = DumpedFile(Path(line[len("Dumping ") :]))
            files[str(current.path)] = current
            continue
        if line.startswith(_REPORT_HEADS):
            reports.append((line, []))
            current = None
            continue
        if reports and current is None:
            if line.strip():
                reports[-1][1].append(line.strip())
            continue
        if not line.strip():
            continue
        if current is None:
            raise AssertionError(f"output before the first 'Dumping' line: {line[:200]!r}")
        suffix = current.path.suffix
        if suffix == ".log":
            if line.startswith("Log starting offset: "):
                current.log_start_offset = int(line.split(": ")[1])
            elif line.startswith("baseOffset: "):
                current.batches.append(_batch(line))
            elif line.startswith("| offset: "):
                current.batches[-1].records.append(_record(line))
            else:
                raise AssertionError(f"unparsed .log line: {line[:200]!r}")
        elif suffix == ".index":
            values = _ints(line, ("offset", "position"))
            assert values is not None, f"unparsed .index line: {line[:200]!r}"
            current.index.append((values[0], values[1]))
        elif suffix == ".timeindex":
            values = _ints(line, ("timestamp", "offset"))
            assert values is not None, f"unparsed .timeindex line: {line[:200]!r}"
            current.timeindex.append((values[0], values[1]))
        elif suffix == ".txnindex":
            names = ("version", "producerId", "firstOffset", "lastOffset", "lastStableOffset")
            values = _ints(line, names)
            assert values is not None, f"unparsed .txnindex line: {line[:200]!r}"
            current.txns.append((values[0], values[1], values[2], values[3], values[4]))
        elif suffix == ".snapshot":
            pairs = dict(_PAIRS.findall(line))
            expected = {
                "producerId",
                "producerEpoch",
                "coordinatorEpoch",
                "currentTxnFirstOffset",
                "lastTimestamp",
                "firstSequence",
                "lastSequence",
                "lastOffset",
                "offsetDelta",
                "timestamp",
            }
            assert set(pairs) == expected, f"unparsed .snapshot line: {line[:200]!r}"
            txn_first = _optional_long(pairs.pop("currentTxnFirstOffset"))
            entry = {k: int(v) for k, v in pairs.items()}
            entry["currentTxnFirstOffset"] = -1 if txn_first is None else txn_first
            current.producers.append(entry)
        else:
            raise AssertionError(f"unexpected file in the dump: {current.path}")
    return Dump(files, reports)


def dump_files(cluster: Any, paths: list[Path]) -> Dump:
    """Run DumpLogSegments once over ``paths`` (a JVM start costs a second) and parse it."""
    result = cluster.tool(
        DUMP_LOG_SEGMENTS,
        "--files",
        ",".join(str(p) for p in paths),
        "--deep-iteration",
        "--print-data-log",
        timeout=180.0,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return parse_dump(result.stdout)
