"""``sidecar inspect PATH [--json] [--verify] [--records]``: what is in a log dir, a partition dir
or one ``.log`` segment, as tables, JSON, a verify report or a records dump.

The functions here are pure apart from reading the given path: they turn it into rows, JSON-able
dicts and lists of typed errors; :func:`run_inspect` only renders them to ``out`` and picks the
exit code. It never writes to the log dir. ``--verify`` reads every byte of every segment (one
batch at a time) and collects problems instead of stopping at the first; ``--json`` builds one
document, so ``--json --records`` holds the whole dump in memory (use text output for big logs).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO, TypeVar

import crc32c

from sidecar.errors import (
    CorruptRecordError,
    FormatError,
    IndexFormatError,
    SegmentVanishedError,
    SidecarError,
    UnreadableFileError,
)
from sidecar.kafka._io import (
    open_with_deleted_fallback,
    read_at,
    stat_with_deleted_fallback,
    unreadable,
)
from sidecar.kafka.indexes import OffsetIndex, TimeIndex, TxnIndex
from sidecar.kafka.logdir import (
    FileKind,
    LogDirScan,
    PartitionScan,
    Segment,
    SkipReason,
    TopicPartition,
    classify_dir_name,
    parse_segment_file_name,
    scan_log_dir,
    scan_partition_dir,
    segment_file_name,
)
from sidecar.kafka.records import BatchHeader, Record, decode_batches, iter_batches

__all__ = [
    "EXIT_NOT_A_LOG_DIR",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "SegmentTarget",
    "VerifiedPartition",
    "batch_row",
    "problem_row",
    "record_row",
    "resolve_target",
    "run_inspect",
    "segment_row",
    "verify_partition",
    "verify_segment",
    "verify_settled",
]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_NOT_A_LOG_DIR = 2

_SEGMENT_COLUMNS = (
    ("PARTITION", "partition"),
    ("BASE", "base_offset"),
    ("END", "end_offset"),
    ("SIZE", "size"),
    ("MAX_TIMESTAMP", "max_timestamp"),
    ("EPOCHS", "leader_epochs"),
    ("TXNINDEX", "txn_index"),
    ("STATE", "state"),
)
_BATCH_COLUMNS = (
    ("POSITION", "position"),
    ("BASE", "base_offset"),
    ("LAST", "last_offset"),
    ("RECORDS", "record_count"),
    ("SIZE", "size"),
    ("CODEC", "compression"),
    ("TIMESTAMP_TYPE", "timestamp_type"),
    ("MAX_TIMESTAMP", "max_timestamp"),
    ("EPOCH", "partition_leader_epoch"),
    ("PRODUCER", "producer"),
    ("FLAGS", "flags"),
)


@dataclass(frozen=True, slots=True)
class SegmentTarget:
    """A single ``.log`` file given on the command line, with what its directory says about it."""

    log_path: Path
    base_offset: int
    next_base_offset: int | None
    """The next ``.log`` in the same directory; ``None`` means this is the active segment."""

    @property
    def is_active(self) -> bool:
        return self.next_base_offset is None


class _NotALogPath(Exception):
    """The path does not exist or is neither a log dir, a partition dir nor a ``.log`` file."""


def resolve_target(path: Path) -> LogDirScan | PartitionScan | SegmentTarget:
    """Scan ``path`` as a log dir, a partition dir or a ``.log`` segment, whichever it is.

    Raises ``ValueError`` with a one-line reason when it is none of them or does not exist.
    """
    try:
        return _resolve(path)
    except _NotALogPath as exc:
        raise ValueError(str(exc)) from exc


def _resolve(path: Path) -> LogDirScan | PartitionScan | SegmentTarget:
    if not path.exists():
        raise _NotALogPath(f"{path} does not exist")
    if path.is_file():
        parsed = parse_segment_file_name(path.name)
        if parsed is None or parsed.kind is not FileKind.LOG:
            raise _NotALogPath(f"{path} is not a segment .log file")
        later = sorted(
            p.offset
            for p in (parse_segment_file_name(n) for n in _listdir(path.parent))
            if p is not None
            and p.kind is FileKind.LOG
            and not p.suffix
            and p.offset > parsed.offset
        )
        return SegmentTarget(path, parsed.offset, later[0] if later else None)
    if not path.is_dir():
        raise _NotALogPath(f"{path} is neither a file nor a directory")
    kind = classify_dir_name(path.name)
    if isinstance(kind, TopicPartition) and _looks_like_partition(path):
        scan = scan_partition_dir(path)
        if scan is None:
            raise _NotALogPath(f"{path} vanished while being read")
        return scan
    if (path / "meta.properties").exists() or any(
        isinstance(classify_dir_name(n), TopicPartition) and (path / n).is_dir()
        for n in _listdir(path)
    ):
        try:
            return scan_log_dir(path)
        except UnreadableFileError as exc:
            raise _NotALogPath(str(exc)) from exc
    if isinstance(kind, SkipReason) and kind is not SkipReason.NOT_A_PARTITION:
        raise _NotALogPath(f"{path} is not a partition the broker serves: {kind.value}")
    raise _NotALogPath(f"{path} is not a Kafka log dir, partition dir or .log file")


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []


def _looks_like_partition(path: Path) -> bool:
    names = _listdir(path)
    return any(parse_segment_file_name(n) is not None for n in names) or any(
        n in ("leader-epoch-checkpoint", "partition.metadata") for n in names
    )


# ---------------------------------------------------------------------------------------------
# rows: JSON-able dicts (text tables render the same dicts)


def segment_row(partition: PartitionScan, segment: Segment) -> dict[str, Any]:
    """One segment as a JSON-able dict (the RLM facts plus readiness)."""
    return {
        "topic": partition.topic,
        "partition": partition.partition,
        "base_offset": segment.base_offset,
        "end_offset": segment.end_offset,
        "size": segment.size,
        "max_timestamp": segment.max_timestamp_ms,
        "leader_epochs": [[e.epoch, e.start_offset] for e in segment.leader_epochs],
        "txn_index_empty": segment.txn_index_empty,
        "index_trimmed": segment.index_trimmed,
        "timeindex_trimmed": segment.timeindex_trimmed,
        "active": segment.is_active,
        "ready": segment.ready,
        "not_ready": None if segment.not_ready is None else segment.not_ready.name,
        "problem": None if segment.problem is None else problem_row(segment.problem),
    }


def batch_row(header: BatchHeader) -> dict[str, Any]:
    """One batch header as a JSON-able dict."""
    return {
        "position": header.position,
        "base_offset": header.base_offset,
        "last_offset": header.last_offset,
        "record_count": header.record_count,
        "size": header.size,
        "partition_leader_epoch": header.partition_leader_epoch,
        "crc": header.crc,
        "compression": header.compression.name.lower(),
        "timestamp_type": header.timestamp_type.name,
        "base_timestamp": header.base_timestamp,
        "max_timestamp": header.max_timestamp,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "transactional": header.is_transactional,
        "control": header.is_control,
        "delete_horizon_ms": header.delete_horizon_ms,
    }


def record_row(record: Record) -> dict[str, Any]:
    """One record as a JSON-able dict; bytes are text when UTF-8, else ``{"base64": ...}``."""
    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestamp_type": record.timestamp_type.name,
        "key": _jsonable_bytes(record.key),
        "value": _jsonable_bytes(record.value),
        "headers": [[k, _jsonable_bytes(v)] for k, v in record.headers],
        "control": None if record.control_type is None else record.control_type.name,
    }


def problem_row(error: SidecarError) -> dict[str, Any]:
    """A typed error as a JSON-able dict: its type, message, file and byte position."""
    return {
        "error": type(error).__name__,
        "message": str(error),
        "path": getattr(error, "path", None),
        "position": getattr(error, "position", None),
    }


def _jsonable_bytes(data: bytes | None) -> str | dict[str, str] | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


# ---------------------------------------------------------------------------------------------
# verify


_VERIFY_PASSES = 3
"""Passes over a partition whose files keep changing before its problems are reported anyway."""

_T = TypeVar("_T", PartitionScan, "SegmentTarget")


@dataclass(frozen=True, slots=True)
class VerifiedPartition:
    """What :func:`verify_settled` found, and on which scan."""

    scan: PartitionScan
    """The scan the problems refer to: a fresh one when the first pass was repeated."""
    problems: list[SidecarError]
    rechecks: int
    """How many times the partition was scanned and verified again because problems were found."""


def verify_partition(partition: PartitionScan) -> list[SidecarError]:
    """Every problem in a partition dir: its scan's typed errors, then each segment's CRCs, offset
    order, indexes and txn index (see :func:`verify_segment`), as :func:`verify_settled` finds
    them."""
    return verify_settled(partition).problems


def verify_settled(partition: PartitionScan) -> VerifiedPartition:
    """Verify ``partition``; when that finds problems, scan and verify it again until a pass runs
    while its files hold still.

    A live broker rewrites rolled segments: the log cleaner swaps in a merged segment and deletes
    the ones it absorbed, retention deletes, a roll turns the active segment into a rolled one.
    A pass that works from a segment list taken before such a change reads a new ``.log`` against
    an old segment end ("batch last offset 90 is past the segment end 72") or an index against a
    different ``.log``. So a problem is reported only from a pass during which no segment file of
    the partition changed (names, inodes, sizes, mtimes; the active segment may grow), or after
    ``_VERIFY_PASSES`` passes that all raced the broker. Clean partitions are read once. Files
    the broker deleted mid-pass (``SegmentVanishedError``) are kept from every pass but do not
    cause a recheck: they are the broker at work, not problems.
    """
    scan, problems, rechecks = _settled(
        partition.path,
        partition.path,
        partition,
        lambda: scan_partition_dir(partition.path),
        _verify_pass,
    )
    return VerifiedPartition(scan, problems, rechecks)


def _settled(
    directory: Path,
    subject: Path,
    first: _T,
    rescan: Callable[[], _T | None],
    check: Callable[[_T], list[SidecarError]],
) -> tuple[_T, list[SidecarError], int]:
    """``check(first)``, then while it finds problems ``check(rescan())`` until a pass ran while
    the files of ``directory`` held still (see :func:`verify_settled`); ``rescan`` returns None
    when ``subject`` is gone. Returns what was checked last, its problems with every pass's
    vanished files, and the number of rechecks."""
    vanished: list[SidecarError] = []

    def verify(target: _T) -> list[SidecarError]:
        found = check(target)
        vanished.extend(p for p in found if isinstance(p, SegmentVanishedError))
        return [p for p in found if not isinstance(p, SegmentVanishedError)]

    target = first
    problems: list[SidecarError] = verify(target)
    rechecks = 0
    while problems and rechecks < _VERIFY_PASSES - 1:
        before = _files_fingerprint(directory)
        fresh = rescan()
        rechecks += 1
        if fresh is None or before is None:
            gone = f"{subject} vanished while being verified (deleted by the broker)"
            problems = [SegmentVanishedError(gone)]
            break
        target, problems = fresh, verify(fresh)
        if _files_fingerprint(directory) == before:
            break
    return target, _dedupe([*problems, *vanished]), rechecks


def _verify_pass(partition: PartitionScan) -> list[SidecarError]:
    problems = list(partition.all_problems())
    for segment in partition.segments:
        problems.extend(
            verify_segment(
                SegmentTarget(segment.log_path, segment.base_offset, segment.next_base_offset)
            )
        )
    return _dedupe(problems)


_FileStat = tuple[str, int, int, int]


def _files_fingerprint(path: Path) -> tuple[_FileStat, ...] | None:
    """Every file name in a partition dir with (inode, size, mtime) of the segment files that are
    not the active segment's; ``None`` when the directory is gone."""
    try:
        names = sorted(p.name for p in path.iterdir())
    except FileNotFoundError:
        return None
    except OSError:
        return ()
    parsed = {name: parse_segment_file_name(name) for name in names}
    logs = [p.offset for p in parsed.values() if p and p.kind is FileKind.LOG and not p.suffix]
    active = max(logs, default=None)
    out: list[_FileStat] = []
    for name in names:
        entry = parsed[name]
        if entry is None or entry.kind is FileKind.SNAPSHOT or entry.offset == active:
            out.append((name, 0, 0, 0))
            continue
        try:
            st = (path / name).stat()
        except OSError:
            out.append((name, -1, -1, -1))
            continue
        out.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def verify_segment(target: SegmentTarget) -> list[SidecarError]:
    """Every problem in one segment, collected rather than raised.

    * the ``.log``: each batch's CRC-32C (a bad CRC does not stop the walk), offsets that go
      backwards or leave [base, nextBase), and a truncated or zero-padded tail (tolerated on the
      active segment); a structural error ends the walk of that file;
    * ``.index``: trimmed when rolled, entries increasing, inside the ``.log``, each at a batch;
    * ``.timeindex``: trimmed when rolled, non-decreasing, offsets inside the segment;
    * ``.txnindex``: whole entries of version 0, offsets consistent.
    """
    problems: list[SidecarError] = []
    end_offset = None if target.next_base_offset is None else target.next_base_offset - 1
    batches: dict[int, int] = {}  # batch position -> base offset
    log_size = 0
    try:
        fh, opened = open_with_deleted_fallback(target.log_path)
    except SidecarError as exc:
        return [exc]
    with fh:
        try:
            log_size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            return [unreadable(opened, exc)]
        problems.extend(_verify_log(fh, str(opened), target, end_offset, batches))
    directory = target.log_path.parent
    problems.extend(
        _verify_offset_index(
            directory / segment_file_name(target.base_offset, FileKind.INDEX),
            target,
            log_size=log_size,
            end_offset=end_offset,
            batches=batches,
        )
    )
    problems.extend(
        _verify_time_index(
            directory / segment_file_name(target.base_offset, FileKind.TIMEINDEX),
            target,
            end_offset=end_offset,
        )
    )
    txn_path = directory / segment_file_name(target.base_offset, FileKind.TXNINDEX)
    if txn_path.exists():
        try:
            problems.extend(TxnIndex.read(txn_path, base_offset=target.base_offset).validate())
        except FormatError as exc:
            problems.append(exc)
    return problems


