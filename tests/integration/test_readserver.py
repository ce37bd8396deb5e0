"""The read server against the real S3 server (SeaweedFS): every offset, byte range and index
read through the Unix socket equals what was tiered; a warm read sends no GET; during an S3
outage cached data is still served and the rest is a clean 503. A second read server process
on the same cache dir stops at start and leaves the first one's files alone."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import StorageError
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.kafka.logdir import FileKind, segment_file_name
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.readserver import (
    ChunkCache,
    ReadClient,
    ReadServer,
    ReadService,
    StorageUnavailableError,
)
from sidecar.storage.manifest import IndexKind
from sidecar.storage.s3 import S3ObjectStore
from tests.helpers import wait_for
from tests.sidecar_runner import read_server, sidecar_env
from tests.unit.readserver._tiered import LAYOUT, Remote, data_batches, three_segments

pytestmark = pytest.mark.integration


class _Switchable:
    """The S3 store with an off switch (an outage at the ObjectStore boundary)."""

    def __init__(self, inner: S3ObjectStore) -> None:
        self.inner = inner
        self.down = False

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        if self.down:
            raise StorageError(f"get {key}: connection refused")
        return await self.inner.get(key, max_bytes=max_bytes)

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: Any = None
    ) -> bytes:
        if self.down:
            raise StorageError(f"get_range {key}: connection refused")
        return await self.inner.get_range(key, start, end_inclusive, arrivals=arrivals)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.asynccontextmanager
async def _serving(
    remote: Remote, objects: Any, tmp_path: Path, metrics: Metrics, *, cache_bytes: int = 8 << 20
) -> AsyncIterator[tuple[Path, ChunkCache]]:
    """The read server on a Unix socket: its path, and its chunk cache (whose ``idle`` a test
    awaits before it counts GETs: a byte range is answered before its GET has ended)."""
    chunks = ChunkCache(
        objects=objects,
        directory=tmp_path / "cache",
        max_bytes=cache_bytes,
        chunk_size=64 * 1024,
        readahead_chunks=2,
        fetch_timeout_s=30.0,
        metrics=metrics,
    )
    service = ReadService(store=remote.store, objects=objects, layout=LAYOUT, chunks=chunks)
    server = ReadServer(service=service, socket_path=tmp_path / "s3.sock", metrics=metrics)
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    await server.started.wait()
    try:
        yield tmp_path / "s3.sock", chunks
    finally:
        stopping.set()
        await task


@contextlib.asynccontextmanager
async def _tiered(s3: Any, tmp_path: Path) -> AsyncIterator[tuple[S3ObjectStore, Remote]]:
    """A metadata store and SeaweedFS for ``Remote`` to tier into; what was tiered is deleted
    from the bucket afterwards."""
    store = RemoteSegmentStore(tmp_path / "state")
    async with S3ObjectStore(
        bucket=s3.bucket,
        endpoint_url=s3.endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
    ) as objects:
        try:
            yield objects, Remote(store, objects, tmp_path / "segments")  # type: ignore[arg-type]
        finally:
            keys = [o.key async for o in objects.list(LAYOUT.prefix)]
            if keys:
                await objects.delete(keys)
            store.close()


async def test_every_offset_range_and_index_through_seaweedfs(s3, tmp_path):
    """Records from every offset, whole segments and indexes match; warm reads GET nothing."""
    async with _tiered(s3, tmp_path) as (objects, remote):
        expected = await three_segments(remote)
        metrics = Metrics()
        async with (
            _serving(remote, objects, tmp_path, metrics) as (socket_path, chunks),
            ReadClient(socket_path=socket_path) as client,
        ):
            for offset in range(0, expected[-1].offset + 1, 7):
                page = await client.records_json("orders", 0, offset, max_records=5)
                want = [r for r in expected if r.offset >= offset][:5]
                assert page.records == want
            got = [r async for r in client.iter_records("orders", 0, 0, max_bytes=20_000)]
            assert got == expected
            for segment in remote.segments:
                sid = encode_kafka_uuid(segment.segment_id.id)
                log = await client.segment_log("orders", 0, sid)
                assert log == remote.logs[segment.segment_id.id]
                assert await client.segment_log("orders", 0, sid, start=5, end=5) == log[5:6]
                offsets = await client.index("orders", 0, sid, "offset")
                assert len(offsets) % 8 == 0
            await chunks.idle()
            gets = metrics.read_fetch_bytes._value.get()
            assert [r async for r in client.iter_records("orders", 0, 0)] == expected
            assert metrics.read_fetch_bytes._value.get() == gets  # all from the disk cache


async def test_a_cold_index_read_gets_the_indexes_beside_the_manifest(s3, tmp_path):
    """On SeaweedFS: a segment's first index read GETs its indexes object's first chunk
    beside the manifest, before the object's size is known (the range ends past the object,
    and the store ends it there); each index comes back byte-exact, from that one GET."""
    async with _tiered(s3, tmp_path) as (objects, remote):
        await three_segments(remote)
        metrics = Metrics()
        async with ChunkCache(
            objects=objects,
            directory=tmp_path / "cache",
            max_bytes=16 * 1024 * 1024,
            chunk_size=1024 * 1024,  # larger than every indexes object here
            readahead_chunks=2,
            fetch_timeout_s=30.0,
            metrics=metrics,
        ) as chunks:
            service = ReadService(store=remote.store, objects=objects, layout=LAYOUT, chunks=chunks)
            try:
                for segment in remote.segments:
                    directory = remote.files / str(segment.segment_id.id)
                    for kind, file in (
                        (IndexKind.OFFSET_INDEX, FileKind.INDEX),
                        (IndexKind.TIME_INDEX, FileKind.TIMEINDEX),
                    ):
                        want = (
                            directory / segment_file_name(segment.start_offset, file)
                        ).read_bytes()
                        assert await service.index_bytes(segment, kind) == want
                await chunks.idle()  # an index is answered before its GET has ended
            finally:
                await service.aclose()
        fetches = {
            (s.labels["kind"], s.labels["outcome"]): s.value
            for s in metrics.read_fetches.collect()[0].samples
            if s.name.endswith("_total") and s.value
        }
        assert fetches == {("prefetch", "ok"): len(remote.segments)}


async def test_an_s3_outage_serves_the_cache_and_503s_the_rest(s3, tmp_path):
    """With S3 down, what is cached is still served; anything else is 503 storage_unavailable,
    and reads work again when S3 is back."""
    async with _tiered(s3, tmp_path) as (real, remote):
        objects = _Switchable(real)
        expected = await three_segments(remote)
        async with (
            _serving(remote, objects, tmp_path, Metrics()) as (socket_path, _),
            ReadClient(socket_path=socket_path) as client,
        ):
            first = await client.records_json("orders", 0, 0, max_records=10)
            objects.down = True
            assert await client.records_json("orders", 0, 0, max_records=10) == first
            # the read ahead may have fetched the next segments' first chunks, but not
            # the last segment's manifest and indexes
            last = remote.segments[-1]
            with pytest.raises(StorageUnavailableError):
                await client.index("orders", 0, encode_kafka_uuid(last.segment_id.id), "timestamp")
            objects.down = False
            got = [r async for r in client.iter_records("orders", 0, 0)]
            assert got == expected


async def test_a_cache_smaller_than_the_data_serves_every_byte(s3, tmp_path, monkeypatch):
    """Reads of more than the cache holds: the chunks written while it fills go with O_DIRECT,
    those written once it evicts go through the page cache; every byte read, twice, equals
    what was tiered, and the disk never holds more than the budget."""
    modes: list[bool] = []  # the write mode of each chunk kept, in the order they were kept
    real_store = ChunkCache._store

    def store_chunk(
        self: ChunkCache,
        file: str,
        names: list[str],
        chunks: list[bytes | memoryview],
        data: bytes | memoryview,
        tag: int,
        direct: bool,
    ) -> Any:
        modes.append(direct)
        return real_store(self, file, names, chunks, data, tag, direct)

    monkeypatch.setattr(ChunkCache, "_store", store_chunk)
    budget = 4 * 64 * 1024  # four chunks
    async with _tiered(s3, tmp_path) as (objects, remote):
        offset = 0
        for _ in range(3):  # three segments of about 300 KiB
            segment = await remote.upload(offset, data_batches(offset, 200))
            offset = segment.end_offset + 1
        metrics = Metrics()
        async with (
            _serving(remote, objects, tmp_path, metrics, cache_bytes=budget) as (socket_path, _),
            ReadClient(socket_path=socket_path) as client,
        ):
            for _ in range(2):
                for segment in remote.segments:
                    sid = encode_kafka_uuid(segment.segment_id.id)
                    log = await client.segment_log("orders", 0, sid)
                    assert log == remote.logs[segment.segment_id.id]
                    cached = sum(
                        p.stat().st_size
                        for p in (tmp_path / "cache").rglob("*.chunk")
                        if p.is_file()
                    )
                    assert cached <= budget
        assert metrics.read_cache_evictions._value.get() > 0
        assert modes[:4] == [True] * 4  # filling: four chunks fit the budget
        assert False in modes  # at the budget


def _bytes_of(path: Path) -> bytes | None:
    """A file's bytes, None when it is gone."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


