"""Shared by every backend: argument checks, the part plan of a multipart upload, and reading
a local file in parts in a worker thread (``os.preadv``), never on the event loop.

Parts are read into buffers from a :class:`BufferPool`: a buffer used before costs no page
faults and no zero-fill when it is filled again, which a fresh 16 MiB buffer does (about 4,000
faults, each zeroing a page). Reads only the file it is given; no client imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from sidecar._aio import acquire_in_thread
from sidecar.errors import InvalidRangeError, TruncatedFileError
from sidecar.storage._crc import crc32c, crc32c_combine
from sidecar.storage.base import DEFAULT_PAGE_SIZE, MAX_PARTS, MIN_PART_SIZE

__all__ = [
    "BufferPool",
    "FilePart",
    "PartBody",
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
#: idle part buffers a pool keeps (in flight, part buffers are bounded by the upload slots)
DEFAULT_IDLE_BUFFERS = 8
#: seconds an idle buffer is kept before its memory goes back to the system
DEFAULT_IDLE_SECONDS = 30.0


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


class BufferPool:
    """Part buffers for reuse, on the event loop's thread only (no locking).

    ``acquire`` hands out an idle buffer at least as large as asked for (the smallest such),
    or a new one; ``release`` keeps up to ``max_idle`` of them, each for ``idle_s`` seconds
    (a timer on the running loop drops older ones). Memory in flight stays bounded by whoever
    limits concurrent parts; idle memory by ``max_idle`` buffers, and none once uploads stop.
    """

    def __init__(
        self, max_idle: int = DEFAULT_IDLE_BUFFERS, idle_s: float = DEFAULT_IDLE_SECONDS
    ) -> None:
        if max_idle < 0:
            raise ValueError(f"max_idle must not be negative, got {max_idle}")
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._idle: list[bytearray] = []
        self._released_at: dict[int, float] = {}  # id(buffer) → when it became idle
        self._trim_timer: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> int:
        """How many buffers wait for reuse."""
        return len(self._idle)

    def acquire(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes, reused when one fits (at most twice ``size``)."""
        best: int | None = None
        for n, buffer in enumerate(self._idle):
            if size <= len(buffer) <= 2 * size and (
                best is None or len(buffer) < len(self._idle[best])
            ):
                best = n
        if best is not None:
            buffer = self._idle.pop(best)
            self._released_at.pop(id(buffer), None)
            return buffer
        return bytearray(size)

    def release(self, buffer: bytearray) -> None:
        """Give a buffer back; beyond ``max_idle`` idle buffers it is dropped (the smallest)."""
        self._idle.append(buffer)
        self._released_at[id(buffer)] = time.monotonic()
        if len(self._idle) > self.max_idle:
            smallest = min(self._idle, key=len)
            self._idle.remove(smallest)
            self._released_at.pop(id(smallest), None)
        self._schedule_trim()

    def trim(self, now: float | None = None) -> None:
        """Drop the buffers idle for ``idle_s`` or longer."""
        now = time.monotonic() if now is None else now
        keep = [b for b in self._idle if now - self._released_at[id(b)] < self.idle_s]
        for buffer in self._idle:
            if now - self._released_at[id(buffer)] >= self.idle_s:
                del self._released_at[id(buffer)]
        self._idle = keep

    def _schedule_trim(self) -> None:
        if self._trim_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # released outside a loop (tests): trimmed at the next release on one
        self._trim_timer = loop.call_later(self.idle_s, self._on_trim_timer)

    def _on_trim_timer(self) -> None:
        self._trim_timer = None
        self.trim()
        if self._idle:
            self._schedule_trim()


#: the pool of every upload that does not bring its own
SHARED_POOL = BufferPool()


class PartBody:
    """One part's bytes in a pooled buffer, to be sent without copying and then released.

    A client sends :attr:`view` (slices of it); ``read``/``seek``/``tell`` exist for clients that
    need a stream (they copy). ``release`` returns the buffer to its pool: call it once the
    request that sends the part is over (its checksum header protects the server from a body
    that changed under a request that was cancelled mid-send).
    """

    __slots__ = ("_buffer", "_pool", "_position", "_view")

    def __init__(self, buffer: bytearray, length: int, pool: BufferPool | None) -> None:
        self._buffer: bytearray | None = buffer
        self._pool = pool
        self._view = memoryview(buffer)[:length]
        self._position = 0

    @classmethod
    def of(cls, data: bytes | bytearray) -> PartBody:
        """A body over a copy of ``data``, owned by no pool (tests, small bodies)."""
        return cls(bytearray(data), len(data), None)

    @property
    def view(self) -> memoryview:
        """The part's bytes; valid until :meth:`release`."""
        if self._buffer is None:
            raise ValueError("the part body was released")
        return self._view

    def __len__(self) -> int:
        return self._view.nbytes

    def __bool__(self) -> bool:
        return True  # a body is present even when empty (clients test ``if body``)

    def read(self, size: int = -1) -> bytes:
        """Stream interface (a copy), for clients that hash or re-read the body."""
        view = self.view
        end = len(view) if size is None or size < 0 else min(len(view), self._position + size)
        data = bytes(view[self._position : end])
        self._position = end
        return data

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: len(self)}[whence]
        self._position = max(0, min(len(self), base + position))
        return self._position

    def tell(self) -> int:
        return self._position

    def tobytes(self) -> bytes:
        """A copy of the part's bytes."""
        return self.view.tobytes()

    def release(self) -> None:
        """Return the buffer to its pool; idempotent. The body is unusable afterwards."""
        buffer, self._buffer = self._buffer, None
        if buffer is None:
            return
        self._view.release()
        if self._pool is not None:
            self._pool.release(buffer)


class PartReader:
    """Positional reads of one open file, each in a worker thread, each with its CRC-32C."""

    def __init__(self, path: Path, fd: int, size: int, pool: BufferPool | None = None) -> None:
        self.path = path
        self.size = size
        self._fd = fd
        self._pool = SHARED_POOL if pool is None else pool

    async def read(self, offset: int, length: int) -> tuple[PartBody, int]:
        """``length`` bytes at ``offset`` in a pooled buffer, and their CRC-32C; a file that
        shrank is an error. The caller releases the body once it is sent."""
        buffer = self._pool.acquire(length)
        body = PartBody(buffer, length, self._pool)
        try:
            crc = await asyncio.to_thread(self._fill, body.view, offset)
        except BaseException:
            body.release()
            raise
        return body, crc

    def _fill(self, view: memoryview, offset: int) -> int:
        length = len(view)
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
        return crc32c(view)


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
async def open_parts(
    path: str | os.PathLike[str], pool: BufferPool | None = None
) -> AsyncIterator[PartReader]:
    """Open ``path`` for positional reads; its size is taken once, at open."""
    file = Path(path)
    fd, size = await acquire_in_thread(
        functools.partial(_open, file), lambda opened: os.close(opened[0])
    )
    try:
        yield PartReader(file, fd, size, pool)
    finally:
        os.close(fd)  # never blocks for a regular file, and must run even when cancelled
