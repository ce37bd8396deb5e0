"""A ``format=json`` records response of a large range is decoded and encoded in worker
threads, a bounded chunk at a time: the event loop (which also runs uploads, the Kafka clients
and /healthz) keeps running while it is served."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

import sidecar.readserver.routes as routes
from sidecar.kafka.records import Compression
from sidecar.observability.loopwatch import LoopWatchdog
from sidecar.observability.metrics import Metrics
from sidecar.readserver import ChunkCache, ReadServer, ReadService
from sidecar.readserver.service import Batch
from tests.unit.readserver._tiered import LAYOUT, Remote, data_batches

BATCHES = 120
PER_BATCH = 500


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=120)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def _get(path: Path, target: str) -> tuple[int, bytes]:
    """(thread) One GET over the Unix socket, the whole body read as fast as it comes."""
    connection = _UnixConnection(path)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


async def test_a_large_json_response_leaves_the_loop_running(
    remote: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """60,000 zstd-compressed records as JSON (tens of MB): no batch is decoded on the event
    loop's thread, and the body is whole. (How long the loop stalls is measured by the read
    benchmark's JSON readers; a wall-clock bound here would depend on the machine's load.)"""
    await remote.upload(0, data_batches(0, BATCHES, per_batch=PER_BATCH, codec=Compression.ZSTD))
    loop_thread = threading.get_ident()
    decoders: list[int] = []
    real = routes.decode_batch

    def recording(batch: Batch) -> Any:
        decoders.append(threading.get_ident())
        return real(batch)

    monkeypatch.setattr(routes, "decode_batch", recording)
    chunks = ChunkCache(
        objects=remote.objects,
        directory=tmp_path / "cache",
        max_bytes=64 << 20,
        chunk_size=1 << 20,
        readahead_chunks=2,
        fetch_timeout_s=30,
    )
    service = ReadService(store=remote.store, objects=remote.objects, layout=LAYOUT, chunks=chunks)
    sock = tmp_path / "r.sock"
    server = ReadServer(service=service, socket_path=sock, metrics=Metrics())
    stopping = asyncio.Event()
    serving = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    watchdog = LoopWatchdog(histogram=Metrics().event_loop_lag, interval_s=0.01)
    watching = asyncio.create_task(watchdog.run(stopping))
    try:
        await watchdog.measured.wait()
        status, body = await asyncio.to_thread(
            _get,
            sock,
            "/v1/topics/orders/partitions/0/records?offset=0&format=json"
            "&max_records=100000&max_bytes=67108864",
        )
    finally:
        stopping.set()
        await asyncio.gather(serving, watching)
    assert status == 200
    document = json.loads(body)
    assert len(document["records"]) == BATCHES * PER_BATCH
    assert document["next_offset"] == BATCHES * PER_BATCH
    assert decoders  # every batch was decoded ...
    assert loop_thread not in decoders  # ... in a worker thread


async def test_json_records_are_encoded_in_bounded_chunks() -> None:
    """The body comes in pieces of about ``_JSON_CHUNK_BYTES`` of batches each (one thread hop
    each), never the whole range at once; the records and next offset are those of the
    batches."""
    from sidecar.kafka.records import parse_batch_header

    raw = _rebased(data_batches(0, 60, per_batch=100))  # uncompressed: about 2 MB
    total = sum(len(b) for b in raw)

    async def stream():  # type: ignore[no-untyped-def]
        for data in raw:
            yield Batch(parse_batch_header(data), [memoryview(data)])

    pieces = [bytes(p) async for p in routes._json_pieces(stream(), b'{"x":1', 0, 1_000_000, None)]
    assert len(pieces) - 2 >= total // routes._JSON_CHUNK_BYTES >= 2
    document = json.loads(b"".join(pieces))
    assert [r["offset"] for r in document["records"]] == list(range(6000))
    assert document["next_offset"] == 6000


def _rebased(batches: list[bytes]) -> list[bytes]:
    from sidecar.kafka.records import parse_batch_header
    from sidecar.testing import rebase_batch

    out, offset = [], 0
    for raw in batches:
        batch = rebase_batch(raw, offset)
        out.append(batch)
        offset = parse_batch_header(batch).next_offset
    return out


def test_a_record_is_the_json_of_its_fields() -> None:
    """The directly formatted record is byte for byte ``json.dumps`` of its fields (compact),
    header keys with quotes, backslashes and non-ASCII included; absent keys and values are
    null."""
    import base64

    from sidecar.kafka.records import Record, TimestampType

    record = Record(
        offset=12,
        timestamp=-1,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        key=None,
        value=b"\x00\xffv",
        headers=[('q"\\é\n', b"h"), ("none", None)],
    )
    fields = {
        "offset": 12,
        "timestamp": -1,
        "timestamp_type": "LOG_APPEND_TIME",
        "leader_epoch": 3,
        "key": None,
        "value": base64.b64encode(b"\x00\xffv").decode(),
        "headers": [
            {"key": 'q"\\é\n', "value": base64.b64encode(b"h").decode()},
            {"key": "none", "value": None},
        ],
    }
    assert routes._record_json(record, 3) == json.dumps(fields, separators=(",", ":")).encode()
