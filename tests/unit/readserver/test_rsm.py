"""The broker plugin's routes on a real Unix socket over the memory object store and real
segment files: copy → fetch (ranges, every index) → delete, path confinement, corrupt and
mismatched segments, and the request limits of the POST routes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from sidecar.errors import StorageError
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.kafka.indexes import AbortedTxn
from sidecar.kafka.logdir import FileKind, segment_file_name
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.readserver import ChunkCache, ReadServer, ReadService
from sidecar.readserver import cache as cache_module
from sidecar.readserver.app import _cache_file_offer
from sidecar.readserver.rsm import CacheFileOffer
from sidecar.readserver.service import NamedFiles, NamedRange
from sidecar.storage.keys import ObjectSuffix
from sidecar.storage.manifest import SegmentManifest
from sidecar.storage.memory import MemoryObjectStore
from sidecar.testing import write_partition
from sidecar.tiering.brokercopy import BrokerCopier
from tests.unit.readserver._tiered import LAYOUT, data_batches
from tests.unit.tiering.test_uploader_files import held_open

BASE = "http://localhost"
TOPIC_ID = uuid.UUID(int=0xABCD << 64 | 7)
EPOCHS_TEXT = b"0\n1\n0 0\n"


@dataclass
class Broker:
    """The broker's log dir as the broker names it, and the sidecar's mount of it."""

    broker_dir: Path
    mount: Path
    partition: Path


@dataclass
class Rsm:
    session: aiohttp.ClientSession
    objects: MemoryObjectStore
    metrics: Metrics
    server: ReadServer

    async def post(self, route: str, body: dict[str, Any]) -> tuple[int, bytes]:
        async with self.session.post(BASE + "/v1/rsm/" + route, json=body) as response:
            return response.status, await response.read()


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    """Two segments plus the active one; the second has an aborted transaction. The sidecar
    mounts the log dir at ``mount``; the broker calls it ``/broker/data``."""
    mount = tmp_path / "mount"
    part = write_partition(
        mount,
        "orders",
        0,
        [data_batches(0, 6), data_batches(30, 6), data_batches(60, 1)],
        topic_id=TOPIC_ID,
        aborted={1: [AbortedTxn(0, 9, 31, 35, 40)]},
    )
    return Broker(Path("/broker/data"), mount, part)


async def _serve(
    tmp_path: Path,
    broker: Broker,
    *,
    copier: bool = True,
    files: bool = True,
    broker_cache_dir: Path | None = None,
    plan_min_bytes: int = 256 * 1024,
) -> AsyncIterator[Rsm]:
    objects = MemoryObjectStore()
    chunks = ChunkCache(
        objects=objects, directory=tmp_path / "cache", max_bytes=1 << 20, chunk_size=16 * 1024
    )
    store = RemoteSegmentStore(tmp_path / "state")
    service = ReadService(
        store=store, objects=objects, layout=LAYOUT, chunks=chunks, plan_min_bytes=plan_min_bytes
    )
    metrics = Metrics()
    server = ReadServer(
        service=service,
        socket_path=tmp_path / "r.sock",
        metrics=metrics,
        cache_files=CacheFileOffer(chunks.directory, broker_cache_dir) if files else None,
        copier=BrokerCopier(
            objects=objects,
            layout=LAYOUT,
            log_dirs=[broker.mount],
            path_map={str(broker.broker_dir): broker.mount},
            part_size=8 * 1024 * 1024,
            concurrency=2,
        )
        if copier
        else None,
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(server.socket_path)))
    try:
        yield Rsm(session, objects, metrics, server)
    finally:
        await session.close()
        stopping.set()
        await task
        store.close()


@pytest.fixture
async def rsm(tmp_path: Path, broker: Broker) -> AsyncIterator[Rsm]:
    async for value in _serve(tmp_path, broker):
        yield value


def _metadata(broker: Broker, base: int, next_base: int, sid: uuid.UUID) -> dict[str, Any]:
    log = broker.partition / segment_file_name(base, FileKind.LOG)
    return {
        "topic": "orders",
        "topic_id": encode_kafka_uuid(TOPIC_ID),
        "partition": 0,
        "segment_id": encode_kafka_uuid(sid),
        "start_offset": base,
        "end_offset": next_base - 1,
        "max_timestamp_ms": 1_700_000_000_000,
        "broker_id": 1,
        "event_timestamp_ms": 1_700_000_000_001,
        "segment_size_in_bytes": log.stat().st_size,
        "segment_leader_epochs": [[0, base]],
        "txn_index_empty": False,
    }


def _copy_body(broker: Broker, base: int, next_base: int, sid: uuid.UUID) -> dict[str, Any]:
    def named(kind: FileKind, offset: int = base) -> str | None:
        local = broker.partition / segment_file_name(offset, kind)
        if not local.exists():
            return None
        return str(broker.broker_dir / broker.partition.name / local.name)

    return {
        **_metadata(broker, base, next_base, sid),
        "files": {
            "log": named(FileKind.LOG),
            "offset_index": named(FileKind.INDEX),
            "time_index": named(FileKind.TIMEINDEX),
            "txn_index": named(FileKind.TXNINDEX),
            "producer_snapshot": named(FileKind.SNAPSHOT, next_base),
        },
        "leader_epoch_index": base64.b64encode(EPOCHS_TEXT).decode(),
    }


class TestCopyAndFetch:
    async def test_copy_then_fetch_every_range_and_index_byte_exact(self, rsm, broker):
        """A copied segment's objects use the standalone keys and manifest, keyed by the
        broker's segment id; fetches give the broker's bytes back, end inclusive."""
        sid = uuid.uuid4()
        status, body = await rsm.post("copy", _copy_body(broker, 30, 60, sid))
        assert (status, json.loads(body)) == (200, {"custom_metadata": None})
        log = (broker.partition / segment_file_name(30, FileKind.LOG)).read_bytes()
        keys = {
            s: LAYOUT.segment_key(
                topic="orders",
                topic_id=TOPIC_ID,
                partition=0,
                base_offset=30,
                segment_id=sid,
                suffix=s,
            )
            for s in ObjectSuffix
        }
        assert await rsm.objects.get(keys[ObjectSuffix.LOG]) == log
        manifest = SegmentManifest.from_json(await rsm.objects.get(keys[ObjectSuffix.MANIFEST]))
        assert (manifest.segment_id, manifest.start_offset, manifest.end_offset) == (sid, 30, 59)
        meta = _metadata(broker, 30, 60, sid)
        for start, end, expected in [
            (0, None, log),
            (0, len(log) - 1, log),
            (10, 99, log[10:100]),
            (len(log) - 1, len(log) + 500, log[-1:]),
        ]:
            status, body = await rsm.post("fetch-segment", {**meta, "start": start, "end": end})
            assert status == 200
            assert body == expected
        status, body = await rsm.post("fetch-segment", {**meta, "start": len(log)})
        assert status == 416
        expected_files = {
            "OFFSET": broker.partition / segment_file_name(30, FileKind.INDEX),
            "TIMESTAMP": broker.partition / segment_file_name(30, FileKind.TIMEINDEX),
            "TRANSACTION": broker.partition / segment_file_name(30, FileKind.TXNINDEX),
            "PRODUCER_SNAPSHOT": broker.partition / segment_file_name(60, FileKind.SNAPSHOT),
        }
        for index_type, path in expected_files.items():
            status, body = await rsm.post("fetch-index", {**meta, "index_type": index_type})
            assert (status, body) == (200, path.read_bytes()), index_type
        status, body = await rsm.post("fetch-index", {**meta, "index_type": "LEADER_EPOCH"})
        assert (status, body) == (200, EPOCHS_TEXT)

    async def test_a_first_fetch_index_gets_the_manifest_and_the_indexes_at_once(
        self, rsm, broker, monkeypatch
    ):
        """The broker's first fetchIndex of a segment: the GET of the indexes object starts
        beside the manifest's, not after it; the indexes after it make no GET."""
        sid = uuid.uuid4()
        assert (await rsm.post("copy", _copy_body(broker, 30, 60, sid)))[0] == 200
        objects = rsm.objects
        get = objects.get
        ranges_at_manifest: list[int] = []

        async def recording_get(key: str, *, max_bytes: int | None = None) -> bytes:
            if key.endswith(".manifest.json"):
                ranges_at_manifest.append(objects.calls["get_range"])
            return await get(key, max_bytes=max_bytes)

        monkeypatch.setattr(objects, "get", recording_get)
        before = objects.calls["get_range"]
        meta = _metadata(broker, 30, 60, sid)
        for index_type, kind in (("OFFSET", FileKind.INDEX), ("TIMESTAMP", FileKind.TIMEINDEX)):
            status, body = await rsm.post("fetch-index", {**meta, "index_type": index_type})
            assert (status, body) == (
                200,
                (broker.partition / segment_file_name(30, kind)).read_bytes(),
            )
        assert ranges_at_manifest == [before + 1]
        assert objects.calls["get_range"] == before + 1

    async def test_missing_transaction_index_is_not_found(self, rsm, broker):
        """The first segment has no aborts: fetchIndex(TRANSACTION) is 404 index_not_found."""
        sid = uuid.uuid4()
        body = _copy_body(broker, 0, 30, sid)
        assert body["files"]["txn_index"] is None
        assert (await rsm.post("copy", body))[0] == 200
        meta = _metadata(broker, 0, 30, sid)
        status, answer = await rsm.post("fetch-index", {**meta, "index_type": "TRANSACTION"})
        assert status == 404
        assert json.loads(answer)["code"] == "index_not_found"

    async def test_delete_is_idempotent_and_fetch_after_it_is_not_found(self, rsm, broker):
        """Deleting twice succeeds; nothing of the segment is left; a fetch is then 404."""
        sid = uuid.uuid4()
        assert (await rsm.post("copy", _copy_body(broker, 0, 30, sid)))[0] == 200
        assert len(rsm.objects.objects) == 3
        meta = _metadata(broker, 0, 30, sid)
        assert (await rsm.post("delete", meta))[0] == 200
        assert (await rsm.post("delete", meta))[0] == 200
        assert rsm.objects.objects == {}
        status, body = await rsm.post("fetch-segment", {**meta, "start": 0})
        assert (status, json.loads(body)["code"]) == (404, "remote_object_not_found")
        status, body = await rsm.post("fetch-index", {**meta, "index_type": "OFFSET"})
        assert (status, json.loads(body)["code"]) == (404, "remote_object_not_found")


