"""Part bodies: pooled buffers filled from the file and sent as slices without copies, or parts
streamed from the file a chunk at a time and checked against their CRC-32C; part CRC-32Cs
from bytes a caller read anyway."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from pathlib import Path

import pytest
from aiohttp import payload

from sidecar.errors import TruncatedFileError
from sidecar.storage import MemoryObjectStore, _parts
from sidecar.storage._crc import crc32c
from sidecar.storage._parts import (
    CHUNK_BYTES,
    BufferPool,
    FilePartBody,
    PartBody,
    PartChangedError,
    PartChecksums,
    open_parts,
)
from sidecar.storage._payload import SLICE_BYTES, FilePartPayload, PartBodyPayload


class _Writer:
    """What aiohttp's stream writer sees: the chunks, as objects."""

    def __init__(self) -> None:
        self.chunks: list[memoryview] = []

    async def write(self, chunk: memoryview) -> None:
        self.chunks.append(chunk)


def test_pool_reuses_a_released_buffer_that_fits() -> None:
    pool = BufferPool(max_idle=2)
    first = pool.acquire(1000)
    pool.release(first)
    assert pool.acquire(900) is first  # within 2x: reused
    pool.release(first)
    assert pool.acquire(100) is not first  # far larger than asked: a new one
    assert pool.acquire(2000) is not first  # too small


def test_pool_keeps_at_most_max_idle_buffers_dropping_the_smallest() -> None:
    pool = BufferPool(max_idle=2)
    buffers = [bytearray(n) for n in (10, 30, 20)]
    for buffer in buffers:
        pool.release(buffer)
    assert pool.idle == 2
    assert pool.acquire(30) is buffers[1]
    assert pool.acquire(20) is buffers[2]
    with pytest.raises(ValueError, match="max_idle"):
        BufferPool(max_idle=-1)


def test_part_body_stream_interface_and_release() -> None:
    pool = BufferPool()
    buffer = bytearray(b"0123456789xx")
    body = PartBody(buffer, 10, pool)
    assert len(body) == 10
    assert bool(PartBody.of(b""))
    assert body.read(4) == b"0123"
    assert body.tell() == 4
    assert body.read() == b"456789"
    assert body.seek(-3, os.SEEK_END) == 7
    assert body.read(100) == b"789"
    body.seek(0)
    assert body.tobytes() == b"0123456789"
    body.release()
    body.release()  # idempotent
    assert pool.idle == 1
    with pytest.raises(ValueError, match="released"):
        _ = body.view
    assert pool.acquire(10) is buffer


async def test_reader_fills_pooled_buffers_and_checks_the_crc(tmp_path: Path) -> None:
    data = os.urandom(3 * 65536 + 17)
    path = tmp_path / "f.log"
    path.write_bytes(data)
    pool = BufferPool()
    async with open_parts(path, pool) as reader:
        body, crc = await reader.read(65536, 65536 + 17)
        assert body.tobytes() == data[65536 : 2 * 65536 + 17]
        assert crc == crc32c(data[65536 : 2 * 65536 + 17])
        buffer_id = id(body.view.obj)
        body.release()
        again, crc2 = await reader.read(0, 65536)  # same buffer, new bytes: no stale tail
        assert id(again.view.obj) == buffer_id
        assert again.tobytes() == data[:65536]
        assert crc2 == crc32c(data[:65536])
        again.release()


async def test_reader_reports_a_file_that_shrank_and_returns_the_buffer(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"x" * 1000)
    pool = BufferPool()
    async with open_parts(path, pool) as reader:
        os.truncate(path, 500)
        with pytest.raises(TruncatedFileError, match="shrank to 500"):
            await reader.read(0, 1000)
    assert pool.idle == 1  # not leaked


