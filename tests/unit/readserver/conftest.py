"""Fixtures for the read path on fake data (builders in ``_tiered``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sidecar.metadata.store import RemoteSegmentStore
from sidecar.readserver.cache import ChunkCache
from sidecar.readserver.service import ReadService
from sidecar.storage.memory import MemoryObjectStore
from tests.unit.readserver._tiered import Remote, read_service


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    """An empty tiered world: a store in tmp_path and a memory object store."""
    store = RemoteSegmentStore(tmp_path / "state")
    try:
        yield Remote(store, MemoryObjectStore(), tmp_path / "segments")
    finally:
        store.close()


@pytest.fixture
async def chunks(remote: Remote, tmp_path: Path) -> AsyncIterator[ChunkCache]:
    """A chunk cache of 64 KiB chunks over the memory store (1 MiB on disk)."""
    async with ChunkCache(
        objects=remote.objects,
        directory=tmp_path / "cache",
        max_bytes=1024 * 1024,
        chunk_size=64 * 1024,
        readahead_chunks=2,
        fetch_timeout_s=5.0,
    ) as cache:
        yield cache


@pytest.fixture
async def service(remote: Remote, chunks: ChunkCache) -> AsyncIterator[ReadService]:
    """The read engine over ``remote`` (:func:`read_service`)."""
    read = read_service(remote, chunks)
    try:
        yield read
    finally:
        await read.aclose()