class TestCopyRefusals:
    async def test_corrupt_segment_is_refused_and_leaves_nothing(self, rsm, broker):
        """A flipped byte fails a batch CRC: 422, and no object is written."""
        log = broker.partition / segment_file_name(0, FileKind.LOG)
        data = bytearray(log.read_bytes())
        data[len(data) // 2] ^= 0xFF
        log.write_bytes(bytes(data))
        with capture_logs() as logs:
            status, body = await rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4()))
        assert (status, json.loads(body)["code"]) == (422, "segment_not_copyable")
        assert rsm.objects.objects == {}
        refused = [e for e in logs if e["event"] == "broker_copy_refused"]
        assert refused
        assert refused[0]["base_offset"] == 0

    async def test_a_failed_copy_is_cleaned_up_with_the_log_closed(self, rsm, broker):
        """What a failed copy wrote is deleted with the segment's ``.log`` already closed: a
        file the broker deletes meanwhile is freed at once, not after the cleanup."""
        log = broker.partition / segment_file_name(0, FileKind.LOG)
        put, delete = rsm.objects.put, rsm.objects.delete
        held: list[bool] = []

        async def failing_put(key: str, data: Any, **kwargs: Any) -> Any:
            if key.endswith(".manifest.json"):
                raise StorageError(f"put {key} failed: the store is down")
            return await put(key, data, **kwargs)

        async def watched_delete(keys: Any) -> None:
            held.append(held_open(log))
            await delete(keys)

        rsm.objects.put = failing_put
        rsm.objects.delete = watched_delete
        status, _ = await rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4()))
        assert status >= 500
        assert held == [False]
        assert rsm.objects.objects == {}

    async def test_copy_the_broker_gave_up_on_leaves_nothing(self, rsm, broker, monkeypatch):
        """The broker closes the connection while the sidecar uploads (its copy timeout, a
        shutdown): it will never write FINISHED for that segment id, so the copy is cancelled
        and what was written is deleted."""
        writing = asyncio.Event()
        put = rsm.objects.put

        async def stuck_put(key: str, data: Any, **kwargs: Any) -> Any:
            if key.endswith(".indexes"):
                writing.set()  # the .log is in the bucket; the upload hangs here
                await asyncio.Event().wait()
            return await put(key, data, **kwargs)

        monkeypatch.setattr(rsm.objects, "put", stuck_put)
        request = asyncio.create_task(rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4())))
        await asyncio.wait_for(writing.wait(), 10)
        assert rsm.objects.objects  # the .log
        with capture_logs() as logs:
            request.cancel()  # the client goes away: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await request
            deadline = asyncio.get_running_loop().time() + 30
            while rsm.objects.objects:
                assert asyncio.get_running_loop().time() < deadline, "the copy was left behind"
                await asyncio.sleep(0.05)
        assert [e["event"] for e in logs if e["event"].startswith("broker_copy_abandoned")] == [
            "broker_copy_abandoned"
        ]

    async def test_copy_that_finishes_after_the_broker_gave_up_leaves_nothing(
        self, rsm, broker, monkeypatch
    ):
        """The copy's last write lands just after the broker closed the connection: the copy
        finished, but for a segment id the broker has given up on, so it is deleted."""
        from sidecar.readserver import rsm as rsm_module

        # the disconnect is seen only once the copy is done, never by the periodic look
        monkeypatch.setattr(rsm_module, "_DISCONNECT_CHECK_S", 3600.0)
        seen: list[Any] = []
        real = rsm_module._copy_while_connected

        async def remember(request: Any, copier: Any, copy: Any) -> None:
            seen.append(request)
            await real(request, copier, copy)

        monkeypatch.setattr(rsm_module, "_copy_while_connected", remember)
        writing = asyncio.Event()
        put = rsm.objects.put

        async def late_put(key: str, data: Any, **kwargs: Any) -> Any:
            if key.endswith(".manifest.json"):
                writing.set()
                deadline = asyncio.get_running_loop().time() + 30
                while seen[0].transport is not None and not seen[0].transport.is_closing():
                    assert asyncio.get_running_loop().time() < deadline, "still connected"
                    await asyncio.sleep(0.01)
            return await put(key, data, **kwargs)

        monkeypatch.setattr(rsm.objects, "put", late_put)
        request = asyncio.create_task(rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4())))
        await asyncio.wait_for(writing.wait(), 10)
        with capture_logs() as logs:
            request.cancel()  # the client goes away: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await request
            deadline = asyncio.get_running_loop().time() + 30
            while not any(e["event"] == "broker_copy_abandoned" for e in logs):
                assert asyncio.get_running_loop().time() < deadline, "the copy was kept"
                await asyncio.sleep(0.05)
        assert rsm.objects.objects == {}
        events = [e["event"] for e in logs if e["event"].startswith("broker_")]
        assert events[:3] == [
            "broker_copy_finished",
            "broker_delete_finished",
            "broker_copy_abandoned",
        ]

    async def test_unreadable_segment_is_retriable_not_corrupt(self, rsm, broker, monkeypatch):
        """A read error (EIO) says nothing about the bytes: 503, which the plugin maps to a
        retriable exception, not 422 "corrupt"."""
        from sidecar.errors import UnreadableFileError
        from sidecar.tiering import brokercopy

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise UnreadableFileError("cannot read: Input/output error", path="x.log")

        monkeypatch.setattr(brokercopy, "iter_batches", failing)
        status, body = await rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4()))
        assert (status, json.loads(body)["code"]) == (503, "copy_interrupted")
        assert rsm.objects.objects == {}

    async def test_an_unreadable_index_is_retriable_not_an_internal_error(
        self, rsm, broker, monkeypatch
    ):
        """A read error (EIO) on an index file is the disk's problem, as on the ``.log``: 503,
        which the plugin maps to a retriable exception, and nothing is left in the bucket."""
        import errno

        from sidecar.tiering import brokercopy

        class Eio(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, buffer: Any) -> int:
                raise OSError(errno.EIO, "Input/output error")

        real = brokercopy.open_segment_file

        def open_file(path: Path) -> Any:
            handle, name = real(path)
            if path.name.endswith(".index"):
                handle.close()
                return Eio(), name
            return handle, name

        monkeypatch.setattr(brokercopy, "open_segment_file", open_file)
        status, body = await rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4()))
        assert (status, json.loads(body)["code"]) == (503, "copy_interrupted")
        assert rsm.objects.objects == {}

    async def test_size_mismatch_is_refused(self, rsm, broker):
        body = _copy_body(broker, 0, 30, uuid.uuid4())
        body["segment_size_in_bytes"] += 1
        status, answer = await rsm.post("copy", body)
        assert (status, json.loads(answer)["code"]) == (422, "segment_not_copyable")

    @pytest.mark.parametrize(
        "path",
        [
            pytest.param("/etc/passwd.log", id="outside"),
            pytest.param("/broker/data/../../etc/x.log", id="dotdot"),
            pytest.param("relative/0.log", id="relative"),
            pytest.param("/broker/data/orders-0/00000000000000000000.index", id="wrong-kind"),
        ],
    )
    async def test_paths_outside_the_log_dirs_are_refused(self, rsm, broker, path):
        """The socket never makes the sidecar read a file outside the broker's log dirs."""
        body = _copy_body(broker, 0, 30, uuid.uuid4())
        body["files"]["log"] = path
        status, answer = await rsm.post("copy", body)
        assert (status, json.loads(answer)["code"]) == (400, "bad_request")
        assert rsm.objects.objects == {}

    async def test_symlink_out_of_the_log_dir_is_refused(self, rsm, broker, tmp_path):
        secret = tmp_path / "secret.log"
        secret.write_bytes(b"x")
        (broker.partition / "evil.log").symlink_to(secret)
        body = _copy_body(broker, 0, 30, uuid.uuid4())
        body["files"]["log"] = str(broker.broker_dir / broker.partition.name / "evil.log")
        status, answer = await rsm.post("copy", body)
        assert (status, json.loads(answer)["code"]) == (400, "bad_request")

    async def test_missing_file_is_not_copyable(self, rsm, broker):
        body = _copy_body(broker, 0, 30, uuid.uuid4())
        body["files"]["log"] = str(broker.broker_dir / broker.partition.name / "000123.log")
        status, answer = await rsm.post("copy", body)
        assert (status, json.loads(answer)["code"]) == (422, "segment_not_copyable")