def _verify_log(
    fh: BinaryIO,
    path: str,
    target: SegmentTarget,
    end_offset: int | None,
    batches: dict[int, int],
) -> list[SidecarError]:
    problems: list[SidecarError] = []
    expected_next = target.base_offset
    try:
        for header in iter_batches(fh, verify_crc=False, tolerate_tail=target.is_active, path=path):
            batches[header.position] = header.base_offset
            data = read_at(fh, header.position, header.size, path=path)
            computed = int(crc32c.crc32c(memoryview(data)[21:]))
            if computed != header.crc:
                problems.append(
                    CorruptRecordError(
                        f"record batch at offset {header.base_offset} is corrupt: stored crc "
                        f"{header.crc:#010x}, computed crc {computed:#010x}",
                        path=path,
                        position=header.position,
                    )
                )
            if header.base_offset < expected_next:
                problems.append(
                    CorruptRecordError(
                        f"batch base offset {header.base_offset} is below the expected "
                        f"{expected_next} (offsets must increase from the segment base)",
                        path=path,
                        position=header.position,
                    )
                )
            if end_offset is not None and header.last_offset > end_offset:
                problems.append(
                    CorruptRecordError(
                        f"batch last offset {header.last_offset} is past the segment end "
                        f"{end_offset} (next segment starts at {end_offset + 1})",
                        path=path,
                        position=header.position,
                    )
                )
            expected_next = max(expected_next, header.next_offset)
    except FormatError as exc:
        problems.append(exc)
    return problems


