"""Sending a file range on an asyncio transport's socket with ``os.sendfile``.

uvloop has no native ``loop.sendfile``: asyncio's fallback reads the file into the process and
writes it. Here the bytes go from the page cache to the socket in the kernel, in worker threads
(:data:`SENDFILE_THREADS`): after the transport has written everything it buffered, on
duplicated descriptors the thread closes itself, so a caller that is cancelled never leaves a
thread writing into a descriptor number that was reused. A socket that stays full is waited on
with the event loop (no thread held), up to a stall deadline; the waits for the transport's
own buffer (:func:`flushed`, :func:`progressing`) have the same deadline.

Only for plain sockets: bytes sent around a TLS transport would skip the encryption. The read
server sends cached chunk files this way; the S3 backend sends upload bodies this way on
plain-HTTP endpoints.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import functools
import os
import select
import sys
import termios
import threading
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = [
    "SENDFILE_THREADS",
    "ShortFileError",
    "flushed",
    "plain_socket",
    "progressing",
    "send_file_range",
    "unsent",
]

T = TypeVar("T")

#: how long a thread waits for room on a full socket before it hands back to the loop
POLL_MS: Final = 50
#: the threads that run sendfile (each returns within POLL_MS of a full socket)
SENDFILE_THREADS: Final = concurrent.futures.ThreadPoolExecutor(
    max_workers=8, thread_name_prefix="sendfile"
)


class ShortFileError(EOFError):
    """The file ended before the range did (it shrank since its size was taken): ``sent``
    bytes of the range went out."""

    def __init__(self, sent: int) -> None:
        super().__init__(f"the file ended {sent} bytes into the range")
        self.sent = sent


def plain_socket(transport: asyncio.BaseTransport | None) -> int | None:
    """The socket descriptor of ``transport`` when bytes may be sent around it (a plain, open
    stream socket, not TLS), else None."""
    if transport is None or transport.is_closing():
        return None
    if transport.get_extra_info("sslcontext") is not None:
        return None
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    fileno = sock.fileno()
    return fileno if isinstance(fileno, int) and fileno >= 0 else None


def _queued(fd: int) -> int:
    """Bytes in the send queue of socket ``fd`` that its peer has not taken (``SIOCOUTQ``:
    unsent and unacknowledged on TCP, not yet read by the peer on a Unix socket); 0 when it
    cannot be asked (closed, not a socket)."""
    try:
        queued = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int.from_bytes(queued, sys.byteorder, signed=True)


def unsent(transport: asyncio.WriteTransport) -> int:
    """Bytes written to ``transport`` that its peer has not taken yet: those in its own buffer
    and those in its socket's send queue. The socket's queue is what moves while a peer reads
    slowly: the transport's buffer only shrinks once the kernel takes more (a socket turns
    writable again only when most of its queue is gone)."""
    pending = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket") if hasattr(transport, "get_extra_info") else None
    if sock is not None:
        try:
            fd = sock.fileno()
        except (OSError, ValueError):
            return pending
        if fd >= 0:
            pending += _queued(fd)
    return pending


async def progressing(transport: asyncio.WriteTransport, wait: Awaitable[T], stall_s: float) -> T:
    """Await ``wait`` (a write and its backpressure) while the peer takes bytes: when the bytes
    not taken yet (:func:`unsent`) have not gone down for ``stall_s`` (looked at every quarter
    of it), ``wait`` is cancelled and this is a TimeoutError. A peer that reads slowly but
    steadily is waited for however long it takes."""
    return await _while_taken(lambda: unsent(transport), wait, stall_s)


async def _while_taken(pending: Callable[[], int], wait: Awaitable[T], stall_s: float) -> T:
    """Await ``wait`` while ``pending()`` (bytes the peer has not taken) goes down at least
    once every ``stall_s``; else cancel it and raise TimeoutError."""
    loop = asyncio.get_running_loop()
    tick = stall_s / 4
    size: int | None = None  # first looked at once ``wait`` has written
    async with asyncio.timeout(stall_s) as deadline:
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal size, handle
            now = pending()
            if size is not None and now < size:
                deadline.reschedule(loop.time() + stall_s)
            size = now
            handle = loop.call_later(tick, check)

        handle = loop.call_later(tick, check)
        try:
            return await wait
        finally:
            handle.cancel()


async def flushed(
    transport: asyncio.WriteTransport,
    drain: Callable[[], Awaitable[None]],
    *,
    stall_s: float | None = None,
) -> None:
    """Wait until the transport has written everything it buffered (so bytes sent around it
    come after): with a high-water mark of 0 the protocol is paused until its buffer is empty;
    ``drain`` is the protocol's wait for that (a stream writer's ``drain``). With ``stall_s``,
    a peer that takes nothing for that long is a TimeoutError (:func:`progressing`)."""
    if not transport.get_write_buffer_size():
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)
    try:
        while transport.get_write_buffer_size():
            if transport.is_closing():
                raise ConnectionResetError("the peer went away")
            if stall_s is None:
                await drain()
            else:
                await progressing(transport, drain(), stall_s)
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


def _send_some(sock: int, fd: int, offset: int, length: int, stop: threading.Event) -> int:
    """(thread) ``sendfile`` until ``length`` bytes are sent, ``stop`` is set, or the socket
    stays full for :data:`POLL_MS`; returns the bytes sent."""
    sent = 0
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    while sent < length and not stop.is_set():
        try:
            n = os.sendfile(sock, fd, offset + sent, length - sent)
        except BlockingIOError:
            if not poller.poll(POLL_MS):
                break
            continue
        if n == 0:
            raise ShortFileError(sent)
        sent += n
    return sent


async def send_file_range(
    sock: int, fd: int, offset: int, length: int, *, stall_s: float = 60.0
) -> None:
    """Send ``length`` bytes of ``fd`` from ``offset`` on the stream socket ``sock`` (from
    :func:`plain_socket`, its transport :func:`flushed` first). A peer that takes nothing for
    ``stall_s`` is a TimeoutError; a file that ends early is :class:`ShortFileError` (with the
    bytes of the whole range sent so far)."""
    loop = asyncio.get_running_loop()
    sock_fd = os.dup(sock)
    file_fd = os.dup(fd)
    stop = threading.Event()
    busy: concurrent.futures.Future[int] | None = None
    done = 0
    try:
        while done < length:
            busy = SENDFILE_THREADS.submit(
                _send_some, sock_fd, file_fd, offset + done, length - done, stop
            )
            try:
                n = await asyncio.wrap_future(busy)
            except ShortFileError as exc:
                raise ShortFileError(done + exc.sent) from None
            busy = None
            done += n
            if done < length and not n:  # the peer is slow: wait for room without a thread
                # room comes back only once most of the socket's queue is gone: a peer that
                # reads slowly shows its progress in the queue meanwhile
                ready = loop.create_future()
                loop.add_writer(sock_fd, ready.set_result, None)
                try:
                    await _while_taken(functools.partial(_queued, sock_fd), ready, stall_s)
                finally:
                    loop.remove_writer(sock_fd)
    finally:
        stop.set()
        if busy is not None and not busy.done():
            busy.add_done_callback(lambda _: _close(sock_fd, file_fd))
        else:
            _close(sock_fd, file_fd)


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