async def test_a_read_cancelled_in_its_thread_returns_the_buffer_once_the_thread_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop cancels a read while its worker thread still reads into the buffer: the read
    raises CancelledError at once, and the buffer goes back to the pool only when the thread
    has let go of it (never while it may still be written)."""
    path = tmp_path / "f.log"
    path.write_bytes(b"x" * 1000)
    pool = BufferPool()
    released = asyncio.Event()
    give_back = pool.release

    def releasing(buffer: bytearray) -> None:
        give_back(buffer)
        released.set()

    monkeypatch.setattr(pool, "release", releasing)
    inside, go_on = threading.Event(), threading.Event()
    async with open_parts(path, pool) as reader:
        fill = reader._fill

        def slow_fill(view: memoryview, offset: int) -> int:
            with view[:10]:  # the thread holds a view of the buffer, as a pread into it does
                inside.set()
                go_on.wait(10)
            return fill(view, offset)

        monkeypatch.setattr(reader, "_fill", slow_fill)
        read = asyncio.create_task(reader.read(0, 1000))
        assert await asyncio.to_thread(inside.wait, 10)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert pool.idle == 0  # still the thread's
        go_on.set()
        await asyncio.wait_for(released.wait(), 10)
    assert pool.idle == 1


async def test_aiohttp_sends_a_part_body_as_slices_of_its_buffer() -> None:
    data = os.urandom(2 * SLICE_BYTES + 5)
    body = PartBody.of(data)
    sent = payload.PAYLOAD_REGISTRY.get(body)
    assert isinstance(sent, PartBodyPayload)
    assert sent.size == len(data)
    writer = _Writer()
    await sent.write(writer)  # type: ignore[arg-type]
    assert [len(c) for c in writer.chunks] == [SLICE_BYTES, SLICE_BYTES, 5]
    assert all(c.obj is body.view.obj for c in writer.chunks)  # views, not copies
    assert b"".join(writer.chunks) == data
    again = _Writer()  # a retry sends the whole body again
    await sent.write_with_length(again, 10)  # type: ignore[arg-type]
    assert b"".join(again.chunks) == data[:10]
    assert await sent.as_bytes() == data


def test_pool_drops_buffers_idle_for_longer_than_idle_s() -> None:
    pool = BufferPool(max_idle=4, idle_s=30.0)
    old, new = bytearray(10), bytearray(10)
    pool.release(old)
    pool.release(new)
    released = pool._released_at[id(old)]
    pool._released_at[id(old)] = released - 31.0
    pool.trim(now=released + 1.0)
    assert pool.idle == 1
    assert pool.acquire(10) is new


async def test_pool_trims_itself_on_the_running_loop() -> None:
    pool = BufferPool(max_idle=4, idle_s=0.05)
    pool.release(bytearray(10))
    assert pool.idle == 1
    timer = pool._trim_timer
    assert timer is not None
    await asyncio.sleep(timer.when() - asyncio.get_running_loop().time() + 0.01)
    assert pool.idle == 0
    assert pool._trim_timer is None


class TestPartChecksums:
    def test_overlapping_windows_give_each_parts_crc(self) -> None:
        """Pieces fed in file order, overlapping what came before (a batch walk re-reads a
        header that straddles its window), give the CRC-32C of every part, once each."""
        data = os.urandom(12 * 1024 + 5)
        sums = PartChecksums(len(data), part_size=5 * 1024)
        sums.feed(0, data[:3000])
        sums.feed(2900, data[2900:9000])  # overlaps 100 bytes
        assert sums.result() is None  # not every byte yet
        sums.feed(9000, data[9000:])
        assert sums.result() == (
            crc32c(data[:5120]),
            crc32c(data[5120:10240]),
            crc32c(data[10240:]),
        )

    def test_a_file_up_to_one_part_is_one_crc_and_an_empty_file_none(self) -> None:
        data = os.urandom(1000)
        sums = PartChecksums(len(data), part_size=5 * 1024)
        sums.feed(0, data)
        assert sums.result() == (crc32c(data),)
        assert PartChecksums(0, part_size=5 * 1024).result() == ()

    def test_a_gap_gives_no_crcs(self) -> None:
        data = os.urandom(4000)
        sums = PartChecksums(len(data), part_size=1024)
        sums.feed(0, data[:1000])
        sums.feed(1500, data[1500:])  # bytes 1000-1499 never seen
        assert sums.result() is None


async def _streamed(body: FilePartBody, limit: int | None = None) -> list[bytes]:
    chunks: list[bytes] = []

    async def write(chunk: bytes) -> None:
        chunks.append(chunk)

    await body.send(write, limit)
    return chunks


class TestFilePartBody:
    async def test_streams_the_part_a_chunk_at_a_time_and_again_on_retry(
        self, tmp_path: Path
    ) -> None:
        """No buffer the size of a part: CHUNK_BYTES-sized ``bytes`` read from the file, the
        whole part again on every send; its checksum pass reads the same bytes."""
        data = os.urandom(3 * CHUNK_BYTES + 300)
        path = tmp_path / "f.log"
        path.write_bytes(data)
        offset, length = 100, 2 * CHUNK_BYTES + 7
        part = data[offset : offset + length]
        async with open_parts(path) as reader:
            crc = await reader.checksum(offset, length)
            assert crc == crc32c(part)
            body = FilePartBody(reader, offset, length, crc)
            sent = payload.PAYLOAD_REGISTRY.get(body)
            assert isinstance(sent, FilePartPayload)
            assert sent.size == length
            first = await _streamed(body)
            assert [len(c) for c in first] == [CHUNK_BYTES, CHUNK_BYTES, 7]
            assert b"".join(first) == part
            assert b"".join(await _streamed(body)) == part  # a retry
            assert b"".join(await _streamed(body, 10)) == part[:10]
            assert await sent.as_bytes() == part

    async def test_changed_bytes_fail_before_the_last_chunk_is_sent(self, tmp_path: Path) -> None:
        """Bytes that no longer match the CRC-32C sent ahead of them are never all sent: the
        server gets an incomplete body and stores nothing; the error is kept for the caller."""
        data = os.urandom(2 * CHUNK_BYTES)
        path = tmp_path / "f.log"
        path.write_bytes(data)
        async with open_parts(path) as reader:
            body = FilePartBody(reader, 0, len(data), crc32c(data))
            with path.open("r+b") as out:
                out.seek(len(data) - 1)
                out.write(bytes([data[-1] ^ 1]))
            chunks: list[bytes] = []

            async def write(chunk: bytes) -> None:
                chunks.append(chunk)

            with pytest.raises(PartChangedError, match="changed since"):
                await body.send(write, None)
            assert [len(c) for c in chunks] == [CHUNK_BYTES]  # the last chunk held back
            assert isinstance(body.failure, PartChangedError)
            assert not PartChangedError.retriable

    async def test_a_file_that_shrank_is_a_truncated_file_error(self, tmp_path: Path) -> None:
        path = tmp_path / "f.log"
        path.write_bytes(b"x" * 3000)
        async with open_parts(path) as reader:
            body = FilePartBody(reader, 0, 3000, crc32c(b"x" * 3000))
            os.truncate(path, 1000)
            with pytest.raises(TruncatedFileError, match="shrank to 1000"):
                await _streamed(body)
            assert isinstance(body.failure, TruncatedFileError)
            with pytest.raises(TruncatedFileError, match="shrank to 1000"):
                await reader.checksum(0, 3000)


async def test_memory_store_checks_announced_part_crcs(tmp_path: Path) -> None:
    """Part CRC-32Cs a caller computed are checked against the bytes, as a store checks the
    checksum headers it gets; CRCs for another part plan are ignored."""
    data = os.urandom(11 * 1024 * 1024)
    path = tmp_path / "f.log"
    path.write_bytes(data)
    store = MemoryObjectStore()
    size = 5 * 1024 * 1024
    right = (crc32c(data[:size]), crc32c(data[size : 2 * size]), crc32c(data[2 * size :]))
    info = await store.put_file("a", path, part_size=size, part_crcs=right)
    assert info.crc32c == crc32c(data)
    with pytest.raises(PartChangedError, match="part 2"):
        await store.put_file("b", path, part_size=size, part_crcs=(right[0], 0, right[2]))
    assert "b" not in store.objects
    await store.put_file("c", path, part_size=size, part_crcs=(1, 2))  # another plan: ignored
    assert await store.get("c") == data


class TestSegmentReadThreads:
    """Part reads of a segment file take seconds on a slow disk; they run in threads of their
    own, so the default executor (the metadata store's queries, the metadata tailer, the
    log-dir scans, /metrics) is never waiting behind them."""

    @pytest.mark.parametrize("way", ["read", "checksum", "send"])
    async def test_a_part_read_that_hangs_leaves_the_default_executor_free(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: str
    ) -> None:
        """With a read stuck in its thread, other work still gets a default executor thread
        (the only one here): it is what lets the stuck read go on."""
        loop = asyncio.get_running_loop()
        default = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(default)
        data = os.urandom(3 * CHUNK_BYTES // 2)
        path = tmp_path / "f.log"
        path.write_bytes(data)
        started = asyncio.Event()
        released = threading.Event()
        seen: list[bool] = []
        read_into = _parts._read_into
        pread = os.pread

        def hang() -> None:
            if not seen:  # the first read only
                loop.call_soon_threadsafe(started.set)
                seen.append(released.wait(timeout=10))

        def slow_read_into(fd: int, target: memoryview, offset: int) -> int:
            hang()
            return read_into(fd, target, offset)

        def slow_pread(fd: int, length: int, offset: int) -> bytes:
            hang()
            return pread(fd, length, offset)

        monkeypatch.setattr(_parts, "_read_into", slow_read_into)
        monkeypatch.setattr(_parts.os, "pread", slow_pread)
        sent: list[bytes] = []

        async def write(chunk: bytes) -> None:
            sent.append(bytes(chunk))

        async with open_parts(path) as reader:
            if way == "read":
                work = reader.read(0, len(data))
            elif way == "checksum":
                work = reader.checksum(0, len(data))
            else:
                work = FilePartBody(reader, 0, len(data), crc32c(data)).send(write, None)
            task = asyncio.ensure_future(work)
            await started.wait()
            await asyncio.to_thread(released.set)
            result = await task
        default.shutdown()
        assert seen == [True]
        if way == "read":
            body, crc = result
            assert (body.tobytes(), crc) == (data, crc32c(data))
            body.release()
        elif way == "checksum":
            assert result == crc32c(data)
        else:
            assert b"".join(sent) == data
