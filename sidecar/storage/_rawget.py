"""Ranged GETs over plain HTTP/1.1, each body received straight into its buffer.

Through botocore and aiohttp, every byte of a GET's body is copied three times in the process:
the transport hands each read to the HTTP parser as a new ``bytes``, the parser slices the body
out of it into another, and :mod:`sidecar.storage._body` copies the pieces into the body's
buffer; and every request pays botocore's per-request machinery (its event hooks, the
response parser: milliseconds of CPU). In a cold sequential read that was about a quarter of
the read server's CPU. Here the request is presigned by botocore (SigV4 query authentication,
with the client's credentials, region and addressing), written on a kept-alive connection,
and the response is read with an :class:`asyncio.BufferedProtocol`: the status line and the
headers into a small buffer, the body straight into a pooled buffer of its ``Content-Length``
(:class:`~sidecar.storage._body.BufferPool`). The kernel's copy is the only one.

Only plain ``http://`` connections without a proxy (the S3 backend decides when to use it).
A response this client does not take (no ``Content-Length``, chunked framing, an interim
``1xx``) raises :class:`UnsupportedResponseError`, and the backend goes back to botocore.
A caller may be told of a body's bytes as they arrive (:data:`BodyHook`), to use them before
the response is whole. Connection failures are ``OSError`` (``ConnectionError``); a
connection kept from an earlier request that turns out closed before any byte of the response
is replaced once. A request cancelled mid-response (its deadline) closes its connection.
Nothing here logs, and no error carries the presigned target (its query holds the credential
scope and the signature).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import NamedTuple, cast

from sidecar.storage._body import BufferPool, default_pool

__all__ = [
    "BadResponseError",
    "BodyHook",
    "RangeGetter",
    "RawResponse",
    "UnsupportedResponseError",
]

#: the most a response's status line and headers may take
HEAD_BYTES = 64 * 1024
#: a connection idle longer than this is closed rather than reused (servers drop idle ones)
IDLE_S = 10.0
#: idle connections kept per host
MAX_IDLE = 32


class UnsupportedResponseError(Exception):
    """A response this client does not read (its framing or status); botocore must."""


class BadResponseError(ConnectionError):
    """A response that breaks HTTP/1.1 (a malformed head, more bytes than announced): the
    connection is closed, and another attempt may do better."""


class RawResponse(NamedTuple):
    """A whole response: the status, the headers (names in lower case) and the body (a
    read-only view of its buffer)."""

    status: int
    headers: dict[str, str]
    body: memoryview


#: told of a response's body before it arrives: ``(status, headers, body)``, ``body`` the
#: read-only view its bytes arrive in, in order from its start; returns what to call with the
#: bytes in so far each time more arrive (or None: nothing). Called from the protocol's
#: callbacks, so neither may raise or block.
BodyHook = Callable[[int, dict[str, str], memoryview], Callable[[int], None] | None]


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive connection and the response being read on it."""

    def __init__(self, pool: BufferPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._head = bytearray(HEAD_BYTES)
        self._head_len = 0
        self._body: memoryview | None = None
        self._filled = 0
        self._length = 0
        self._status = 0
        self._headers: dict[str, str] = {}
        self._done: asyncio.Future[RawResponse] | None = None
        self._hook: BodyHook | None = None
        self._filling: Callable[[int], None] | None = None
        #: whether any byte of the current response arrived
        self.answered = False

    # -- asyncio -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionResetError("the store closed the connection mid-response"))

    def eof_received(self) -> bool:
        self.closed = True
        self._fail(ConnectionResetError("the store closed the connection mid-response"))
        return False  # close our side too

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return self._body[self._filled :]
        if self._head_len == HEAD_BYTES:  # cannot happen: a full head buffer fails at once
            raise RuntimeError("response head buffer full")
        return memoryview(self._head)[self._head_len :]

    def buffer_updated(self, nbytes: int) -> None:
        self.answered = True
        if self._done is None or self._done.done():
            self.abort()  # bytes nobody asked for: the connection cannot be trusted
            return
        if self._body is not None:
            self._filled += nbytes
            if self._filling is not None:
                self._filling(self._filled)
            self._finish_if_whole()
            return
        self._head_len += nbytes
        try:
            self._parse_head()
        except (BadResponseError, UnsupportedResponseError) as exc:
            self._fail(exc)
            self.abort()

    # -- the request ---------------------------------------------------------------------

    def request(self, data: bytes, hook: BodyHook | None = None) -> asyncio.Future[RawResponse]:
        """Send one request; the future resolves with its whole response (``hook``: see
        :data:`BodyHook`)."""
        if self.transport is None or self.closed:
            raise ConnectionResetError("the connection to the store is closed")
        self._head_len = 0
        self._body = None
        self._filled = 0
        self._hook = hook
        self._filling = None
        self.answered = False
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._done

    def reusable(self) -> bool:
        return not self.closed and self._headers.get("connection", "").lower() != "close"

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _parse_head(self) -> None:
        end = self._head.find(b"\r\n\r\n", 0, self._head_len)
        if end < 0:
            if self._head_len == HEAD_BYTES:
                raise BadResponseError(f"the response's headers are longer than {HEAD_BYTES} bytes")
            return
        lines = self._head[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status_text = rest.partition(" ")[0]
        if not version.startswith("HTTP/1.") or not status_text.isdigit():
            raise BadResponseError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(status_text)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise BadResponseError(f"a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if status < 200:
            raise UnsupportedResponseError(f"an interim response ({status})")
        if "transfer-encoding" in headers:
            raise UnsupportedResponseError("a response with Transfer-Encoding")
        length_text = headers.get("content-length", "")
        if not length_text.isdigit():
            raise UnsupportedResponseError("a response without Content-Length")
        if version == "HTTP/1.0":
            headers.setdefault("connection", "close")
        self._status, self._headers, self._length = status, headers, int(length_text)
        self._body = memoryview(self._pool.take(self._length))[: self._length]
        extra = self._head_len - (end + 4)
        if extra > self._length:
            raise BadResponseError("the store sent more bytes than its Content-Length")
        self._body[:extra] = self._head[end + 4 : self._head_len]
        self._filled = extra
        if self._hook is not None:
            self._filling = self._hook(status, headers, self._body.toreadonly())
            if self._filling is not None and extra:
                self._filling(extra)
        self._finish_if_whole()

    def _finish_if_whole(self) -> None:
        body = self._body
        if body is None or self._filled < self._length:
            return
        self._body = None
        self._hook = self._filling = None
        # the head buffer is free again: the loop reads the end of an idle connection, or bytes
        # nobody asked for (buffer_updated drops the connection), into it
        self._head_len = 0
        if self._done is not None and not self._done.done():
            self._done.set_result(RawResponse(self._status, self._headers, body.toreadonly()))

    def _fail(self, exc: Exception) -> None:
        self._body = None
        self._hook = self._filling = None
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)


class RangeGetter:
    """Kept-alive connections to the store's hosts, and ranged GETs on them."""

    def __init__(
        self,
        *,
        max_idle: int = MAX_IDLE,
        idle_s: float = IDLE_S,
        pool: BufferPool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_idle = max_idle
        self._idle_s = idle_s
        self._pool = default_pool() if pool is None else pool
        self._clock = clock
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._closed = False

    @property
    def idle_connections(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    async def get(
        self,
        host: str,
        port: int,
        target: str,
        *,
        netloc: str,
        start: int,
        end_inclusive: int,
        hook: BodyHook | None = None,
    ) -> RawResponse:
        """``GET target`` with ``Range: bytes=start-end_inclusive`` from ``host:port``
        (``netloc``: the Host header, as the request was signed). ``hook`` is told of the
        body as it arrives (:data:`BodyHook`); a request made again on a fresh connection
        tells it again, of a new body."""
        if self._closed:
            raise RuntimeError("the range getter is closed")
        request = (
            f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\n"
            f"Range: bytes={start}-{end_inclusive}\r\nAccept-Encoding: identity\r\n\r\n"
        ).encode("latin-1")
        while True:
            connection, reused = await self._connection(host, port)
            try:
                response = await connection.request(request, hook)
            except ConnectionError:
                connection.abort()
                if reused and not connection.answered:
                    continue  # the store had closed it while it was idle: once more, afresh
                raise
            except BaseException:
                connection.abort()  # cancelled mid-response (a deadline), or refused
                raise
            self._release(host, port, connection)
            return response

    async def _connection(self, host: str, port: int) -> tuple[_Connection, bool]:
        """An idle connection to ``host:port`` (True) or a new one (False)."""
        idle = self._idle.get((host, port), [])
        now = self._clock()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since <= self._idle_s:
                return connection, True
            connection.abort()
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(lambda: _Connection(self._pool), host, port)
        return connection, False

    def _release(self, host: str, port: int, connection: _Connection) -> None:
        idle = self._idle.setdefault((host, port), [])
        if self._closed or not connection.reusable() or len(idle) >= self._max_idle:
            connection.abort()
            return
        connection.idle_since = self._clock()
        idle.append(connection)

    def close(self) -> None:
        """Close every idle connection; later GETs raise ``RuntimeError``."""
        self._closed = True
        for conns in self._idle.values():
            for connection in conns:
                connection.abort()
        self._idle.clear()