def _verify_offset_index(
    path: Path,
    target: SegmentTarget,
    *,
    log_size: int,
    end_offset: int | None,
    batches: dict[int, int],
) -> list[SidecarError]:
    if not path.exists():
        return []
    try:
        index = OffsetIndex.read(path, base_offset=target.base_offset)
    except FormatError as exc:
        return [exc]
    problems: list[SidecarError] = []
    if not target.is_active and not index.trimmed:
        problems.append(
            IndexFormatError(
                f"rolled segment's index has a preallocated zero tail of "
                f"{index.zero_tail_entries} entries",
                path=str(path),
                position=len(index.data),
            )
        )
    bound = log_size
    if target.is_active:
        # the broker appends to the .log before it indexes what it appended: entries read
        # after the walk may point past the size taken before it, never past the size now
        with contextlib.suppress(OSError, SidecarError):
            bound = max(log_size, stat_with_deleted_fallback(target.log_path)[0].st_size)
    problems.extend(index.validate(log_size=bound, end_offset=end_offset))
    for i, (offset, position) in enumerate(index):
        if position >= log_size or not batches:  # past the walked bytes: no batch to check
            continue
        if position not in batches:
            problems.append(
                IndexFormatError(
                    f"entry {i} points at byte {position}, which is not the start of a batch",
                    path=str(path),
                    position=i * 8,
                )
            )
        elif offset < batches[position]:
            problems.append(
                IndexFormatError(
                    f"entry {i} offset {offset} is before the base offset {batches[position]} "
                    f"of the batch at byte {position}",
                    path=str(path),
                    position=i * 8,
                )
            )
    return problems


