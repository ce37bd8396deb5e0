"""A GET's body read into one pooled buffer: the bytes, the fallbacks, the errors, and a
buffer reused only once no view of it is alive."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiobotocore.response import AioReadTimeoutError
from botocore.exceptions import ResponseStreamingError

from sidecar.storage._body import POOLED_MIN_BYTES, BufferPool, read_body

MiB = 1 << 20


class _Body:
    """What aiobotocore's StreamingBody offers: ``raw_stream.content`` and ``read()``."""

    def __init__(self, content: Any) -> None:
        self.raw_stream = mock.Mock(content=content, url="http://s3.test/b/k")
        self.read_calls = 0

    async def read(self) -> bytes:
        self.read_calls += 1
        return b"whole"


def _stream(pieces: list[bytes], *, eof: bool = True) -> aiohttp.StreamReader:
    protocol = mock.Mock(_reading_paused=False)
    reader = aiohttp.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    for piece in pieces:
        reader.feed_data(piece)
    if eof:
        reader.feed_eof()
    return reader


async def test_pieces_land_in_one_read_only_view() -> None:
    data = os.urandom(3 * MiB + 5)
    pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    body = _Body(_stream(pieces))
    got = await read_body(body, len(data), pool=BufferPool())
    assert isinstance(got, memoryview)
    assert got.readonly
    assert got == data
    assert body.read_calls == 0  # not through aiobotocore's joining read()


async def test_a_body_shorter_than_announced_comes_back_short() -> None:
    got = await read_body(_Body(_stream([b"abc"])), 10, pool=BufferPool())
    assert bytes(got) == b"abc"  # the caller's length check refuses it


async def test_a_body_longer_than_announced_comes_back_whole() -> None:
    got = await read_body(_Body(_stream([b"abc", b"defg", b"hi"])), 5, pool=BufferPool())
    assert got == b"abcdefghi"  # the caller's length check refuses it


async def test_the_end_of_an_http_chunk_is_not_the_end_of_the_body() -> None:
    reader = _stream([], eof=False)
    reader.begin_http_chunk_receiving()
    reader.feed_data(b"abc")
    reader.end_http_chunk_receiving()
    await asyncio.sleep(0)
    assert await reader.readchunk() == (b"abc", True)
    reader.feed_data(b"def")
    reader.end_http_chunk_receiving()
    reader.feed_data(b"gh")
    reader.feed_eof()
    got = await read_body(_Body(reader), 5, pool=BufferPool())
    assert got == b"defgh"


@pytest.mark.parametrize("length", [None, "12", True, -1])
async def test_without_a_usable_length_the_body_reads_itself(length: object) -> None:
    body = _Body(_stream([b"abc"]))
    assert await read_body(body, length, pool=BufferPool()) == b"whole"
    assert body.read_calls == 1


async def test_another_http_backend_reads_itself() -> None:
    body = _Body(object())
    assert await read_body(body, 3, pool=BufferPool()) == b"whole"


async def test_a_read_timeout_is_aiobotocores() -> None:
    reader = _stream([b"abc"], eof=False)
    reader.set_exception(aiohttp.ServerTimeoutError("read timed out"))
    with pytest.raises(AioReadTimeoutError):
        await read_body(_Body(reader), 10, pool=BufferPool())


async def test_a_broken_connection_is_a_streaming_error() -> None:
    reader = _stream([b"abc"], eof=False)
    reader.set_exception(aiohttp.ServerDisconnectedError())
    with pytest.raises(ResponseStreamingError):
        await read_body(_Body(reader), 10, pool=BufferPool())


async def test_a_cut_body_is_a_payload_error() -> None:
    reader = _stream([b"abc"], eof=False)
    reader.set_exception(aiohttp.ClientPayloadError("cut"))
    with pytest.raises(aiohttp.ClientPayloadError):
        await read_body(_Body(reader), 10, pool=BufferPool())


async def test_a_buffer_is_reused_only_when_no_view_of_it_is_alive() -> None:
    pool = BufferPool()
    size = 2 * MiB
    first = os.urandom(size)
    got = await read_body(_Body(_stream([first])), size, pool=pool)
    piece = got[10:20]  # a slice outlives the view it was cut from
    del got
    second = await read_body(_Body(_stream([b"x" * size])), size, pool=pool)
    assert piece == first[10:20]  # not overwritten by the second body
    assert pool.pooled_bytes == 2 * size
    del second
    third = await read_body(_Body(_stream([b"y" * size])), size, pool=pool)
    assert piece == first[10:20]
    assert pool.pooled_bytes == 2 * size  # the second body's buffer again, no new one
    assert third == b"y" * size
    del piece, third
    pool.take(size)
    assert pool.pooled_bytes == 2 * size


def test_a_reused_buffer_is_cut_to_the_body_and_small_bodies_are_not_pooled() -> None:
    pool = BufferPool()
    big = pool.take(4 * MiB)
    identity = id(big)
    del big
    again = pool.take(3 * MiB)  # at least half the buffer's size: reused
    assert id(again) == identity
    del again
    assert len(pool.take(POOLED_MIN_BYTES - 1)) == POOLED_MIN_BYTES - 1
    assert pool.pooled_bytes == 4 * MiB
    small = pool.take(MiB + 1)  # less than half: a buffer of its own, pooled
    assert id(small) != identity
    assert len(small) == MiB + 1
    assert pool.pooled_bytes == 5 * MiB + 1


def test_the_pool_holds_at_most_max_bytes_and_frees_idle_buffers() -> None:
    now = [0.0]
    pool = BufferPool(max_bytes=4 * MiB, idle_s=10.0, clock=lambda: now[0])
    held = [pool.take(2 * MiB), pool.take(2 * MiB), pool.take(2 * MiB)]
    assert pool.pooled_bytes == 4 * MiB  # the third is its own, not pooled
    del held[0]
    now[0] = 5.0
    bigger = pool.take(3 * MiB)  # the unreferenced buffer freed to make room; still none
    assert pool.pooled_bytes == 2 * MiB
    del bigger
    held.clear()
    now[0] = 100.0
    pool._trimmed()
    assert pool.pooled_bytes == 0


async def test_idle_buffers_are_freed_by_a_timer() -> None:
    pool = BufferPool(idle_s=0.05)
    buffer = pool.take(2 * MiB)
    assert pool.pooled_bytes == 2 * MiB
    await asyncio.sleep(0.2)
    assert pool.pooled_bytes == 2 * MiB  # still referred to
    del buffer
    await asyncio.sleep(0.2)
    assert pool.pooled_bytes == 0
