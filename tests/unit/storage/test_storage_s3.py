"""The S3 backend without a server: error translation, the retry classifier, timeouts and
refused connections on loopback (on injected sleep), configuration and secrets."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, Self
from urllib.parse import quote, unquote, urlsplit

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    FlexibleChecksumError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from structlog.testing import capture_logs

from sidecar.config import S3Config
from sidecar.errors import (
    ChecksumMismatchError,
    ChecksumNotEchoedError,
    ConditionalWriteUnsupportedError,
    InvalidRangeError,
    KeyNotFoundError,
    ObjectTooLargeError,
    StorageAccessError,
    StorageError,
    TruncatedFileError,
)
from sidecar.observability.metrics import Metrics
from sidecar.storage import open_store
from sidecar.storage import s3 as s3_module
from sidecar.storage._crc import composite_checksum, crc32c, encode_checksum
from sidecar.storage._parts import FilePartBody, PartChangedError, PartReader
from sidecar.storage.s3 import S3ObjectStore, _arrivals_hook, _is_transient

ACCESS_KEY = "AKIAUNITTESTKEY00001"
SECRET = "unit-test-secret-value-0123456789"


MiB = 1024 * 1024


class FakeSleep:
    """Records requested delays instead of sleeping."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def _store(**kwargs: Any) -> S3ObjectStore:
    arguments: dict[str, Any] = {
        "bucket": "unit",
        "endpoint_url": "http://127.0.0.1:9",
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET,
    }
    arguments.update(kwargs)
    return S3ObjectStore(**arguments)


def _client_error(code: str, status: int, message: str = "") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )


def _mapped(store: S3ObjectStore, exc: BaseException) -> StorageError:
    """What the boundary raises for ``exc``, chained as the store chains it."""
    error = store._error("get", "topic-0/00000000000000000000.log", exc)
    error.__cause__ = exc
    return error


class TestErrorMapping:
    @pytest.mark.parametrize(
        ("code", "status", "expected", "transient"),
        [
            pytest.param("NoSuchKey", 404, KeyNotFoundError, False, id="no-such-key"),
            pytest.param("404", 404, KeyNotFoundError, False, id="head-404"),
            pytest.param("InvalidRange", 416, InvalidRangeError, False, id="invalid-range"),
            pytest.param("BadDigest", 400, ChecksumMismatchError, True, id="bad-digest"),
            pytest.param(
                "XAmzContentChecksumMismatch", 400, ChecksumMismatchError, True, id="checksum"
            ),
            pytest.param("NoSuchUpload", 404, StorageError, False, id="no-such-upload"),
            pytest.param("NoSuchBucket", 404, StorageAccessError, False, id="no-such-bucket"),
            pytest.param("AccessDenied", 403, StorageAccessError, False, id="access-denied"),
            pytest.param("SignatureDoesNotMatch", 403, StorageAccessError, False, id="signature"),
            pytest.param("SlowDown", 503, StorageError, True, id="slow-down"),
            pytest.param("InternalError", 500, StorageError, True, id="internal"),
            pytest.param("RequestTimeout", 400, StorageError, True, id="request-timeout"),
            pytest.param("TooManyRequests", 429, StorageError, True, id="429"),
        ],
    )
    def test_client_errors(
        self, code: str, status: int, expected: type[StorageError], transient: bool
    ) -> None:
        """S3 error codes become the sidecar's types, and only transient ones are retried."""
        error = _mapped(_store(), _client_error(code, status, "details"))
        assert type(error) is expected
        assert "get s3://unit/topic-0/00000000000000000000.log" in str(error)
        assert _is_transient(error) is transient

    @pytest.mark.parametrize(
        ("exc", "transient"),
        [
            pytest.param(EndpointConnectionError(endpoint_url="http://x"), True, id="refused"),
            pytest.param(ReadTimeoutError(endpoint_url="http://x"), True, id="read-timeout"),
            pytest.param(TimeoutError(), True, id="asyncio-timeout"),
            pytest.param(ConnectionResetError(), True, id="reset"),
            pytest.param(NoCredentialsError(), False, id="no-credentials"),
            pytest.param(ParamValidationError(report="bad"), False, id="param-validation"),
        ],
    )
    def test_transport_errors(self, exc: BaseException, transient: bool) -> None:
        """Transport failures are StorageError; connection trouble and timeouts are retried."""
        error = _mapped(_store(), exc)
        assert type(error) is StorageError
        assert _is_transient(error) is transient

    def test_both_timeouts_say_timed_out(self) -> None:
        """The attempt's deadline and the client's read timeout read the same to an operator."""
        for exc in (ReadTimeoutError(endpoint_url="http://x"), TimeoutError()):
            assert "timed out" in str(_mapped(_store(), exc))

    def test_response_checksum_error(self) -> None:
        """botocore's own checksum failure is ChecksumMismatchError."""
        error = _mapped(_store(), FlexibleChecksumError(error_msg="mismatch"))
        assert type(error) is ChecksumMismatchError

    def test_secrets_are_redacted_from_server_messages(self) -> None:
        """A server message that echoes a credential never reaches our message."""
        message = f"Access Key Id {ACCESS_KEY} with secret {SECRET} is refused"
        error = _mapped(_store(), _client_error("InvalidAccessKeyId", 403, message))
        assert ACCESS_KEY not in str(error)
        assert SECRET not in str(error)

    def test_own_verification_failures_are_transient(self) -> None:
        """A checksum mismatch we detect ourselves (no cause) is worth another read."""
        assert _is_transient(ChecksumMismatchError("bytes differ"))
        assert not _is_transient(KeyNotFoundError("gone"))
        assert not _is_transient(ValueError("not ours"))


