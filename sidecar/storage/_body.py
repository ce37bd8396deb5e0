"""Reading a GET's streamed body into one buffer of its announced size.

aiobotocore's ``read()`` of a whole body goes through aiohttp's ``StreamReader.read(-1)``: it
joins the pieces present at each wake-up into one bytes object, then joins those into the body,
two copies of every byte, and the second into a fresh allocation the size of the body. Here the
pieces the HTTP parser produced are taken one by one as they are (``readchunk``, no join) and
copied once into a buffer of the response's ``Content-Length``, handed on as a read-only
``memoryview``. The read-server's chunk cache slices its chunks out of it without copies.

Large buffers come from a small pool (:class:`BufferPool`) and go back to it when nothing
refers to them any more: a fresh allocation of many MiB is new memory, which the kernel hands
over page by page (a fault and a zeroed page each 4 KiB), and that was the largest single cost
of a cold sequential read in the read server. A pooled buffer is reused only when no view of it
is alive (its reference count, which every ``memoryview`` of it, and every slice of those, keeps
raised), so bytes handed out are never overwritten; buffers left unused for a while are freed.

Errors are those of aiobotocore's ``read()``: a read timeout is
:class:`~aiobotocore.response.AioReadTimeoutError`, a broken connection
:class:`~botocore.exceptions.ResponseStreamingError`; a body cut short is aiohttp's
``ClientPayloadError``. The caller still checks the length against what it asked for.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import aiohttp
from aiobotocore.response import AioReadTimeoutError
from botocore.exceptions import ResponseStreamingError

#: bodies from this size up are read into pooled buffers
POOLED_MIN_BYTES = 1 << 20
#: at most this many bytes of buffers in the pool (in use or not)
POOL_MAX_BYTES = 160 << 20
#: a pooled buffer not taken for this long is freed
POOL_IDLE_S = 10.0


class BufferPool:
    """Buffers for large bodies, reused once no view of them is alive.

    Whether a buffer is still referred to is read from its reference count: the pool holds one
    reference, and every ``memoryview`` of it (through the buffer it exports, which slices
    share) holds another while it lives. At most ``max_bytes`` of buffers are pooled; a body
    that finds no free buffer and no room gets a buffer of its own. A buffer is reused for a
    body of at least half its size (the view handed out is cut to the body)."""

    def __init__(
        self,
        *,
        max_bytes: int = POOL_MAX_BYTES,
        idle_s: float = POOL_IDLE_S,
        clock: Any = time.monotonic,
    ) -> None:
        self._max_bytes = max_bytes
        self._idle_s = idle_s
        self._clock = clock
        self._buffers: list[bytearray] = []
        self._used: list[float] = []
        self._bytes = 0
        self._trim: asyncio.TimerHandle | None = None
        self._trim_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # event loops of several threads may share the pool

    @property
    def pooled_bytes(self) -> int:
        return self._bytes

    def _free(self, i: int) -> bool:
        # the list's reference and getrefcount's argument: nothing else holds it
        return sys.getrefcount(self._buffers[i]) == 2

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes (exactly ``size`` when new) that nothing else
        refers to."""
        with self._lock:
            return self._take(size)

    def _take(self, size: int) -> bytearray:
        now = self._clock()
        best = -1
        for i in range(len(self._buffers)):  # by index: a loop variable would be a reference
            length = len(self._buffers[i])
            if (
                size <= length < 2 * size
                and (best < 0 or length < len(self._buffers[best]))
                and self._free(i)
            ):
                best = i
        if best >= 0:
            self._used[best] = now
            return self._buffers[best]
        buffer = bytearray(size)
        if size >= POOLED_MIN_BYTES:
            self._drop_idle(now, room_for=size)
            if self._bytes + size <= self._max_bytes:
                self._buffers.append(buffer)
                self._used.append(now)
                self._bytes += size
                self._schedule_trim()
        return buffer

    def _drop_idle(self, now: float, *, room_for: int = 0) -> None:
        """Free the buffers nobody refers to that were not taken for ``idle_s``; with
        ``room_for``, also free unreferenced ones (oldest first) until that many bytes fit."""
        keep: list[int] = []
        for i in sorted(range(len(self._buffers)), key=self._used.__getitem__):
            over = self._bytes + room_for > self._max_bytes
            if self._free(i) and (over or now - self._used[i] >= self._idle_s):
                self._bytes -= len(self._buffers[i])
            else:
                keep.append(i)
        keep.sort()
        self._buffers = [self._buffers[i] for i in keep]
        self._used = [self._used[i] for i in keep]

    def _schedule_trim(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._trim is not None and self._trim_loop is loop:
            return
        self._trim_loop = loop  # a trim pending on a loop that has ended never runs
        self._trim = loop.call_later(self._idle_s, self._trimmed)

    def _trimmed(self) -> None:
        self._trim = None
        with self._lock:
            self._drop_idle(self._clock())
        if self._buffers:
            self._schedule_trim()


_POOL = BufferPool()


def default_pool() -> BufferPool:
    """The process's pool of large body buffers."""
    return _POOL


async def read_body(
    body: Any, content_length: object, *, pool: BufferPool | None = None
) -> bytes | memoryview:
    """All of the streamed ``body`` of a GET whose response announced ``content_length``.

    Falls back to the body's own ``read()`` when the length is unknown or the body is not
    aiohttp's stream (another HTTP backend)."""
    raw = getattr(body, "raw_stream", None)
    content = getattr(raw, "content", None)
    if (
        not isinstance(content_length, int)
        or isinstance(content_length, bool)
        or content_length < 0
        or not isinstance(content, aiohttp.StreamReader)
    ):
        data: bytes = await body.read()
        return data
    try:
        return await _read_into(content, content_length, _POOL if pool is None else pool)
    except TimeoutError as exc:  # asyncio's timeout error is this one
        raise AioReadTimeoutError(endpoint_url=str(getattr(raw, "url", "")), error=exc) from exc
    except aiohttp.ClientConnectionError as exc:
        raise ResponseStreamingError(error=exc) from exc


async def _read_into(
    content: aiohttp.StreamReader, size: int, pool: BufferPool
) -> bytes | memoryview:
    view = memoryview(pool.take(size))[:size]
    filled = 0
    while True:
        piece, chunk_end = await content.readchunk()
        if not piece:
            if chunk_end:  # the end of one HTTP chunk (chunked encoding), not of the body
                continue
            break
        end = filled + len(piece)
        if end > size:  # more than announced: the caller's length check refuses it
            rest = [bytes(view[:filled]), piece]
            while True:
                piece, chunk_end = await content.readchunk()
                if not piece and not chunk_end:
                    return b"".join(rest)
                rest.append(piece)
        view[filled:end] = piece
        filled = end
    return view[:filled].toreadonly()


__all__ = ["BufferPool", "default_pool", "read_body"]
