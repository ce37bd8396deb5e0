"""File access for the log-dir parsers: open with the broker's deletion race in mind, read exact
byte ranges, and turn ``OSError`` into our typed errors.

Synchronous and read-only. Never writes, renames or deletes anything in a log dir (the daemon only
reads the broker's files), and never reads more than the caller asks for.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from sidecar.errors import (
    FormatError,
    SegmentVanishedError,
    TruncatedFileError,
    UnreadableFileError,
)

__all__ = [
    "DELETED_SUFFIX",
    "open_with_deleted_fallback",
    "read_at",
    "read_small_file",
    "stat_with_deleted_fallback",
    "unreadable",
]

#: suffix the broker appends before deleting a file (``LogFileUtils.DELETED_FILE_SUFFIX``)
DELETED_SUFFIX = ".deleted"

#: largest checkpoint or snapshot we read whole; a producer snapshot of 1M producers is 46 MB
MAX_SMALL_FILE = 256 * 1024 * 1024


def unreadable(path: Path | str, exc: OSError, *, position: int = 0) -> UnreadableFileError:
    """An ``UnreadableFileError`` naming the file, for an ``OSError`` other than not-found."""
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, IsADirectoryError) or exc.errno == errno.EISDIR:
        reason = "is a directory, not a file"
    return UnreadableFileError(
        f"cannot read file: {reason}", path=str(path), position=position, errno=exc.errno
    )


def open_with_deleted_fallback(path: Path) -> tuple[BinaryIO, Path]:
    """Open ``path`` for reading; if it is gone, try ``<path>.deleted`` once.

    Kafka renames every file of a segment to ``*.deleted`` before removing it 60 s later, so a file
    listed a moment ago may only exist under the new name. Returns the open file and the name that
    worked. Raises ``SegmentVanishedError`` when both names are gone and ``UnreadableFileError`` for
    any other ``OSError`` (permissions, a directory in the file's place).
    """
    candidates = [path] if path.name.endswith(DELETED_SUFFIX) else [path, _deleted_name(path)]
    for candidate in candidates:
        try:
            fh = candidate.open("rb")
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise unreadable(candidate, exc) from exc
        return fh, candidate
    raise SegmentVanishedError(
        f"{path} vanished: neither it nor its {DELETED_SUFFIX} twin exists (deleted by the broker)"
    )


def read_at(fh: BinaryIO, position: int, size: int, *, path: Path | str) -> bytes:
    """Read up to ``size`` bytes at ``position`` (fewer only at end of file)."""
    try:
        fh.seek(position)
        return fh.read(size)
    except OSError as exc:
        raise unreadable(path, exc, position=position) from exc


def read_small_file(
    path: Path,
    *,
    deleted_fallback: bool,
    limit: int = MAX_SMALL_FILE,
    error: type[FormatError] = TruncatedFileError,
) -> bytes:
    """Read a whole small file (checkpoint, snapshot, index).

    ``deleted_fallback`` tries ``<path>.deleted`` when ``path`` is gone (segment files and producer
    snapshots are renamed before deletion; checkpoints are not, and raise ``FileNotFoundError``).
    A file larger than ``limit`` raises ``error`` rather than being read.
    """
    if deleted_fallback:
        fh, path = open_with_deleted_fallback(path)
    else:
        try:
            fh = path.open("rb")
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise unreadable(path, exc) from exc
    with fh:
        try:
            # asked for its size (plus one byte, to see it grew), not the limit: a read of
            # limit + 1 bytes allocates that much up front, for every small file
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(min(size, limit) + 1)
            if len(data) > size and len(data) <= limit:  # it grew meanwhile: the rest
                data += fh.read(limit + 1 - len(data))
        except OSError as exc:
            raise unreadable(path, exc) from exc
    if len(data) > limit:
        raise error(f"file is larger than the {limit}-byte limit", path=str(path), position=limit)
    return data


def _deleted_name(path: Path) -> Path:
    return path.with_name(path.name + DELETED_SUFFIX)


def stat_with_deleted_fallback(path: Path) -> tuple[os.stat_result, Path]:
    """``os.stat`` of ``path``, or of ``<path>.deleted`` when the broker renamed it meanwhile.

    Raises ``SegmentVanishedError`` when both are gone and ``UnreadableFileError`` for other
    ``OSError``s.
    """
    candidates = [path] if path.name.endswith(DELETED_SUFFIX) else [path, _deleted_name(path)]
    for candidate in candidates:
        try:
            return candidate.stat(), candidate
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise unreadable(candidate, exc) from exc
    raise SegmentVanishedError(
        f"{path} vanished: neither it nor its {DELETED_SUFFIX} twin exists (deleted by the broker)"
    )
