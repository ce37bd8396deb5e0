"""Sending file ranges around a transport with sendfile: which transports qualify, exact bytes,
a peer that reads slowly, a file that ends early, and a peer that stops reading."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sidecar._sendfile import (
    ShortFileError,
    plain_socket,
    progressing,
    send_file_range,
    unsent,
)

#: a self-signed P-256 certificate for 127.0.0.1 (valid for a century) and its key, for the TLS
#: test only
_TEST_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgfBRNaejabpkh3SiG
lgIKaAP1PlVu3D3wjDPdOmL4a/qhRANCAATpdKL5gxHMAMf/tLkqBTDe3uMEH5rP
Vyc6nORT0bkVHK5U+QuU/zSKo9ml5F70t+zGDTFRQK8Eo6nI7uEtC8Z1
-----END PRIVATE KEY-----
"""
_TEST_CERT = """-----BEGIN CERTIFICATE-----
MIIBfjCCASWgAwIBAgIUOIsGOmCbh5a8TM+/i/Mf/IqlJo0wCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMCAXDTI2MTEyNjAzMjc1MVoYDzIxMjYxMTAy
MDMyNzUxWjAUMRIwEAYDVQQDDAkxMjcuMC4wLjEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAATpdKL5gxHMAMf/tLkqBTDe3uMEH5rPVyc6nORT0bkVHK5U+QuU/zSK
o9ml5F70t+zGDTFRQK8Eo6nI7uEtC8Z1o1MwUTAdBgNVHQ4EFgQUrprvqr/NRtTE
03pMrOp0xmzSY68wHwYDVR0jBBgwFoAUrprvqr/NRtTE03pMrOp0xmzSY68wDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiAFtykfvL+zwBd0Y4mCJpMM
QpLUkS+BR3joPVNMtE4Y7gIgcWg7JmKQ0TjvGeGzsODLM/y+YDcaVB16NwCla+kL
NQY=
-----END CERTIFICATE-----
"""


class _Transport:
    def __init__(self, closing: bool = False, **extra: Any) -> None:
        self._closing = closing
        self._extra = extra

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)


class TestPlainSocket:
    def test_only_an_open_plain_socket_qualifies(self) -> None:
        """TLS (either marker), a closing transport or one without a socket never get bytes
        sent around them."""
        left, right = socket.socketpair()
        try:
            assert plain_socket(_Transport(socket=left)) == left.fileno()
            assert plain_socket(_Transport(socket=left, sslcontext=object())) is None
            assert plain_socket(_Transport(socket=left, ssl_object=object())) is None
            assert plain_socket(_Transport(closing=True, socket=left)) is None
            assert plain_socket(_Transport()) is None
            assert plain_socket(None) is None
        finally:
            left.close()
            right.close()

    @pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
    def test_a_tls_transport_does_not_qualify(self, tmp_path: Path, run: Any) -> None:
        """A real TLS connection is refused by its own markers (a TLS transport also exposes
        the socket below it), on both event loops the sidecar runs on."""
        run(self._tls_check(tmp_path))

    @staticmethod
    async def _tls_check(tmp_path: Path) -> None:
        key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
        key.write_text(_TEST_KEY)
        cert.write_text(_TEST_CERT)
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        client_context = ssl.create_default_context(cafile=str(cert))
        client_context.check_hostname = False

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
            assert plain_socket(writer.transport) is None
            writer.close()
            _reader2, plain = await asyncio.open_connection("127.0.0.1", port)
            assert plain_socket(plain.transport) is not None  # the same loop, no TLS
            plain.close()
        finally:
            server.close()
            await server.wait_closed()


@contextlib.contextmanager
def _link(
    tmp_path: Path, data: bytes, *, buffer_bytes: int | None = None
) -> Iterator[tuple[int, socket.socket, socket.socket]]:
    """A file holding ``data`` (its descriptor) and a non-blocking socket pair (sender,
    receiver), with ``buffer_bytes`` socket buffers when given; all closed after the block."""
    path = tmp_path / "data"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    left, right = socket.socketpair()
    try:
        if buffer_bytes is not None:
            left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
            right.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        left.setblocking(False)
        right.setblocking(False)
        yield fd, left, right
    finally:
        os.close(fd)
        left.close()
        right.close()


async def _drain(sock: socket.socket, into: bytearray, start: asyncio.Event | None = None) -> None:
    if start is not None:
        await start.wait()
    loop = asyncio.get_running_loop()
    while chunk := await loop.sock_recv(sock, 1 << 20):
        into += chunk


async def _end(sender: socket.socket, reading: asyncio.Task[None]) -> None:
    """Close the sending side and wait for the reader to take the rest."""
    sender.shutdown(socket.SHUT_WR)
    await reading