class TestRequests:
    @pytest.mark.parametrize(
        ("change", "field"),
        [
            pytest.param({"topic_id": "nope"}, "topic_id", id="uuid"),
            pytest.param({"partition": -1}, "partition", id="partition"),
            pytest.param({"start_offset": "0"}, "start_offset", id="type"),
            pytest.param({"segment_leader_epochs": []}, "segment_leader_epochs", id="epochs"),
            pytest.param({"txn_index_empty": 1}, "txn_index_empty", id="bool"),
        ],
    )
    async def test_bad_metadata_is_400_naming_the_field(self, rsm, broker, change, field):
        body = {**_metadata(broker, 0, 30, uuid.uuid4()), **change}
        status, answer = await rsm.post("delete", body)
        assert status == 400
        assert field in json.loads(answer)["message"]

    async def test_method_body_and_json_limits(self, rsm):
        """GET is 405; no JSON object is 400; a body over 1 MiB is 413."""
        async with rsm.session.get(BASE + "/v1/rsm/delete") as response:
            assert response.status == 405
        async with rsm.session.post(BASE + "/v1/rsm/delete", data=b"[1]") as response:
            assert response.status == 400
        async with rsm.session.post(BASE + "/v1/rsm/delete", data=b"{") as response:
            assert response.status == 400
        big = b"{" + b" " * (1024 * 1024) + b"}"
        async with rsm.session.post(
            BASE + "/v1/rsm/delete", data=io.BytesIO(big), headers={"Content-Length": str(len(big))}
        ) as response:
            assert response.status == 413
            assert (await response.json())["code"] == "request_too_large"

    async def test_a_plugin_of_another_protocol_is_refused_by_name(self, rsm, broker):
        """The broker's jar and the sidecar are upgraded apart: a request of a protocol version
        this sidecar does not speak is a 400 ``unsupported_protocol`` naming both versions
        (counted, logged once per version), before anything is read or deleted; the version
        this sidecar speaks, or no header, is served."""
        body = _metadata(broker, 0, 30, uuid.uuid4())
        with capture_logs() as logs:
            for _ in range(3):
                async with rsm.session.post(
                    BASE + "/v1/rsm/delete", json=body, headers={"X-Sidecar-Rsm-Protocol": "2"}
                ) as response:
                    assert response.status == 400
                    answer = await response.json()
        assert answer["code"] == "unsupported_protocol"
        assert "'2'" in answer["message"]
        assert "protocol 1" in answer["message"]
        assert answer["supported"] == 1
        assert [e["protocol"] for e in logs if e["event"] == "rsm_protocol_unsupported"] == ["2"]
        errors = rsm.metrics.registry.get_sample_value(
            "kafka_tiered_sidecar_read_errors_total", {"code": "unsupported_protocol"}
        )
        assert errors == 3
        assert rsm.objects.calls["delete"] == 0
        assert rsm.server.plugin_activity.last_request_at is None  # refused: not a plugin call
        for headers in ({"X-Sidecar-Rsm-Protocol": "1"}, {}):
            async with rsm.session.post(
                BASE + "/v1/rsm/delete", json=body, headers=headers
            ) as response:
                assert response.status == 200, await response.text()
        last = rsm.server.plugin_activity.last_request_at
        assert last is not None
        assert abs(time.time() - last) < 60

    async def test_without_a_copier_copy_is_unavailable(self, tmp_path, broker):
        """A read server started without the copier answers 503 (retriable for the plugin)."""
        async for rsm in _serve(tmp_path, broker, copier=False):
            status, body = await rsm.post("copy", _copy_body(broker, 0, 30, uuid.uuid4()))
            assert (status, json.loads(body)["code"]) == (503, "copy_unavailable")


