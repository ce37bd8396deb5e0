"""The raw ranged-GET client against a scripted HTTP server on loopback.

Each test scripts the server's replies, one per request, and checks what the client made of
them: bodies received across many reads, kept-alive connections reused or not, the framing it
refuses, a connection the server closed while it was idle, a request cancelled mid-body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from sidecar.storage._body import BufferPool
from sidecar.storage._rawget import (
    BadResponseError,
    RangeGetter,
    UnsupportedResponseError,
)

Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Server:
    """Answers the n-th request (over all connections) with ``replies[n]``."""

    replies: list[Reply]
    requests: list[tuple[int, bytes]] = field(default_factory=list)
    connections: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests.append((number, head))
                try:
                    await self.replies[len(self.requests) - 1](writer)
                except ConnectionError:  # the client closed the connection mid-reply
                    return
                if writer.is_closing():
                    return
        finally:
            writer.close()
            self.disconnected.set()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[list[Reply]], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(replies: list[Reply]) -> Server:
        script = Server(replies)
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
        script.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return script

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def ok(
    body: bytes, *, extra: str = "", pieces: int = 1, status: str = "206 Partial Content"
) -> Reply:
    """A reply with ``body``, written in ``pieces`` writes (each drained)."""

    async def reply(writer: asyncio.StreamWriter) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        writer.write(head)
        step = max(1, -(-len(body) // pieces))
        for at in range(0, len(body), step):
            writer.write(body[at : at + step])
            await writer.drain()
            await asyncio.sleep(0)

    return reply


def raw(data: bytes, *, close: bool = False) -> Reply:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        if close:
            writer.close()

    return reply


def hang_up() -> Reply:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.close()

    return reply


async def get(getter: RangeGetter, server: Server, start: int = 0, end: int = 9) -> bytes:
    response = await getter.get(
        "127.0.0.1",
        server.port,
        "/bucket/key?X-Amz-Signature=abc",
        netloc=f"127.0.0.1:{server.port}",
        start=start,
        end_inclusive=end,
    )
    assert response.status in (200, 206)
    assert response.body.readonly
    return bytes(response.body)


async def test_a_large_body_arrives_over_many_reads_into_one_buffer_and_the_connection_is_kept(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    body = bytes(range(256)) * 40_000  # 10 MB
    server = await serve([ok(body, pieces=37), ok(b"second")])
    getter = RangeGetter(pool=BufferPool())
    assert await get(getter, server, 5, 5 + len(body) - 1) == body
    assert getter.idle_connections == 1
    assert await get(getter, server) == b"second"
    assert server.connections == 1  # the second request went on the kept connection
    _, head = server.requests[0]
    assert head.startswith(b"GET /bucket/key?X-Amz-Signature=abc HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in head
    assert f"Range: bytes=5-{5 + len(body) - 1}\r\n".encode() in head
    getter.close()


async def test_a_hook_is_told_of_the_body_as_it_arrives(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    """The hook gets the status, the headers and the body's buffer before the body; then each
    count it is told is more than the last, and the buffer holds the body's bytes up to it at
    that moment. A hook may return None (nothing to call as the body arrives)."""
    body = bytes(range(256)) * 8_000  # 2 MB
    server = await serve(
        [
            ok(body, pieces=23, extra="Content-Range: bytes 0-2047999/9999999\r\n"),
            ok(b"second"),
        ]
    )
    getter = RangeGetter(pool=BufferPool())
    heads: list[tuple[int, str, int]] = []
    counts: list[int] = []
    wrong: list[int] = []

    def hook(status: int, headers: dict[str, str], view: memoryview) -> Callable[[int], None]:
        assert view.readonly
        heads.append((status, headers["content-range"], len(view)))

        def filling(count: int) -> None:
            counts.append(count)
            if view[:count] != body[:count]:
                wrong.append(count)

        return filling

    response = await getter.get(
        "127.0.0.1", server.port, "/k", netloc="h", start=0, end_inclusive=len(body) - 1, hook=hook
    )
    assert bytes(response.body) == body
    assert heads == [(206, "bytes 0-2047999/9999999", len(body))]
    assert len(counts) > 1
    assert counts == sorted(set(counts))
    assert counts[-1] == len(body)
    assert wrong == []
    seen: list[int] = []  # a hook that returns None: nothing to call as the body arrives
    response = await getter.get(
        "127.0.0.1",
        server.port,
        "/k",
        netloc="h",
        start=0,
        end_inclusive=5,
        hook=lambda status, headers, view: seen.append(status),
    )
    assert bytes(response.body) == b"second"
    assert seen == [206]
    getter.close()


async def test_headers_and_body_in_one_write(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    server = await serve(
        [
            raw(
                b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-3/9\r\n"
                b"Content-Length: 4\r\n\r\nabcd"
            )
        ]
    )
    getter = RangeGetter()
    response = await getter.get(
        "127.0.0.1", server.port, "/k", netloc="h", start=0, end_inclusive=3
    )
    assert (response.status, bytes(response.body)) == (206, b"abcd")
    assert response.headers["content-range"] == "bytes 0-3/9"
    getter.close()


@pytest.mark.parametrize(
    "head",
    [
        "HTTP/1.1 206 Partial Content\r\nConnection: close\r\n",
        "HTTP/1.0 206 Partial Content\r\n",
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_a_connection_the_server_closes_is_not_kept(
    serve: Callable[[list[Reply]], Awaitable[Server]], head: str
) -> None:
    reply = raw(f"{head}Content-Length: 2\r\n\r\nok".encode())
    server = await serve([reply, reply])
    getter = RangeGetter()
    assert await get(getter, server) == b"ok"
    assert getter.idle_connections == 0
    assert await get(getter, server) == b"ok"
    assert server.connections == 2
    getter.close()


async def test_a_kept_connection_the_server_dropped_is_replaced_once(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    """The server takes the second request on the kept connection and hangs up without a
    byte (as a server that closed it idle would): the request goes again on a new one."""
    server = await serve([ok(b"first"), hang_up(), ok(b"again")])
    getter = RangeGetter()
    assert await get(getter, server) == b"first"
    assert await get(getter, server) == b"again"
    assert [number for number, _ in server.requests] == [1, 1, 2]
    getter.close()


async def test_a_body_cut_short_on_a_new_connection_is_a_connection_error(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    server = await serve(
        [raw(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n\r\nonly this", close=True)]
    )
    getter = RangeGetter()
    with pytest.raises(ConnectionError):
        await get(getter, server)
    assert server.connections == 1  # not asked again: part of the response had come
    assert getter.idle_connections == 0
    getter.close()


@pytest.mark.parametrize(
    ("reply", "what"),
    [
        (
            b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n",
            "Transfer-Encoding",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nok", "without Content-Length"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "interim"),
    ],
    ids=["chunked", "no-length", "interim"],
)
async def test_framing_it_does_not_read_is_unsupported(
    serve: Callable[[list[Reply]], Awaitable[Server]], reply: bytes, what: str
) -> None:
    server = await serve([raw(reply)])
    getter = RangeGetter()
    with pytest.raises(UnsupportedResponseError, match=what):
        await get(getter, server)
    assert getter.idle_connections == 0
    await asyncio.wait_for(server.disconnected.wait(), 10)  # the connection was closed
    getter.close()


@pytest.mark.parametrize(
    ("reply", "what"),
    [
        (b"SMTP ready\r\n\r\n", "status line"),
        (
            b"HTTP/1.1 206 Partial Content\r\nno colon here\r\nContent-Length: 1\r\n\r\nx",
            "malformed header",
        ),
        (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 2\r\n\r\nokEXTRA", "more bytes"),
        (b"HTTP/1.1 206 Partial Content\r\nX-Long: " + b"a" * 70_000, "longer than"),
    ],
    ids=["status-line", "header-line", "extra-bytes", "huge-head"],
)
async def test_a_broken_response_is_a_connection_error_and_closes_the_connection(
    serve: Callable[[list[Reply]], Awaitable[Server]], reply: bytes, what: str
) -> None:
    server = await serve([raw(reply)])
    getter = RangeGetter()
    with pytest.raises(BadResponseError, match=what):
        await get(getter, server)
    assert getter.idle_connections == 0
    await asyncio.wait_for(server.disconnected.wait(), 10)
    getter.close()


async def test_an_error_response_comes_back_whole(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    xml = b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
    server = await serve([ok(xml, status="404 Not Found"), ok(b"next")])
    getter = RangeGetter()
    response = await getter.get(
        "127.0.0.1", server.port, "/k", netloc="h", start=0, end_inclusive=1
    )
    assert (response.status, bytes(response.body)) == (404, xml)
    assert await get(getter, server) == b"next"  # the connection stays usable
    assert server.connections == 1
    getter.close()


async def test_a_request_cancelled_mid_body_closes_its_connection(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def stall(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 1000\r\n\r\nsome")
        await writer.drain()
        started.set()
        await release.wait()

    server = await serve([stall, ok(b"fresh")])
    getter = RangeGetter()
    task = asyncio.create_task(get(getter, server))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert getter.idle_connections == 0
    release.set()
    await asyncio.wait_for(server.disconnected.wait(), 10)
    assert await get(getter, server) == b"fresh"
    assert server.connections == 2
    getter.close()


async def test_a_connection_idle_too_long_is_not_reused(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    now = [100.0]
    server = await serve([ok(b"one"), ok(b"two"), ok(b"three")])
    getter = RangeGetter(idle_s=10.0, clock=lambda: now[0])
    assert await get(getter, server) == b"one"
    now[0] += 9.0
    assert await get(getter, server) == b"two"  # idle 9 s: kept
    now[0] += 11.0
    assert await get(getter, server) == b"three"  # idle 11 s: a new connection
    assert [number for number, _ in server.requests] == [1, 1, 2]
    getter.close()


async def test_idle_connections_are_bounded_and_closed_with_the_getter(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    all_in = asyncio.Event()
    arrived: list[bytes] = []

    def held(body: bytes) -> Reply:
        """Answers once all three requests are in: three connections at once."""

        async def reply(writer: asyncio.StreamWriter) -> None:
            arrived.append(body)
            if len(arrived) == 3:
                all_in.set()
            await all_in.wait()
            await ok(body)(writer)

        return reply

    server = await serve([held(b"a"), held(b"b"), held(b"c")])
    getter = RangeGetter(max_idle=2)
    tasks = [asyncio.create_task(get(getter, server)) for _ in range(3)]
    assert sorted(await asyncio.gather(*tasks)) == [b"a", b"b", b"c"]
    assert server.connections == 3
    assert getter.idle_connections == 2
    getter.close()
    assert getter.idle_connections == 0
    with pytest.raises(RuntimeError, match="closed"):
        await get(getter, server)


async def test_bodies_come_from_the_pool_and_go_back_to_it(
    serve: Callable[[list[Reply]], Awaitable[Server]],
) -> None:
    body = b"x" * (2 << 20)
    server = await serve([ok(body, pieces=5), ok(body, pieces=5)])
    pool = BufferPool()
    getter = RangeGetter(pool=pool)
    first = await get(getter, server, 0, len(body) - 1)
    assert first == body
    assert pool.pooled_bytes == len(body)
    assert await get(getter, server, 0, len(body) - 1) == body
    assert pool.pooled_bytes == len(body)  # the first buffer was free again: reused
    getter.close()


async def test_a_response_that_filled_the_head_buffer_leaves_room_for_the_next_read() -> None:
    """The first read of a large response fills the whole head buffer (its headers and the
    start of its body). Once the response is whole, the loop may ask for a buffer again, for
    the end of the stream of an idle connection the store closes, or for bytes nobody asked
    for: it gets room to read them into, not an error (which the loop logs as a fatal error
    on the transport)."""
    from sidecar.storage._rawget import HEAD_BYTES, _Connection

    class Transport:
        def write(self, data: bytes) -> None:
            pass

        def abort(self) -> None:
            self.aborted = True

    connection = _Connection(BufferPool())
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    done = connection.request(b"GET / HTTP/1.1\r\n\r\n")
    length = 3 * HEAD_BYTES
    stream = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + b"x" * length
    at = 0
    while not done.done():
        room = connection.get_buffer(-1)
        n = min(len(room), len(stream) - at)
        assert n > 0
        room[:n] = stream[at : at + n]
        connection.buffer_updated(n)
        at += n
    assert at == len(stream)
    assert bytes(done.result().body) == b"x" * length
    room = connection.get_buffer(-1)  # the store closes the idle connection: its end is read
    assert len(room) > 0
    connection.eof_received()
    assert connection.closed
