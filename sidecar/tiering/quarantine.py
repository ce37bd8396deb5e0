"""Corrupt versus unreadable, and the quarantine of segments whose bytes are proven corrupt.

**Classification** (:func:`classify`). A failed upload is one of:

* ``CORRUPT``: the segment's own bytes are bad (a batch CRC that does not match, a batch header
  that does not parse, batches that do not fill the file). Reading it again gives the same bytes,
  so it is quarantined: never uploaded again until an operator clears it.
* ``UNREADABLE``: the file could not be read (``EIO`` from a failing disk, ``EACCES``, a file
  that is a directory): :class:`~sidecar.errors.UnreadableFileError` or a bare ``OSError``. That
  says nothing about the bytes, so it is retried with the engine's backoff and never quarantined.
* ``OTHER``: everything else (S3, metadata, leadership), handled by the engine as before.

**The quarantine** (:class:`Quarantine`) is ``<state_dir>/quarantine.json``, keyed by *topic id*
and partition: a topic deleted and re-created under the same name has a new id and inherits
nothing. The daemon adds entries; ``sidecar quarantine clear`` removes them. Both rewrite the file
atomically (temporary file, then rename) under an advisory lock on ``quarantine.json.lock``, each
merging its change into what is on disk, so neither loses the other's write. The daemon notices
a rewrite by the file's identity (inode, size, mtime) with :meth:`Quarantine.refresh`, which the
engine calls about once a second, off the event loop.

Files written before entries carried a topic id (``{"segments": [{"topic": ..., ...}]}``) cannot
be attributed to a topic id safely (the topic may have been re-created since), and their entries
may stem from a transient read error rather than corrupt bytes. They are dropped, with a warning,
and the file is rewritten: such a segment is simply read and CRC-checked again at its next upload
attempt, and quarantined again (by topic id) only if its bytes are still corrupt.

No asyncio: every method may block on the file and is called from a worker thread (the CLI calls
it directly). It never touches the broker's log dirs.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import json
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import UnreadableFileError
from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid
from sidecar.observability.logging import get_logger
from sidecar.tiering.uploader import CorruptSegmentError

__all__ = [
    "FORMAT_VERSION",
    "Quarantine",
    "QuarantineEntry",
    "Verdict",
    "classify",
    "read_error_reason",
]

log = get_logger(__name__)

#: ``version`` of the file written here; files without one are the older, name-keyed format
FORMAT_VERSION = 2


class Verdict(enum.Enum):
    """What a failed upload says about the segment."""

    CORRUPT = "corrupt"
    """Its bytes are proven bad: quarantine it."""
    UNREADABLE = "unreadable"
    """The file could not be read: retry with backoff, never quarantine."""
    OTHER = "other"
    """Not about the local files at all."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def classify(exc: BaseException) -> Verdict:
    """Corrupt bytes, an unreadable file, or neither (see the module docstring).

    A read error in the cause chain of a :class:`CorruptSegmentError` makes it ``UNREADABLE``:
    only bytes that were read and found bad are proof of corruption. (Other errors may have an
    ``OSError`` cause, a refused S3 connection say, and are not about the local files.)
    """
    if isinstance(exc, UnreadableFileError | OSError):
        return Verdict.UNREADABLE
    if isinstance(exc, CorruptSegmentError):
        causes = list(_chain(exc))[1:]
        if any(isinstance(e, UnreadableFileError | OSError) for e in causes):
            return Verdict.UNREADABLE
        return Verdict.CORRUPT
    return Verdict.OTHER