def _many_chunks(tmp_path: Path) -> Broker:
    """One segment of many chunks (of the served cache), plus the active one."""
    mount = tmp_path / "mount"
    part = write_partition(
        mount,
        "orders",
        0,
        [data_batches(0, 40, value_size=1000), data_batches(200, 1)],
        topic_id=TOPIC_ID,
    )
    return Broker(Path("/broker/data"), mount, part)


class TestFetchWindows:
    CHUNK = 16 * 1024  # the chunk size of the served cache

    @pytest.fixture
    def broker(self, tmp_path: Path) -> Broker:
        return _many_chunks(tmp_path)

    async def test_a_window_reads_ahead_into_the_rest_of_its_range(self, rsm, broker):
        """The plugin asks for a range one window at a time: while one window is served, the
        chunks after it, up to ``readahead_end``, are fetched from the store; every window's
        bytes are exact, served from the store or the cache alike."""
        sid = uuid.uuid4()
        status, _ = await rsm.post("copy", _copy_body(broker, 0, 200, sid))
        assert status == 200
        log = (broker.partition / segment_file_name(0, FileKind.LOG)).read_bytes()
        assert len(log) > 6 * self.CHUNK
        meta = {**_metadata(broker, 0, 200, sid), "readahead_end": len(log) - 1}
        before = rsm.objects.calls["get_range"]
        status, body = await rsm.post("fetch-segment", {**meta, "start": 0, "end": self.CHUNK - 1})
        assert (status, body) == (200, log[: self.CHUNK])
        deadline = asyncio.get_running_loop().time() + 30
        while rsm.objects.calls["get_range"] - before < 2:  # a GET past the window
            assert asyncio.get_running_loop().time() < deadline, "no read-ahead past the window"
            await asyncio.sleep(0.01)
        for start in range(self.CHUNK, len(log), self.CHUNK):
            end = min(len(log), start + self.CHUNK) - 1
            status, body = await rsm.post("fetch-segment", {**meta, "start": start, "end": end})
            assert (status, body) == (200, log[start : end + 1])


