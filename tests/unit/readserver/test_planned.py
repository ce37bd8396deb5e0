"""Planned responses: batches verified on an earlier read are sent from the cached chunks
without reading them (Content-Length, sendfile) and equal what the streaming walk sends; a
chunk fetched again (a new copy) is never sent on the strength of the old copy's check."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import uvloop

from sidecar import _sendfile as sendfile_module
from sidecar.readserver import ChunkCache, ReadServer, ReadService, routes
from sidecar.readserver.service import FileRange, Plan
from tests.unit.readserver._tiered import LAYOUT, TP, Remote, data_batches, three_segments

BASE = "http://localhost"


def _plan_bytes(plan: Plan) -> bytes:
    try:
        return b"".join(
            os.pread(p.fd, p.length, p.offset) if isinstance(p, FileRange) else bytes(p)
            for p in plan.pieces
        )
    finally:
        plan.close()


async def _streamed(service: ReadService, offset: int, max_bytes: int, limit=None) -> bytes:
    stream = await service.runs(TP, offset, max_bytes, limit_offset=limit)
    return b"".join([bytes(p) async for run in stream for p in run.pieces])


async def _read_through(service: ReadService, max_bytes: int) -> None:
    """A sequential reader from offset 0 to the end (it builds the segment maps)."""
    end = (await service.tiered_range(TP))[1]
    offset = 0
    while offset <= end:
        stream = await service.runs(TP, offset, max_bytes)
        offset = max([run.next_offset async for run in stream])


class TestPlanRecords:
    """plan_records against runs on the same data."""

    async def test_a_planned_response_is_a_prefix_of_the_streamed_one(self, remote, service):
        """Before any read there is no plan; after a sequential read, from every offset and for
        several sizes and limits the plan's bytes are the streamed response or a prefix of it
        ending at a batch boundary, at least one batch."""
        await three_segments(remote)
        assert await service.plan_records(TP, 0, 1 << 20) is None
        await _read_through(service, 5000)
        await service.chunks.idle()
        end = (await service.tiered_range(TP))[1]
        planned = 0
        for max_bytes in (1, 3000, 1 << 20):
            for limit in (None, 100):
                for offset in range(end + 1):
                    plan = await service.plan_records(TP, offset, max_bytes, limit_offset=limit)
                    streamed = await _streamed(service, offset, max_bytes, limit)
                    if plan is None:
                        continue
                    planned += 1
                    got = _plan_bytes(plan)
                    assert got, (offset, max_bytes)
                    assert streamed.startswith(got), (offset, max_bytes, limit)
                    if max_bytes == 1 << 20 and limit is None:
                        assert got == streamed, offset  # fully mapped: the whole response
        assert planned > 2 * (end + 1)

    async def test_a_refetched_chunk_is_not_trusted(self, remote, service):
        """After a chunk is invalidated (and fetched again) the plan is gone until a walk
        verifies the new copy."""
        await remote.upload(0, data_batches(0, 400))
        await _read_through(service, 1 << 20)
        await service.chunks.idle()
        plan = await service.plan_records(TP, 0, 1 << 20)
        assert plan is not None
        plan.close()
        segment = remote.segments[0]
        service.chunks.invalidate(service.log_ref(segment), 0, 0)
        assert await service.plan_records(TP, 0, 1 << 20) is None
        await _read_through(service, 1 << 20)
        plan = await service.plan_records(TP, 0, 1 << 20)
        assert plan is not None
        assert _plan_bytes(plan) == await _streamed(service, 0, 1 << 20)


async def _serve(remote: Remote, directory: Path, started: threading.Event, stop: list) -> None:
    chunks = ChunkCache(
        objects=remote.objects, directory=directory / "cache", max_bytes=64 << 20,
        chunk_size=512 * 1024, memory_chunks=0, fetch_timeout_s=5.0,
    )  # fmt: skip
    service = ReadService(
        store=remote.store, objects=remote.objects, layout=LAYOUT, chunks=chunks, lineage_ttl_s=0
    )
    server = ReadServer(service=service, socket_path=directory / "p.sock")
    stopping = asyncio.Event()
    stop.append((asyncio.get_running_loop(), stopping))
    task = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    started.set()
    await task


@pytest.fixture(params=["asyncio", "uvloop"])
async def big(
    remote: Remote, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Path, bytes]]:
    """About 6 MiB tiered in two segments, served with 512 KiB chunks, none kept in memory
    (every planned piece is a file range, most sent with sendfile): by a server on this loop,
    or on uvloop in a thread, as the daemon runs (no native sendfile, transports that are not
    asyncio's classes)."""
    logs = []
    for first in (0, 5000):
        segment = await remote.upload(first, data_batches(first, 500, per_batch=10, value_size=600))
        logs.append(remote.logs[segment.segment_id.id])
    started = threading.Event()
    stop: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
    if request.param == "asyncio":
        runner = asyncio.create_task(_serve(remote, tmp_path, started, stop))
        assert await asyncio.to_thread(started.wait, 10)
    else:
        thread = threading.Thread(
            target=uvloop.run, args=(_serve(remote, tmp_path, started, stop),), daemon=True
        )
        thread.start()
        assert await asyncio.to_thread(started.wait, 10)
    try:
        yield tmp_path / "p.sock", b"".join(logs)
    finally:
        loop, stopping = stop[0]
        loop.call_soon_threadsafe(stopping.set)
        if request.param == "asyncio":
            await runner
        else:
            await asyncio.to_thread(thread.join, 10)
            assert not thread.is_alive()


async def _read_all(http: aiohttp.ClientSession) -> tuple[bytes, list[str | None]]:
    """The partition's raw batches, 4 MiB responses from offset 0; and each response's
    Content-Length header."""
    out, lengths, offset = b"", [], 0
    url = f"{BASE}/v1/topics/orders/partitions/0/records"
    while True:
        async with http.get(url, params={"offset": offset, "max_bytes": 4 << 20}) as response:
            if response.status == 416:
                return out, lengths
            assert response.status == 200
            length = response.headers.get("Content-Length")
            body = await response.read()
        if not body:  # right after the tiered range: the end of the log
            return out, lengths
        lengths.append(length)
        out += body
        offset = _next_offset(body)


def _next_offset(body: bytes) -> int:
    position = last = 0
    while position < len(body):
        base = int.from_bytes(body[position : position + 8], "big")
        length = int.from_bytes(body[position + 8 : position + 12], "big")
        delta = int.from_bytes(body[position + 23 : position + 27], "big")
        last = base + delta
        position += 12 + length
    return last + 1


class TestSendfile:
    """Planned responses over the socket."""

    async def test_warm_responses_are_planned_and_byte_exact(self, big, monkeypatch):
        """The second read of the partition has Content-Length responses (planned, sent with
        sendfile) with the same bytes; so do whole-segment log ranges; a client that stops
        reading for a while still gets every byte."""
        socket_path, log = big
        sent: list[int] = []
        short: list[int] = []
        real = sendfile_module._send_some

        def counting(*args: object) -> int:
            sent.append(real(*args))  # type: ignore[arg-type]
            if sent[-1] < args[3]:  # type: ignore[operator]
                short.append(sent[-1])  # the socket stayed full: back to the loop
            return sent[-1]

        monkeypatch.setattr(sendfile_module, "_send_some", counting)
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as http:
            cold, cold_lengths = await _read_all(http)
            assert cold == log
            assert None in cold_lengths  # streamed (chunked) while cold
            warm, warm_lengths = await _read_all(http)
            assert warm == log
            assert None not in warm_lengths
            assert sum(sent) > len(log) // 2
            url = f"{BASE}/v1/topics/orders/partitions/0/records"
            async with http.get(url, params={"offset": 7, "max_bytes": 1}) as response:
                assert response.headers.get("Transfer-Encoding") == "chunked"  # small: streamed
                assert _next_offset(await response.read()) == 10
            async with http.get(f"{BASE}/v1/topics/orders/partitions/0/segments") as response:
                listing = await response.json()
            ranges = b""
            for segment in listing["segments"]:
                url = f"{BASE}/v1/topics/orders/partitions/0/segments/{segment['segment_id']}/log"
                async with http.get(url) as response:
                    ranges += await response.read()
            assert ranges == log
        # a slow client: the server's sendfile meets a full socket (of the default size) and
        # waits for room on the event loop
        monkeypatch.setattr(routes, "_SEND_BUFFER_BYTES", 0)
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        try:
            writer.write(
                b"GET /v1/topics/orders/partitions/0/records?offset=0&max_bytes=8388608 "
                b"HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"Content-Length" in head
            await asyncio.sleep(0.3)  # a stalled client (not synchronisation)
            body = await reader.read()
            assert body == log
            assert short
        finally:
            writer.close()
            await writer.wait_closed()