def _verify_time_index(
    path: Path, target: SegmentTarget, *, end_offset: int | None
) -> list[SidecarError]:
    if not path.exists():
        return []
    try:
        index = TimeIndex.read(path, base_offset=target.base_offset)
    except FormatError as exc:
        return [exc]
    problems: list[SidecarError] = []
    if not target.is_active and not index.trimmed:
        problems.append(
            IndexFormatError(
                f"rolled segment's time index has a preallocated zero tail of "
                f"{index.zero_tail_entries} entries",
                path=str(path),
                position=len(index.data),
            )
        )
    problems.extend(index.validate(end_offset=end_offset))
    return problems


def _dedupe(problems: Sequence[SidecarError]) -> list[SidecarError]:
    seen: set[tuple[str, str]] = set()
    out: list[SidecarError] = []
    for p in problems:
        key = (type(p).__name__, str(p))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


# ---------------------------------------------------------------------------------------------
# walking batches and records of one segment, collecting errors


def _iter_batches(
    target: SegmentTarget, *, records: bool, problems: list[SidecarError]
) -> Iterator[tuple[BatchHeader, list[Record] | None]]:
    try:
        fh, opened = open_with_deleted_fallback(target.log_path)
    except SidecarError as exc:
        problems.append(exc)
        return
    with fh:
        path = str(opened)
        try:
            if records:
                yield from decode_batches(
                    fh, verify_crc=True, tolerate_tail=target.is_active, path=path
                )
            else:
                for header in iter_batches(
                    fh, verify_crc=True, tolerate_tail=target.is_active, path=path
                ):
                    yield header, None
        except SidecarError as exc:
            problems.append(exc)


