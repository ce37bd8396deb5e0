"""A segment's ``.index`` (offset -> file position), ``.timeindex`` (timestamp -> offset) and
``.txnindex`` (aborted transactions): parsing, trimmed-versus-preallocated detection, validation,
and the broker's lookups.

Upstream: ``storage/src/main/java/org/apache/kafka/storage/internals/log/{AbstractIndex,OffsetIndex,
TimeIndex,TransactionIndex,AbortedTxn}.java``
(https://github.com/apache/kafka/tree/trunk/storage/src/main/java/org/apache/kafka/storage/internals/log).

Pure and synchronous; works on bytes from a local file or from the object store alike. It never
writes an index, and it reads one entry of a file to tell whether it is trimmed. Entries stay packed
in one ``bytes`` object and are unpacked on access, so a 10 MiB index costs 10 MiB, not 1.3 million
Python objects.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, NamedTuple, TypeVar

from sidecar.errors import IndexFormatError, TruncatedFileError
from sidecar.kafka._io import open_with_deleted_fallback, read_at, read_small_file, unreadable

__all__ = [
    "ABORTED_TXN_ENTRY",
    "OFFSET_INDEX_ENTRY",
    "TIME_INDEX_ENTRY",
    "AbortedTxn",
    "OffsetIndex",
    "OffsetPosition",
    "TimeIndex",
    "TimestampOffset",
    "TxnIndex",
    "index_tail",
]

#: ``OffsetIndex`` entry
OFFSET_INDEX_ENTRY = struct.Struct(
    ">"
    "i"  # relativeOffset: offset - segment baseOffset
    "i"  # position: byte position of a batch in the .log
)
#: ``TimeIndex`` entry
TIME_INDEX_ENTRY = struct.Struct(
    ">"
    "q"  # timestamp: the largest timestamp seen before relativeOffset
    "i"  # relativeOffset: offset - segment baseOffset
)
#: ``AbortedTxn`` entry of a ``TransactionIndex``
ABORTED_TXN_ENTRY = struct.Struct(
    ">"
    "h"  # version: 0
    "q"  # producerId
    "q"  # firstOffset: first offset of the aborted transaction
    "q"  # lastOffset: offset of the abort marker
    "q"  # lastStableOffset: the LSO when the abort was written
)

#: ``RecordBatch.NO_TIMESTAMP``, what the time index answers when no entry matches
NO_TIMESTAMP = -1
_ABORTED_TXN_VERSION = 0


class OffsetPosition(NamedTuple):
    """An offset-index answer: an absolute offset and the ``.log`` position to scan from."""

    offset: int
    position: int


class TimestampOffset(NamedTuple):
    """A time-index answer: a timestamp and an absolute offset."""

    timestamp: int
    offset: int


class AbortedTxn(NamedTuple):
    """One aborted transaction from a ``.txnindex`` (offsets are absolute)."""

    version: int
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


E = TypeVar("E", OffsetPosition, TimestampOffset, AbortedTxn)


@dataclass(frozen=True, slots=True)
class _PackedIndex(Generic[E]):
    """Fixed-size entries kept packed; the subclasses say how an entry unpacks."""

    entry: ClassVar[struct.Struct]
    base_offset: int
    """The segment's base offset; relative offsets in the file are added to it."""
    data: bytes
    """The valid entries, packed (a preallocated zero tail is not included)."""
    file_size: int
    """Size of the file (or object) the entries came from, tail included."""
    zero_tail_entries: int
    """All-zero entries after the last valid one: the unwritten part of a preallocated index."""
    path: str | None = None

    @property
    def trimmed(self) -> bool:
        """True when the file holds only valid entries, as the broker leaves it after a roll."""
        return self.zero_tail_entries == 0

    def __len__(self) -> int:
        return len(self.data) // self.entry.size

    def __getitem__(self, index: int) -> E:
        count = len(self)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(index)
        return self._unpack(index)

    def __iter__(self) -> Iterator[E]:
        for i in range(len(self)):
            yield self._unpack(i)

    def _unpack(self, index: int) -> E:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    @classmethod
    def _split(cls, data: bytes, *, path: str | None, allow_zero_tail: bool) -> tuple[bytes, int]:
        size = cls.entry.size
        if len(data) % size:
            valid = len(data) - len(data) % size
            raise TruncatedFileError(
                f"index of {len(data)} bytes is not a whole number of {size}-byte entries",
                path=path,
                position=valid,
            )
        count = len(data) // size
        if not allow_zero_tail or count == 1:
            return data, 0  # one all-zero entry is (base offset, 0), not padding
        # Entries up to the last non-zero byte are valid; the all-zero entries after it are the
        # unwritten part of a preallocated file (bytes.rstrip keeps this at C speed).
        last_valid = -(-len(data.rstrip(b"\0")) // size)
        return data[: last_valid * size], count - last_valid


@dataclass(frozen=True, slots=True)
class OffsetIndex(_PackedIndex[OffsetPosition]):
    """A ``.index`` file: sparse (relativeOffset, position) entries, strictly increasing."""

    entry: ClassVar[struct.Struct] = OFFSET_INDEX_ENTRY

    @classmethod
    def parse(cls, data: bytes, *, base_offset: int, path: str | None = None) -> OffsetIndex:
        """Entries from the bytes of a ``.index``; a preallocated zero tail is set aside."""
        valid, tail = cls._split(data, path=path, allow_zero_tail=True)
        return cls(base_offset, valid, len(data), tail, path)

    @classmethod
    def read(cls, path: Path, *, base_offset: int) -> OffsetIndex:
        """Read a ``.index`` file (with the ``.deleted`` fallback)."""
        data = read_small_file(path, deleted_fallback=True, error=IndexFormatError)
        return cls.parse(data, base_offset=base_offset, path=str(path))

    def _unpack(self, index: int) -> OffsetPosition:
        relative, position = OFFSET_INDEX_ENTRY.unpack_from(self.data, index * 8)
        return OffsetPosition(self.base_offset + relative, position)

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The largest entry with offset <= ``target_offset``, else (base offset, 0), as
        ``OffsetIndex.lookup`` answers; scan the ``.log`` from its position."""
        slot = _largest_lower_bound(len(self), target_offset, lambda i: self._unpack(i).offset)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self._unpack(slot)

    def validate(
        self, *, log_size: int | None = None, end_offset: int | None = None
    ) -> list[IndexFormatError]:
        """Every problem found: offsets and positions that do not strictly increase, offsets
        outside [base offset, ``end_offset``], positions at or past ``log_size``."""
        problems: list[IndexFormatError] = []
        previous: OffsetPosition | None = None
        for i, (offset, position) in enumerate(self):
            where = i * OFFSET_INDEX_ENTRY.size
            if offset < self.base_offset:
                rel = offset - self.base_offset
                problems.append(_problem(self, where, f"entry {i} has relative offset {rel} < 0"))
            if end_offset is not None and offset > end_offset:
                message = f"entry {i} offset {offset} is past the segment end offset {end_offset}"
                problems.append(_problem(self, where, message))
            if position < 0 or (log_size is not None and position >= log_size):
                size = "" if log_size is None else f" {log_size}-byte"
                message = f"entry {i} points at byte {position}, outside the{size} .log"
                problems.append(_problem(self, where, message))
            if previous is not None and offset <= previous.offset:
                message = (
                    f"entry {i} offset {offset} does not increase (previous {previous.offset})"
                )
                problems.append(_problem(self, where, message))
            if previous is not None and position <= previous.position:
                message = f"entry {i} position {position} <= previous {previous.position}"
                problems.append(_problem(self, where, message))
            previous = OffsetPosition(offset, position)
        return problems


@dataclass(frozen=True, slots=True)
class TimeIndex(_PackedIndex[TimestampOffset]):
    """A ``.timeindex`` file: (timestamp, relativeOffset) entries, both non-decreasing."""

    entry: ClassVar[struct.Struct] = TIME_INDEX_ENTRY

    @classmethod
    def parse(cls, data: bytes, *, base_offset: int, path: str | None = None) -> TimeIndex:
        """Entries from the bytes of a ``.timeindex``; a preallocated zero tail is set aside."""
        valid, tail = cls._split(data, path=path, allow_zero_tail=True)
        return cls(base_offset, valid, len(data), tail, path)

    @classmethod
    def read(cls, path: Path, *, base_offset: int) -> TimeIndex:
        """Read a ``.timeindex`` file (with the ``.deleted`` fallback)."""
        data = read_small_file(path, deleted_fallback=True, error=IndexFormatError)
        return cls.parse(data, base_offset=base_offset, path=str(path))

    def _unpack(self, index: int) -> TimestampOffset:
        timestamp, relative = TIME_INDEX_ENTRY.unpack_from(self.data, index * 12)
        return TimestampOffset(timestamp, self.base_offset + relative)

    def last_entry(self) -> TimestampOffset:
        """The last entry, or (NO_TIMESTAMP, base offset) when empty (``TimeIndex.lastEntry``)."""
        if not len(self):
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self._unpack(len(self) - 1)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The largest entry with timestamp <= ``target_timestamp``, else (NO_TIMESTAMP, base
        offset), as ``TimeIndex.lookup`` answers. The caller then finds that offset's position in
        the offset index and scans the ``.log`` for the first record at or after the target."""
        slot = _largest_lower_bound(
            len(self), target_timestamp, lambda i: self._unpack(i).timestamp
        )
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self._unpack(slot)

    def validate(self, *, end_offset: int | None = None) -> list[IndexFormatError]:
        """Every problem found: timestamps or offsets that decrease, offsets outside
        [base offset, ``end_offset``]."""
        problems: list[IndexFormatError] = []
        previous: TimestampOffset | None = None
        for i, (timestamp, offset) in enumerate(self):
            where = i * TIME_INDEX_ENTRY.size
            if offset < self.base_offset:
                rel = offset - self.base_offset
                problems.append(_problem(self, where, f"entry {i} has relative offset {rel} < 0"))
            if end_offset is not None and offset > end_offset:
                message = f"entry {i} offset {offset} is past the segment end offset {end_offset}"
                problems.append(_problem(self, where, message))
            if previous is not None and timestamp < previous.timestamp:
                message = (
                    f"entry {i} timestamp {timestamp} decreases (previous {previous.timestamp})"
                )
                problems.append(_problem(self, where, message))
            if previous is not None and offset < previous.offset:
                message = f"entry {i} offset {offset} decreases (previous {previous.offset})"
                problems.append(_problem(self, where, message))
            previous = TimestampOffset(timestamp, offset)
        return problems


@dataclass(frozen=True, slots=True)
class TxnIndex(_PackedIndex[AbortedTxn]):
    """A ``.txnindex`` file: 34-byte aborted-transaction entries. Never preallocated, and often
    absent (created on the first abort), which means the same as empty."""

    entry: ClassVar[struct.Struct] = ABORTED_TXN_ENTRY

    @classmethod
    def parse(cls, data: bytes, *, base_offset: int, path: str | None = None) -> TxnIndex:
        """Entries from the bytes of a ``.txnindex``; a partial last entry is a truncated file and
        an entry with a version other than 0 is an ``IndexFormatError``."""
        valid, _ = cls._split(data, path=path, allow_zero_tail=False)
        index = cls(base_offset, valid, len(data), 0, path)
        for i in range(len(index)):
            version = struct.unpack_from(">h", valid, i * ABORTED_TXN_ENTRY.size)[0]
            if version != _ABORTED_TXN_VERSION:
                raise IndexFormatError(
                    f"aborted transaction entry {i} has version {version}, expected "
                    f"{_ABORTED_TXN_VERSION}",
                    path=path,
                    position=i * ABORTED_TXN_ENTRY.size,
                )
        return index

    @classmethod
    def read(cls, path: Path, *, base_offset: int) -> TxnIndex:
        """Read a ``.txnindex``; a missing file is an empty index, as in the broker."""
        try:
            data = read_small_file(path, deleted_fallback=False, error=IndexFormatError)
        except FileNotFoundError:
            data = b""
        return cls.parse(data, base_offset=base_offset, path=str(path))

    def _unpack(self, index: int) -> AbortedTxn:
        return AbortedTxn(*ABORTED_TXN_ENTRY.unpack_from(self.data, index * 34))

    def validate(self) -> list[IndexFormatError]:
        """Every problem found: first offset after last offset, or a last offset before the
        segment's base offset (``TransactionIndex.sanityCheck``)."""
        problems: list[IndexFormatError] = []
        for i, txn in enumerate(self):
            where = i * ABORTED_TXN_ENTRY.size
            if txn.first_offset > txn.last_offset:
                message = f"entry {i} first offset {txn.first_offset} > last {txn.last_offset}"
                problems.append(_problem(self, where, message))
            if txn.last_offset < self.base_offset:
                message = f"entry {i} last offset {txn.last_offset} < base {self.base_offset}"
                problems.append(_problem(self, where, message))
        return problems


def index_tail(path: Path, entry_size: int) -> tuple[int, bytes]:
    """The size of an index file and its last entry's bytes, read with one small read.

    This is the cheap readiness probe: a rolled segment's index is trimmed, so its last entry is
    not all zeros, while an active segment's preallocated index ends in zeros. An empty file
    returns ``(0, b"")``. Raises ``TruncatedFileError`` when the size is not a whole number of
    entries, ``SegmentVanishedError`` when the file and its ``.deleted`` twin are gone.
    """
    fh, opened = open_with_deleted_fallback(path)
    with fh:
        try:
            size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise unreadable(opened, exc) from exc
        if size % entry_size:
            raise TruncatedFileError(
                f"index of {size} bytes is not a whole number of {entry_size}-byte entries",
                path=str(opened),
                position=size - size % entry_size,
            )
        if size == 0:
            return 0, b""
        last = read_at(fh, size - entry_size, entry_size, path=opened)
    if len(last) != entry_size:
        raise TruncatedFileError(
            "index shrank while being read", path=str(opened), position=size - entry_size
        )
    return size, last


def _largest_lower_bound(count: int, target: int, key: Callable[[int], int]) -> int:
    """The last slot whose key is <= target, or -1 (``AbstractIndex.largestLowerBoundSlotFor``)."""
    if count == 0 or key(0) > target:
        return -1
    lo, hi = 0, count - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _problem(index: _PackedIndex[E], position: int, message: str) -> IndexFormatError:
    return IndexFormatError(message, path=index.path, position=position)
