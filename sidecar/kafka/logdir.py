"""A broker log dir as the sidecar sees it: partition directories, their segments, the segment
facts Kafka's RemoteLogManager computes, and whether each segment is ready to tier.

Upstream: ``core/src/main/scala/kafka/log/LocalLog.scala`` (directory names, roll order),
``storage/src/main/java/org/apache/kafka/storage/internals/log/{LogFileUtils,LogSegment}.java``,
``core/src/main/java/kafka/log/remote/RemoteLogManager.java`` (``copyLogSegment``)
(https://github.com/apache/kafka).

Pure and synchronous: a scan is a function of the files on disk. It only reads (never writes,
renames or deletes in a log dir), reads one index entry and the producer snapshot per segment,
never a ``.log`` body, and turns every per-file problem into a typed error attached to the scan, so
one bad partition never hides the others. The broker's races are expected: files renamed to
``.deleted`` are read under the new name, vanished segments are reported as such, and a producer
snapshot still being written in place means "not ready yet", not corruption.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

from sidecar.errors import FormatError, SegmentVanishedError, SidecarError, UnreadableFileError
from sidecar.kafka._io import (
    DELETED_SUFFIX,
    open_with_deleted_fallback,
    stat_with_deleted_fallback,
    unreadable,
)
from sidecar.kafka.checkpoints import (
    EpochEntry,
    MetaProperties,
    epoch_entries_in_range,
    read_leader_epoch_checkpoint,
    read_meta_properties,
    read_partition_metadata,
    verify_producer_snapshot,
)
from sidecar.kafka.indexes import OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY, index_tail

__all__ = [
    "LEADER_EPOCH_CHECKPOINT",
    "META_PROPERTIES",
    "PARTITION_METADATA",
    "FileKind",
    "LogDirScan",
    "NotReadyReason",
    "PartitionScan",
    "Segment",
    "SegmentFileName",
    "SkipReason",
    "SkippedDir",
    "TopicPartition",
    "classify_dir_name",
    "open_segment_file",
    "parse_segment_file_name",
    "read_broker_identity",
    "scan_log_dir",
    "scan_partition_dir",
    "segment_file_name",
]

META_PROPERTIES = "meta.properties"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"


def read_broker_identity(log_dirs: Sequence[Path]) -> MetaProperties | None:
    """The first readable ``meta.properties`` of the broker's log dirs (node id, cluster id)."""
    for log_dir in log_dirs:
        try:
            return read_meta_properties(log_dir / META_PROPERTIES)
        except (FileNotFoundError, FormatError):
            continue
    return None


#: the KRaft metadata log lives in a partition-like dir; it is never tiered
_METADATA_TOPIC = "__cluster_metadata"
_MAX_TOPIC_LENGTH = 249  # Topic.MAX_NAME_LENGTH
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+\Z")
# LocalLog.DeleteDirPattern / FutureDirPattern / StrayDirPattern, matched whole
_SPECIAL_DIR = re.compile(r"(\S+)-(\S+)\.(\S+)-(delete|future|stray)\Z")
_SEGMENT_FILE = re.compile(
    r"(?P<offset>[0-9]{20})\.(?P<kind>log|index|timeindex|txnindex|snapshot)"
    r"(?P<suffix>\.deleted|\.cleaned|\.swap)?\Z"
)
_TRANSIENT_SUFFIXES = (DELETED_SUFFIX, ".cleaned", ".swap", ".tmp")


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class SkipReason(enum.StrEnum):
    """Why a directory in a log dir is not scanned as a partition."""

    DELETE = "scheduled for deletion (-delete)"
    FUTURE = "target of a log-dir move (-future)"
    STRAY = "stray partition (-stray)"
    METADATA_LOG = "KRaft metadata log"
    NOT_A_PARTITION = "not a <topic>-<partition> name"
    VANISHED = "vanished during the scan"


@dataclass(frozen=True, slots=True)
class SkippedDir:
    """A directory of the log dir that is not a partition we scan, and why."""

    path: Path
    reason: SkipReason


_SPECIAL_REASONS = {
    "delete": SkipReason.DELETE,
    "future": SkipReason.FUTURE,
    "stray": SkipReason.STRAY,
}