# ---------------------------------------------------------------------------------------------
# rendering


def run_inspect(
    path: Path,
    *,
    as_json: bool,
    verify: bool,
    records: bool,
    out: TextIO,
    err: TextIO | None = None,
) -> int:
    """Inspect ``path`` and write the result to ``out``.

    Returns 0 when all is well, 1 when problems were found (every problem with ``verify``; only
    those met while listing otherwise), 2 when ``path`` does not exist or is not a log dir,
    partition dir or ``.log`` file (said on ``err``, stderr by default, also with
    ``as_json``). Files the broker deleted while they were being read
    (``SegmentVanishedError``: retention or topic deletion racing the scan) are listed under
    ``vanished``; they are the broker at work, not problems.
    """
    try:
        target = _resolve(path)
    except _NotALogPath as exc:
        # on stderr, as every command's errors, with --json too: stdout has only documents
        (err if err is not None else sys.stderr).write(f"sidecar: error: {exc}\n")
        return EXIT_NOT_A_LOG_DIR
    problems: list[SidecarError] = []
    if isinstance(target, SegmentTarget):
        document = _segment_document(target, verify=verify, records=records, problems=problems)
    else:
        document = _dir_document(target, verify=verify, records=records, problems=problems)
    problems = _dedupe(problems)
    vanished = [p for p in problems if isinstance(p, SegmentVanishedError)]
    problems = [p for p in problems if not isinstance(p, SegmentVanishedError)]
    document["problems"] = [problem_row(p) for p in problems]
    document["vanished"] = [problem_row(p) for p in vanished]
    document["ok"] = not problems
    if as_json:
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        _render_text(document, out)
    return EXIT_PROBLEMS if problems else EXIT_OK