@pytest.fixture
async def silent_server() -> AsyncIterator[tuple[int, list[int]]]:
    """A loopback TCP server that accepts requests and never answers; yields (port, accepts)."""
    accepted: list[int] = []
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writers.append(writer)
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, accepted
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class TestTransport:
    async def test_timeout_is_storage_error_and_retried(
        self, silent_server: tuple[int, list[int]]
    ) -> None:
        """A server that never answers costs one timeout per attempt, then a StorageError."""
        port, accepted = silent_server
        sleep = FakeSleep()
        async with _store(
            endpoint_url=f"http://127.0.0.1:{port}",
            request_timeout_s=0.3,
            max_attempts=2,
            sleep=sleep,
        ) as store:
            with pytest.raises(StorageError, match=r"get s3://unit/k") as info:
                await store.get("k")
        assert type(info.value) is StorageError
        assert len(sleep.delays) == 1
        assert len(accepted) == 2

    async def test_refused_connection_is_retried(self) -> None:
        """A refused connection is retried per the policy, then surfaces as StorageError."""
        sleep = FakeSleep()
        async with _store(
            endpoint_url=f"http://127.0.0.1:{_closed_port()}", max_attempts=3, sleep=sleep
        ) as store:
            with pytest.raises(StorageError, match="put s3://unit/k") as info:
                await store.put("k", b"body")
        assert isinstance(info.value.__cause__, EndpointConnectionError)
        assert len(sleep.delays) == 2
        assert SECRET not in str(info.value)

    async def test_invalid_range_needs_no_request(self) -> None:
        """A malformed range fails before any connection is made."""
        async with _store(endpoint_url=f"http://127.0.0.1:{_closed_port()}") as store:
            with pytest.raises(InvalidRangeError):
                await store.get_range("k", 10, 9)


class TestConfiguration:
    async def test_from_config_and_repr(self) -> None:
        """open_store builds the S3 store from S3Config; its repr shows no credential."""
        config = S3Config.model_validate(
            {
                "bucket": "tiered",
                "endpoint_url": "http://127.0.0.1:9",
                "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET,
                "request_timeout_s": 5.0,
            }
        )
        store = open_store(config)
        assert isinstance(store, S3ObjectStore)
        text = repr(store)
        assert "tiered" in text
        assert ACCESS_KEY not in text
        assert SECRET not in text
        await store.aclose()
        await store.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await store.head("k")

    def test_invalid_timeout(self) -> None:
        """A non-positive request timeout is refused."""
        with pytest.raises(ValueError, match="request_timeout_s"):
            _store(request_timeout_s=0)