def classify_dir_name(name: str) -> TopicPartition | SkipReason:
    """Parse ``<topic>-<partition>`` as ``LocalLog.parseTopicPartitionName``, or say why not.

    Topics may contain ``-`` and ``.``; the partition is after the last ``-``. ``-delete``,
    ``-future`` and ``-stray`` directories and the KRaft metadata log are recognised and skipped,
    and any other name that is not a legal topic and a canonical non-negative partition number
    is ``NOT_A_PARTITION``.
    """
    special = _SPECIAL_DIR.match(name)
    if special:
        return _SPECIAL_REASONS[special.group(4)]
    topic, sep, partition = name.rpartition("-")
    if (
        not sep
        or not topic
        or len(topic) > _MAX_TOPIC_LENGTH
        or topic in (".", "..")
        or not _LEGAL_TOPIC.match(topic)
        or not partition.isascii()
        or not partition.isdigit()
        or str(int(partition)) != partition
        or int(partition) > 2**31 - 1
    ):
        return SkipReason.NOT_A_PARTITION
    if topic == _METADATA_TOPIC:
        return SkipReason.METADATA_LOG
    return TopicPartition(topic, int(partition))


class FileKind(enum.StrEnum):
    """The per-segment files, named ``<20-digit offset>.<kind>``."""

    LOG = "log"
    INDEX = "index"
    TIMEINDEX = "timeindex"
    TXNINDEX = "txnindex"
    SNAPSHOT = "snapshot"


class SegmentFileName(NamedTuple):
    offset: int
    kind: FileKind
    suffix: str
    """``""``, or ``.deleted`` / ``.cleaned`` / ``.swap`` for a file in transition."""


def parse_segment_file_name(name: str) -> SegmentFileName | None:
    """``00000000000000001234.log`` → (1234, LOG, ""); ``None`` for anything else."""
    match = _SEGMENT_FILE.match(name)
    if not match:
        return None
    return SegmentFileName(int(match["offset"]), FileKind(match["kind"]), match["suffix"] or "")


def segment_file_name(offset: int, kind: FileKind) -> str:
    """``LogFileUtils.filenamePrefixFromOffset``: the 20-digit zero-padded offset, then the kind."""
    return f"{offset:020d}.{kind.value}"


def open_segment_file(path: Path) -> tuple[BinaryIO, Path]:
    """Open a segment file (or producer snapshot) for reading, as an uploader should.

    If the broker renamed it to ``<path>.deleted`` since it was listed, that name is opened
    instead; an open file keeps reading fine after the rename. Returns the file and the name that
    worked; raises ``SegmentVanishedError`` when both names are gone.
    """
    return open_with_deleted_fallback(path)


class NotReadyReason(enum.StrEnum):
    """Why a segment cannot be tiered yet (or at all)."""

    ACTIVE = "active segment: the broker still appends to it"
    INDEX_NOT_TRIMMED = ".index still has its preallocated zero tail"
    TIMEINDEX_NOT_TRIMMED = ".timeindex still has its preallocated zero tail"
    SNAPSHOT_MISSING = "no <nextBase>.snapshot yet"
    SNAPSHOT_INCOMPLETE = "<nextBase>.snapshot is still being written (bad CRC or short)"
    SNAPSHOT_CORRUPT = "<nextBase>.snapshot is corrupt"
    VANISHED = "deleted by the broker during the scan"
    UNREADABLE = "a file of the segment cannot be read or parsed"


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment and the facts RemoteLogManager would publish for it.

    Equality ignores ``size`` (the active segment grows) and ``problem`` (exceptions compare by
    identity), so two scans of an unchanged partition compare equal.
    """

    base_offset: int
    log_path: Path
    index_path: Path | None
    """``<base>.index`` if it exists (it is created lazily)."""
    timeindex_path: Path | None
    txnindex_path: Path | None
    """``<base>.txnindex`` if it exists (created on the first aborted transaction)."""
    is_active: bool
    """The last segment: the broker still appends to it."""
    next_base_offset: int | None
    max_timestamp_ms: int | None
    """``LogSegment.largestTimestamp()``: the last ``.timeindex`` entry, or the ``.log`` mtime
    when that has no timestamp. ``None`` for the active segment."""
    leader_epochs: tuple[EpochEntry, ...]
    """``epochEntriesInRange(base, nextBase)`` of the partition's leader-epoch checkpoint."""
    txn_index_empty: bool
    """``segment.txnIndex().isEmpty()``: no ``.txnindex`` or an empty one (checked for the active
    segment too, whose aborted transactions the broker appends as they happen)."""
    index_trimmed: bool | None
    """``None`` when the file does not exist."""
    timeindex_trimmed: bool | None
    snapshot_path: Path | None
    """``<nextBase>.snapshot`` when it parsed with a valid CRC, or when it is an older snapshot
    that did not (``SNAPSHOT_CORRUPT``): that never heals, and Kafka's RLM uploads it as it is."""
    not_ready: NotReadyReason | None
    """``None`` when the segment is ready to tier."""
    size: int = field(compare=False)
    """Bytes in the ``.log`` (``segment.log().sizeInBytes()``)."""
    problem: SidecarError | None = field(default=None, compare=False)
    """The typed error behind ``SNAPSHOT_CORRUPT``, ``VANISHED`` or ``UNREADABLE``."""

    @property
    def start_offset(self) -> int:
        return self.base_offset

    @property
    def end_offset(self) -> int | None:
        """``nextSegmentBaseOffset - 1``, as RLM publishes it; ``None`` for the active segment."""
        return None if self.next_base_offset is None else self.next_base_offset - 1

    @property
    def ready(self) -> bool:
        """Rolled, indexes trimmed and ``<nextBase>.snapshot`` valid: safe to upload as is."""
        return self.not_ready is None


