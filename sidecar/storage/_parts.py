"""Shared by every backend: argument checks, the part plan of a multipart upload, and reading
a local file in parts in a worker thread (``os.pread``), never on the event loop.

Reads only the file it is given; no client imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sidecar.errors import InvalidRangeError, TruncatedFileError
from sidecar.storage._crc import crc32c, crc32c_combine
from sidecar.storage.base import DEFAULT_PAGE_SIZE, MAX_PARTS, MIN_PART_SIZE

__all__ = [
    "FilePart",
    "PartReader",
    "batches",
    "check_page_size",
    "check_range",
    "check_upload_args",
    "combine_parts",
    "crc32c_off_loop",
    "open_parts",
    "plan_parts",
]

T = TypeVar("T")

#: read size where os.preadv is missing (each read is copied once into the part's buffer)
_FALLBACK_READ_BYTES = 1024 * 1024
#: bodies at least this large are hashed in a worker thread
_THREAD_HASH_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FilePart:
    """One part of a multipart upload: S3 part numbers start at 1."""

    number: int
    offset: int
    length: int


def check_upload_args(part_size: int, concurrency: int) -> None:
    """Reject part sizes S3 would refuse at the end of an upload, and useless concurrency."""
    if part_size < MIN_PART_SIZE:
        raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes, got {part_size}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")


def check_page_size(page_size: int) -> None:
    """Listing pages hold 1 to 1000 entries (S3's maximum)."""
    if not 1 <= page_size <= DEFAULT_PAGE_SIZE:
        raise ValueError(f"page_size must be within 1..{DEFAULT_PAGE_SIZE}, got {page_size}")


def check_range(key: str, start: int, end_inclusive: int) -> None:
    """A range that no object can satisfy is an error before any request is made."""
    if start < 0 or end_inclusive < start:
        raise InvalidRangeError(f"get_range {key}: invalid range {start}-{end_inclusive}")


def plan_parts(size: int, part_size: int) -> list[FilePart]:
    """Cut ``size`` bytes into parts of ``part_size`` (raised to stay within S3's part count)."""
    part_size = max(part_size, -(-size // MAX_PARTS))
    return [
        FilePart(number=n, offset=offset, length=min(part_size, size - offset))
        for n, offset in enumerate(range(0, size, part_size), start=1)
    ]


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of at most ``size`` items (``itertools.batched`` is Python 3.12+)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def combine_parts(parts: Sequence[tuple[int, int]]) -> int:
    """The whole object's CRC-32C from ``(crc, length)`` of its parts, in order."""
    total = 0
    for crc, length in parts:
        total = crc32c_combine(total, crc, length)
    return total


async def crc32c_off_loop(body: bytes) -> int:
    """CRC-32C of ``body``, in a worker thread when it is large enough to matter."""
    if len(body) >= _THREAD_HASH_BYTES:
        return await asyncio.to_thread(crc32c, body)
    return crc32c(body)


class PartReader:
    """Positional reads of one open file, each in a worker thread, each with its CRC-32C."""

    def __init__(self, path: Path, fd: int, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = fd

    async def read(self, offset: int, length: int) -> tuple[io.BytesIO, int]:
        """``length`` bytes at ``offset``, and their CRC-32C; a file that shrank is an error.

        The bytes come in a ``BytesIO`` that owns its buffer, positioned at 0: aiohttp sends
        such a body without copying it (it would copy a ``bytes`` body, doubling memory).
        """
        return await asyncio.to_thread(self._read, offset, length)

    def _read(self, offset: int, length: int) -> tuple[io.BytesIO, int]:
        buffer = io.BytesIO()
        if length == 0:
            return buffer, 0
        buffer.seek(length - 1)
        buffer.write(b"\0")  # grows the buffer in place, no temporary of ``length`` bytes
        with buffer.getbuffer() as view:
            done = 0
            while done < length:
                with view[done:] as rest:
                    count = _read_into(self._fd, rest, offset + done)
                if count == 0:
                    raise TruncatedFileError(
                        f"file shrank to {offset + done} bytes while uploading (was {self.size})",
                        path=str(self.path),
                        position=offset + done,
                    )
                done += count
            crc = crc32c(view)
        buffer.seek(0)
        return buffer, crc


def _read_into(fd: int, target: memoryview, offset: int) -> int:
    """Fill ``target`` from ``fd`` at ``offset`` as far as one read goes; 0 at end of file."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [target], offset)
    chunk = os.pread(fd, min(len(target), _FALLBACK_READ_BYTES), offset)
    target[: len(chunk)] = chunk
    return len(chunk)


def _open(path: Path) -> tuple[int, int]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return fd, os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise


@contextlib.asynccontextmanager
async def open_parts(path: str | os.PathLike[str]) -> AsyncIterator[PartReader]:
    """Open ``path`` for positional reads; its size is taken once, at open."""
    file = Path(path)
    fd, size = await asyncio.to_thread(_open, file)
    try:
        yield PartReader(file, fd, size)
    finally:
        os.close(fd)  # never blocks for a regular file, and must run even when cancelled