class TestCacheFiles:
    """A plugin on the sidecar's host (or in its pod) is told where cached bytes are and reads
    the chunk files itself; anything it could not read that way still comes as bytes."""

    CHUNK = 16 * 1024  # the chunk size of the served cache

    @pytest.fixture
    def broker(self, tmp_path: Path) -> Broker:
        return _many_chunks(tmp_path)

    async def _copied(self, rsm: Rsm, broker: Broker) -> tuple[dict[str, Any], bytes]:
        sid = uuid.uuid4()
        status, _ = await rsm.post("copy", _copy_body(broker, 0, 200, sid))
        assert status == 200
        log = (broker.partition / segment_file_name(0, FileKind.LOG)).read_bytes()
        assert len(log) > 6 * self.CHUNK
        return _metadata(broker, 0, 200, sid), log

    @staticmethod
    def _read(files: list[dict[str, Any]]) -> bytes:
        """The bytes the plugin reads from the ranges it was given."""
        out = bytearray()
        for entry in files:
            with Path(entry["path"]).open("rb") as file:
                file.seek(entry["offset"])
                out += file.read(entry["length"])
        return bytes(out)

    async def test_cached_ranges_are_answered_with_their_files(self, tmp_path, broker):
        async for rsm in _serve(tmp_path, broker, plan_min_bytes=1):
            meta, log = await self._copied(rsm, broker)
            # cold: the bytes come from the store, streamed, even to a plugin that reads files
            status, body = await rsm.post("fetch-segment", {**meta, "start": 0, "files": True})
            assert (status, body) == (200, log)
            await rsm.server.service.chunks.idle()  # every chunk written to its file
            for start, end in [(0, len(log) - 1), (100, 3 * self.CHUNK + 17), (len(log) - 5, None)]:
                last = len(log) - 1 if end is None else end
                async with rsm.session.post(
                    BASE + "/v1/rsm/fetch-segment",
                    json={**meta, "start": start, "end": end, "files": True},
                ) as response:
                    assert response.status == 200
                    assert response.content_type == "application/json"
                    files = (await response.json())["files"]
                assert all(Path(f["path"]).is_relative_to(tmp_path / "cache") for f in files)
                assert self._read(files) == log[start : last + 1]
            # a plugin that does not ask gets the bytes, from the same files
            status, body = await rsm.post("fetch-segment", {**meta, "start": 100, "end": 999})
            assert (status, body) == (200, log[100:1000])
            shared = rsm.metrics.read_shared_file_bytes._value.get()
            assert shared == len(log) + (3 * self.CHUNK + 17 - 100 + 1) + 5

    async def test_paths_are_as_the_broker_mounts_the_cache(self, tmp_path, broker):
        pod = Path("/pod/broker/sidecar-cache")
        async for rsm in _serve(tmp_path, broker, broker_cache_dir=pod, plan_min_bytes=1):
            meta, log = await self._copied(rsm, broker)
            assert (await rsm.post("fetch-segment", {**meta, "start": 0}))[1] == log
            await rsm.server.service.chunks.idle()
            status, body = await rsm.post("fetch-segment", {**meta, "start": 0, "files": True})
            assert status == 200
            files = json.loads(body)["files"]
            assert files
            assert all(f["path"].startswith(f"{pod}/") for f in files)
            here = [
                {**f, "path": str(tmp_path / "cache" / Path(f["path"]).relative_to(pod))}
                for f in files
            ]
            assert self._read(here) == log

    async def test_a_sidecar_that_offers_no_files_sends_the_bytes(self, tmp_path, broker):
        async for rsm in _serve(tmp_path, broker, files=False, plan_min_bytes=1):
            meta, log = await self._copied(rsm, broker)
            assert (await rsm.post("fetch-segment", {**meta, "start": 0}))[1] == log
            await rsm.server.service.chunks.idle()
            status, body = await rsm.post("fetch-segment", {**meta, "start": 0, "files": True})
            assert (status, body) == (200, log)
            assert rsm.metrics.read_shared_file_bytes._value.get() == 0

    async def test_files_must_be_a_boolean(self, rsm, broker):
        meta, _ = await self._copied(rsm, broker)
        status, body = await rsm.post("fetch-segment", {**meta, "start": 0, "files": "yes"})
        assert status == 400
        assert "files must be true or false" in json.loads(body)["message"]

    async def test_chunks_still_being_written_come_as_bytes(self, tmp_path, broker, monkeypatch):
        """Cached chunks whose files are not written yet are served from memory as bytes; once
        written, the same range is answered with the files."""
        release = threading.Event()
        real = cache_module._write_tmp

        def write_when_released(*args: Any) -> Any:  # in the cache's worker thread
            release.wait(30)
            return real(*args)

        monkeypatch.setattr(cache_module, "_write_tmp", write_when_released)
        async for rsm in _serve(tmp_path, broker, plan_min_bytes=1):
            meta, log = await self._copied(rsm, broker)
            try:
                assert (await rsm.post("fetch-segment", {**meta, "start": 0}))[1] == log
                window = {**meta, "start": 0, "end": 2 * self.CHUNK - 1, "files": True}
                status, body = await rsm.post("fetch-segment", window)
                assert (status, body) == (200, log[: 2 * self.CHUNK])
                assert rsm.metrics.read_shared_file_bytes._value.get() == 0
            finally:
                release.set()
            await rsm.server.service.chunks.idle()
            status, body = await rsm.post("fetch-segment", window)
            assert status == 200
            assert self._read(json.loads(body)["files"]) == log[: 2 * self.CHUNK]

    async def test_a_path_the_plugin_cannot_take_gets_the_bytes(self, tmp_path, broker):
        """An offer whose broker-side directory the plugin cannot take is not made by the read
        server (logged); one made anyway answers with the bytes."""
        odd = Path('/pod/"cache"')
        assert not CacheFileOffer(tmp_path / "cache", odd).usable
        with capture_logs() as logs:
            assert _cache_file_offer(tmp_path / "cache", odd) is None
            assert _cache_file_offer(tmp_path / "cache", Path("/pod/cache")) is not None
        assert [e["event"] for e in logs] == ["read_cache_files_not_offered"]
        async for rsm in _serve(tmp_path, broker, broker_cache_dir=odd, plan_min_bytes=1):
            meta, log = await self._copied(rsm, broker)
            assert (await rsm.post("fetch-segment", {**meta, "start": 0}))[1] == log
            await rsm.server.service.chunks.idle()
            status, body = await rsm.post("fetch-segment", {**meta, "start": 3, "files": True})
            assert (status, body) == (200, log[3:])
            assert rsm.metrics.read_shared_file_bytes._value.get() == 0

    def test_ranges_are_named_as_the_broker_sees_them(self, tmp_path):
        cache = tmp_path / "cache"
        offer = CacheFileOffer(cache)
        assert offer.usable
        inside = cache / "ab" / "x.chunk"
        assert offer.broker_path(inside) == str(inside)
        assert offer.broker_path(tmp_path / "elsewhere.chunk") is None
        assert offer.broker_path(cache / "ab" / 'a"b.chunk') is None
        assert offer.broker_path(cache / "ab" / "a\\b.chunk") is None
        assert offer.broker_path(cache / "ab" / "\u00e9.chunk") is None
        other = cache / "cd" / "y.chunk"
        named = NamedFiles([NamedRange(inside, 5, 14), NamedRange(other, 0, 3)], 17)
        assert json.loads(offer.answer(named) or b"")["files"] == [
            {"path": str(inside), "offset": 5, "length": 14},
            {"path": str(other), "offset": 0, "length": 3},
        ]
        pod = CacheFileOffer(cache, Path("/pod/cache"))
        assert json.loads(pod.answer(named) or b"")["files"][1]["path"] == "/pod/cache/cd/y.chunk"
        assert offer.answer(NamedFiles([NamedRange(cache / "ab" / 'a"b', 0, 1)], 1)) is None