@dataclass(frozen=True, slots=True)
class PartitionScan:
    """One partition directory: identity, epochs and segments sorted by base offset."""

    path: Path
    topic: str
    partition: int
    topic_id: str | None
    """From ``partition.metadata`` (base64url, as Kafka prints it); ``None`` if absent."""
    leader_epochs: tuple[EpochEntry, ...]
    """The whole ``leader-epoch-checkpoint``."""
    segments: tuple[Segment, ...]
    snapshot_offsets: tuple[int, ...]
    """Offsets of the ``<offset>.snapshot`` files, ascending."""
    transient_files: tuple[str, ...]
    """``.deleted``, ``.cleaned``, ``.swap`` and ``.tmp`` files: the broker is mid-operation."""
    unknown_files: tuple[str, ...]
    problems: tuple[SidecarError, ...] = field(default=(), compare=False)
    """Partition-level errors (checkpoint or partition.metadata unreadable, directory unlistable);
    segment-level errors are on each :class:`Segment`."""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def active_segment(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def ready_segments(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.ready)

    def all_problems(self) -> list[SidecarError]:
        """Partition-level problems, then every segment's."""
        return [*self.problems, *(s.problem for s in self.segments if s.problem is not None)]


@dataclass(frozen=True, slots=True)
class LogDirScan:
    """A whole log dir: the broker facts and every partition, sorted by (topic, partition)."""

    path: Path
    meta: MetaProperties | None
    """``meta.properties``; ``None`` when absent (an unformatted dir) or unreadable."""
    partitions: tuple[PartitionScan, ...]
    skipped: tuple[SkippedDir, ...]
    problems: tuple[SidecarError, ...] = field(default=(), compare=False)

    def partition(self, topic: str, partition: int) -> PartitionScan | None:
        for p in self.partitions:
            if p.topic == topic and p.partition == partition:
                return p
        return None


def scan_log_dir(path: Path) -> LogDirScan:
    """Scan a broker log dir (one entry of ``log.dirs``).

    Raises ``UnreadableFileError`` only when ``path`` itself cannot be listed (missing, not a
    directory, no permission); everything below it is reported inside the result.
    """
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise UnreadableFileError("log dir does not exist", path=str(path), position=0) from exc
        raise unreadable(path, exc) from exc
    problems: list[SidecarError] = []
    meta: MetaProperties | None = None
    try:
        meta = read_meta_properties(path / META_PROPERTIES)
    except FileNotFoundError:
        pass
    except FormatError as exc:
        problems.append(exc)
    partitions: list[PartitionScan] = []
    skipped: list[SkippedDir] = []
    for entry in entries:
        if not _is_dir(entry):
            continue
        entry_path = Path(entry.path)
        kind = classify_dir_name(entry.name)
        if isinstance(kind, SkipReason):
            skipped.append(SkippedDir(entry_path, kind))
            continue
        scan = _scan_partition(entry_path, kind)
        if scan is None:
            skipped.append(SkippedDir(entry_path, SkipReason.VANISHED))
        else:
            partitions.append(scan)
    partitions.sort(key=lambda p: (p.topic, p.partition))
    return LogDirScan(Path(path), meta, tuple(partitions), tuple(skipped), tuple(problems))


def scan_partition_dir(path: Path) -> PartitionScan | None:
    """Scan one partition directory; ``None`` when its name is not a partition we track
    (``-delete``, ``-future``, ``-stray``, the metadata log, garbage) or it vanished.

    This is the detector's per-directory hook; two scans of an unchanged directory compare equal.
    """
    kind = classify_dir_name(path.name)
    if isinstance(kind, SkipReason):
        return None
    return _scan_partition(path, kind)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _scan_partition(path: Path, tp: TopicPartition) -> PartitionScan | None:
    try:
        names = sorted(p.name for p in path.iterdir())
    except FileNotFoundError:
        return None  # deleted, or renamed to -delete, since the log dir was listed
    except OSError as exc:
        return PartitionScan(
            path=path,
            topic=tp.topic,
            partition=tp.partition,
            topic_id=None,
            leader_epochs=(),
            segments=(),
            snapshot_offsets=(),
            transient_files=(),
            unknown_files=(),
            problems=(unreadable(path, exc),),
        )
    problems: list[SidecarError] = []
    logs: list[int] = []
    files: dict[tuple[int, FileKind], Path] = {}
    snapshots: list[int] = []
    transient: list[str] = []
    unknown: list[str] = []
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is not None and not parsed.suffix:
            files[(parsed.offset, parsed.kind)] = path / name
            if parsed.kind is FileKind.LOG:
                logs.append(parsed.offset)
            elif parsed.kind is FileKind.SNAPSHOT:
                snapshots.append(parsed.offset)
        elif parsed is not None or name.endswith(_TRANSIENT_SUFFIXES):
            transient.append(name)
        elif name not in (LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA):
            unknown.append(name)

    topic_id: str | None = None
    try:
        topic_id = read_partition_metadata(path / PARTITION_METADATA).topic_id
    except FileNotFoundError:
        pass
    except FormatError as exc:
        problems.append(exc)
    epochs: tuple[EpochEntry, ...] = ()
    try:
        epochs = read_leader_epoch_checkpoint(path / LEADER_EPOCH_CHECKPOINT)
    except FileNotFoundError:
        pass
    except FormatError as exc:
        problems.append(exc)

    newest_snapshot = max(snapshots, default=None)
    segments = []
    for i, base in enumerate(logs):
        next_base = logs[i + 1] if i + 1 < len(logs) else None
        segments.append(_scan_segment(base, next_base, files, epochs, newest_snapshot))
    return PartitionScan(
        path=path,
        topic=tp.topic,
        partition=tp.partition,
        topic_id=topic_id,
        leader_epochs=epochs,
        segments=tuple(segments),
        snapshot_offsets=tuple(snapshots),
        transient_files=tuple(transient),
        unknown_files=tuple(unknown),
        problems=tuple(problems),
    )


class _SegmentFacts:
    """Mutable accumulator for one segment's scan; frozen into a :class:`Segment` at the end."""

    __slots__ = (
        "index_trimmed",
        "max_timestamp_ms",
        "not_ready",
        "problem",
        "size",
        "snapshot_path",
        "timeindex_trimmed",
        "txn_index_empty",
    )

    def __init__(self) -> None:
        self.size = 0
        self.max_timestamp_ms: int | None = None
        self.index_trimmed: bool | None = None
        self.timeindex_trimmed: bool | None = None
        self.txn_index_empty = True
        self.snapshot_path: Path | None = None
        self.not_ready: NotReadyReason | None = None
        self.problem: SidecarError | None = None

    def fail(self, reason: NotReadyReason, problem: SidecarError | None = None) -> None:
        if self.not_ready is None:
            self.not_ready = reason
        if self.problem is None:
            self.problem = problem


def _scan_segment(
    base: int,
    next_base: int | None,
    files: dict[tuple[int, FileKind], Path],
    epochs: tuple[EpochEntry, ...],
    newest_snapshot: int | None,
) -> Segment:
    log_path = files[(base, FileKind.LOG)]
    index_path = files.get((base, FileKind.INDEX))
    timeindex_path = files.get((base, FileKind.TIMEINDEX))
    txnindex_path = files.get((base, FileKind.TXNINDEX))
    facts = _SegmentFacts()
    mtime_ms = 0
    try:
        stat, _ = stat_with_deleted_fallback(log_path)
        facts.size = stat.st_size
        mtime_ms = stat.st_mtime_ns // 1_000_000
    except SegmentVanishedError as exc:
        facts.fail(NotReadyReason.VANISHED, exc)
    except FormatError as exc:
        facts.fail(NotReadyReason.UNREADABLE, exc)

    if next_base is None:
        facts.fail(NotReadyReason.ACTIVE)
        _check_txn_index(facts, txnindex_path)  # its aborted transactions count too (a stat)
    else:
        _check_indexes(facts, index_path, timeindex_path, mtime_ms)
        _check_txn_index(facts, txnindex_path)
        _check_snapshot(
            facts, files.get((next_base, FileKind.SNAPSHOT)), next_base, newest_snapshot
        )

    return Segment(
        base_offset=base,
        log_path=log_path,
        index_path=index_path,
        timeindex_path=timeindex_path,
        txnindex_path=txnindex_path,
        is_active=next_base is None,
        next_base_offset=next_base,
        max_timestamp_ms=facts.max_timestamp_ms,
        leader_epochs=epoch_entries_in_range(epochs, base, -1 if next_base is None else next_base),
        txn_index_empty=facts.txn_index_empty,
        index_trimmed=facts.index_trimmed,
        timeindex_trimmed=facts.timeindex_trimmed,
        snapshot_path=facts.snapshot_path,
        not_ready=facts.not_ready,
        size=facts.size,
        problem=facts.problem,
    )


def _check_indexes(
    facts: _SegmentFacts, index_path: Path | None, timeindex_path: Path | None, mtime_ms: int
) -> None:
    if index_path is not None:
        try:
            size, last = index_tail(index_path, OFFSET_INDEX_ENTRY.size)
            facts.index_trimmed = size <= OFFSET_INDEX_ENTRY.size or any(last)
            if not facts.index_trimmed:
                facts.fail(NotReadyReason.INDEX_NOT_TRIMMED)
        except SegmentVanishedError as exc:
            facts.fail(NotReadyReason.VANISHED, exc)
        except FormatError as exc:
            facts.fail(NotReadyReason.UNREADABLE, exc)
    largest = -1
    if timeindex_path is not None:
        try:
            size, last = index_tail(timeindex_path, TIME_INDEX_ENTRY.size)
            facts.timeindex_trimmed = size <= TIME_INDEX_ENTRY.size or any(last)
            if not facts.timeindex_trimmed:
                facts.fail(NotReadyReason.TIMEINDEX_NOT_TRIMMED)
            elif last:
                largest = TIME_INDEX_ENTRY.unpack(last)[0]
        except SegmentVanishedError as exc:
            facts.fail(NotReadyReason.VANISHED, exc)
        except FormatError as exc:
            facts.fail(NotReadyReason.UNREADABLE, exc)
    # LogSegment.largestTimestamp: maxTimestampSoFar (the time index's last entry) when it has
    # a timestamp, else the .log's last-modified time
    facts.max_timestamp_ms = largest if largest >= 0 else mtime_ms


def _check_txn_index(facts: _SegmentFacts, txnindex_path: Path | None) -> None:
    if txnindex_path is None:
        return
    try:
        stat, _ = stat_with_deleted_fallback(txnindex_path)
        facts.txn_index_empty = stat.st_size == 0
    except SegmentVanishedError:
        facts.txn_index_empty = True  # removed with its segment; the .log check reports that
    except FormatError as exc:
        facts.fail(NotReadyReason.UNREADABLE, exc)


def _check_snapshot(
    facts: _SegmentFacts, snapshot_path: Path | None, next_base: int, newest: int | None
) -> None:
    if snapshot_path is None:
        facts.fail(NotReadyReason.SNAPSHOT_MISSING)
        return
    try:
        verify_producer_snapshot(snapshot_path)
    except SegmentVanishedError as exc:
        facts.fail(NotReadyReason.VANISHED, exc)
        return
    except UnreadableFileError as exc:
        facts.fail(NotReadyReason.UNREADABLE, exc)
        return
    except FormatError as exc:
        if next_base == newest:
            # written in place right after the roll, without fsync: wait for a valid CRC
            facts.fail(NotReadyReason.SNAPSHOT_INCOMPLETE)
        else:
            # the broker re-reads only its newest snapshots at load, so an older one stays bad;
            # its path is kept: the tiering engine uploads it as it is, as Kafka's RLM does
            facts.fail(NotReadyReason.SNAPSHOT_CORRUPT, exc)
            facts.snapshot_path = snapshot_path
        return
    facts.snapshot_path = snapshot_path
