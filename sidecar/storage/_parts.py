"""Shared by every backend: argument checks, the part plan of a multipart upload, and reading
a local file in parts in a worker thread (``os.preadv``/``os.pread``), never on the event loop.
The reads run in :data:`~sidecar._aio.SEGMENT_READ_THREADS`, not the default executor: a slow
disk holds those threads only.

Two ways to read a part:

* :meth:`PartReader.read` fills a whole part into a buffer from a :class:`BufferPool` (a buffer
  used before costs no page faults and no zero-fill when it is filled again, which a fresh
  16 MiB buffer does: about 4,000 faults, 8 ms of CPU).
* :meth:`PartReader.checksum` and :class:`FilePartBody` never hold a part in memory: the
  part's CRC-32C is computed (or taken from :class:`PartChecksums`, fed by a read the caller made
  anyway), then the part is streamed from the file :data:`CHUNK_BYTES` at a time, each chunk's
  CRC-32C chained on the way, and the body fails before its last byte when the bytes sent do not
  match the checksum sent ahead of them. Chunks this size stay in the CPU caches between the read,
  the CRC and the socket send, and memory per part in flight is one chunk.

Reads only the file it is given; no client imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sidecar._aio import SEGMENT_READ_THREADS, acquire_in_thread, in_segment_thread
from sidecar._sendfile import ShortFileError, send_file_range
from sidecar.errors import ChecksumMismatchError, InvalidRangeError, TruncatedFileError
from sidecar.storage._crc import crc32c, crc32c_combine
from sidecar.storage.base import DEFAULT_PAGE_SIZE, MAX_PARTS, MIN_PART_SIZE

__all__ = [
    "CHUNK_BYTES",
    "SINGLE_PUT_PARTS",
    "BufferPool",
    "FilePart",
    "FilePartBody",
    "PartBody",
    "PartChangedError",
    "PartChecksums",
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

#: a file up to this many part sizes goes in one PUT: as a multipart upload it would take a
#: create, a complete and two part requests (each request costs ~2 ms of client CPU) for at
#: most two parts in parallel; a streamed PUT needs no more memory than a part
SINGLE_PUT_PARTS = 2
#: bytes read at a time when a part is checksummed or streamed from its file
CHUNK_BYTES = 2 * 1024 * 1024
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
    """Cut ``size`` bytes into parts of ``part_size`` (raised to stay within S3's part count);
    up to :data:`SINGLE_PUT_PARTS` parts' worth is one part, sent with one PUT."""
    if size <= SINGLE_PUT_PARTS * part_size:
        return [FilePart(number=1, offset=0, length=size)] if size else []
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


def _release_when_done(body: PartBody, fill: asyncio.Future[int]) -> None:
    if not fill.cancelled():
        fill.exception()  # retrieved: the read's caller saw its own error or cancellation
    body.release()


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
        fill = in_segment_thread(self._fill, body.view, offset)
        try:
            crc = await asyncio.shield(fill)
        except BaseException:
            if fill.done():
                body.release()
            else:
                # a cancellation does not stop the thread, which may still be reading into
                # the body: its buffer goes back to the pool once the thread is done with it
                fill.add_done_callback(functools.partial(_release_when_done, body))
            raise
        return body, crc

    def _fill(self, view: memoryview, offset: int) -> int:
        self._fill_exact(view, offset)
        return crc32c(view)

    async def checksum(self, offset: int, length: int) -> int:
        """CRC-32C of ``length`` bytes at ``offset``, read :data:`CHUNK_BYTES` at a time into a
        per-thread scratch buffer (nothing kept); a file that shrank is an error."""
        return await in_segment_thread(self._checksum, offset, length)

    def _checksum(self, offset: int, length: int) -> int:
        scratch = _scratch()
        crc = 0
        done = 0
        while done < length:
            with scratch[: min(CHUNK_BYTES, length - done)] as view:
                self._fill_exact(view, offset + done)
                crc = crc32c(view, crc)
                done += len(view)
        return crc

    def read_chunk(self, offset: int, length: int, crc: int) -> tuple[bytes, int]:
        """Thread side: ``length`` bytes at ``offset`` as a new ``bytes`` (it may be queued by a
        transport after the send returns, so it is never reused), and ``crc`` chained over them."""
        data = os.pread(self._fd, length, offset)
        if len(data) < length:  # a regular file reads short only at its end, but be sure
            rest = bytearray(data)
            while len(rest) < length:
                more = os.pread(self._fd, length - len(rest), offset + len(rest))
                if not more:
                    break
                rest += more
            data = bytes(rest)
        if len(data) < length:
            raise self.truncated(offset + len(data))
        return data, crc32c(data, crc)

    def _fill_exact(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            with view[done:] as rest:
                count = _read_into(self._fd, rest, offset + done)
            if count == 0:
                raise self.truncated(offset + done)
            done += count

    @property
    def fd(self) -> int:
        """The open file's descriptor (valid while the reader is open)."""
        return self._fd

    def truncated(self, position: int) -> TruncatedFileError:
        """The error of a read that found the file ending at ``position``."""
        return TruncatedFileError(
            f"file shrank to {position} bytes while uploading (was {self.size})",
            path=str(self.path),
            position=position,
        )


_THREAD_SCRATCH = threading.local()


def _scratch() -> memoryview:
    """This worker thread's :data:`CHUNK_BYTES` buffer (allocated once per thread)."""
    buffer: bytearray | None = getattr(_THREAD_SCRATCH, "buffer", None)
    if buffer is None:
        buffer = _THREAD_SCRATCH.buffer = bytearray(CHUNK_BYTES)
    return memoryview(buffer)


class PartChecksums:
    """The CRC-32C of every part of a file, as :func:`plan_parts` cuts it (one part: a single
    PUT), from bytes a caller reads in file order for its own reasons.

    ``feed(position, data)`` takes each piece read; pieces may overlap what was fed before but
    must not leave a gap. :meth:`result` is the CRCs once every byte was fed, else None (then the
    uploader computes them itself).
    """

    __slots__ = ("_covered", "_crc", "_crcs", "_gap", "_parts", "part_size", "size")

    def __init__(self, size: int, part_size: int) -> None:
        self.size = size
        self.part_size = part_size
        self._parts = plan_parts(size, part_size)
        self._crcs: list[int] = []
        self._crc = 0
        self._covered = 0
        self._gap = False

    def feed(self, position: int, data: bytes | bytearray | memoryview) -> None:
        end = position + len(data)
        if end <= self._covered or self._gap:
            return
        if position > self._covered:
            self._gap = True  # bytes were skipped: the CRCs cannot be completed
            return
        with memoryview(data) as whole, whole[self._covered - position :] as view:
            start = 0
            while start < len(view) and len(self._crcs) < len(self._parts):
                part = self._parts[len(self._crcs)]
                take = min(len(view) - start, part.offset + part.length - self._covered)
                with view[start : start + take] as piece:
                    self._crc = crc32c(piece, self._crc)
                start += take
                self._covered += take
                if self._covered == part.offset + part.length:
                    self._crcs.append(self._crc)
                    self._crc = 0

    def result(self) -> tuple[int, ...] | None:
        """Each part's CRC-32C in part order, or None when not every byte was fed."""
        if self._gap or len(self._crcs) < len(self._parts):
            return None
        return tuple(self._crcs)

    def whole(self) -> int | None:
        """The whole file's CRC-32C (its parts' combined), or None when not every byte was fed."""
        crcs = self.result()
        if crcs is None:
            return None
        lengths = [part.length for part in self._parts]
        return combine_parts(list(zip(crcs, lengths, strict=True)))


class PartChangedError(ChecksumMismatchError):
    """A part's bytes in the file changed between their CRC-32C and their send: nothing of them
    was stored, and sending them again cannot help (not retriable)."""

    retriable: ClassVar[bool] = False


class FilePartBody:
    """One part of an open file, sent by streaming it from the file (see the module docstring).

    The sender (the S3 backend's aiohttp payload) calls :meth:`send` or, on a plain socket when
    ``zero_copy`` allows it, :meth:`send_zero_copy`; every call sends the whole part again
    (retries). ``crc`` is the CRC-32C announced for these bytes.

    * :meth:`send` reads the part a chunk at a time; the chunks' chained CRC-32C is compared
      with ``crc`` before the last chunk goes out.
    * :meth:`send_zero_copy` hands the file range to the kernel (``sendfile``): the bytes never
      enter the process, so they are not checked here; the store checks the body against the
      CRC-32C header and refuses a mismatch, and :meth:`matches` then tells a file that changed
      (:class:`PartChangedError`) from damage in transit (retried).

    A mismatch (the file changed since it was checksummed) or a short read fails the send,
    records the error in :attr:`failure` (a request that fails is then reported with it) and
    leaves the server with an incomplete body, which it discards.
    """

    __slots__ = ("_reader", "crc", "failure", "length", "offset", "sent_zero_copy", "zero_copy")

    def __init__(
        self, reader: PartReader, offset: int, length: int, crc: int, *, zero_copy: bool = False
    ) -> None:
        self._reader = reader
        self.offset = offset
        self.length = length
        self.crc = crc
        self.zero_copy = zero_copy
        #: whether the last send went through :meth:`send_zero_copy`
        self.sent_zero_copy = False
        self.failure: Exception | None = None

    @property
    def path(self) -> Path:
        return self._reader.path

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return True  # a body is present even when empty (clients test ``if body``)

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        """Clients rewind bodies before a retry; every send starts at the part's first byte."""
        return 0

    def tell(self) -> int:
        return 0

    async def send_zero_copy(self, sock: int) -> None:
        """Send the whole part on the plain stream socket ``sock`` (its transport flushed) with
        ``sendfile``; a file that shrank fails the send with :class:`TruncatedFileError`."""
        self.sent_zero_copy = True
        try:
            await send_file_range(sock, self._reader.fd, self.offset, self.length)
        except ShortFileError as exc:
            self.failure = self._reader.truncated(self.offset + exc.sent)
            raise self.failure from None

    async def matches(self) -> bool:
        """Whether the part's bytes in the file still have the CRC-32C ``crc`` (a read of the
        part; after the store refused a body sent without reading it). A file that shrank does
        not match."""
        try:
            return await self._reader.checksum(self.offset, self.length) == self.crc
        except TruncatedFileError:
            return False

    async def send(self, write: Callable[[bytes], Awaitable[None]], limit: int | None) -> None:
        """Write the part (at most ``limit`` bytes) through ``write``, a chunk at a time; the
        next chunk is read (in a thread) while the current one is written."""
        self.sent_zero_copy = False
        end = self.length if limit is None else min(self.length, limit)
        done = 0
        ahead = self._read_ahead(done, end, 0)
        try:
            while ahead is not None:
                try:
                    data, crc = await ahead
                except TruncatedFileError as exc:
                    self.failure = exc
                    raise
                done += len(data)
                ahead = self._read_ahead(done, end, crc)
                if done == self.length and crc != self.crc:
                    self.failure = PartChangedError(
                        f"{self._reader.path}: bytes {self.offset}-{self.offset + done - 1} "
                        "changed since their CRC-32C was computed; not sent"
                    )
                    raise self.failure
                await write(data)
        finally:
            if ahead is not None:  # a send that failed: nobody waits for the read ahead
                ahead.add_done_callback(_forget)

    def _read_ahead(
        self, done: int, end: int, crc: int
    ) -> asyncio.Future[tuple[bytes, int]] | None:
        if done >= end:
            return None
        return in_segment_thread(
            self._reader.read_chunk, self.offset + done, min(CHUNK_BYTES, end - done), crc
        )


def _forget(future: asyncio.Future[Any]) -> None:
    """Retrieve a discarded future's outcome (asyncio logs an exception nobody retrieved)."""
    if not future.cancelled():
        future.exception()


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
        functools.partial(_open, file),
        lambda opened: os.close(opened[0]),
        executor=SEGMENT_READ_THREADS,
    )
    try:
        yield PartReader(file, fd, size, pool)
    finally:
        os.close(fd)  # never blocks for a regular file, and must run even when cancelled