async def test_a_second_process_on_the_cache_dir_exits_and_the_first_keeps_serving(
    s3: Any, tmp_path: Path
) -> None:
    """Two read server processes given the same cache_dir: the second, with a budget below
    what the first has cached, stops at start with exit code 2 and a message naming the
    directory, before it lists, evicts or removes anything there; the first keeps serving,
    and every chunk file it had written is still there, byte for byte."""
    async with _tiered(s3, tmp_path) as (_, remote):
        offset = 0
        for _ in range(3):  # three segments of about 600 KiB: more than the second's budget
            segment = await remote.upload(offset, data_batches(offset, 400))
            offset = segment.end_offset + 1
        config = tmp_path / "read.toml"
        config.write_text(
            f'state_dir = "{tmp_path / "state"}"\n'
            f'[s3]\nendpoint_url = "{s3.endpoint}"\nbucket = "{s3.bucket}"\n'
            f'prefix = "{LAYOUT.prefix}"\n'
            f"[read_server]\nchunk_size_bytes = {64 * 1024}\n"
        )
        env = sidecar_env(s3)  # the credentials; JSON logs
        cache = tmp_path / "cache-first"  # where read_server() puts the first one's cache
        async with read_server(tmp_path, config, env, "first") as (socket_path, _):
            async with ReadClient(socket_path=socket_path) as client:
                for segment in remote.segments:
                    sid = encode_kafka_uuid(segment.segment_id.id)
                    assert (
                        await client.segment_log("orders", 0, sid)
                        == remote.logs[segment.segment_id.id]
                    )
            # the chunks are written behind the reads; a file has its final name once whole
            logs = sum(len(log) for log in remote.logs.values())
            assert logs > 1024 * 1024  # the second one's budget
            await asyncio.to_thread(
                wait_for,
                lambda: sum(p.stat().st_size for p in cache.rglob("*.chunk")) >= logs,
                timeout=60,
                what="the first server's chunk files",
            )
            written = {p: p.read_bytes() for p in cache.rglob("*.chunk")}

            second = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sidecar.readserver",
                "--config",
                str(config),
                "--set",
                f"read_server.socket_path={tmp_path / 'second.sock'}",
                "--set",
                f"read_server.cache_dir={cache}",
                "--set",
                f"read_server.cache_size_bytes={1024 * 1024}",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            assert second.stderr is not None
            lines: list[bytes] = []
            try:
                # its log and error go to stderr: read until it ends, or until it listens
                while line := await asyncio.wait_for(second.stderr.readline(), 60):
                    lines.append(line)
                    assert b"read_server_listening" not in line, "the second server started"
                code = await asyncio.wait_for(second.wait(), 60)
            finally:
                if second.returncode is None:
                    second.kill()
                    await second.wait()
            stderr = b"".join(lines).decode()
            assert code == 2, stderr
            assert f"sidecar.readserver: error: read_server.cache_dir {cache}:" in stderr
            assert "another process" in stderr

            changed = [p.name for p, data in written.items() if _bytes_of(p) != data]
            assert changed == [], "chunk files of the first server removed or changed"
            async with ReadClient(socket_path=socket_path) as client:
                for segment in remote.segments:
                    sid = encode_kafka_uuid(segment.segment_id.id)
                    assert (
                        await client.segment_log("orders", 0, sid)
                        == remote.logs[segment.segment_id.id]
                    )