class _LoopbackServer:
    """A loopback HTTP/1.1 server (``async with``: started on a free port, ``port``); each
    request's line and headers (lower-cased names) go to :meth:`_answer`, which writes the
    reply (reading a body first if it wants one). A client that goes away ends the
    connection quietly."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        raise NotImplementedError

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode("latin-1").split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (f.partition(":") for f in fields if f)
                }
                await self._answer(line, headers, reader, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _RecordingServer(_LoopbackServer):
    """A loopback HTTP/1.1 server that answers every request 200 with an ETag (and the echo of
    the request's CRC-32C) and records each request's head (lower-cased header names) and body
    size, and the body. With ``verify`` it checks a body against its CRC-32C header as S3 does
    (400 BadDigest when they differ); the first ``damaged`` bodies are answered BadDigest as if
    they had been damaged on the way."""

    def __init__(self, *, verify: bool = False, damaged: int = 0) -> None:
        super().__init__()
        self.requests: list[tuple[str, dict[str, str], int]] = []
        self.bodies: list[bytes] = []
        self.verify = verify
        self.damaged = damaged

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        size = int(headers.get("content-length", "0"))
        body = await reader.readexactly(size)
        self.requests.append((line, headers, size))
        self.bodies.append(body)
        echo = headers.get("x-amz-checksum-crc32c")
        if echo and (
            len(self.bodies) <= self.damaged
            or (self.verify and echo != encode_checksum(crc32c(body)))
        ):
            refusal = (
                b"<Error><Code>BadDigest</Code><Message>The CRC32C you specified did not"
                b" match the calculated checksum.</Message></Error>"
            )
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\n"
                + f"Content-Length: {len(refusal)}\r\n\r\n".encode()
                + refusal
            )
            return
        extra = f"x-amz-checksum-crc32c: {echo}\r\n".encode() if echo else b""
        writer.write(b'HTTP/1.1 200 OK\r\nETag: "e"\r\n' + extra + b"Content-Length: 0\r\n\r\n")


class TestSlowLinks:
    async def test_an_upload_attempt_gets_time_for_its_body(self) -> None:
        """An attempt that sends a body is not cut at request_timeout_s while the body moves
        (a slow or crowded uplink would fail every attempt of a large part): its deadline is
        the timeout plus the body's time at the slowest rate allowed. An attempt without a
        body keeps the plain timeout."""
        sent: list[float] = []

        async def slow_send(client: Any) -> str:
            sent.append(time.perf_counter())
            await asyncio.sleep(0.6)  # twice the request timeout; 64 s allowed for the body
            return "done"

        async with _store(request_timeout_s=0.3, max_attempts=1) as store:
            found = await store._call("put", "k", slow_send, body_bytes=8 * 1024 * 1024)
            with pytest.raises(StorageError, match=r"put s3://unit/k timed out after 0\.3 s"):
                await store._call("put", "k", slow_send)
        assert found == "done"
        assert len(sent) == 2


class _AwaitedServer(_LoopbackServer):
    """A loopback server that, when it closes, waits for its connections' handlers: the store
    is closed by then, every handler has seen its client go away and closed its end, and
    nothing is left to the garbage collector."""

    def __init__(self) -> None:
        super().__init__()
        self._connections: set[asyncio.Task[Any]] = set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        await super()._handle(reader, writer)

    async def __aexit__(self, *exc: object) -> None:
        await super().__aexit__(*exc)
        if self._connections:
            await asyncio.wait(self._connections)


class _HangingMultipart(_AwaitedServer):
    """Starts multipart uploads, then answers nothing: neither a part nor an abort (a store
    that became unreachable mid-upload). ``parts`` is set once a part's request came in."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.parts = asyncio.Event()

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.lines.append(line)
        if line.startswith("POST") and "?uploads" in line:
            body = (
                b"<InitiateMultipartUploadResult><Bucket>unit</Bucket><Key>k</Key>"
                b"<UploadId>u1</UploadId></InitiateMultipartUploadResult>"
            )
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            return
        if "partNumber=" in line:
            self.parts.set()
        while await reader.read(65536):  # no answer, ever: until the client goes away
            pass
        raise ConnectionResetError("the client went away")


class TestCancelledUploads:
    async def test_a_cancelled_upload_spends_little_time_on_its_abort(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A stop (a forced one: the second SIGTERM) cancels uploads in flight. Each tries
        to abort its multipart upload once, briefly, instead of under the whole retry policy
        (4 attempts of request_timeout_s against a store that does not answer)."""
        monkeypatch.setattr(s3_module, "_ABORT_WHEN_CANCELLED_S", 2.0)
        path = tmp_path / "segment.log"
        path.write_bytes(b"x" * (11 * 1024 * 1024))  # three parts of 5 MiB
        async with (
            _HangingMultipart() as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}",
                request_timeout_s=30.0,
                max_attempts=4,
            ) as store,
        ):
            upload = asyncio.create_task(store.put_file("k", path, part_size=5 * 1024 * 1024))
            await server.parts.wait()
            with capture_logs() as logs:
                upload.cancel()
                done, _ = await asyncio.wait({upload}, timeout=20)
        assert upload in done
        assert upload.cancelled()
        assert any(line.startswith("DELETE") and "uploadId=u1" in line for line in server.lines)
        failed = [e for e in logs if e["event"] == "multipart_abort_failed"]
        assert len(failed) == 1
        assert "multipart_grace_s" in failed[0]["detail"]


def _reply(status: str, body: bytes = b"", headers: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body


class _LostCompletion(_AwaitedServer):
    """A multipart S3 that completes an upload and then loses the answer (the connection
    closes); the repeated completion finds no such upload, as MinIO answers. ``stored``
    changes the bytes it keeps; ``echo`` says whether HEAD returns the composite CRC-32C
    (else only the MD5-of-MD5s entity tag); ``complete`` False never completes at all."""

    def __init__(self, *, stored: Any = None, echo: bool = True, complete: bool = True) -> None:
        super().__init__()
        self.parts: dict[int, bytes] = {}
        self.object: bytes | None = None
        self.lines: list[str] = []
        self._stored = stored or (lambda body: body)
        self._echo = echo
        self._complete = complete

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.lines.append(line)
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        method, target, _ = line.split(" ", 2)
        query = target.partition("?")[2]
        if method == "POST" and query == "uploads":
            xml = (
                b"<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
                b"</InitiateMultipartUploadResult>"
            )
            writer.write(_reply("200 OK", xml))
        elif method == "PUT" and "partNumber=" in query:
            number = int(re.search(r"partNumber=(\d+)", query).group(1))  # type: ignore[union-attr]
            self.parts[number] = body
            echo = encode_checksum(crc32c(body))
            tag = hashlib.md5(body).hexdigest()  # noqa: S324 - S3's entity tag
            writer.write(
                _reply("200 OK", headers=f'ETag: "{tag}"\r\nx-amz-checksum-crc32c: {echo}\r\n')
            )
        elif method == "POST" and query.startswith("uploadId="):
            if self.parts and self._complete:
                self.object = self._stored(b"".join(b for _, b in sorted(self.parts.items())))
                self.parts.clear()
                raise ConnectionResetError("the answer is lost")
            error = b"<Error><Code>NoSuchUpload</Code><Message>gone</Message></Error>"
            writer.write(_reply("404 Not Found", error))
        elif method == "HEAD":
            if self.object is None:
                writer.write(_reply("404 Not Found"))
                return
            chunks = [self.object[i : i + 5 * MiB] for i in range(0, len(self.object), 5 * MiB)]
            digests = b"".join(hashlib.md5(c).digest() for c in chunks)  # noqa: S324
            tag = f"{hashlib.md5(digests).hexdigest()}-{len(chunks)}"  # noqa: S324
            extra = f'ETag: "{tag}"\r\n'
            if self._echo:
                crcs = composite_checksum(crc32c(c) for c in chunks)
                extra += f"x-amz-checksum-crc32c: {crcs}\r\n"
            writer.write(
                f"HTTP/1.1 200 OK\r\n{extra}Content-Length: {len(self.object)}\r\n\r\n".encode()
            )
        elif method == "GET" and self.object is not None:
            first, last = (int(x) for x in headers["range"].removeprefix("bytes=").split("-"))
            data = self.object[first : last + 1]
            writer.write(
                _reply(
                    "206 Partial Content",
                    data,
                    f"Content-Range: bytes {first}-{first + len(data) - 1}/{len(self.object)}\r\n",
                )
            )
        elif method == "DELETE":
            writer.write(_reply("204 No Content"))
        else:
            writer.write(_reply("501 Not Implemented"))


class TestLostCompletion:
    """A completion whose answer is lost is repeated and finds no such upload; the object the
    first one made counts as this upload when it is ours, and only then."""

    @staticmethod
    async def _upload(server: _LostCompletion, path: Any) -> Any:
        async with _store(
            endpoint_url=f"http://127.0.0.1:{server.port}", sleep=FakeSleep()
        ) as store:
            return await store.put_file("k", path, part_size=5 * MiB)

    @pytest.mark.parametrize("echo", [True, False], ids=["checksum", "etag"])
    async def test_the_object_the_lost_answer_made_is_the_upload(
        self, tmp_path: Any, echo: bool
    ) -> None:
        data = bytes(range(256)) * (11 * MiB // 256) + b"tail"
        path = tmp_path / "segment.log"
        path.write_bytes(data)
        async with _LostCompletion(echo=echo) as server:
            with capture_logs() as logs:
                info = await self._upload(server, path)
        assert server.object == data
        assert info.size == len(data)
        assert info.crc32c == crc32c(data)
        assert sum(line.startswith("POST /unit/k?uploadId=") for line in server.lines) == 2
        assert sum(line.startswith("POST /unit/k?uploads") for line in server.lines) == 1
        assert not any(line.startswith("DELETE") for line in server.lines)
        assert [e["event"] for e in logs].count("multipart_completed_unanswered") == 1

    async def test_another_object_at_the_key_is_not_taken_for_it(self, tmp_path: Any) -> None:
        path = tmp_path / "segment.log"
        path.write_bytes(b"a" * (11 * MiB))
        async with _LostCompletion(stored=lambda b: b[:-1] + b"b") as server:
            with pytest.raises(StorageError, match="NoSuchUpload"):
                await self._upload(server, path)

    async def test_an_upload_that_never_completed_stays_an_error(self, tmp_path: Any) -> None:
        path = tmp_path / "segment.log"
        path.write_bytes(b"a" * (11 * MiB))
        async with _LostCompletion(complete=False) as server:
            with pytest.raises(StorageError, match="NoSuchUpload"):
                await self._upload(server, path)
        assert server.object is None
        assert any(line.startswith("DELETE /unit/k?uploadId=u1") for line in server.lines)


class _ConditionalPuts(_AwaitedServer):
    """Answers every PUT with ``status`` and an S3 error ``code`` (none for 200: then with
    the echo of the request's CRC-32C, as S3 does), and records each request's If-None-Match
    header."""

    def __init__(self, status: str, code: str = "") -> None:
        super().__init__()
        self.status = status
        self.code = code
        self.conditions: list[str | None] = []

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        await reader.readexactly(int(headers.get("content-length", "0")))
        self.conditions.append(headers.get("if-none-match"))
        body = f"<Error><Code>{self.code}</Code><Message>m</Message></Error>".encode()
        echo = headers.get("x-amz-checksum-crc32c")
        extra = f"x-amz-checksum-crc32c: {echo}\r\n" if echo and not self.code else ""
        writer.write(_reply(self.status, body if self.code else b"", f'ETag: "e"\r\n{extra}'))


class TestPutIfAbsent:
    """One PUT with If-None-Match: *, its three answers."""

    @pytest.mark.parametrize(
        ("status", "code", "expected"),
        [
            ("200 OK", "", True),
            ("412 Precondition Failed", "PreconditionFailed", False),
            ("409 Conflict", "ConditionalRequestConflict", False),
        ],
    )
    async def test_written_or_already_there(self, status: str, code: str, expected: bool) -> None:
        async with (
            _ConditionalPuts(status, code) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", sleep=FakeSleep()) as store,
        ):
            assert await store.put_if_absent("p/marker", b"{}") is expected
        assert server.conditions == ["*"]  # one request: a refusal is an answer, not a fault

    async def test_a_store_without_the_condition_says_so_at_once(self) -> None:
        async with (
            _ConditionalPuts("501 Not Implemented", "NotImplemented") as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", sleep=FakeSleep()) as store,
        ):
            with pytest.raises(ConditionalWriteUnsupportedError, match="If-None-Match"):
                await store.put_if_absent("p/marker", b"{}")
        assert server.conditions == ["*"]  # not retried: it will not learn on a retry


class TestPerRequestWork:
    async def test_part_bodies_go_without_expect_continue(self, tmp_path: Any) -> None:
        """A file body is sent at once (no ``Expect: 100-continue`` round trip), signed, with
        its CRC-32C, and every request carries the same User-Agent."""
        path = tmp_path / "segment.log"
        path.write_bytes(b"k" * 70_000)
        async with (
            _RecordingServer() as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}",
                request_timeout_s=5.0,  # a request waiting for 100 Continue times out
                max_attempts=1,
            ) as store,
        ):
            info = await store.put_file("t/0.log", path)
            await store.put("t/0.idx", b"index")
        assert info.size == 70_000
        assert [r[0].split()[0] for r in server.requests] == ["PUT", "PUT"]
        assert [r[2] for r in server.requests] == [70_000, 5]
        for _line, headers, _size in server.requests:
            assert "expect" not in headers
            assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=")
            assert "x-amz-checksum-crc32c" in headers
        assert server.requests[0][1]["user-agent"] == server.requests[1][1]["user-agent"]

    async def test_empty_key_is_refused_before_any_request(self) -> None:
        """Without botocore's parameter validation, an empty key still never reaches the
        server (it would address the bucket itself)."""
        async with (
            _RecordingServer() as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}") as store,
        ):
            with pytest.raises(StorageError, match="key is empty"):
                await store.put("", b"x")
            with pytest.raises(StorageError, match="key is empty"):
                await store.get("")
            assert [i async for i in store.list("")] == []  # a prefix may be empty
        assert [r[0].split()[0] for r in server.requests] == ["GET"]


class _HugeObject(_AwaitedServer):
    """Answers every GET with the head of a 1 GiB object and a few KB of its body, then sends
    nothing more (``chunked``: with no Content-Length, in chunks), until the client goes."""

    def __init__(self, *, chunked: bool = False) -> None:
        super().__init__()
        self.chunked = chunked
        self.gets = 0

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.gets += 1
        if self.chunked:
            piece = b"x" * 1000
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"".join(b"3e8\r\n" + piece + b"\r\n" for _ in range(4))
            )
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n" + b"x" * 4000)
        await writer.drain()
        while await reader.read(65536):  # the rest never comes: until the client goes away
            pass


class TestBoundedGet:
    """``get(max_bytes=)`` refuses an object over the limit without reading it into memory."""

    @pytest.mark.parametrize("chunked", [False, True], ids=["announced", "chunked"])
    async def test_an_object_over_max_bytes_is_refused_unread(self, chunked: bool) -> None:
        """A GET of an object larger than the caller takes (a corrupt or foreign object at a
        manifest's key) is ObjectTooLargeError at once, on the announced length or after
        ``max_bytes`` + 1 bytes: not the whole body, not retried, counted."""
        metrics = Metrics()
        async with (
            _HugeObject(chunked=chunked) as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}",
                request_timeout_s=30.0,  # reading the whole body would hang the test
                max_attempts=3,
                metrics=metrics,
            ) as store,
        ):
            with pytest.raises(
                ObjectTooLargeError, match=r"get s3://unit/k\.manifest\.json"
            ) as info:
                await store.get("k.manifest.json", max_bytes=1024)
        assert "more than the 1024" in str(info.value)
        assert not info.value.retriable
        assert server.gets == 1
        errors = metrics.registry.get_sample_value(
            "kafka_tiered_sidecar_s3_request_errors_total",
            {"operation": "get_object", "reason": "other"},
        )
        assert errors == 1

    @pytest.mark.parametrize(
        ("size", "max_bytes", "whole"),
        [(3000, 1024 * 1024, True), (3000, 3000, True), (5000, 2048, False)],
        ids=["small", "exactly-the-limit", "too-large"],
    )
    async def test_a_body_without_a_length_is_read_to_its_end(
        self, monkeypatch: pytest.MonkeyPatch, size: int, max_bytes: int, whole: bool
    ) -> None:
        """With no Content-Length, a body that arrives in pieces (each read returns what has
        arrived) is read to its end or past ``max_bytes``: never cut at the first piece,
        which would make a whole manifest look truncated or a large object look small."""
        data = bytes(range(256)) * (size // 256) + bytes(size % 256)

        class Trickle:
            """A body that hands out at most 1000 bytes a read."""

            def __init__(self) -> None:
                self.rest = data

            async def __aenter__(self) -> Trickle:
                return self

            async def __aexit__(self, *exc: object) -> None:
                return None

            async def read(self, amt: int | None = None) -> bytes:
                take = len(self.rest) if amt is None or amt < 0 else amt
                piece, self.rest = self.rest[: min(take, 1000)], self.rest[min(take, 1000) :]
                return piece

        class Client:
            async def get_object(self, **kwargs: Any) -> dict[str, Any]:
                return {"Body": Trickle()}

        async def client() -> Client:
            return Client()

        async with _store(max_attempts=1) as store:
            monkeypatch.setattr(store, "_ensure_client", client)
            if whole:
                assert await store.get("k.manifest.json", max_bytes=max_bytes) == data
            else:
                with pytest.raises(ObjectTooLargeError, match="at least 2049 bytes"):
                    await store.get("k.manifest.json", max_bytes=max_bytes)


class TestStreamedParts:
    """Parts go streamed from the file, with CRC-32Cs computed before or handed in (multipart
    uploads: tests/integration/test_storage_contract.py, on SeaweedFS)."""

    async def test_handed_in_crcs_spare_the_checksum_read(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With ``part_crcs`` (the uploader's batch check computed them) the file is read once,
        to send it, with the CRC-32C handed in."""
        data = bytes(range(256)) * (12 * 1024)  # 3 MiB: three chunks
        path = tmp_path / "segment.log"
        path.write_bytes(data)

        async def no_checksum_read(*args: Any) -> int:
            raise AssertionError("the part CRC-32Cs were handed in")

        monkeypatch.setattr(PartReader, "checksum", no_checksum_read)
        async with (
            _RecordingServer() as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}") as store,
        ):
            info = await store.put_file("t/0.log", path, part_crcs=[crc32c(data)])
        assert info.crc32c == crc32c(data)
        ((_line, headers, size),) = server.requests
        assert (size, headers["x-amz-checksum-crc32c"]) == (len(data), encode_checksum(info.crc32c))

    async def test_bytes_that_do_not_match_their_crc_are_never_all_sent(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Bytes that do not match the CRC-32C announced for them (the file changed after its
        check) fail at once with that error, are not sent again and never reach the server
        whole."""
        data = b"s" * (3 * MiB)
        path = tmp_path / "segment.log"
        path.write_bytes(data)
        sends: list[int] = []
        send = FilePartBody.send

        async def counted(body: FilePartBody, *args: Any) -> None:
            sends.append(body.length)
            await send(body, *args)

        monkeypatch.setattr(FilePartBody, "send", counted)
        async with (
            _RecordingServer() as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}",
                max_attempts=4,
                sendfile_uploads=False,
            ) as store,
        ):
            with pytest.raises(PartChangedError, match="changed since"):
                await store.put_file("t/0.log", path, part_crcs=[12345])
        assert (sends, server.requests) == ([len(data)], [])


class TestSendfileParts:
    """A single PUT to a plain-HTTP endpoint goes with sendfile; the store's checksum check
    guards it (on SeaweedFS too: tests/integration/test_storage_contract.py)."""

    @staticmethod
    def _never_streamed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
        sent: list[int] = []
        zero_copy = FilePartBody.send_zero_copy

        async def streamed(body: FilePartBody, *args: Any) -> None:
            raise AssertionError("the body was read through the process")

        async def counted(body: FilePartBody, sock: int) -> None:
            sent.append(body.length)
            await zero_copy(body, sock)

        monkeypatch.setattr(FilePartBody, "send", streamed)
        monkeypatch.setattr(FilePartBody, "send_zero_copy", counted)
        return sent

    async def test_the_body_goes_with_sendfile_byte_exact(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The file's bytes reach the server whole after the headers, under their CRC-32C,
        and the connection serves the next request."""
        data = bytes(range(256)) * (20 * 1024) + b"tail"  # 5 MiB and a bit
        path = tmp_path / "segment.log"
        path.write_bytes(data)
        sent = self._never_streamed(monkeypatch)
        async with (
            _RecordingServer(verify=True) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}") as store,
        ):
            info = await store.put_file("t/0.log", path, part_crcs=[crc32c(data)])
            await store.put("t/0.idx", b"index")
        assert sent == [len(data)]
        assert info.crc32c == crc32c(data)
        assert server.bodies == [data, b"index"]
        assert server.requests[0][1]["x-amz-checksum-crc32c"] == encode_checksum(crc32c(data))

    async def test_a_file_that_changed_is_refused_once_and_named(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Bytes that no longer match the CRC-32C computed at the check: the store refuses
        them (BadDigest), the file is read to tell why, and the error says the file changed;
        it is not sent again."""
        data = b"c" * (3 * MiB)
        path = tmp_path / "segment.log"
        path.write_bytes(data)
        sent = self._never_streamed(monkeypatch)
        async with (
            _RecordingServer(verify=True) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", max_attempts=4) as store,
        ):
            with pytest.raises(PartChangedError, match="changed since"):
                await store.put_file("t/0.log", path, part_crcs=[crc32c(data) ^ 1])
        assert sent == [len(data)]
        assert server.bodies == [data]

    async def test_damage_in_transit_is_retried(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A refusal while the file still matches its CRC-32C is damage on the way: the
        whole body is sent again and stored."""
        data = b"d" * (2 * MiB + 17)
        path = tmp_path / "segment.log"
        path.write_bytes(data)
        sent = self._never_streamed(monkeypatch)
        async with (
            _RecordingServer(verify=True, damaged=1) as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}", max_attempts=3, backoff_s=0.0
            ) as store,
        ):
            info = await store.put_file("t/0.log", path)
        assert info.crc32c == crc32c(data)
        assert sent == [len(data), len(data)]
        assert server.bodies == [data, data]

    async def test_a_file_that_shrank_fails_with_its_position(
        self, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The file is cut between its open and the send: sendfile runs out early and the
        upload fails with TruncatedFileError, never with a body the server takes whole."""
        data = b"t" * (3 * MiB)
        path = tmp_path / "segment.log"
        path.write_bytes(data)
        zero_copy = FilePartBody.send_zero_copy

        async def cut_first(body: FilePartBody, sock: int) -> None:
            with path.open("r+b") as handle:
                handle.truncate(MiB)
            await zero_copy(body, sock)

        monkeypatch.setattr(FilePartBody, "send_zero_copy", cut_first)
        async with (
            _RecordingServer() as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", max_attempts=3) as store,
        ):
            with pytest.raises(TruncatedFileError, match="shrank"):
                await store.put_file("t/0.log", path, part_crcs=[crc32c(data)])
        assert server.bodies == []


class _UnechoingS3:
    """A loopback S3 for single PUTs, HEAD, ranged GET and batch delete that never echoes a
    checksum (a store without checksum support); ``alter`` changes the bytes it keeps."""

    def __init__(self, alter: Any = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.methods: list[str] = []
        self.alter = alter or (lambda body: body)
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _UnechoingS3:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> bytes:
        path, _, query = target.partition("?")
        key = path.split("/", 2)[2] if path.count("/") >= 2 else ""
        if method == "PUT":
            self.objects[key] = self.alter(body)
            return b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 0\r\n\r\n'
        if method == "HEAD":
            size = len(self.objects[key])
            return f'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: {size}\r\n\r\n'.encode()
        if method == "GET":
            data = self.objects[key]
            first, last = (int(x) for x in headers["range"].removeprefix("bytes=").split("-"))
            last = min(last, len(data) - 1)
            part = data[first : last + 1]
            head = (
                f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{len(data)}"
                f"\r\nContent-Length: {len(part)}\r\n\r\n"
            )
            return head.encode() + part
        if method == "POST" and query.startswith("delete"):
            for deleted in re.findall(rb"<Key>(.*?)</Key>", body):
                self.objects.pop(deleted.decode(), None)
            xml = b"<DeleteResult></DeleteResult>"
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(xml) + xml
        return b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line, *fields = head.decode("latin-1").split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (f.partition(":") for f in fields if f)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method, target, _ = line.split(" ", 2)
                self.methods.append(method)
                writer.write(self._answer(method, target, headers, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _unechoed(metrics: Metrics, resolution: str) -> float | None:
    return metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_s3_unechoed_uploads_total", {"resolution": resolution}
    )


class TestChecksumEcho:
    """An upload answered without its CRC-32C echo is verified by reading it back, or refused;
    the module docstring's integrity claim holds either way."""

    async def test_verify_reads_back_and_accepts_the_same_bytes(self, tmp_path: Any) -> None:
        metrics = Metrics()
        body = b"the bytes the broker wrote" * 100
        async with (
            _UnechoingS3() as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", metrics=metrics) as store,
        ):
            await store.put("t/0.idx", body)
            (tmp_path / "f").write_bytes(body)
            await store.put_file("t/0.log", tmp_path / "f")
        assert server.methods == ["PUT", "HEAD", "GET", "PUT", "HEAD", "GET"]
        assert server.objects == {"t/0.idx": body, "t/0.log": body}
        assert _unechoed(metrics, "verified_get") == 2

    async def test_verify_deletes_other_bytes_and_raises(self) -> None:
        metrics = Metrics()
        async with (
            _UnechoingS3(alter=lambda body: body[::-1]) as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}", metrics=metrics, max_attempts=1
            ) as store,
        ):
            with pytest.raises(ChecksumMismatchError, match="no CRC-32C echo"):
                await store.put("t/0.idx", b"abc" * 1000)
        assert server.objects == {}
        assert server.methods == ["PUT", "HEAD", "GET", "POST"]
        assert _unechoed(metrics, "mismatch") == 1

    async def test_verify_catches_a_short_object_from_the_head(self) -> None:
        async with (
            _UnechoingS3(alter=lambda body: body[:-1]) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", max_attempts=1) as store,
        ):
            with pytest.raises(ChecksumMismatchError, match="has 2999 bytes, we sent 3000"):
                await store.put("t/0.idx", b"abc" * 1000)
        assert server.methods == ["PUT", "HEAD", "POST"]

    async def test_refuse_deletes_and_raises_a_non_retriable_error(self) -> None:
        metrics = Metrics()
        async with (
            _UnechoingS3() as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}",
                metrics=metrics,
                checksum_echo="refuse",
            ) as store,
        ):
            with pytest.raises(ChecksumNotEchoedError) as raised:
                await store.put("t/0.idx", b"abc")
        assert not raised.value.retriable
        assert server.objects == {}
        assert server.methods == ["PUT", "POST"]
        assert _unechoed(metrics, "refused") == 1

    def test_the_knob_is_typed(self) -> None:
        with pytest.raises(ValueError, match="checksum_echo"):
            _store(checksum_echo="ignore")
        assert S3Config(checksum_echo="refuse").checksum_echo == "refuse"
        with pytest.raises(ValueError, match="checksum_echo"):
            S3Config(checksum_echo="ignore")