def _dir_document(
    target: LogDirScan | PartitionScan,
    *,
    verify: bool,
    records: bool,
    problems: list[SidecarError],
) -> dict[str, Any]:
    if isinstance(target, LogDirScan):
        partitions = list(target.partitions)
        problems.extend(target.problems)
        document: dict[str, Any] = {
            "kind": "log_dir",
            "path": str(target.path),
            "meta": None
            if target.meta is None
            else {
                "version": target.meta.version,
                "node_id": target.meta.node_id,
                "cluster_id": target.meta.cluster_id,
                "directory_id": target.meta.directory_id,
            },
            "skipped": [{"path": str(s.path), "reason": s.reason.name} for s in target.skipped],
        }
    else:
        partitions = [target]
        document = {"kind": "partition", "path": str(target.path)}
    document["partitions"] = []
    for listed in partitions:
        partition = listed
        if verify:
            verified = verify_settled(listed)
            partition = verified.scan
            problems.extend(verified.problems)
        else:
            problems.extend(listed.all_problems())
        entry: dict[str, Any] = {
            "topic": partition.topic,
            "partition": partition.partition,
            "path": str(partition.path),
            "topic_id": partition.topic_id,
            "leader_epochs": [[e.epoch, e.start_offset] for e in partition.leader_epochs],
            "snapshot_offsets": list(partition.snapshot_offsets),
            "transient_files": list(partition.transient_files),
            "unknown_files": list(partition.unknown_files),
            "segments": [segment_row(partition, s) for s in partition.segments],
        }
        if verify:
            entry["rechecks"] = verified.rechecks
        if records:
            entry["records"] = [
                {"batch": batch_row(h), "records": [record_row(r) for r in recs or ()]}
                for s in partition.segments
                for h, recs in _iter_batches(
                    SegmentTarget(s.log_path, s.base_offset, s.next_base_offset),
                    records=True,
                    problems=problems,
                )
            ]
        document["partitions"].append(entry)
    return document


def _segment_document(
    target: SegmentTarget, *, verify: bool, records: bool, problems: list[SidecarError]
) -> dict[str, Any]:
    batches = [
        {**batch_row(h), **({"records": [record_row(r) for r in recs]} if recs is not None else {})}
        for h, recs in _iter_batches(target, records=records, problems=problems)
    ]
    document: dict[str, Any] = {}
    if verify:
        target, found, document["rechecks"] = _settled(
            target.log_path.parent,
            target.log_path,
            target,
            lambda: _resegment(target),
            verify_segment,
        )
        problems.extend(found)
    return {
        "kind": "segment",
        "path": str(target.log_path),
        "base_offset": target.base_offset,
        "next_base_offset": target.next_base_offset,
        "active": target.is_active,
        "batches": batches,
        **document,
    }


def _resegment(target: SegmentTarget) -> SegmentTarget | None:
    """``target`` as its directory lists it now; None when the file is gone."""
    try:
        fresh = _resolve(target.log_path)
    except _NotALogPath:
        return None
    return fresh if isinstance(fresh, SegmentTarget) else None


