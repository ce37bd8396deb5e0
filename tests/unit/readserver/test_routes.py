"""The HTTP API on a real Unix socket over fake tiered data: every endpoint, JSON errors with
stable codes, limits, the socket's mode, truncation on a mid-body failure, the Python client and
``sidecar read``."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from sidecar.errors import ConfigError
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.kafka.records import decode_batches, iter_batches
from sidecar.observability.metrics import Metrics
from sidecar.readserver import (
    ChunkCache,
    IndexNotFoundError,
    OffsetOutOfRangeError,
    ReadClient,
    ReadLimits,
    ReadServer,
    ReadService,
    TruncatedResponseError,
    UnknownTopicError,
    routes,
)
from sidecar.readserver._cli import read_command
from sidecar.readserver.routes import OPENAPI_PATH
from sidecar.readserver.service import Plan
from sidecar.storage.keys import ObjectSuffix
from tests.unit.readserver._tiered import LAYOUT, TP, Remote, data_batches, three_segments

BASE = "http://localhost"


@dataclass
class Running:
    """A read server running on a Unix socket, and a raw aiohttp session to it."""

    server: ReadServer
    session: aiohttp.ClientSession
    socket: Path
    metrics: Metrics

    async def get(self, path: str, **kwargs: object) -> tuple[int, bytes, dict[str, str]]:
        async with self.session.get(BASE + path, **kwargs) as response:  # type: ignore[arg-type]
            return response.status, await response.read(), dict(response.headers)

    async def error(self, path: str, **kwargs: object) -> tuple[int, dict[str, object]]:
        status, body, headers = await self.get(path, **kwargs)
        assert headers["Content-Type"].startswith("application/json"), body
        return status, json.loads(body)


async def _start(
    remote: Remote,
    tmp_path: Path,
    *,
    limits: ReadLimits | None = None,
    socket_path: Path | None = None,
    cache_bytes: int = 1 << 20,
    chunk_size: int = 16 * 1024,
) -> AsyncIterator[Running]:
    chunks = ChunkCache(
        objects=remote.objects,
        directory=tmp_path / "cache",
        max_bytes=cache_bytes,
        chunk_size=chunk_size,
        readahead_chunks=2,
        fetch_timeout_s=5.0,
    )
    service = ReadService(
        store=remote.store, objects=remote.objects, layout=LAYOUT, chunks=chunks, lineage_ttl_s=0
    )
    metrics = Metrics()
    socket_path = socket_path or tmp_path / "r.sock"
    server = ReadServer(
        service=service, socket_path=socket_path, limits=limits, metrics=metrics, tcp_port=0
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    waiter = asyncio.create_task(server.started.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        await task  # raises the startup error
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path)))
    try:
        yield Running(server, session, socket_path, metrics)
    finally:
        await session.close()
        stopping.set()
        await task


@pytest.fixture
async def running(remote: Remote, tmp_path: Path) -> AsyncIterator[Running]:
    """The read server over ``remote`` with default limits."""
    async for value in _start(remote, tmp_path):
        yield value


P = "/v1/topics/orders/partitions/0"


class TestSocket:
    """The Unix socket: mode 0660, a stale socket replaced, removed on stop."""

    async def test_socket_mode_is_0660_and_removed_on_stop(self, remote, tmp_path):
        """The socket is 0660 while serving and gone after stop."""
        async for run in _start(remote, tmp_path):
            mode = run.socket.stat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o660
            status, body, _ = await run.get("/v1/version")
            assert status == 200
            assert json.loads(body)["api"] == "v1"
        assert not (tmp_path / "r.sock").exists()

    async def test_a_stale_socket_is_replaced_and_a_file_is_refused(self, remote, tmp_path):
        """A leftover socket file is replaced; a regular file at the path is a ConfigError."""
        import socket

        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(tmp_path / "r.sock"))
        stale.close()
        async for run in _start(remote, tmp_path):
            assert (await run.get("/v1/version"))[0] == 200
        (tmp_path / "r.sock").write_text("not a socket")
        with pytest.raises(ConfigError, match="not a socket"):
            async for _ in _start(remote, tmp_path):
                pass

    async def test_a_socket_another_server_listens_on_is_not_taken(self, remote, tmp_path):
        """A second server on a live server's socket path refuses to start; the first keeps
        its socket and serves on."""
        async for run in _start(remote, tmp_path):
            second = tmp_path / "second"
            second.mkdir()
            with pytest.raises(ConfigError, match="another process listens"):
                async for _ in _start(remote, second, socket_path=run.socket):
                    pass
            assert (await run.get("/v1/version"))[0] == 200
        assert not run.socket.exists()

    async def test_a_socket_file_replaced_under_the_server_is_left_on_stop(self, remote, tmp_path):
        """On stop the server removes its own socket file, not one that took the path since."""
        import socket

        async for run in _start(remote, tmp_path):
            run.socket.unlink()
            other = socket.socket(socket.AF_UNIX)
            other.bind(str(run.socket))
        other.close()
        assert stat.S_ISSOCK(run.socket.lstat().st_mode)

    async def test_loopback_tcp_serves_the_same_api(self, running):
        """With a TCP port, the API answers on 127.0.0.1 too."""
        port = running.server.bound_port
        assert port
        async with ReadClient(url=f"http://127.0.0.1:{port}") as client:
            assert (await client.version())["api"] == "v1"


class TestRecords:
    """GET .../records: raw batches and JSON records."""

    async def test_raw_batches_are_the_brokers_bytes(self, remote, running):
        """format=raw streams the .log bytes from the batch holding the offset."""
        await three_segments(remote)
        everything = b"".join(remote.logs.values())
        status, body, headers = await running.get(P + "/records?offset=0&max_bytes=100000000")
        assert status == 200
        assert body == everything
        assert headers["Content-Type"] == "application/vnd.apache.kafka.record-batches"
        assert headers["X-Tiered-Start-Offset"] == "0"
        assert headers["X-Tiered-End-Offset"] == str(remote.segments[-1].end_offset)
        assert headers["X-Topic-Id"] == encode_kafka_uuid(TP.topic_id)

    async def test_raw_honours_max_records_with_whole_batches(self, remote, running):
        """format=raw with max_records sends the whole batches that end below offset +
        max_records (5 records a batch here): 12 records give batches 0-4 and 5-9; a limit
        inside the first batch still sends that batch."""
        await three_segments(remote)
        first = remote.logs[next(iter(remote.logs))]
        status, body, _ = await running.get(
            P + "/records?offset=0&max_bytes=100000000&max_records=12"
        )
        assert status == 200
        offsets = [b.base_offset for b in iter_batches(body)]
        assert offsets == [0, 5]
        assert first.startswith(body)
        _, body, _ = await running.get(P + "/records?offset=0&max_records=2")
        assert [b.base_offset for b in iter_batches(body)] == [0]

    async def test_json_records_skip_control_records(self, remote, running):
        """format=json decodes records from the offset on; commit/abort markers are left out."""
        expected = await three_segments(remote)
        status, body, _ = await running.get(
            P + "/records", params={"offset": "62", "format": "json", "max_bytes": "100000000"}
        )
        assert status == 200
        document = json.loads(body)
        got = document["records"]
        want = [r for r in expected if r.offset >= 62]
        assert [r["offset"] for r in got] == [r.offset for r in want]
        assert base64.b64decode(got[0]["value"]) == want[0].value
        assert got[0]["headers"] == [
            {"key": "n", "value": base64.b64encode(b"62").decode()},
            {"key": "null", "value": None},
        ]
        assert document["next_offset"] == remote.segments[-1].end_offset + 1
        assert 81 not in [r["offset"] for r in got]  # the COMMIT marker
        assert 83 not in [r["offset"] for r in got]  # the ABORT marker

    async def test_json_max_records_gives_the_next_offset(self, remote, running):
        """max_records stops mid-batch and next_offset continues exactly there."""
        await three_segments(remote)
        params = {"offset": "3", "format": "json", "max_records": "4"}
        status, body, _ = await running.get(P + "/records", params=params)
        document = json.loads(body)
        assert status == 200
        assert [r["offset"] for r in document["records"]] == [3, 4, 5, 6]
        assert document["next_offset"] == 7

    async def test_out_of_range_is_416_with_the_range(self, remote, running):
        """An offset past the tiered end: 416 offset_out_of_range with the available range."""
        await three_segments(remote)
        end = remote.segments[-1].end_offset
        status, body = await running.error(P + f"/records?offset={end + 2}")
        assert status == 416
        assert body["code"] == "offset_out_of_range"
        assert body["available"] == {"start_offset": 0, "end_offset": end}

    async def test_a_failure_mid_body_truncates_the_response(self, remote, running):
        """A corrupt batch in the second segment: the first streams, then the connection
        closes; the client sees a truncated response, never the bad bytes."""
        await remote.upload(0, data_batches(0, 10))
        second = await remote.upload(50, data_batches(50, 100))
        key = LAYOUT.segment_key(
            topic=TP.topic,
            topic_id=TP.topic_id,
            partition=0,
            base_offset=50,
            segment_id=second.segment_id.id,
            suffix=ObjectSuffix.LOG,
        )
        body = bytearray(remote.objects.objects[key])
        body[-100] ^= 0xFF
        await remote.objects.put(key, bytes(body))
        async with ReadClient(socket_path=running.socket) as client:
            with pytest.raises(TruncatedResponseError):
                await client.record_batches("orders", 0, 0, max_bytes=10**8)
        assert running.metrics.read_errors.labels("remote_data_invalid")._value.get() == 1


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait until ``condition()`` holds (checked on every turn of the event loop it yields)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.01)


def _value(metric: Any, *labels: str) -> float:
    return float((metric.labels(*labels) if labels else metric)._value.get())


async def _until_idle(metrics: Metrics, timeout: float = 30.0) -> None:
    """Wait until no request is in flight (every response finished or ended)."""
    await _until(lambda: _value(metrics.read_requests_in_flight) == 0, "idle", timeout)


async def _read_a_little_and_close(run: Running, path: str) -> None:
    """Send a GET for ``path``, read the status line and a little of the body, close."""
    reader, writer = await asyncio.open_unix_connection(str(run.socket))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    got = await reader.readexactly(1000)
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    writer.close()
    await writer.wait_closed()


def _small_send_buffer(request: web.Request) -> None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)


class TestClientGone:
    """A client that closes its connection mid-body (the broker plugin closes reads it stops
    early): not a server error, counted as status 499, nothing written after it."""

    @pytest.mark.parametrize("warm", [False, True], ids=["streamed", "planned"])
    async def test_a_client_closing_mid_body_is_not_an_internal_error(
        self, remote, tmp_path, monkeypatch, warm
    ):
        """Reading 1000 bytes of a 3 MiB segment and closing ends the request as 499, with no
        500 and no internal_error counted."""
        # a small socket send buffer: the kernel can never take the whole body at once
        monkeypatch.setattr(routes, "_large_send_buffer", _small_send_buffer)
        segment = await remote.upload(0, data_batches(0, 110, per_batch=10, value_size=3000))
        assert segment.segment_size_in_bytes > 3 * 1024 * 1024
        sid = encode_kafka_uuid(segment.segment_id.id)
        path = f"{P}/segments/{sid}/log"
        async for run in _start(remote, tmp_path, cache_bytes=8 << 20, chunk_size=256 * 1024):
            if warm:
                status, body, _ = await run.get(path)
                assert (status, body) == (200, remote.logs[segment.segment_id.id])
            await _read_a_little_and_close(run, path)
            await _until_idle(run.metrics)
            assert _value(run.metrics.read_requests, "segment_log", "499") == 1
            assert _value(run.metrics.read_requests, "segment_log", "500") == 0
            assert _value(run.metrics.read_errors, "internal_error") == 0
            # the server goes on serving
            assert (await run.get("/v1/version"))[0] == 200


def _deleted_open_files(directory: Path) -> list[str]:
    """Files under ``directory`` this process holds open although they were unlinked."""
    found = []
    for link in Path("/proc/self/fd").iterdir():
        try:
            target = str(link.readlink())
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(str(directory)) and target.endswith(" (deleted)"):
            found.append(target)
    return found


async def _read_all(service: ReadService, segment_id: uuid.UUID) -> None:
    """Read a whole segment through the chunk cache (a plan, if already cached, is closed)."""
    stream = await service.segment_range(TP, segment_id, 0, None)
    if isinstance(stream, Plan):
        stream.close()
        return
    async for _ in stream:
        pass


class TestStalledClient:
    """A client that stops reading without closing: after ``send_stall_s`` without progress
    its connection is aborted, the request ends, and the chunk files it held are closed."""

    @pytest.mark.parametrize(
        "chunk_size",
        [pytest.param(16 * 1024, id="written"), pytest.param(256 * 1024, id="sendfile")],
    )
    async def test_a_stalled_client_releases_its_slot_and_the_evicted_chunks(
        self, remote, tmp_path, monkeypatch, chunk_size
    ):
        """A warm segment asked for and never read: the request ends after the stall deadline
        (counted as the sendfile stall always was), and chunks evicted meanwhile by other
        reads leave no deleted-but-open files behind."""
        monkeypatch.setattr(routes, "_large_send_buffer", _small_send_buffer)
        first = await remote.upload(0, data_batches(0, 110, per_batch=10, value_size=3000))
        second = await remote.upload(
            first.end_offset + 1, data_batches(0, 110, per_batch=10, value_size=3000)
        )
        limits = ReadLimits(send_stall_s=1.0)
        async for run in _start(
            remote, tmp_path, limits=limits, cache_bytes=4 << 20, chunk_size=chunk_size
        ):
            service = run.server.service
            await _read_all(service, first.segment_id.id)
            plan = await service.segment_range(TP, first.segment_id.id, 0, None)
            assert isinstance(plan, Plan)  # warm: the socket read is sent from the chunk files
            plan.close()
            sid = encode_kafka_uuid(first.segment_id.id)
            reader, writer = await asyncio.open_unix_connection(str(run.socket))
            try:
                writer.write(
                    f"GET {P}/segments/{sid}/log HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
                )
                status = await reader.readuntil(b"\r\n")
                assert status.startswith(b"HTTP/1.1 200"), status
                # ... and nothing more is read; the other segment evicts the first's chunks
                await _read_all(service, second.segment_id.id)
                await _until_idle(run.metrics, timeout=15)
                assert _deleted_open_files(tmp_path / "cache") == []
                assert _value(run.metrics.read_errors, "storage_timeout") == 1
                assert _value(run.metrics.read_errors, "internal_error") == 0
            finally:
                writer.close()
            assert (await run.get("/v1/version"))[0] == 200


class TestOtherEndpoints:
    """Topics, partitions, segments, byte ranges, indexes, offsets, the OpenAPI document."""

    async def test_topics_partition_and_segments(self, remote, running):
        """The listings show the topic id, the tiered range, states and the offsets served."""
        await three_segments(remote)
        started = await remote.upload(1000, data_batches(1000, 1), finish=False)
        status, body, _ = await running.get("/v1/topics")
        assert json.loads(body)["topics"] == [
            {"topic": "orders", "topic_id": encode_kafka_uuid(TP.topic_id), "partitions": [0]}
        ]
        status, body, _ = await running.get("/v1/topics/orders")  # the parent of P answers too
        assert status == 200
        assert json.loads(body)["partitions"] == [0]
        status, body, _ = await running.get("/v1/topics/nothing-here")
        assert (status, json.loads(body)["code"]) == (404, "unknown_topic")
        status, body, _ = await running.get(P)
        info = json.loads(body)
        assert (status, info["segments"], info["tiered"]["start_offset"]) == (200, 3, 0)
        status, body, _ = await running.get(P + "/segments")
        segments = json.loads(body)["segments"]
        assert [s["state"] for s in segments] == ["COPY_SEGMENT_FINISHED"] * 3 + [
            "COPY_SEGMENT_STARTED"
        ]
        assert segments[0]["serves"] == [[0, remote.segments[0].end_offset]]
        assert segments[-1]["serves"] == []
        status, body, _ = await running.get(P + "/segments?state=COPY_SEGMENT_STARTED")
        assert [s["segment_id"] for s in json.loads(body)["segments"]] == [
            encode_kafka_uuid(started.segment_id.id)
        ]
        sid = encode_kafka_uuid(started.segment_id.id)
        status, body, _ = await running.get(P + f"/segments/{sid}")
        assert json.loads(body)["state"] == "COPY_SEGMENT_STARTED"

    async def test_log_range_and_indexes(self, remote, running):
        """fetchLogSegment's inclusive range with an exact Content-Length, and fetchIndex."""
        segment = await remote.upload(0, data_batches(0, 30))
        log = remote.logs[segment.segment_id.id]
        sid = encode_kafka_uuid(segment.segment_id.id)
        status, body, headers = await running.get(P + f"/segments/{sid}/log?start=100&end=20000")
        assert status == 200
        assert body == log[100:20001]
        assert headers["Content-Length"] == str(len(body))
        status, body, _ = await running.get(P + f"/segments/{sid}/log")
        assert body == log
        status, error = await running.error(P + f"/segments/{sid}/log?start={len(log)}")
        assert (status, error["code"], error["size"]) == (416, "range_not_satisfiable", len(log))
        status, body, _ = await running.get(P + f"/segments/{sid}/indexes/timestamp")
        assert status == 200
        assert len(body) % 12 == 0
        status, error = await running.error(P + f"/segments/{sid}/indexes/transaction")
        assert (status, error["code"]) == (404, "index_not_found")

    async def test_head_sends_headers_only(self, remote, running):
        """HEAD on a byte range answers with headers and no body, so the next response on the
        kept-alive connection is intact."""
        segment = await remote.upload(0, data_batches(0, 30))
        sid = encode_kafka_uuid(segment.segment_id.id)
        for _ in range(3):
            async with running.session.head(BASE + P + f"/segments/{sid}/log") as head:
                assert head.status == 200
                assert int(head.headers["Content-Length"]) == len(
                    remote.logs[segment.segment_id.id]
                )
                assert await head.read() == b""
            status, body, _ = await running.get(P + f"/segments/{sid}")
            assert status == 200
            assert json.loads(body)["state"] == "COPY_SEGMENT_FINISHED"

    async def test_offsets_for_timestamps(self, remote, running):
        """The first record at or after a timestamp, or nulls past the end."""
        await three_segments(remote)
        status, body, _ = await running.get(P + "/offsets?timestamp=1700000000055")
        answer = json.loads(body)
        assert (status, answer["offset"], answer["timestamp"]) == (200, 6, 1_700_000_000_060)
        status, body, _ = await running.get(P + "/offsets?timestamp=1800000000000")
        assert json.loads(body)["offset"] is None

    async def test_openapi_document_is_served(self, running):
        """/v1/openapi.yaml is the document in the package, and it parses."""
        status, body, _ = await running.get("/v1/openapi.yaml")
        assert status == 200
        assert body == OPENAPI_PATH.read_bytes()
        assert "/v1/topics/{topic}/partitions/{partition}/records" in yaml.safe_load(body)["paths"]


