"""Part buffers: pooled, filled from the file, sent by aiohttp as slices without copies."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from aiohttp import payload

from sidecar.errors import TruncatedFileError
from sidecar.storage._crc import crc32c
from sidecar.storage._parts import BufferPool, PartBody, open_parts
from sidecar.storage._payload import SLICE_BYTES, PartBodyPayload


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