def _render_text(document: dict[str, Any], out: TextIO) -> None:
    kind = document["kind"]
    if kind == "segment":
        state = (
            "active" if document["active"] else f"rolled, next base {document['next_base_offset']}"
        )
        out.write(f"segment {document['path']} (base offset {document['base_offset']}, {state})\n")
        rows = [_batch_text(b) for b in document["batches"]]
        _write_table(out, _BATCH_COLUMNS, rows)
        for batch in document["batches"]:
            for record in batch.get("records", ()):
                out.write(_record_text(record) + "\n")
    else:
        if kind == "log_dir":
            meta = document["meta"]
            who = (
                "no meta.properties"
                if meta is None
                else f"node {meta['node_id']}, cluster {meta['cluster_id']}, "
                f"directory {meta['directory_id']}"
            )
            out.write(f"log dir {document['path']} ({who})\n")
        for partition in document["partitions"]:
            epochs = _epochs_text(partition["leader_epochs"])
            out.write(
                f"{partition['topic']}-{partition['partition']}  topic id "
                f"{partition['topic_id'] or '-'}  epochs {epochs or '-'}\n"
            )
        rows = [
            _segment_text(s) for partition in document["partitions"] for s in partition["segments"]
        ]
        _write_table(out, _SEGMENT_COLUMNS, rows)
        for skipped in document.get("skipped", ()):
            out.write(f"skipped {skipped['path']}: {SkipReason[skipped['reason']].value}\n")
        for partition in document["partitions"]:
            for entry in partition.get("records", ()):
                for record in entry["records"]:
                    out.write(
                        f"{partition['topic']}-{partition['partition']} {_record_text(record)}\n"
                    )
    for problem in document["problems"]:
        out.write(f"PROBLEM {problem['error']}: {problem['message']}\n")
    for gone in document["vanished"]:
        out.write(f"VANISHED (deleted by the broker during the scan): {gone['message']}\n")
    out.write("ok\n" if document["ok"] else f"{len(document['problems'])} problem(s)\n")


def _segment_text(row: dict[str, Any]) -> dict[str, str]:
    if row["ready"]:
        state = "ready"
    elif row["active"]:
        state = "active"
    else:
        state = f"not ready: {row['not_ready'].lower()}"
    return {
        "partition": f"{row['topic']}-{row['partition']}",
        "base_offset": str(row["base_offset"]),
        "end_offset": "-" if row["end_offset"] is None else str(row["end_offset"]),
        "size": str(row["size"]),
        "max_timestamp": _timestamp_text(row["max_timestamp"]),
        "leader_epochs": _epochs_text(row["leader_epochs"]) or "-",
        "txn_index": "empty" if row["txn_index_empty"] else "aborts",
        "state": state,
    }


def _batch_text(row: dict[str, Any]) -> dict[str, str]:
    flags = [
        name
        for name, on in (
            ("txn", row["transactional"]),
            ("control", row["control"]),
            ("delete-horizon", row["delete_horizon_ms"] is not None),
        )
        if on
    ]
    return {
        "position": str(row["position"]),
        "base_offset": str(row["base_offset"]),
        "last_offset": str(row["last_offset"]),
        "record_count": str(row["record_count"]),
        "size": str(row["size"]),
        "compression": row["compression"],
        "timestamp_type": row["timestamp_type"].lower(),
        "max_timestamp": _timestamp_text(row["max_timestamp"]),
        "partition_leader_epoch": str(row["partition_leader_epoch"]),
        "producer": "-"
        if row["producer_id"] < 0
        else f"{row['producer_id']}/{row['producer_epoch']}/{row['base_sequence']}",
        "flags": ",".join(flags) or "-",
    }


def _record_text(row: dict[str, Any]) -> str:
    parts = [
        f"offset={row['offset']}",
        f"timestamp={_timestamp_text(row['timestamp'])}",
        f"key={_value_text(row['key'])}",
        f"value={_value_text(row['value'])}",
    ]
    if row["headers"]:
        parts.append("headers=" + ",".join(f"{k}={_value_text(v)}" for k, v in row["headers"]))
    if row["control"] is not None:
        parts.append(f"control={row['control']}")
    return " ".join(parts)


def _value_text(value: str | dict[str, str] | None, limit: int = 120) -> str:
    if value is None:
        return "null"
    text = f"base64:{value['base64']}" if isinstance(value, dict) else json.dumps(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def _epochs_text(epochs: list[list[int]]) -> str:
    return ",".join(f"{epoch}@{start}" for epoch, start in epochs)


def _timestamp_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 0:  # Kafka's NO_TIMESTAMP (-1: data converted from the v0 format), not a date
        return str(ms)
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _write_table(
    out: TextIO, columns: Sequence[tuple[str, str]], rows: Sequence[dict[str, str]]
) -> None:
    widths = [max([len(title), *(len(row[key]) for row in rows)]) for title, key in columns]
    out.write("  ".join(t.ljust(w) for (t, _), w in zip(columns, widths, strict=True)).rstrip())
    out.write("\n")
    for row in rows:
        cells = (row[key].ljust(w) for (_, key), w in zip(columns, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")