class TestErrors:
    """Bad input: JSON errors with stable codes, never a 5xx."""

    @pytest.mark.parametrize(
        ("path", "status", "code"),
        [
            pytest.param("/v1/topics/nope/partitions/0", 404, "unknown_topic", id="topic"),
            pytest.param("/v1/topics/orders/partitions/9", 404, "unknown_partition", id="part"),
            pytest.param("/v1/nothing", 404, "not_found", id="route"),
            pytest.param(P + "/records", 400, "bad_request", id="no-offset"),
            pytest.param(P + "/records?offset=x", 400, "bad_request", id="offset-text"),
            pytest.param(P + "/records?offset=-1", 400, "bad_request", id="offset-negative"),
            pytest.param(P + "/records?offset=1&offset=2", 400, "bad_request", id="twice"),
            pytest.param(P + "/records?offset=1&bogus=1", 400, "bad_request", id="unknown"),
            pytest.param(P + "/records?offset=0&format=xml", 400, "bad_request", id="format"),
            pytest.param(P + "/records?offset=99999999999999999999", 400, "bad_request", id="huge"),
            pytest.param(
                "/v1/topics/orders/partitions/-1/records?offset=0", 400, "bad_request", id="neg"
            ),
            pytest.param("/v1/topics/a%20b/partitions/0", 400, "bad_request", id="topic-name"),
            pytest.param(P + "/segments/xyz/log", 400, "bad_request", id="segment-id"),
            pytest.param(P + "/segments?state=GONE", 400, "bad_request", id="state"),
            pytest.param(
                P + f"/segments/{encode_kafka_uuid(uuid.UUID(int=5))}/log",
                404,
                "unknown_segment",
                id="segment",
            ),
            pytest.param(P + "/offsets", 400, "bad_request", id="no-timestamp"),
            pytest.param(P + "?topic_id=short", 400, "bad_request", id="topic-id"),
        ],
    )
    async def test_bad_requests_have_stable_codes(self, remote, running, path, status, code):
        """Each malformed or unknown request gets its status and code as JSON."""
        await remote.upload(0, data_batches(0, 2))
        got_status, body = await running.error(path)
        assert (got_status, body["code"]) == (status, code), body
        assert body["message"]

    async def test_path_traversal_never_reaches_a_file(self, remote, running, tmp_path):
        """Encoded dot segments and slashes in names are rejected, never resolved to files."""
        await remote.upload(0, data_batches(0, 2))
        secret = tmp_path / "secret"
        secret.write_text("TOP-SECRET-CONTENT-42")
        for path in (
            "/v1/topics/..%2F..%2F..%2Fetc%2Fpasswd/partitions/0",
            "/v1/topics/%2e%2e/partitions/0/records?offset=0",
            "/v1/topics/orders/partitions/0/segments/..%2F..%2Fsecret/log",
            "/v1/../../../../etc/passwd",
            "/v1/topics/orders/partitions/0/segments/AAAAAAAAAAAAAAAAAAAAAA/indexes/..%2Fsecret",
        ):
            async with running.session.get(BASE + path) as response:
                body = await response.read()
                assert response.status in (400, 404), (path, response.status)
                assert b"TOP-SECRET-CONTENT-42" not in body
                assert b"root:" not in body

    async def test_limits(self, remote, tmp_path):
        """414 for a long target, 431 for big headers, 413 for a body, 405 for POST."""
        async for run in _start(remote, tmp_path, limits=ReadLimits(max_url_bytes=300)):
            status, body = await run.error("/v1/topics?x=" + "a" * 400)
            assert (status, body["code"]) == (414, "uri_too_long")
            big = {f"X-Big-{i}": "b" * 3000 for i in range(3)}
            status, body = await run.error("/v1/version", headers=big)
            assert (status, body["code"]) == (431, "headers_too_large")
            status, body = await run.error("/v1/version", headers={"X-Big": "b" * 9000})
            assert (status, body["code"]) == (431, "headers_too_large")
            async with run.session.post(BASE + "/v1/version", data=b"x" * 10) as response:
                assert response.status == 413
                assert (await response.json())["code"] == "request_too_large"
            async with run.session.delete(BASE + "/v1/version") as response:
                assert response.status == 405
                assert (await response.json())["code"] == "method_not_allowed"

    async def test_too_many_requests_is_429(self, remote, tmp_path):
        """Past max_concurrent_requests, a request is answered 429 with Retry-After."""
        gate = asyncio.Event()
        entered = asyncio.Event()
        real_get_range = remote.objects.get_range

        async def slow_get_range(key: str, start: int, end: int, **_: object) -> bytes:
            entered.set()
            await gate.wait()
            return await real_get_range(key, start, end)

        remote.objects.get_range = slow_get_range  # type: ignore[method-assign]
        await remote.upload(0, data_batches(0, 2))
        limits = ReadLimits(max_concurrent_requests=1)
        async for run in _start(remote, tmp_path, limits=limits):
            first = asyncio.create_task(run.get(P + "/records?offset=0"))
            await entered.wait()
            status, body, headers = await run.get("/v1/version")
            assert (status, json.loads(body)["code"]) == (429, "too_many_requests")
            assert headers["Retry-After"] == "1"
            gate.set()
            assert (await first)[0] == 200

    async def test_a_failing_store_is_503(self, remote, running):
        """S3 failing before the first byte: 503 storage_unavailable, and the server lives."""
        from sidecar.errors import StorageError

        await remote.upload(0, data_batches(0, 2))
        # an offset inside a segment read for the first time needs its manifest first
        remote.objects.fail_next("get", StorageError("S3 is down"))
        status, body = await running.error(P + "/records?offset=1")
        assert (status, body["code"]) == (503, "storage_unavailable")
        assert (await running.get(P + "/records?offset=1"))[0] == 200
        # a segment's first offset starts at its byte 0 (no index read): the data's GET fails
        await remote.upload(10, data_batches(10, 2))
        remote.objects.fail_next("get_range", StorageError("S3 is down"))
        status, body = await running.error(P + "/records?offset=10")
        assert (status, body["code"]) == (503, "storage_unavailable")
        assert (await running.get(P + "/records?offset=10"))[0] == 200