class _RangeServer(_LoopbackServer):
    """A loopback S3 stand-in for GETs of one object: a presigned request (``X-Amz-Signature``
    in its query, as the raw client sends) is answered by ``raw_reply`` (a status and an S3
    error code, ``"chunked"``, or the ranged bytes when None); a request signed in its
    ``Authorization`` header (botocore's) always gets the ranged bytes. Each request's line and
    headers are recorded."""

    def __init__(self, data: bytes, raw_reply: tuple[int, str] | str | None = None) -> None:
        super().__init__()
        self.data = data
        self.raw_reply = raw_reply
        self.requests: list[tuple[str, dict[str, str]]] = []

    def _ranged(self, headers: dict[str, str]) -> bytes:
        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
        start, end = int(first), min(int(last), len(self.data) - 1)
        body = self.data[start : end + 1]
        return (
            b"HTTP/1.1 206 Partial Content\r\n"
            + f"Content-Range: bytes {start}-{end}/{len(self.data)}\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.requests.append((line, headers))
        presigned = "X-Amz-Signature=" in line
        if not presigned or self.raw_reply is None:
            writer.write(self._ranged(headers))
        elif self.raw_reply == "chunked":
            writer.write(
                b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            )
        else:
            status, code = self.raw_reply
            error = f"<Error><Code>{code}</Code><Message>{code} here</Message></Error>"
            writer.write(
                f"HTTP/1.1 {status} {code}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(error)}\r\n\r\n{error}".encode()
            )


def _sigv4_query_signature(method: str, target: str, host: str, secret: str) -> str:
    """The SigV4 query signature a store computes for a presigned request it received: over
    its path as sent, its query but the signature, and the Host header as sent (AWS's
    signing rules, written out here apart from botocore's)."""
    path, _, query = target.partition("?")
    params = [tuple(unquote(x) for x in pair.split("=", 1)) for pair in query.split("&")]
    values = dict(params)
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
        for k, v in sorted(params)
        if k != "X-Amz-Signature"
    )
    signed = values["X-Amz-SignedHeaders"]
    assert signed == "host"
    canonical = "\n".join(
        [method, path, canonical_query, f"host:{host}\n", signed, "UNSIGNED-PAYLOAD"]
    )
    scope = values["X-Amz-Credential"].split("/", 1)[1]
    date, region, service, _ = scope.split("/")
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            values["X-Amz-Date"],
            scope,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