class TestSendFileRange:
    async def test_the_range_arrives_exactly(self, tmp_path: Path) -> None:
        data = os.urandom(3 * 1024 * 1024 + 5)
        got = bytearray()
        with _link(tmp_path, data) as (fd, left, right):
            reading = asyncio.create_task(_drain(right, got))
            await send_file_range(left.fileno(), fd, 1000, len(data) - 2000)
            await _end(left, reading)
        assert bytes(got) == data[1000:-1000]

    async def test_a_slow_reader_gets_everything(self, tmp_path: Path) -> None:
        """The socket fills (small buffers) before the reader starts: the send waits for room
        on the loop and goes on."""
        data = os.urandom(2 * 1024 * 1024)
        got = bytearray()
        start = asyncio.Event()
        with _link(tmp_path, data, buffer_bytes=4096) as (fd, left, right):
            reading = asyncio.create_task(_drain(right, got, start))
            sending = asyncio.create_task(send_file_range(left.fileno(), fd, 0, len(data)))
            await asyncio.sleep(0.2)  # the socket is full by now; the test holds either way
            assert not sending.done()
            start.set()
            await sending
            await _end(left, reading)
        assert bytes(got) == data

    async def test_a_file_that_ends_early_says_how_much_went(self, tmp_path: Path) -> None:
        data = os.urandom(100_000)
        got = bytearray()
        with _link(tmp_path, data) as (fd, left, right):
            reading = asyncio.create_task(_drain(right, got))
            with pytest.raises(ShortFileError) as caught:
                await send_file_range(left.fileno(), fd, 0, 150_000)
            await _end(left, reading)
        assert caught.value.sent == 100_000
        assert bytes(got) == data

    async def test_a_peer_that_stops_reading_is_a_timeout(self, tmp_path: Path) -> None:
        data = os.urandom(8 * 1024 * 1024)
        with _link(tmp_path, data) as (fd, left, _right), pytest.raises(TimeoutError):
            await send_file_range(left.fileno(), fd, 0, len(data), stall_s=0.2)


class _Buffered:
    """A transport whose write buffer shrinks by ``step`` bytes each time it is looked at
    (``step`` 0: a peer that reads nothing), until it is empty."""

    def __init__(self, size: int, step: int) -> None:
        self.size = size
        self.step = step
        self.looks = 0

    def get_write_buffer_size(self) -> int:
        self.looks += 1
        size = self.size
        self.size = max(0, self.size - self.step)
        return size


class TestProgressing:
    async def test_a_peer_that_keeps_taking_bytes_is_waited_for(self) -> None:
        """A write that lasts many stall periods returns, since the buffer shrinks at every
        look (each look comes before the deadline it would push)."""
        transport: Any = _Buffered(size=10**9, step=1)

        async def wait() -> str:
            while transport.looks < 25:  # six stall periods of looks
                await asyncio.sleep(0.01)
            return "written"

        assert await progressing(transport, wait(), 0.1) == "written"

    async def test_a_peer_that_takes_nothing_is_a_timeout(self) -> None:
        """No byte taken for the stall period: TimeoutError, and the write is cancelled."""
        transport: Any = _Buffered(size=1000, step=0)
        cancelled = asyncio.Event()

        async def wait() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with pytest.raises(TimeoutError):
            await progressing(transport, wait(), 0.1)
        assert cancelled.is_set()

    async def test_a_slow_steady_reader_of_a_socket_is_waited_for(self) -> None:
        """The peer reads a few KiB at a time, far less than the socket's send buffer: the
        transport's own buffer does not shrink until the kernel has room for more, but the
        socket's queue goes down at every look, and that is progress."""
        with _SlowReader() as (writer_sock, reader):
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_unix_connection(asyncio.Protocol, sock=writer_sock)
            try:

                async def written() -> None:
                    while unsent(transport) > 0:  # the peer took everything
                        await asyncio.sleep(0.05)

                transport.write(b"x" * _SLOW_BYTES)
                reader.start()
                await progressing(transport, written(), 0.5)
            finally:
                transport.close()
        assert reader.taken == _SLOW_BYTES

    async def test_a_slow_steady_reader_of_a_sent_file_is_waited_for(self, tmp_path) -> None:
        """The same reader of a file range sent with sendfile: the socket turns writable again
        only once most of its queue is gone, but the queue going down is progress."""
        path = tmp_path / "chunk"
        path.write_bytes(b"x" * _SLOW_BYTES)
        fd = os.open(path, os.O_RDONLY)
        try:
            with _SlowReader() as (writer_sock, reader):
                writer_sock.setblocking(False)
                reader.start()
                await send_file_range(writer_sock.fileno(), fd, 0, _SLOW_BYTES, stall_s=0.5)
        finally:
            os.close(fd)
        assert reader.taken == _SLOW_BYTES


#: what the slow reader is sent: more than its socket buffers hold
_SLOW_BYTES = 3 << 19


class _SlowReader(threading.Thread):
    """A peer reading 8 KiB every 10 ms or so (well under 1 MB/s: its sender's 1 MiB socket
    buffer takes seconds to empty) in a thread, until the sender closes; as a context, the
    socket pair (sender, this reader), both closed and the thread joined at the end."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.writer_sock, self.reader_sock = socket.socketpair()
        self.writer_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 512 << 10)
        self.reader_sock.settimeout(10)
        self.stop = threading.Event()
        self.taken = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.reader_sock.recv(8192)
            except OSError:
                return
            if not data:
                return
            self.taken += len(data)
            self.stop.wait(0.01)

    def __enter__(self) -> tuple[socket.socket, _SlowReader]:
        return self.writer_sock, self

    def __exit__(self, *exc: object) -> None:
        # the sender closes first: the reader sees the end after taking what was sent
        self.writer_sock.close()
        if self.is_alive():
            self.join(10)
        self.stop.set()
        self.reader_sock.close()