class TestClientAndCli:
    """The Python client and ``sidecar read`` use the same API."""

    async def test_client_reads_every_record_and_raises_typed_errors(self, remote, running):
        """iter_records returns every data record; errors arrive as their classes."""
        expected = await three_segments(remote)
        async with ReadClient(socket_path=running.socket) as client:
            got = [r async for r in client.iter_records("orders", 0, 0, max_bytes=3000)]
            assert got == expected
            page = await client.records_json("orders", 0, 60, max_records=10)
            assert [r.offset for r in page.records] == list(range(60, 70))
            raw = await client.record_batches("orders", 0, 0, max_bytes=1)
            assert len(list(decode_batches(raw))) == 1
            with pytest.raises(UnknownTopicError):
                await client.partition("nope", 0)
            with pytest.raises(OffsetOutOfRangeError) as caught:
                await client.records("orders", 0, 10**6)
            assert caught.value.details["available"]["start_offset"] == 0
            sid = encode_kafka_uuid(remote.segments[0].segment_id.id)
            with pytest.raises(IndexNotFoundError):
                await client.index("orders", 0, sid, "transaction")
            log = b"".join([p async for p in client.stream_segment_log("orders", 0, sid)])
            assert log == remote.logs[remote.segments[0].segment_id.id]

    async def test_a_negative_count_is_refused_not_an_empty_answer(self, remote, running):
        """count=-1 is a ValueError; 0 is no record (None reads to the end)."""
        await three_segments(remote)
        async with ReadClient(socket_path=running.socket) as client:
            with pytest.raises(ValueError, match="count must be 0 or more"):
                [r async for r in client.iter_records("orders", 0, 0, count=-1)]
            assert [r async for r in client.iter_records("orders", 0, 0, count=0)] == []
            assert len([r async for r in client.iter_records("orders", 0, 0, count=2)]) == 2

    async def test_sidecar_read_prints_records_like_kcat(self, remote, running):
        """`sidecar read` prints offset, timestamp, key, headers and value per record."""
        expected = await three_segments(remote)
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(
            read_command,
            socket_path=running.socket,
            url=None,
            topic="orders",
            partition=0,
            offset=None,
            timestamp=1_700_000_000_600,
            count=3,
            as_json=False,
            out=out,
            err=err,
        )
        lines = out.getvalue().splitlines()
        assert code == 0
        assert len(lines) == 3
        first = expected[60]
        assert lines[0] == (
            f"Offset: 60  Timestamp: {first.timestamp}  Key: key-60  Headers: n=60,null=NULL  "
            f"Value: {first.value.decode()}"
        )
        out = io.StringIO()
        await asyncio.to_thread(
            read_command,
            socket_path=running.socket,
            url=None,
            topic="orders",
            partition=0,
            offset=0,
            timestamp=None,
            count=None,
            as_json=True,
            out=out,
            err=err,
        )
        printed = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [p["offset"] for p in printed] == [r.offset for r in expected]
        assert printed[0]["headers"] == ["n", "0", "null", None]

    async def test_sidecar_cli_main_reads_through_the_socket(self, remote, running, capsys):
        """`sidecar read --socket ... --offset ... --count` through the CLI entry point."""
        await remote.upload(0, data_batches(0, 2))
        from sidecar.cli import main

        code = await asyncio.to_thread(
            main,
            [
                "read",
                "--socket",
                str(running.socket),
                "--topic",
                "orders",
                "--partition",
                "0",
                "--offset",
                "4",
                "--count",
                "2",
            ],
        )
        out = capsys.readouterr().out.splitlines()
        assert code == 0
        assert [line.split("  ")[0] for line in out] == ["Offset: 4", "Offset: 5"]
        code = await asyncio.to_thread(
            main,
            ["read", "--socket", str(running.socket), "--topic", "nope", "--partition", "0",
             "--offset", "0"],
        )  # fmt: skip
        assert code == 1
        assert "no tiered data for topic 'nope'" in capsys.readouterr().err


def test_unreachable_socket_is_a_typed_error(tmp_path):
    """No server at the socket: ServerUnreachableError, exit code 1 from the CLI."""
    from sidecar.cli import main

    code = main(
        ["read", "--socket", str(tmp_path / "none.sock"), "--topic", "t", "--partition", "0",
         "--offset", "0"]
    )  # fmt: skip
    assert code == 1