class _VerifyingRangeServer(_RangeServer):
    """A :class:`_RangeServer` that checks each presigned GET's signature as a store does,
    with the Host header it received: a mismatch is 403 SignatureDoesNotMatch."""

    async def _answer(
        self,
        line: str,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        method, target, _ = line.split(" ", 2)
        signature = re.search(r"[?&]X-Amz-Signature=([0-9a-f]+)", target)
        if signature is not None and signature[1] != _sigv4_query_signature(
            method, target, headers.get("host", ""), SECRET
        ):
            self.requests.append((line, headers))
            error = "<Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>"
            writer.write(_reply("403 Forbidden", error.encode()))
            return
        await super()._answer(line, headers, reader, writer)


class _Arrivals:
    """Records what a ranged GET tells of its body as it arrives."""

    def __init__(self) -> None:
        self.bodies: list[memoryview] = []
        self.counts: list[int] = []

    def receiving(self, body: memoryview) -> None:
        self.bodies.append(body)

    def arrived(self, count: int) -> None:
        self.counts.append(count)


class TestRawRangeGets:
    """Ranged GETs on a plain-HTTP endpoint go through the raw client, presigned; what it
    cannot read goes back to botocore; error responses map as botocore's do."""

    async def test_a_ranged_get_is_presigned_and_counted(self) -> None:
        data = bytes(range(256)) * 64
        metrics = Metrics()
        async with (
            _RangeServer(data) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", metrics=metrics) as store,
        ):
            assert store.raw_range_gets
            assert bytes(await store.get_range("t/0.log", 100, 5000)) == data[100:5001]
            assert bytes(await store.get_range("t/0.log", 16_000, 99_999)) == data[16_000:]
        (line, headers), _ = server.requests
        assert line.startswith("GET /unit/t/0.log?")
        assert "X-Amz-Signature=" in line
        assert "authorization" not in headers
        assert headers["range"] == "bytes=100-5000"
        assert ACCESS_KEY not in repr(store)
        count = metrics.registry.get_sample_value(
            "kafka_tiered_sidecar_s3_requests_total", {"operation": "get_object"}
        )
        assert count == 2

    @pytest.mark.parametrize("key", ["t/0.log", "a b+c%d~e", "topic-ü/ключ/0.log", "x=y&z?#/!*'()"])
    async def test_the_signature_holds_for_the_host_header_sent(self, key: str) -> None:
        """The Host header the raw client sends is the one botocore signed: lower case, and
        without the default port (an endpoint written ``http://MinIO:80`` signs
        ``host:minio``); keys with spaces, '+', '%', '~' and non-ASCII letters are signed
        as sent."""
        data = bytes(range(256)) * 4
        async with (
            _VerifyingRangeServer(data) as server,
            _store(endpoint_url=f"http://LocalHost:{server.port}", max_attempts=1) as store,
        ):
            assert store.raw_range_gets
            assert bytes(await store.get_range(key, 10, 99)) == data[10:100]
        ((line, headers),) = server.requests
        assert "X-Amz-Signature=" in line
        assert headers["host"] == f"localhost:{server.port}"

    @pytest.mark.parametrize(
        ("url", "host"),
        [
            ("http://MinIO.example:80/b/k?q", "minio.example"),
            ("http://minio.example:9000/b/k?q", "minio.example:9000"),
            ("http://Minio.example/b/k?q", "minio.example"),
            ("http://[::1]:80/b/k?q", "[::1]"),
            ("http://[::1]:8333/b/k?q", "[::1]:8333"),
            ("http://user@minio:9000/b/k?q", "minio:9000"),
        ],
    )
    def test_the_host_header_is_the_one_botocore_signs(self, url: str, host: str) -> None:
        assert s3_module._signed_host(urlsplit(url)) == host

    async def test_arrivals_are_told_of_a_ranged_gets_bytes(self) -> None:
        """Through the raw client, ``arrivals`` gets the body's buffer, then counts up to its
        length, with the range's bytes in it; the GET returns the same bytes."""
        data = bytes(range(256)) * 4096  # 1 MiB
        arrivals = _Arrivals()
        async with (
            _RangeServer(data) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}") as store,
        ):
            got = await store.get_range("t/0.log", 1000, 900_000, arrivals=arrivals)
        assert bytes(got) == data[1000:900_001]
        (body,) = arrivals.bodies
        assert arrivals.counts[-1] == len(body) == 899_001
        assert bytes(body) == data[1000:900_001]

    @pytest.mark.parametrize(
        ("status", "content_range"),
        [
            (200, None),
            (206, None),
            (206, "bytes 10-19/100"),
            (206, "bytes 0-8/100"),
            (206, "bytes */100"),
            (404, "bytes 0-9/100"),
        ],
        ids=["whole-object", "no-range", "other-start", "other-length", "unsatisfied", "error"],
    )
    def test_arrivals_hear_only_of_the_range_asked_for(
        self, status: int, content_range: str | None
    ) -> None:
        """An answer that is not the range asked for (the whole object, another range, an
        error) is told of not at all; the GET's own checks deal with it."""
        arrivals = _Arrivals()
        hook = _arrivals_hook(0, arrivals)
        headers = {} if content_range is None else {"content-range": content_range}
        assert hook(status, headers, memoryview(bytes(10))) is None
        assert arrivals.bodies == []
        assert hook(206, {"content-range": "bytes 0-9/100"}, memoryview(bytes(10))) is not None
        assert len(arrivals.bodies) == 1

    @pytest.mark.parametrize(
        ("reply", "error"),
        [
            ((404, "NoSuchKey"), KeyNotFoundError),
            ((416, "InvalidRange"), InvalidRangeError),
            ((403, "SignatureDoesNotMatch"), StorageAccessError),
        ],
        ids=["missing", "bad-range", "refused"],
    )
    async def test_error_responses_map_as_botocores_do(
        self, reply: tuple[int, str], error: type[StorageError]
    ) -> None:
        sleep = FakeSleep()
        async with (
            _RangeServer(b"0123456789", raw_reply=reply) as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}", sleep=sleep) as store,
        ):
            with pytest.raises(StorageError) as info:
                await store.get_range("t/0.log", 0, 3)
        assert type(info.value) is error
        assert "get_range s3://unit/t/0.log" in str(info.value)
        assert "X-Amz" not in str(info.value)
        assert ACCESS_KEY not in str(info.value)
        assert sleep.delays == []  # none of these is retried
        assert len(server.requests) == 1

    async def test_throttling_is_retried(self) -> None:
        sleep = FakeSleep()
        async with (
            _RangeServer(b"0123456789", raw_reply=(503, "SlowDown")) as server,
            _store(
                endpoint_url=f"http://127.0.0.1:{server.port}", sleep=sleep, max_attempts=3
            ) as store,
        ):
            with pytest.raises(StorageError, match="SlowDown") as info:
                await store.get_range("t/0.log", 0, 3)
        assert type(info.value) is StorageError
        assert _is_transient(info.value)
        assert len(sleep.delays) == 2
        assert len(server.requests) == 3

    async def test_a_response_it_cannot_read_sends_the_store_back_to_botocore(self) -> None:
        data = b"abcdefghij" * 10
        async with (
            _RangeServer(data, raw_reply="chunked") as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}") as store,
        ):
            with capture_logs() as logs:
                assert bytes(await store.get_range("t/0.log", 5, 14)) == data[5:15]
                assert bytes(await store.get_range("t/0.log", 20, 29)) == data[20:30]
            assert not store.raw_range_gets
        kinds = [
            "presigned" if "X-Amz-Signature=" in line else h.get("authorization", "")[:4]
            for line, h in server.requests
        ]
        assert kinds == ["presigned", "AWS4", "AWS4"]
        off = [e for e in logs if e["event"] == "s3_raw_range_gets_off"]
        assert len(off) == 1
        assert "Transfer-Encoding" in off[0]["reason"]

    async def test_a_get_presigned_before_the_fall_back_goes_through_botocore(self) -> None:
        """One GET is presigning when another meets a response the raw client cannot read:
        the first still gets its bytes, through botocore."""
        data = b"0123456789" * 10
        async with (
            _RangeServer(data, raw_reply="chunked") as server,
            _store(endpoint_url=f"http://127.0.0.1:{server.port}") as store,
        ):
            client = await store._ensure_client()
            presign = client.generate_presigned_url
            waiting = asyncio.Event()
            resume = asyncio.Event()

            async def held_presign(*args: Any, **kwargs: Any) -> str:
                url: str = await presign(*args, **kwargs)
                if not waiting.is_set():  # the first GET waits here
                    waiting.set()
                    await resume.wait()
                return url

            client.generate_presigned_url = held_presign
            first = asyncio.create_task(store.get_range("t/0.log", 0, 9))
            await waiting.wait()
            assert bytes(await store.get_range("t/0.log", 10, 19)) == data[10:20]
            assert not store.raw_range_gets
            resume.set()
            assert bytes(await first) == data[:10]

    @pytest.mark.parametrize(
        ("endpoint", "env", "setting", "raw"),
        [
            ("http://127.0.0.1:9", {}, True, True),
            ("http://127.0.0.1:9", {}, False, False),
            ("https://127.0.0.1:9", {}, True, False),
            (None, {}, True, False),
            ("http://minio:9000", {"HTTP_PROXY": "http://proxy:3128"}, True, False),
            (
                "http://minio:9000",
                {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "minio"},
                True,
                True,
            ),
        ],
        ids=["http", "off", "https", "aws", "proxy", "no-proxy-for-it"],
    )
    def test_only_plain_http_without_a_proxy(
        self,
        monkeypatch: pytest.MonkeyPatch,
        endpoint: str | None,
        env: dict[str, str],
        setting: bool,
        raw: bool,
    ) -> None:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert _store(endpoint_url=endpoint, raw_range_gets=setting).raw_range_gets is raw

    def test_the_setting_reaches_the_store(self) -> None:
        config = S3Config.model_validate(
            {"bucket": "tiered", "endpoint_url": "http://127.0.0.1:9", "raw_range_gets": False}
        )
        store = open_store(config)
        assert isinstance(store, S3ObjectStore)
        assert not store.raw_range_gets