def read_error_reason(exc: BaseException) -> str:
    """A bounded label for a read error: the errno's name in lower case (``eio``, ``eacces``),
    or ``unknown`` when the error carries no errno."""
    for error in _chain(exc):
        number = getattr(error, "errno", None)
        if isinstance(error, UnreadableFileError | OSError) and isinstance(number, int):
            return errno.errorcode.get(number, "unknown").lower()
    return "unknown"


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """One quarantined segment."""

    topic_id: uuid.UUID
    topic: str
    """The topic's name when it was quarantined (for people; the key is ``topic_id``)."""
    partition: int
    base_offset: int
    end_offset: int | None
    size_bytes: int
    """The ``.log``'s size: bytes whose only copy is local, lost when local retention runs."""
    reason: str
    since_ms: int
    """When it was quarantined (Unix ms)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": encode_kafka_uuid(self.topic_id),
            "topic": self.topic,
            "partition": self.partition,
            "base_offset": self.base_offset,
            "end_offset": self.end_offset,
            "size_bytes": self.size_bytes,
            "reason": self.reason,
            "since_ms": self.since_ms,
        }

    @classmethod
    def from_json(cls, item: Any) -> QuarantineEntry:
        """Parse one entry; ``KeyError``/``ValueError``/``TypeError`` when it is malformed."""
        end = item.get("end_offset")
        return cls(
            topic_id=decode_kafka_uuid(str(item["topic_id"])),
            topic=str(item["topic"]),
            partition=int(item["partition"]),
            base_offset=int(item["base_offset"]),
            end_offset=None if end is None else int(end),
            size_bytes=int(item.get("size_bytes", 0)),
            reason=str(item.get("reason", "")),
            since_ms=int(item.get("since_ms", 0)),
        )


_Key = tuple[uuid.UUID, int]
_Entries = dict[_Key, dict[int, QuarantineEntry]]
#: what identifies one version of the file: inode, size, mtime (None: no file)
_Signature = tuple[int, int, int] | None


@dataclass(frozen=True, slots=True)
class _Loaded:
    entries: _Entries
    signature: _Signature
    legacy: int
    """Entries of the older, name-keyed format (dropped)."""
    damaged: bool


class Quarantine:
    """Segments proven corrupt, by topic id and partition, persisted in ``path`` (JSON)."""

    def __init__(self, path: Path, *, migrate: bool = True) -> None:
        """Load ``path``. With ``migrate``, entries of the older, name-keyed format are dropped
        from the file (logged); without, they are only counted (``legacy_dropped``)."""
        self._path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._mutex = threading.Lock()
        loaded = self._read()
        self._entries = loaded.entries
        self._signature = loaded.signature
        self.legacy_dropped = loaded.legacy
        """Entries of the older, name-keyed format found at load (and dropped)."""
        self.damaged = loaded.damaged
        """The file, or some of its entries, could not be read at the last load."""
        if loaded.legacy and migrate:
            log.warning(
                "quarantine_legacy_entries_dropped",
                path=str(path),
                entries=loaded.legacy,
                detail="entries keyed by topic name cannot be matched to a topic id; those"
                " segments are CRC-checked again at their next upload and quarantined again"
                " only if still corrupt",
            )
            self._rewrite(lambda entries: False)

    @property
    def path(self) -> Path:
        return self._path

    # --- reading

    def offsets(self, topic_id: uuid.UUID, partition: int) -> frozenset[int]:
        """Base offsets of the quarantined segments of one partition (of this topic id)."""
        with self._mutex:
            return frozenset(self._entries.get((topic_id, partition), {}))

    def segments(
        self, topic_id: uuid.UUID, partition: int
    ) -> frozenset[tuple[int, int | None, int]]:
        """``(base offset, end offset, size)`` of the quarantined segments of one partition:
        what names a segment (another at the same base offset is not quarantined)."""
        with self._mutex:
            by_offset = self._entries.get((topic_id, partition), {})
            return frozenset(
                (e.base_offset, e.end_offset, e.size_bytes) for e in by_offset.values()
            )

    def entries(
        self, topic_id: uuid.UUID | None = None, partition: int | None = None
    ) -> list[QuarantineEntry]:
        """Every entry (or those of one topic id, and partition), by topic, partition, offset."""
        with self._mutex:
            found = [
                entry
                for (tid, p), by_offset in self._entries.items()
                if (topic_id is None or tid == topic_id) and (partition is None or p == partition)
                for entry in by_offset.values()
            ]
        return sorted(found, key=lambda e: (e.topic, str(e.topic_id), e.partition, e.base_offset))

    def __len__(self) -> int:
        with self._mutex:
            return sum(len(v) for v in self._entries.values())

    @property
    def size_bytes(self) -> int:
        """Bytes of the quarantined segments (never tiered: their only copy is local)."""
        with self._mutex:
            return sum(e.size_bytes for v in self._entries.values() for e in v.values())

    def refresh(self) -> bool:
        """Reload the file if another process (``sidecar quarantine clear``) rewrote it since
        it was last read or written here; returns whether it did."""
        if self._stat() == self._signature:
            return False
        with self._locked():  # not in the middle of a write of ours (or of the CLI's)
            loaded = self._read()
            with self._mutex:
                changed = loaded.entries != self._entries
                self._entries = loaded.entries
                self._signature = loaded.signature
                self.damaged = loaded.damaged
        return changed

    # --- changing

    def add(self, entry: QuarantineEntry) -> None:
        """Quarantine a segment. Kept in memory even when the file cannot be written (then
        logged): the daemon must not upload it either way."""
        key = (entry.topic_id, entry.partition)

        def put(entries: _Entries) -> bool:
            entries.setdefault(key, {})[entry.base_offset] = entry
            return True

        try:
            self._rewrite(put)
        except OSError as exc:
            with self._mutex:
                put(self._entries)
            log.error(  # noqa: TRY400 - the path and error are the report
                "quarantine_save_failed", path=str(self._path), error=str(exc)
            )

    def clear(
        self,
        *,
        topic: str,
        partition: int,
        base_offset: int | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> list[QuarantineEntry]:
        """Remove the entries of ``topic``-``partition`` (every topic id that had this name,
        or only ``topic_id``), all of them or only the one at ``base_offset``; returns them."""
        removed: list[QuarantineEntry] = []

        def drop(entries: _Entries) -> bool:
            for (tid, p), by_offset in list(entries.items()):
                if p != partition or (topic_id is not None and tid != topic_id):
                    continue
                for offset, entry in list(by_offset.items()):
                    if entry.topic != topic and topic_id is None:
                        continue
                    if base_offset is not None and offset != base_offset:
                        continue
                    removed.append(by_offset.pop(offset))
                if not by_offset:
                    del entries[(tid, p)]
            return bool(removed)

        self._rewrite(drop)
        return sorted(removed, key=lambda e: (str(e.topic_id), e.base_offset))

    # --- the file

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _rewrite(self, change: Any) -> None:
        """Under the lock: read the file, apply ``change`` (returns whether it changed
        anything), write it back if so, and make the result the in-memory state."""
        with self._locked():
            loaded = self._read()
            entries = loaded.entries
            if change(entries) or loaded.legacy or loaded.damaged:
                self._write(entries)
            with self._mutex:
                self._entries = entries
                self._signature = self._stat()

    def _write(self, entries: _Entries) -> None:
        items = [
            entry.to_json()
            for by_offset in entries.values()
            for entry in sorted(by_offset.values(), key=lambda e: e.base_offset)
        ]
        items.sort(key=lambda i: (i["topic"], i["topic_id"], i["partition"], i["base_offset"]))
        tmp = self._path.with_name(self._path.name + ".tmp")
        with tmp.open("w") as out:
            json.dump({"version": FORMAT_VERSION, "segments": items}, out, indent=1)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self._path)

    def _stat(self) -> _Signature:
        try:
            st = self._path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> _Loaded:
        signature = self._stat()
        try:
            raw = json.loads(self._path.read_text())
        except FileNotFoundError:
            return _Loaded({}, None, 0, damaged=False)
        except (OSError, ValueError) as exc:
            log.warning("quarantine_file_unreadable", path=str(self._path), error=str(exc))
            return _Loaded({}, signature, 0, damaged=True)
        items = raw.get("segments", []) if isinstance(raw, dict) else None
        if not isinstance(items, list):
            log.warning("quarantine_file_unreadable", path=str(self._path), error="no segments")
            return _Loaded({}, signature, 0, damaged=True)
        entries: _Entries = {}
        legacy = 0
        damaged = False
        for item in items:
            if isinstance(item, dict) and "topic_id" not in item:
                legacy += 1
                continue
            try:
                entry = QuarantineEntry.from_json(item)
            except (KeyError, ValueError, TypeError, AttributeError) as exc:
                log.warning("quarantine_entry_unreadable", path=str(self._path), error=str(exc))
                damaged = True
                continue
            entries.setdefault((entry.topic_id, entry.partition), {})[entry.base_offset] = entry
        return _Loaded(entries, signature, legacy, damaged)
