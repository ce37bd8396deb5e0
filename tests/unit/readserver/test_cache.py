"""The read path's caches on fake data: the disk chunk cache (LRU within a byte budget, single
flight, failures never cached, read-ahead, deadlines, restart) and the memory cache."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sidecar.errors import CacheDirInUseError, KeyNotFoundError, StorageError
from sidecar.observability.metrics import Metrics
from sidecar.readserver import cache as cache_module
from sidecar.readserver.cache import ChunkCache, ChunkFile, MemoryCache, ObjectRef
from sidecar.readserver.errors import RemoteDataError, StorageTimeoutError
from sidecar.storage.memory import MemoryObjectStore

CHUNK = 1024


def _files(directory: Path) -> list[Path]:
    """The cache's chunk files (and ``.tmp`` files), not its lock file."""
    return sorted(p for p in directory.glob("*/*") if p.is_file())


def _disk_bytes(directory: Path) -> int:
    total = 0
    for path in _files(directory):
        with contextlib.suppress(FileNotFoundError):  # a .tmp renamed meanwhile
            total += path.stat().st_size
    return total


async def _store(**objects: bytes) -> MemoryObjectStore:
    store = MemoryObjectStore()
    for key, body in objects.items():
        await store.put(key, body)
    return store


def _cache(store: MemoryObjectStore, directory: Path, **kwargs: object) -> ChunkCache:
    options: dict[str, object] = {
        "objects": store,
        "directory": directory,
        "max_bytes": 4 * CHUNK,
        "chunk_size": CHUNK,
        "readahead_chunks": 0,
        "fetch_timeout_s": 5.0,
    }
    options.update(kwargs)
    return ChunkCache(**options)  # type: ignore[arg-type]


class _Gate:
    """An object store whose get_range waits until released (no sleeps: an Event)."""

    def __init__(self, inner: MemoryObjectStore) -> None:
        self.inner = inner
        self.release = asyncio.Event()
        self.entered = 0
        self.waiting = asyncio.Event()

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: object = None
    ) -> bytes:
        self.entered += 1
        self.waiting.set()
        await self.release.wait()
        return await self.inner.get_range(key, start, end_inclusive)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class _Trickle:
    """An object store whose ranged GETs deliver their bytes in ``steps`` pieces, one each
    time the test calls :meth:`deliver`, telling ``arrivals`` of them as a streaming backend
    does. ``cut`` lists the attempts to cut after that many pieces and make again (the
    backend's own retry: a new body); ``fail_after`` fails the GET after that many pieces."""

    def __init__(self, inner: MemoryObjectStore, *, steps: int = 4) -> None:
        self.inner = inner
        self.steps = steps
        self.cut: list[int] = []
        self.fail_after: int | None = None
        self.gets = 0
        self._allowed = asyncio.Semaphore(0)
        self._delivered = asyncio.Event()

    async def deliver(self, pieces: int = 1) -> None:
        """Let ``pieces`` pieces through, and wait until each is told of."""
        for _ in range(pieces):
            self._delivered.clear()
            self._allowed.release()
            await self._delivered.wait()

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: object = None
    ) -> bytes:
        data = await self.inner.get_range(key, start, end_inclusive)
        self.gets += 1
        piece = -(-len(data) // self.steps)
        while True:
            body = bytearray(len(data))
            if arrivals is not None:
                arrivals.receiving(memoryview(body).toreadonly())  # type: ignore[attr-defined]
            cut = self.cut.pop(0) if self.cut else None
            for number, at in enumerate(range(0, len(data), piece)):
                if number == cut:
                    break
                if number == self.fail_after:
                    raise StorageError("the connection broke mid-body")
                await self._allowed.acquire()
                body[at : at + piece] = data[at : at + piece]
                if arrivals is not None:
                    arrivals.arrived(min(at + piece, len(data)))  # type: ignore[attr-defined]
                self._delivered.set()
            else:
                return bytes(body)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class TestChunkCacheReads:
    """Reads return the object's bytes, from S3 once and then from disk."""

    async def test_read_returns_the_bytes_and_caches_them(self, tmp_path):
        """A read inside one chunk returns those bytes; the second read is a disk hit."""
        body = os.urandom(3 * CHUNK + 100)
        store = await _store(obj=body)
        metrics = Metrics()
        async with _cache(store, tmp_path, metrics=metrics) as cache:
            obj = ObjectRef("obj", len(body))
            assert body[10:500] == await cache.read(obj, 10, 490)
            assert body[100:200] == await cache.read(obj, 100, 100)
            assert body[3 * CHUNK : 3 * CHUNK + 100] == await cache.read(obj, 3 * CHUNK, 100)
            await cache.idle()
            assert store.calls["get_range"] == 2
            assert cache.cached_chunks == 2
            assert cache.cached_bytes == CHUNK + 100
        lookups = {
            s.labels["result"]: s.value
            for s in metrics.read_cache_lookups.collect()[0].samples
            if s.name.endswith("_total")
        }
        assert {k: v for k, v in lookups.items() if v} == {"hit": 1.0, "miss": 2.0}

    async def test_a_first_chunk_fetched_before_its_size_is_known(self, tmp_path):
        """``fetch_first`` GETs an object's first chunk by key alone (the store ends the range
        at the object's end); a read naming the object with its size then uses it, with no
        second GET, and a second ``fetch_first`` does nothing. A read whose size says more
        than the chunk holds is RemoteDataError, and the chunk is not served again."""
        body = os.urandom(CHUNK // 2)
        store = await _store(small=body, other=os.urandom(CHUNK // 4))
        async with _cache(store, tmp_path, max_bytes=8 * CHUNK) as cache:
            cache.fetch_first("small")
            cache.fetch_first("small")  # in flight: no second GET
            assert body[10:20] == await cache.read(ObjectRef("small", len(body)), 10, 10)
            cache.fetch_first("small")  # cached: nothing
            await cache.idle()
            assert store.calls["get_range"] == 1
            cache.fetch_first("other")
            with pytest.raises(RemoteDataError, match="shorter"):
                await cache.read(ObjectRef("other", CHUNK // 2), CHUNK // 4, 10)
            with pytest.raises(RemoteDataError, match="shorter"):
                await cache.read(ObjectRef("other", CHUNK // 2), CHUNK // 4, 10)
            assert store.calls["get_range"] == 3  # each read after the first asked again

    async def test_a_range_across_chunks_is_refused(self, tmp_path):
        """A range that crosses a chunk boundary is the caller's bug: ValueError."""
        store = await _store(obj=bytes(3 * CHUNK))
        async with _cache(store, tmp_path) as cache:
            with pytest.raises(ValueError, match="one chunk"):
                await cache.read(ObjectRef("obj", 3 * CHUNK), CHUNK - 10, 20)

    async def test_short_object_is_remote_data_error(self, tmp_path):
        """An object shorter than its metadata says is never cached as if it were whole."""
        store = await _store(obj=bytes(CHUNK + 10))
        async with _cache(store, tmp_path) as cache:
            with pytest.raises(RemoteDataError, match="shorter"):
                await cache.read(ObjectRef("obj", 2 * CHUNK), CHUNK, 100)
            await cache.idle()
            assert cache.cached_chunks == 0

    async def test_vanished_file_is_fetched_again(self, tmp_path):
        """A chunk file removed behind the cache's back is fetched from S3 again."""
        body = os.urandom(CHUNK)
        store = await _store(obj=body)
        async with _cache(store, tmp_path, memory_chunks=0) as cache:
            obj = ObjectRef("obj", CHUNK)
            await cache.read(obj, 0, 10)
            await cache.idle()
            for path in _files(tmp_path):
                path.unlink()
            assert body[5:50] == await cache.read(obj, 5, 45)
            assert store.calls["get_range"] == 2


class TestChunkCacheEarlyReads:
    """A read with ``early`` takes a chunk's bytes from its GET as they arrive; the GET's
    end, success or failure, still decides what is cached and what later readers get."""

    async def test_an_early_read_has_its_bytes_before_the_get_ends(self, tmp_path):
        """An early reader of a chunk's first bytes has them after the first piece, while a
        plain reader of the same bytes waits for the whole GET; one GET serves both."""
        body = os.urandom(CHUNK)
        trickle = _Trickle(await _store(obj=body))
        metrics = Metrics()
        async with _cache(trickle, tmp_path, metrics=metrics) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", CHUNK)
            plain = asyncio.create_task(cache.read(obj, 10, 100))
            early = asyncio.create_task(cache.read(obj, 10, 100, early=True))
            await trickle.deliver(1)
            assert body[10:110] == await early
            assert not plain.done()
            assert metrics.read_early_bytes._value.get() == 100
            await trickle.deliver(3)
            assert body[10:110] == await plain
            assert body[500:600] == await cache.read(obj, 500, 100, early=True)  # cached now
            assert trickle.gets == 1
            assert metrics.read_early_bytes._value.get() == 100

    async def test_an_early_read_waits_for_its_own_bytes_and_gets_the_gets_failure(self, tmp_path):
        """An early reader of bytes past those in waits for them; a GET that fails before
        they come fails that reader (a reader that gave up meanwhile is no matter), caches
        nothing, and the next read fetches again."""
        body = os.urandom(CHUNK)
        trickle = _Trickle(await _store(obj=body))
        trickle.fail_after = 2
        async with _cache(trickle, tmp_path) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", CHUNK)
            far = asyncio.create_task(cache.read(obj, 900, 100, early=True))
            quitter = asyncio.create_task(cache.read(obj, 800, 100, early=True))
            near = asyncio.create_task(cache.read(obj, 0, 100, early=True))
            await trickle.deliver(1)
            assert body[:100] == await near
            quitter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await quitter
            assert not far.done()
            await trickle.deliver(1)
            with pytest.raises(StorageError, match="mid-body"):
                await far
            assert not cache.is_cached(obj, 0)
            trickle.fail_after = None
            again = asyncio.create_task(cache.read(obj, 900, 100, early=True))
            await trickle.deliver(4)
            assert body[900:1000] == await again
            assert trickle.gets == 2

    async def test_a_get_made_again_serves_early_readers_from_its_new_body(self, tmp_path):
        """The backend makes the GET again after a cut (a new body): bytes taken from the first
        attempt stay right, and readers of later bytes get them from the second."""
        body = os.urandom(CHUNK)
        trickle = _Trickle(await _store(obj=body))
        trickle.cut = [1]
        async with _cache(trickle, tmp_path) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", CHUNK)
            first = asyncio.create_task(cache.read(obj, 0, 200, early=True))
            later = asyncio.create_task(cache.read(obj, 300, 200, early=True))
            await trickle.deliver(1)  # the first attempt's only piece
            taken = await first
            await trickle.deliver(1)  # the second attempt's first piece: not yet byte 300
            assert not later.done()
            await trickle.deliver(1)
            assert body[300:500] == await later
            await trickle.deliver(2)
            await cache.idle()
            assert body[:200] == taken
            assert cache.is_cached(obj, 0)

    async def test_an_early_read_of_a_chunk_in_a_group_get(self, tmp_path):
        """A chunk that a group GET fetches with others is read early at its place in that
        GET's body, once the bytes before it and its own are in."""
        body = os.urandom(4 * CHUNK)
        trickle = _Trickle(await _store(obj=body), steps=4)
        async with _cache(
            trickle,  # type: ignore[arg-type]
            tmp_path,
            max_bytes=8 * CHUNK,
            readahead_chunks=1,
            group_chunks=4,
        ) as cache:
            obj = ObjectRef("obj", len(body))
            cache.prefetch(obj, 0, 4)
            read = asyncio.create_task(
                cache.read(obj, 2 * CHUNK + 10, 50, readahead=False, early=True)
            )
            await trickle.deliver(2)
            assert not read.done()
            await trickle.deliver(1)
            assert body[2 * CHUNK + 10 : 2 * CHUNK + 60] == await read
            await trickle.deliver(1)
            await cache.idle()
            assert trickle.gets == 1
            assert cache.cached_chunks == 4


class TestChunkCacheEviction:
    """The disk holds at most max_bytes; the least recently used chunk goes first."""

    async def test_lru_chunk_is_evicted_within_the_byte_budget(self, tmp_path):
        """Reading a fifth chunk into a four-chunk budget evicts the least recently used."""
        body = os.urandom(6 * CHUNK)
        store = await _store(obj=body)
        metrics = Metrics()
        async with _cache(store, tmp_path, metrics=metrics) as cache:
            obj = ObjectRef("obj", len(body))
            for index in range(4):
                await cache.read(obj, index * CHUNK, 1)
            await cache.idle()
            await cache.read(obj, 0, 1)  # chunk 0 is now the most recently used
            await cache.read(obj, 4 * CHUNK, 1)
            await cache.idle()
            assert [cache.is_cached(obj, i) for i in range(5)] == [True, False, True, True, True]
            assert 4 * CHUNK == cache.cached_bytes == _disk_bytes(tmp_path)
            assert metrics.read_cache_evictions._value.get() == 1.0
            # the evicted chunk is fetched again, and still correct
            assert body[CHUNK : CHUNK + 7] == await cache.read(obj, CHUNK, 7)
            assert store.calls["get_range"] == 6

    async def test_disk_never_exceeds_the_budget(self, tmp_path):
        """Many reads of many objects never leave more than max_bytes on disk, and the bytes the
        cache counts are the bytes on disk once the writes ended."""
        objects = {f"o{i}": os.urandom(3 * CHUNK) for i in range(5)}
        store = await _store(**objects)
        async with _cache(store, tmp_path, max_bytes=5 * CHUNK) as cache:
            for key, body in objects.items():
                for index in range(3):
                    obj = ObjectRef(key, len(body))
                    assert body[index * CHUNK] == (await cache.read(obj, index * CHUNK, 1))[0]
                    assert _disk_bytes(tmp_path) <= 5 * CHUNK
            # a chunk evicted while its write is in flight counts until the write ends, so how
            # full the cache ends up depends on the disk's speed; the accounting must not
            await cache.idle()
            assert cache.cached_bytes == _disk_bytes(tmp_path) <= 5 * CHUNK
            assert cache.cached_bytes == cache.cached_chunks * CHUNK > 0

    async def test_reopen_keeps_chunks_and_drops_partial_files(self, tmp_path):
        """A reopened cache serves the chunks on disk, removes .tmp leftovers and evicts down to
        a smaller budget."""
        body = os.urandom(4 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        async with _cache(store, tmp_path) as cache:
            for index in range(4):
                await cache.read(obj, index * CHUNK, 1)
        leftover = _files(tmp_path)[0].with_name("junk.chunk.tmp")
        leftover.write_bytes(b"partial")
        async with _cache(store, tmp_path, max_bytes=2 * CHUNK) as cache:
            assert not leftover.exists()
            assert cache.cached_chunks == 2
            assert _disk_bytes(tmp_path) == 2 * CHUNK
            cached = [i for i in range(4) if cache.is_cached(obj, i)]
            for index in cached:
                assert body[index * CHUNK : index * CHUNK + 9] == await cache.read(
                    obj, index * CHUNK, 9
                )
        assert store.calls["get_range"] == 4

    async def test_a_second_cache_in_the_same_directory_is_refused(self, tmp_path):
        """While a cache is open, another one (another process's, or this process's) cannot
        open its directory: it would evict the first one's files down to its own budget and
        remove its writes in flight. Once the first closes, the directory can be opened."""
        body = os.urandom(4 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        async with _cache(store, tmp_path) as first:
            for index in range(4):
                await first.read(obj, index * CHUNK, 1)
            await first.idle()
            on_disk = _files(tmp_path)
            second = _cache(store, tmp_path, max_bytes=CHUNK)
            with pytest.raises(CacheDirInUseError, match="another process"):
                await second.open()
            await second.aclose()
            assert _files(tmp_path) == on_disk
            assert body[CHUNK : CHUNK + 5] == await first.read(obj, CHUNK, 5)
        async with _cache(store, tmp_path) as third:
            assert third.cached_chunks == 4

    async def test_a_cancelled_close_releases_the_directory(self, tmp_path, monkeypatch):
        """A close cancelled while it waits for a stuck chunk write (a second SIGTERM, a task
        group failing) still releases the directory's lock."""
        body = os.urandom(CHUNK)
        loop = asyncio.get_running_loop()
        release = threading.Event()
        writing = asyncio.Event()
        real = cache_module._write_tmp

        def stuck_write(
            path: Path, data: bytes | memoryview, tag: int, direct: bool
        ) -> tuple[Path, bool]:
            loop.call_soon_threadsafe(writing.set)
            release.wait(30)
            return real(path, data, tag, direct)

        monkeypatch.setattr(cache_module, "_write_tmp", stuck_write)
        store = await _store(obj=body)
        first = _cache(store, tmp_path)
        await first.open()
        try:
            await first.read(ObjectRef("obj", CHUNK), 0, 1)
            await writing.wait()
            closing = asyncio.create_task(first.aclose())
            await asyncio.sleep(0)  # one step: the close runs up to its wait for the write
            assert not closing.done()
            assert first._state is cache_module._State.CLOSED
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            second = _cache(store, tmp_path)
            await second.open()
            await second.aclose()
        finally:
            release.set()
            await first.idle()

    async def test_budget_below_one_chunk_is_refused(self, tmp_path):
        """A budget that cannot hold one chunk is a configuration error."""
        with pytest.raises(ValueError, match="one chunk"):
            _cache(MemoryObjectStore(), tmp_path, max_bytes=CHUNK - 1)


class TestChunkCacheSingleFlight:
    """Concurrent reads of one chunk share one GET; a failure is never cached."""

    async def test_concurrent_reads_share_one_get(self, tmp_path):
        """Twenty readers of one chunk wait for the same GET and get the same bytes."""
        body = os.urandom(2 * CHUNK)
        gate = _Gate(await _store(obj=body))
        metrics = Metrics()
        async with _cache(gate, tmp_path, metrics=metrics) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", len(body))
            readers = [asyncio.create_task(cache.read(obj, CHUNK + i, 10)) for i in range(20)]
            await gate.waiting.wait()
            gate.release.set()
            results = await asyncio.gather(*readers)
        assert [body[CHUNK + i : CHUNK + i + 10] for i in range(20)] == results
        assert gate.entered == 1
        joined = metrics.read_cache_lookups.labels("joined")._value.get()
        assert joined == 19.0

    async def test_failure_reaches_every_waiter_and_is_not_cached(self, tmp_path):
        """A failed GET fails every reader waiting on it; the next read fetches again."""
        body = os.urandom(CHUNK)
        store = await _store(obj=body)
        store.fail_next("get_range", StorageError("S3 is down"))
        async with _cache(store, tmp_path) as cache:
            obj = ObjectRef("obj", CHUNK)
            results = await asyncio.gather(
                *(cache.read(obj, i, 1) for i in range(5)), return_exceptions=True
            )
            assert all(isinstance(r, StorageError) for r in results)
            assert store.calls["get_range"] == 1
            assert cache.cached_chunks == 0
            assert body[:4] == await cache.read(obj, 0, 4)
            assert store.calls["get_range"] == 2

    async def test_missing_object_is_not_cached(self, tmp_path):
        """KeyNotFoundError goes to the reader and leaves nothing behind."""
        async with _cache(MemoryObjectStore(), tmp_path) as cache:
            with pytest.raises(KeyNotFoundError):
                await cache.read(ObjectRef("nope", 10), 0, 10)
            await cache.idle()
            assert _files(tmp_path) == []

    async def test_cancelled_reader_does_not_cancel_the_shared_get(self, tmp_path):
        """One waiter giving up does not cancel the GET the others wait for."""
        body = os.urandom(CHUNK)
        gate = _Gate(await _store(obj=body))
        async with _cache(gate, tmp_path) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", CHUNK)
            quitter = asyncio.create_task(cache.read(obj, 0, 1))
            stayer = asyncio.create_task(cache.read(obj, 1, 1))
            await gate.waiting.wait()
            quitter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await quitter
            gate.release.set()
            assert body[1:2] == await stayer
            assert cache.is_cached(obj, 0)

    async def test_get_past_its_deadline_is_a_timeout(self, tmp_path):
        """A GET that does not finish within fetch_timeout_s is StorageTimeoutError."""
        gate = _Gate(await _store(obj=bytes(CHUNK)))
        async with _cache(gate, tmp_path, fetch_timeout_s=0.05) as cache:  # type: ignore[arg-type]
            with pytest.raises(StorageTimeoutError, match="took more than"):
                await cache.read(ObjectRef("obj", CHUNK), 0, 1)
            await cache.idle()
            assert cache.cached_chunks == 0


class TestChunkCacheReadAhead:
    """A read starts GETs of the next chunks, into the following object past the end."""

    async def test_read_ahead_fetches_the_next_chunks(self, tmp_path):
        """Reading chunk 0 with two chunks of read-ahead caches chunks 1 and 2, not 3."""
        body = os.urandom(5 * CHUNK)
        store = await _store(obj=body)
        async with _cache(store, tmp_path, readahead_chunks=2, max_bytes=8 * CHUNK) as cache:
            obj = ObjectRef("obj", len(body))
            await cache.read(obj, 0, 10)
            await cache.idle()
            assert [cache.is_cached(obj, i) for i in range(5)] == [True, True, True, False, False]
            before = store.calls["get_range"]
            assert body[2 * CHUNK : 2 * CHUNK + 5] == await cache.read(
                obj, 2 * CHUNK, 5, readahead=False
            )
            assert before == store.calls["get_range"]

    async def test_read_ahead_continues_into_the_follow_object(self, tmp_path):
        """At an object's last chunk, read-ahead goes on into the next segment's first chunks."""
        store = await _store(a=os.urandom(CHUNK + 1), b=os.urandom(3 * CHUNK))
        async with _cache(store, tmp_path, readahead_chunks=2) as cache:
            a, b = ObjectRef("a", CHUNK + 1), ObjectRef("b", 3 * CHUNK)
            await cache.read(a, CHUNK, 1, follow=(b,))
            await cache.idle()
            assert [cache.is_cached(b, i) for i in range(3)] == [True, True, False]

    async def test_read_ahead_goes_on_through_several_follow_objects(self, tmp_path):
        """Segments shorter than the read-ahead: it continues through the next ones in order,
        so a reader of small segments has more than one segment's GET ahead of it."""
        store = await _store(
            a=os.urandom(CHUNK), b=os.urandom(CHUNK), c=os.urandom(2 * CHUNK), d=os.urandom(CHUNK)
        )
        async with _cache(store, tmp_path, readahead_chunks=3) as cache:
            a, b = ObjectRef("a", CHUNK), ObjectRef("b", CHUNK)
            c, d = ObjectRef("c", 2 * CHUNK), ObjectRef("d", CHUNK)
            await cache.read(a, 0, 1, follow=(b, c, d))
            await cache.idle()
            assert [cache.is_cached(b, 0), cache.is_cached(c, 0), cache.is_cached(c, 1)] == [
                True,
                True,
                True,
            ]
            assert not cache.is_cached(d, 0)  # beyond the read-ahead's depth

    async def test_read_ahead_stops_at_the_limit(self, tmp_path):
        """With a limit, read-ahead fetches only chunks that start before it."""
        store = await _store(obj=os.urandom(6 * CHUNK))
        async with _cache(store, tmp_path, readahead_chunks=4, max_bytes=8 * CHUNK) as cache:
            obj = ObjectRef("obj", 6 * CHUNK)
            await cache.read(obj, 0, 1, readahead_limit=2 * CHUNK + 1)
            await cache.idle()
            assert [cache.is_cached(obj, i) for i in range(4)] == [True, True, True, False]

    async def test_failed_read_ahead_is_only_counted(self, tmp_path):
        """A read-ahead GET that fails is counted and forgotten; a later read fetches again."""
        body = os.urandom(2 * CHUNK)
        store = await _store(obj=body)
        metrics = Metrics()
        async with _cache(store, tmp_path, readahead_chunks=1, metrics=metrics) as cache:
            obj = ObjectRef("obj", len(body))
            assert body[:3] == await cache.read(obj, 0, 3, readahead=False)
            store.fail_next("get_range", StorageError("flaky"))
            assert body[:3] == await cache.read(obj, 0, 3)  # a hit; read-ahead of chunk 1 fails
            await cache.idle()
            assert metrics.read_fetches.labels("prefetch", "error")._value.get() == 1.0
            assert not cache.is_cached(obj, 1)
            assert body[CHUNK : CHUNK + 3] == await cache.read(obj, CHUNK, 3)
            assert store.calls["get_range"] == 3

    async def test_a_sequential_reader_is_read_ahead_in_groups(self, tmp_path):
        """Reads going from chunk 0 to chunk 1 make the reader sequential: read-ahead then
        reaches 2 groups ahead and fetches missing chunks a group per GET; each chunk is cached
        with its own bytes. A reader that jumps gets the plain read-ahead again."""
        body = os.urandom(20 * CHUNK)
        store = await _store(obj=body)
        async with _cache(
            store, tmp_path, readahead_chunks=2, group_chunks=4, max_bytes=32 * CHUNK
        ) as cache:
            obj = ObjectRef("obj", len(body))
            assert body[:5] == await cache.read(obj, 0, 5)  # demand 0, read-ahead 1 and 2
            await cache.idle()
            assert store.calls["get_range"] == 3
            assert body[CHUNK : CHUNK + 5] == await cache.read(obj, CHUNK, 5)
            await cache.idle()
            # chunks 3-6 and 7-10 with one GET each (the second group goes past 2 x 4 ahead)
            assert store.calls["get_range"] == 5
            assert [cache.is_cached(obj, i) for i in range(13)] == [True] * 11 + [False] * 2
            for i in range(11):
                got = await cache.read(obj, i * CHUNK + 7, 9, readahead=False)
                assert bytes(got) == body[i * CHUNK + 7 : i * CHUNK + 16]
            assert store.calls["get_range"] == 5
            assert body[16 * CHUNK : 16 * CHUNK + 1] == await cache.read(obj, 16 * CHUNK, 1)
            await cache.idle()  # a jump: chunk 16 and plain read-ahead of 17 and 18
            assert store.calls["get_range"] == 8
            assert not cache.is_cached(obj, 19)

    async def test_a_sequential_readers_chunks_ahead_stay_in_memory(self, tmp_path):
        """Every chunk fetched ahead of a sequential reader (two groups beyond the one it
        reads) is still in memory when it gets there: none is read back from disk."""
        body = os.urandom(20 * CHUNK)
        store = await _store(obj=body)
        async with _cache(
            store, tmp_path, readahead_chunks=2, group_chunks=4, max_bytes=32 * CHUNK
        ) as cache:
            obj = ObjectRef("obj", len(body))
            await cache.read(obj, 0, 1)
            await cache.read(obj, CHUNK, 1)  # sequential: 3-6 and 7-10 fetched
            await cache.idle()
            assert [cache.resident(obj, i) for i in range(2, 12)] == [True] * 9 + [False]

    async def test_reads_served_from_cached_chunks_keep_the_group_read_ahead(self, tmp_path):
        """Reads answered from chunks already cached, without ``read`` (planned responses),
        count as reads through ``read_ahead``: the sequential reader's read-ahead goes on a
        group per GET, not one chunk per GET as the plain read-ahead would."""
        body = os.urandom(20 * CHUNK)
        store = await _store(obj=body)
        async with _cache(store, tmp_path, max_bytes=32 * CHUNK, **_GROUPS) as cache:
            obj = ObjectRef("obj", len(body))
            await cache.read(obj, 0, 1)
            await cache.read(obj, CHUNK, 1)  # sequential: 3-6 and 7-10 fetched
            await cache.idle()
            assert store.calls["get_range"] == 5
            cache.read_ahead(obj, 2 * CHUNK, 4 * CHUNK - 1)  # chunks 2 and 3, from the cache
            await cache.idle()
            # two groups ahead of chunk 3 reach chunk 11: 11-14 with one GET
            assert store.calls["get_range"] == 6
            assert [cache.is_cached(obj, i) for i in range(16)] == [True] * 15 + [False]
            for i in (4, 5, 6, 7):
                cache.read_ahead(obj, i * CHUNK, i * CHUNK + 9)
            await cache.idle()
            assert store.calls["get_range"] == 7  # 15-18 at chunk 7
            assert [cache.is_cached(obj, i) for i in range(15, 20)] == [True] * 4 + [False]
            for i in range(19):
                got = await cache.read(obj, i * CHUNK, CHUNK, readahead=False)
                assert bytes(got) == body[i * CHUNK : (i + 1) * CHUNK]

    async def test_a_sequential_reader_goes_on_into_the_next_object_with_a_group(self, tmp_path):
        """``go_on_into``: a sequential reader of one object gets the first group of the next
        one with one GET and is sequential there from its first chunk (group read-ahead at
        once); a reader that jumped gets the plain ``readahead_chunks``."""
        first, second, third = (os.urandom(12 * CHUNK) for _ in range(3))
        store = await _store(a=first, b=second, c=third)
        async with _cache(store, tmp_path, max_bytes=64 * CHUNK, **_GROUPS) as cache:
            a, b, c = (ObjectRef(key, 12 * CHUNK) for key in "abc")
            await cache.read(a, 10 * CHUNK, 1)  # and chunk 11 read ahead
            await cache.read(a, 11 * CHUNK, 1)  # sequential in a
            cache.go_on_into(a, b)
            await cache.idle()
            assert store.calls["get_range"] == 3
            assert [cache.is_cached(b, i) for i in range(5)] == [True] * 4 + [False]
            assert bytes(await cache.read(b, 0, 5)) == second[:5]
            await cache.idle()
            # sequential at b's chunk 0: two groups ahead, 4-7 and 8-11, a GET each
            assert store.calls["get_range"] == 5
            assert all(cache.is_cached(b, i) for i in range(12))
            await cache.read(b, 5 * CHUNK, 1)  # a jump in b (its read-ahead: all cached)
            cache.go_on_into(b, c)
            await cache.idle()
            assert store.calls["get_range"] == 6
            assert [cache.is_cached(c, i) for i in range(3)] == [True, True, False]

    @staticmethod
    async def _read_with_waits(
        directory: Path, speedup: dict[int, float], waits: int
    ) -> tuple[list[int], dict[str, float], ChunkCache, ObjectRef]:
        """A sequential reader of 2-chunk groups, with up to eight groups of read-ahead, that
        reads one chunk per ``1 / speedup[groups]`` seconds of a controlled clock at each
        depth and waits for its read-ahead ``waits`` times; returns its depth after each wait,
        the depth changes counted, and the cache (still open) and object."""
        body = os.urandom(160 * CHUNK)
        gate = _Gate(await _store(obj=body))
        now = [0.0]
        metrics = Metrics()
        cache = _cache(
            gate,  # type: ignore[arg-type]
            directory,
            readahead_chunks=1,
            group_chunks=2,
            max_concurrent_fetches=16,
            max_bytes=160 * CHUNK,
            metrics=metrics,
            clock=lambda: now[0],
        )
        await cache.open()
        obj = ObjectRef("obj", len(body))
        gate.release.set()
        at, depths = 0, []
        for _ in range(waits):
            gate.release.clear()
            while cache.is_cached(obj, at):  # hits: their read-ahead asks for what follows
                now[0] += 1 / speedup[cache.readahead_groups("obj")]
                assert body[at * CHUNK : at * CHUNK + 2] == await cache.read(obj, at * CHUNK, 2)
                at += 1
            now[0] += 1 / speedup[cache.readahead_groups("obj")]
            reader = asyncio.create_task(cache.read(obj, at * CHUNK, 2))
            await gate.waiting.wait()
            gate.release.set()
            assert body[at * CHUNK : at * CHUNK + 2] == await reader  # it waited
            await cache.idle()
            gate.waiting.clear()
            depths.append(cache.readahead_groups("obj"))
            at += 1
        changes = {
            s.labels["change"]: s.value
            for s in metrics.read_readahead_changes.collect()[0].samples
            if s.name.endswith("_total")
        }
        return depths, changes, cache, obj

    async def test_a_reader_that_waits_and_reads_faster_deeper_gets_more(self, tmp_path):
        """A sequential reader that has to wait for a chunk its read-ahead is fetching gets
        twice the read-ahead, once it has read a while at its depth, as long as each
        deepening made it read faster, up to every GET read-ahead may have (half of
        ``max_concurrent_fetches``); a jump starts it at two groups again."""
        depths, changes, cache, obj = await self._read_with_waits(
            tmp_path, {2: 1.0, 4: 2.0, 8: 4.0}, waits=8
        )
        try:
            assert depths[0] == 2  # the first group's reads do not count: the first GETs
            assert depths[-1] == 8
            assert sorted(set(depths)) == [2, 4, 8]
            assert depths == sorted(depths)
            assert changes == {"deeper": 2.0}
            # the read-ahead reaches the reader's groups deep
            at = max(i for i in range(160) if cache.is_cached(obj, i))
            assert at >= 8 * 2
            await cache.read(obj, 120 * CHUNK, 1)  # a jump
            assert cache.readahead_groups("obj") == 2
        finally:
            await cache.aclose()

    async def test_a_deeper_read_ahead_that_reads_no_faster_is_given_up(self, tmp_path):
        """A reader whose read-ahead, twice as deep, reads less than 1.25 times faster (an
        object store on the same host: its waits are the CPU the GETs take) goes back to the
        depth before and stays there, however often it waits; after a jump it is measured
        again."""
        depths, changes, cache, obj = await self._read_with_waits(
            tmp_path, {2: 1.0, 4: 1.2, 8: 8.0}, waits=10
        )
        try:
            assert 4 in depths
            assert depths[-4:] == [2, 2, 2, 2]
            assert changes == {"deeper": 1.0, "back": 1.0}
            for i in range(120, 127):  # a jump, and a sequential read from there
                await cache.read(obj, i * CHUNK, 1)
            assert cache.readahead_groups("obj") == 2
        finally:
            await cache.aclose()

    async def test_a_failed_group_get_fails_its_chunks_and_is_not_cached(self, tmp_path):
        """A group GET that fails reaches a reader waiting for any of its chunks; none of them
        is cached, and the next read fetches them again."""
        body = os.urandom(12 * CHUNK)
        gate = _Gate(await _store(obj=body))
        async with _cache(
            gate, tmp_path, readahead_chunks=1, group_chunks=4, max_bytes=32 * CHUNK
        ) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", len(body))
            gate.release.set()
            await cache.read(obj, 0, 1)
            await cache.read(obj, CHUNK, 1)  # sequential: chunks 2-5 and 6-9, a GET each
            await cache.idle()
            assert gate.entered == 4
            gate.release.clear()
            gate.waiting.clear()
            gate.inner.fail_next("get_range", StorageError("flaky"))
            await cache.read(obj, 2 * CHUNK, 1)  # sequential at 2: 10-11 is one group GET
            await gate.waiting.wait()
            assert gate.entered == 5
            waiter = asyncio.create_task(cache.read(obj, 11 * CHUNK, 1, readahead=False))
            gate.release.set()
            with pytest.raises(StorageError):
                await waiter
            await cache.idle()
            assert not cache.is_cached(obj, 10)
            assert not cache.is_cached(obj, 11)
            assert body[11 * CHUNK : 11 * CHUNK + 3] == await cache.read(obj, 11 * CHUNK, 3)

    async def test_close_cancels_gets_in_flight(self, tmp_path):
        """Closing the cache cancels its GETs and later reads raise RuntimeError; a GET given
        up this way is not counted as a failed one."""
        gate = _Gate(await _store(obj=bytes(CHUNK)))
        metrics = Metrics()
        cache = _cache(gate, tmp_path, metrics=metrics)  # type: ignore[arg-type]
        await cache.open()
        reader = asyncio.create_task(cache.read(ObjectRef("obj", CHUNK), 0, 1))
        await gate.waiting.wait()
        await cache.aclose()
        await cache.aclose()  # idempotent
        with pytest.raises(asyncio.CancelledError):
            await reader
        with pytest.raises(RuntimeError, match="closed"):
            await cache.read(ObjectRef("obj", CHUNK), 0, 1)
        assert not [s for s in metrics.read_fetches.collect()[0].samples if s.value]


async def _read_sequentially(cache: ChunkCache, obj: ObjectRef, chunks: int) -> None:
    """Chunk after chunk from 0, as a sequential reader does (group GETs ahead of it)."""
    for i in range(chunks):
        await cache.read(obj, i * CHUNK, 1)
    await cache.idle()


def _chunk_files(directory: Path) -> list[str]:
    return sorted(p.name for p in _files(directory) if p.suffix == ".chunk")


def _chunks_in(file: str) -> range:
    """The chunk numbers a cache file's name says it holds (``...-<first>[+<count>].chunk``)."""
    first, _, count = file[: -len(".chunk")].rpartition("-")[2].partition("+")
    return range(int(first), int(first) + int(count or 1))


async def _assert_chunks(
    cache: ChunkCache, obj: ObjectRef, body: bytes, indexes: range, skip: int = 0
) -> None:
    """Each chunk of ``indexes`` read from the cache (from byte ``skip`` of it, no read-ahead)
    equals the object's bytes."""
    for i in indexes:
        got = await cache.read(obj, i * CHUNK + skip, CHUNK - skip, readahead=False)
        assert bytes(got) == body[i * CHUNK + skip : (i + 1) * CHUNK]


#: a sequential reader's read-ahead in groups of four chunks
_GROUPS = {"readahead_chunks": 2, "group_chunks": 4}


class TestChunkCacheGroupFiles:
    """The chunks of one group GET go in one file, cached, read and dropped as a whole."""

    async def test_a_group_is_one_file_and_a_reopened_cache_reads_its_chunks(self, tmp_path):
        """A sequential read leaves files of four chunks (``+4``); a reopened cache indexes
        every chunk of them and reads each at its place in its file, without a GET."""
        body = os.urandom(16 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        options = {**_GROUPS, "max_bytes": 32 * CHUNK}
        async with _cache(store, tmp_path, **options) as cache:
            await _read_sequentially(cache, obj, 16)
            assert cache.cached_chunks == 16
        names = _chunk_files(tmp_path)
        assert any(name.endswith("+4.chunk") for name in names)
        assert len(names) < 16  # fewer files than chunks
        assert _disk_bytes(tmp_path) == len(body)
        gets = store.calls["get_range"]
        async with _cache(store, tmp_path, **options) as cache:
            assert cache.cached_chunks == 16
            await _assert_chunks(cache, obj, body, range(16), skip=3)
            assert store.calls["get_range"] == gets

    async def test_open_chunk_of_a_group_file_says_where_the_chunk_starts(self, tmp_path):
        """``open_chunk`` of a chunk on disk inside a group file gives its fd and offset: the
        bytes there are the chunk's (what ``sendfile`` sends)."""
        body = os.urandom(12 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        options = {**_GROUPS, "max_bytes": 32 * CHUNK}
        async with _cache(store, tmp_path, **options) as cache:
            await _read_sequentially(cache, obj, 12)
        async with _cache(store, tmp_path, **options) as cache:
            offsets = set()
            for i in range(12):
                copy = cache.copy_id(obj, i)
                assert copy is not None
                found = await cache.open_chunk(obj, i, copy)
                assert isinstance(found, ChunkFile)
                try:
                    assert (
                        os.pread(found.fd, CHUNK, found.offset) == body[i * CHUNK : (i + 1) * CHUNK]
                    )
                finally:
                    os.close(found.fd)
                offsets.add(found.offset)
            assert max(offsets) > 0

    async def test_written_chunk_names_a_written_file_and_opens_nothing(
        self, tmp_path, monkeypatch
    ):
        """``written_chunk`` (for a reader that opens files itself) names a chunk's file only
        once it is written, even while the chunk is also in memory; never a chunk being
        written or another copy; and it opens no file."""
        body = os.urandom(4 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        disk = _SlowDisk(monkeypatch)
        try:
            async with _cache(store, tmp_path, max_bytes=32 * CHUNK) as cache:
                assert await cache.read(obj, CHUNK, CHUNK) == body[CHUNK : 2 * CHUNK]
                copy = cache.copy_id(obj, 1)
                assert copy is not None
                assert cache.written_chunk(obj, 1, copy) is None  # its write is held back
                disk.release.set()
                await cache.idle()
                open_fds = sum(1 for _ in Path("/proc/self/fd").iterdir())
                found = cache.written_chunk(obj, 1, copy)
                assert found is not None
                assert sum(1 for _ in Path("/proc/self/fd").iterdir()) == open_fds
                assert not isinstance(await cache.open_chunk(obj, 1, copy), ChunkFile)  # memory
                with found.path.open("rb") as file:
                    file.seek(found.offset)
                    assert file.read(CHUNK) == body[CHUNK : 2 * CHUNK]
                assert cache.written_chunk(obj, 1, copy + 1) is None
                assert cache.written_chunk(obj, 2, copy) is None  # not cached
        finally:
            disk.release.set()

    async def test_a_chunk_invalidated_drops_its_whole_file(self, tmp_path):
        """Invalidating one chunk of a group file (a CRC failure) forgets every chunk of that
        file and removes it; the next reads fetch them again, with the right bytes."""
        body = os.urandom(16 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        async with _cache(store, tmp_path, **_GROUPS, max_bytes=32 * CHUNK) as cache:
            await _read_sequentially(cache, obj, 16)
            grouped = next(n for n in _chunk_files(tmp_path) if n.endswith("+4.chunk"))
            first = _chunks_in(grouped).start
            cache.invalidate(obj, (first + 2) * CHUNK, (first + 2) * CHUNK)
            assert [cache.is_cached(obj, first + i) for i in range(4)] == [False] * 4
            assert cache.cached_chunks == 12
            assert grouped not in _chunk_files(tmp_path)
            assert _disk_bytes(tmp_path) == cache.cached_bytes == 12 * CHUNK
            await _assert_chunks(cache, obj, body, range(first, first + 4))

    async def test_files_are_evicted_whole_within_the_budget(self, tmp_path):
        """A sequential read of three times the budget evicts files, least recently used
        first: the disk stays within the budget, and the chunks of one file are cached
        together or not at all."""
        body = os.urandom(96 * CHUNK)
        store = await _store(obj=body)
        metrics = Metrics()
        obj = ObjectRef("obj", len(body))
        async with _cache(
            store, tmp_path, **_GROUPS, max_bytes=32 * CHUNK, metrics=metrics
        ) as cache:
            await _read_sequentially(cache, obj, 96)
            assert _disk_bytes(tmp_path) <= 32 * CHUNK
            assert cache.cached_bytes <= 32 * CHUNK
            assert metrics.read_cache_evictions._value.get() >= 64
            for name in _chunk_files(tmp_path):
                assert all(cache.is_cached(obj, i) for i in _chunks_in(name))
            cached = [i for i in range(96) if cache.is_cached(obj, i)]
            assert max(cached, default=-1) == 95  # the latest kept, the earliest evicted
            assert not cache.is_cached(obj, 0)

    async def test_a_group_of_more_than_an_eighth_of_the_budget_is_split(self, tmp_path):
        """A file is evicted whole, so none holds more than an eighth of the budget: with a
        budget of 16 chunks, a group of four goes in files of two."""
        body = os.urandom(12 * CHUNK)
        store = await _store(obj=body)
        obj = ObjectRef("obj", len(body))
        async with _cache(store, tmp_path, **_GROUPS, max_bytes=16 * CHUNK) as cache:
            await _read_sequentially(cache, obj, 12)
            names = _chunk_files(tmp_path)
            assert any(name.endswith("+2.chunk") for name in names)
            assert not any(name.endswith("+4.chunk") for name in names)
            await _assert_chunks(cache, obj, body, range(12))


class TestMemoryCache:
    """Parsed objects in memory: LRU by weight, single flight, failures not cached."""

    async def test_values_are_cached_within_the_weight(self):
        """Loads are cached; over the weight, the least recently used value goes."""
        cache: MemoryCache[str, bytes] = MemoryCache(max_weight=10)
        loads: list[str] = []

        def loader(key: str, size: int):
            async def load() -> bytes:
                loads.append(key)
                return bytes(size)

            return load

        for key in ("a", "b", "a", "c"):
            await cache.get(key, loader(key, 4), len)
        assert loads == ["a", "b", "c"]
        assert "a" in cache
        assert "c" in cache
        assert "b" not in cache
        assert cache.weight == 8
        await cache.get("big", loader("big", 11), len)  # heavier than the cache: not kept
        assert "big" not in cache
        await cache.aclose()

    async def test_concurrent_loads_share_one_call_and_failures_are_not_cached(self):
        """Concurrent gets share one load; a failed load is retried by the next get."""
        cache: MemoryCache[str, int] = MemoryCache(max_weight=100)
        release = asyncio.Event()
        calls = 0

        async def load() -> int:
            nonlocal calls
            calls += 1
            await release.wait()
            if calls == 1:
                raise StorageError("boom")
            return 42

        first = [asyncio.create_task(cache.get("k", load, lambda _: 1)) for _ in range(5)]
        release.set()
        results = await asyncio.gather(*first, return_exceptions=True)
        assert all(isinstance(r, StorageError) for r in results)
        assert calls == 1
        assert await cache.get("k", load, lambda _: 1) == 42
        assert await cache.get("k", load, lambda _: 1) == 42
        assert calls == 2
        await cache.aclose()


def _spy_writes(
    monkeypatch: pytest.MonkeyPatch, *, refuse: bool = False
) -> tuple[list[bool], list[bool]]:
    """Record each chunk-file write: whether O_DIRECT was asked for, and whether it was used;
    with ``refuse``, the filesystem refuses it (the write goes buffered)."""
    asked: list[bool] = []
    used: list[bool] = []
    real = cache_module.write_file

    def spy(path: Path, data: bytes | memoryview, *, direct: bool = True) -> bool:
        asked.append(direct)
        used.append(real(path, data, direct=direct and not refuse))
        return used[-1]

    monkeypatch.setattr(cache_module, "write_file", spy)
    return asked, used


class TestChunkCacheDirectWrites:
    """Chunk files are written around the page cache, or through it where refused."""

    async def test_chunks_are_written_with_o_direct(self, tmp_path, monkeypatch):
        """Every chunk file is written with O_DIRECT by default (this directory is on a disk
        filesystem), and holds exactly the chunk's bytes."""
        body = os.urandom(2 * CHUNK + 10)
        _asked, modes = _spy_writes(monkeypatch)
        async with _cache(await _store(obj=body), tmp_path, memory_chunks=0) as cache:
            obj = ObjectRef("obj", len(body))
            for i in range(3):
                await cache.read(obj, i * CHUNK, min(CHUNK, len(body) - i * CHUNK))
            await cache.idle()
        assert modes == [True, True, True]
        chunks = sorted(p.read_bytes() for p in _files(tmp_path) if p.suffix == ".chunk")
        assert chunks == sorted([body[:CHUNK], body[CHUNK : 2 * CHUNK], body[2 * CHUNK :]])

    async def test_a_refusing_filesystem_is_logged_once_then_written_buffered(
        self, tmp_path, monkeypatch
    ):
        """The first refusal of O_DIRECT is logged once; that chunk and every later one is
        cached through the page cache, byte for byte, and read back from disk."""
        body = os.urandom(3 * CHUNK)
        asked, _modes = _spy_writes(monkeypatch, refuse=True)
        store = await _store(obj=body)
        with capture_logs() as logs:
            async with _cache(store, tmp_path, memory_chunks=0) as cache:
                obj = ObjectRef("obj", len(body))
                for i in range(3):
                    await cache.read(obj, i * CHUNK, CHUNK)
                    await cache.idle()
                for i in range(3):
                    assert body[i * CHUNK : (i + 1) * CHUNK] == bytes(
                        await cache.read(obj, i * CHUNK, CHUNK)
                    )
                assert store.calls["get_range"] == 3  # the second pass came from disk
        assert asked == [True, False, False]
        refused = [e for e in logs if e["event"] == "read_cache_direct_io_refused"]
        assert len(refused) == 1
        assert refused[0]["directory"] == str(tmp_path)

    async def test_a_cache_at_its_budget_writes_buffered(self, tmp_path, monkeypatch):
        """While the cache fills, chunks are written with O_DIRECT; once a chunk must evict
        another to fit, it is written through the page cache (reusing the evicted chunk's
        pages), byte for byte, and the disk stays within the budget."""
        body = os.urandom(6 * CHUNK)
        asked, modes = _spy_writes(monkeypatch)
        store = await _store(obj=body)
        async with _cache(store, tmp_path, memory_chunks=0) as cache:  # 4 chunks
            obj = ObjectRef("obj", len(body))
            for i in range(6):
                await cache.read(obj, i * CHUNK, CHUNK)
                await cache.idle()
            assert _disk_bytes(tmp_path) <= 4 * CHUNK
            for i in range(2, 6):  # the last four, from disk
                assert (
                    bytes(await cache.read(obj, i * CHUNK, CHUNK))
                    == body[i * CHUNK : (i + 1) * CHUNK]
                )
            assert store.calls["get_range"] == 6
        assert asked == [True, True, True, True, False, False]
        assert modes == asked

    @pytest.mark.parametrize("direct_io", [True, False], ids=["o_direct", "buffered"])
    async def test_chunk_files_are_for_their_owner_and_group_only(self, tmp_path, direct_io):
        """Tiered data is not world-readable: chunk files are 0640 and their directories 0750
        (less the umask); the broker plugin reads them through the group."""
        umask = os.umask(0o022)
        try:
            body = os.urandom(CHUNK)
            async with _cache(await _store(obj=body), tmp_path, direct_io=direct_io) as cache:
                await cache.read(ObjectRef("obj", len(body)), 0, CHUNK)
                await cache.idle()
        finally:
            os.umask(umask)
        [path] = _files(tmp_path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750

    async def test_direct_io_off_writes_buffered(self, tmp_path, monkeypatch):
        """``direct_io=False`` (the configuration's ``cache_direct_io``) never asks for it."""
        asked, _modes = _spy_writes(monkeypatch)
        body = os.urandom(CHUNK)
        async with _cache(await _store(obj=body), tmp_path, direct_io=False) as cache:
            await cache.read(ObjectRef("obj", len(body)), 0, CHUNK)
            await cache.idle()
        assert asked == [False]


class _SlowDisk:
    """Chunk writes block in their worker thread until released (a disk slower than S3)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        real = cache_module._write_tmp

        def write(
            path: Path, data: bytes | memoryview, tag: int, direct: bool
        ) -> tuple[Path, bool]:
            self.release.wait(30)
            return real(path, data, tag, direct)

        monkeypatch.setattr(cache_module, "_write_tmp", write)


class _GatedOs:
    """The cache module's ``os`` with an ``open`` that blocks in its worker thread until
    released, then opens for real and records the fd."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()
        self.opened: list[int] = []

    def open(self, path: Path, flags: int) -> int:
        self.entered.set()
        self.release.wait(30)
        fd = os.open(path, flags)
        self.opened.append(fd)
        self.done.set()
        return fd

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class TestChunkCacheBounds:
    """Writes behind are bounded, and no file descriptor outlives a cancelled open."""

    async def test_pending_writes_are_bounded_then_chunks_are_served_from_memory(
        self, tmp_path, monkeypatch
    ):
        """With the disk stuck, chunks beyond the pending-write bound are served (from memory)
        but not queued for the disk; they are counted and the pending bytes stay bounded."""
        body = os.urandom(4 * CHUNK)
        metrics = Metrics()
        disk = _SlowDisk(monkeypatch)
        cache = _cache(
            await _store(obj=body),
            tmp_path / "c",
            max_bytes=16 * CHUNK,
            max_pending_write_bytes=2 * CHUNK,
            metrics=metrics,
        )
        obj = ObjectRef("obj", len(body))
        try:
            async with cache:
                for i in range(4):
                    got = await cache.read(obj, i * CHUNK, CHUNK)
                    assert bytes(got) == body[i * CHUNK : (i + 1) * CHUNK]
                assert [cache.is_cached(obj, i) for i in range(4)] == [True, True, False, False]
                value = metrics.registry.get_sample_value
                assert value("kafka_tiered_sidecar_read_cache_writes_skipped_total") == 2
                assert value("kafka_tiered_sidecar_read_cache_pending_write_bytes") == 2 * CHUNK
                # the skipped chunks are still served from memory, without a GET
                got = await cache.read(obj, 3 * CHUNK, CHUNK)
                assert bytes(got) == body[3 * CHUNK :]
                assert (
                    value(
                        "kafka_tiered_sidecar_read_fetches_total",
                        {"kind": "demand", "outcome": "ok"},
                    )
                    == 4
                )
                disk.release.set()
                await cache.idle()
                assert value("kafka_tiered_sidecar_read_cache_pending_write_bytes") == 0
                assert len([p for p in _files(tmp_path / "c") if p.suffix == ".chunk"]) == 2
        finally:
            disk.release.set()

    async def test_writes_have_threads_of_their_own(self, tmp_path, monkeypatch):
        """Chunk writes run on the cache's own threads, at most WRITE_THREADS at once: with
        every one of them stuck, the process's other file work (the default executor) and
        reads of files already written still go on."""
        body = os.urandom(8 * CHUNK)
        loop = asyncio.get_running_loop()
        release = threading.Event()
        writing: list[str] = []
        all_busy = asyncio.Event()
        real = cache_module._write_tmp

        def write(
            path: Path, data: bytes | memoryview, tag: int, direct: bool
        ) -> tuple[Path, bool]:
            writing.append(threading.current_thread().name)
            if len(writing) == cache_module.WRITE_THREADS:
                loop.call_soon_threadsafe(all_busy.set)
            release.wait(30)
            return real(path, data, tag, direct)

        obj = ObjectRef("obj", len(body))
        async with _cache(await _store(obj=body), tmp_path, max_bytes=16 * CHUNK) as cache:
            assert await cache.read(obj, 0, CHUNK) == body[:CHUNK]
            await cache.idle()  # chunk 0 written before the disk gets stuck
            monkeypatch.setattr(cache_module, "_write_tmp", write)
            try:
                for i in range(1, 8):
                    assert (
                        await cache.read(obj, i * CHUNK, CHUNK) == body[i * CHUNK : (i + 1) * CHUNK]
                    )
                await all_busy.wait()
                assert await asyncio.to_thread(lambda: "free") == "free"
                copy = cache.copy_id(obj, 0)
                assert copy is not None
                found = await cache.open_chunk(obj, 0, copy)
                assert isinstance(found, ChunkFile)
                os.close(found.fd)
                assert len(writing) == cache_module.WRITE_THREADS  # the rest wait their turn
            finally:
                release.set()
            await cache.idle()
        assert len(writing) == 7
        assert all(name.startswith("chunk-cache-write") for name in writing)
        assert len([p for p in _files(tmp_path) if p.suffix == ".chunk"]) == 8

    async def test_an_open_cancelled_in_its_thread_closes_the_fd(self, tmp_path, monkeypatch):
        """open_chunk is cancelled while its worker thread is inside os.open: the fd that
        thread then returns is closed, not leaked."""
        body = os.urandom(CHUNK)
        cache = _cache(await _store(obj=body), tmp_path / "c", memory_chunks=0)
        obj = ObjectRef("obj", len(body))
        gated = _GatedOs()
        async with cache:
            await cache.read(obj, 0, CHUNK)
            await cache.idle()  # on disk, not in memory
            copy = cache.copy_id(obj, 0)
            assert copy is not None
            monkeypatch.setattr(cache_module, "os", gated)
            try:
                opening = asyncio.create_task(cache.open_chunk(obj, 0, copy))
                assert await asyncio.to_thread(gated.entered.wait, 30)
                opening.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await opening
            finally:
                gated.release.set()
            assert await asyncio.to_thread(gated.done.wait, 30)  # the thread opened the fd
            await cache.idle()
            [fd] = gated.opened
            leaked = _is_open(fd)
            if leaked:
                os.close(fd)
            assert not leaked


class TestChunkCacheEdges:
    """Rare orders of events: a file evicted twice while written, a read in the loop turn
    after a GET failed, a cache file the disk cannot read."""

    async def test_a_file_evicted_twice_while_written_is_counted_once(self, tmp_path, monkeypatch):
        """A file evicted while written, fetched again into the same name and evicted again
        before the first write ended: each write takes its own bytes off the count."""
        body = os.urandom(2 * CHUNK)
        disk = _SlowDisk(monkeypatch)
        try:
            async with _cache(
                await _store(obj=body), tmp_path, max_bytes=CHUNK, memory_chunks=0
            ) as cache:
                obj = ObjectRef("obj", len(body))
                await cache.read(obj, 0, 1)  # A, its write held
                await cache.read(obj, CHUNK, 1)  # B evicts A while A is written
                cache.invalidate(obj, 0, 0)
                await cache.read(obj, 0, 1)  # A again, same file name: evicts B
                cache.invalidate(obj, CHUNK, CHUNK)
                await cache.read(obj, CHUNK, 1)  # B again: evicts A's second copy
                disk.release.set()
                await cache.idle()
                on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*.chunk"))
                assert cache.cached_bytes == on_disk
        finally:
            disk.release.set()

    async def test_a_read_just_after_a_failed_get_makes_a_new_one(self, tmp_path):
        """A read that comes between the GET's failure and its cleanup does not take the old
        failure: a failure is never cached."""
        body = os.urandom(CHUNK)
        inner = await _store(obj=body)
        calls = 0
        failed = asyncio.Event()

        class FailOnce:
            async def get_range(
                self, key: str, start: int, end_inclusive: int, *, arrivals: object = None
            ) -> bytes:
                nonlocal calls
                calls += 1
                if calls == 1:
                    failed.set()
                    raise StorageError("the first GET failed")
                return await inner.get_range(key, start, end_inclusive)

            def __getattr__(self, name: str) -> object:
                return getattr(inner, name)

        async with _cache(FailOnce(), tmp_path) as cache:  # type: ignore[arg-type]
            obj = ObjectRef("obj", CHUNK)
            first = asyncio.create_task(cache.read(obj, 0, 1))

            async def late() -> bytes | memoryview:
                # steps of one loop turn each (no timer): the read comes in the turn after
                # the one in which the GET failed, before the cache's cleanup of it ran
                seen = False
                while not seen:
                    seen = failed.is_set()
                    await asyncio.sleep(0)
                return await cache.read(obj, 0, 1)

            second = asyncio.create_task(late())
            with pytest.raises(StorageError):
                await first
            assert await second == body[:1]
        assert calls == 2

    async def test_a_cache_file_the_disk_cannot_read_is_fetched_again(self, tmp_path, monkeypatch):
        """EIO on a cached chunk: the read is answered from the bucket, which still has the
        bytes, instead of failing (the broker would take a failure as final)."""
        body = os.urandom(CHUNK)
        store = await _store(obj=body)
        async with _cache(store, tmp_path, memory_chunks=0) as cache:
            obj = ObjectRef("obj", CHUNK)
            await cache.read(obj, 0, 1)
            await cache.idle()
            real = cache_module._pread

            def broken(path: Path, offset: int, length: int) -> bytes:
                raise OSError(5, "Input/output error")

            monkeypatch.setattr(cache_module, "_pread", broken)
            with capture_logs() as logs:
                assert await cache.read(obj, 10, 5) == body[10:15]
            monkeypatch.setattr(cache_module, "_pread", real)
            assert store.calls["get_range"] == 2
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
                "read_cache_read_failed"
            ]


class _StuckFiles:
    """``Path.unlink`` refuses (EACCES) to remove the existing files whose names are listed,
    as a file or directory whose permissions changed under the cache would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: set[str] = set()
        real = Path.unlink

        def unlink(path: Path, missing_ok: bool = False) -> None:
            if path.name in self.names and path.exists():
                raise PermissionError(13, "Permission denied", str(path))
            real(path, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", unlink)


class TestChunkCacheUnlinkFailures:
    """A chunk file the filesystem refuses to remove is logged and counted; reads go on, the
    count stays the bytes on disk, and the file is removed once the filesystem lets it."""

    async def test_an_eviction_that_cannot_remove_a_file_serves_the_read(
        self, tmp_path, monkeypatch
    ):
        """The file evicted first cannot be removed: the read that needed room still gets its
        bytes, the next file is evicted instead, and the stuck one is removed at a later
        eviction once the filesystem allows it."""
        body = os.urandom(4 * CHUNK)
        store = await _store(obj=body)
        stuck = _StuckFiles(monkeypatch)
        metrics = Metrics()
        async with _cache(
            store, tmp_path, max_bytes=2 * CHUNK, memory_chunks=0, metrics=metrics
        ) as cache:
            obj = ObjectRef("obj", len(body))
            for index in range(2):
                await cache.read(obj, index * CHUNK, 1)
            await cache.idle()
            first = _files(tmp_path)
            stuck.names = {p.name for p in first}  # neither chunk 0's nor chunk 1's file
            with capture_logs() as logs:
                assert body[2 * CHUNK : 2 * CHUNK + 9] == await cache.read(obj, 2 * CHUNK, 9)
                await cache.idle()
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
                "read_cache_unlink_failed",
                "read_cache_unlink_failed",
            ]
            assert metrics.read_cache_unlink_errors._value.get() == 2.0
            # both stuck files are on disk and counted; the new chunk was served from memory,
            # not written past the budget
            assert cache.cached_bytes == _disk_bytes(tmp_path) == 2 * CHUNK
            assert not cache.is_cached(obj, 2)
            stuck.names = set()
            assert body[3 * CHUNK : 3 * CHUNK + 9] == await cache.read(obj, 3 * CHUNK, 9)
            await cache.idle()
            assert cache.is_cached(obj, 3)
            assert cache.cached_bytes == _disk_bytes(tmp_path) <= 2 * CHUNK
            assert not set(first) & set(_files(tmp_path))

    async def test_a_file_that_cannot_be_removed_when_invalidated_is_fetched_again(
        self, tmp_path, monkeypatch
    ):
        """Invalidating a chunk whose file cannot be removed does not raise: the chunk is
        fetched again, its new copy replaces the old file, and the count matches the disk."""
        body = os.urandom(CHUNK)
        store = await _store(obj=body)
        stuck = _StuckFiles(monkeypatch)
        async with _cache(store, tmp_path, memory_chunks=0) as cache:
            obj = ObjectRef("obj", CHUNK)
            await cache.read(obj, 0, 1)
            await cache.idle()
            stuck.names = {p.name for p in _files(tmp_path)}
            with capture_logs() as logs:
                cache.invalidate(obj, 0, 0)
            assert [e["event"] for e in logs] == ["read_cache_unlink_failed"]
            assert cache.cached_bytes == _disk_bytes(tmp_path) == CHUNK
            assert body[3:9] == await cache.read(obj, 3, 6)
            await cache.idle()
            assert store.calls["get_range"] == 2
            assert cache.cached_bytes == _disk_bytes(tmp_path) == CHUNK
            assert cache.is_cached(obj, 0)

    async def test_a_file_that_cannot_be_removed_stays_counted_when_its_new_copy_fails(
        self, tmp_path, monkeypatch
    ):
        """The chunk of a file that could not be removed is fetched again, but writing its new
        copy fails: the old file is still on disk, so it stays counted, and it is removed at
        a later eviction once the filesystem lets it."""
        body = os.urandom(3 * CHUNK)
        store = await _store(obj=body)
        stuck = _StuckFiles(monkeypatch)
        async with _cache(store, tmp_path, max_bytes=2 * CHUNK, memory_chunks=0) as cache:
            obj = ObjectRef("obj", len(body))
            await cache.read(obj, 0, 1)
            await cache.idle()
            stuck.names = {p.name for p in _files(tmp_path)}
            with capture_logs():
                cache.invalidate(obj, 0, 0)
            real_write = cache_module._write_tmp

            def failing_write(*args: object) -> object:
                raise OSError(errno.EIO, "Input/output error")

            monkeypatch.setattr(cache_module, "_write_tmp", failing_write)
            with capture_logs() as logs:
                assert body[3:9] == await cache.read(obj, 3, 6)
                await cache.idle()
            assert "read_cache_write_failed" in [e["event"] for e in logs]
            assert cache.cached_bytes == _disk_bytes(tmp_path) == CHUNK
            monkeypatch.setattr(cache_module, "_write_tmp", real_write)
            stuck.names = set()
            for index in (1, 2):
                await cache.read(obj, index * CHUNK, 1)
                await cache.idle()
            assert cache.cached_bytes == _disk_bytes(tmp_path) == 2 * CHUNK


class TestChunkCacheRenameFailures:
    """A chunk written to ``.tmp`` whose rename fails leaves no file outside the byte count:
    the ``.tmp`` is removed at once, or counted (as a file that cannot be removed) while the
    filesystem keeps it."""

    @staticmethod
    def _broken_disk(monkeypatch: pytest.MonkeyPatch, *, unlink_too: bool) -> list[bool]:
        """``Path.replace`` of a ``.tmp`` file fails (EIO), and with ``unlink_too`` so does
        ``Path.unlink`` of an existing one (EACCES), while the returned flag is set."""
        broken = [True]
        real_replace, real_unlink = Path.replace, Path.unlink

        def replace(path: Path, target: Path) -> Path:
            if broken[0] and path.name.endswith(".tmp"):
                raise OSError(errno.EIO, "Input/output error", str(path))
            return real_replace(path, target)

        def unlink(path: Path, missing_ok: bool = False) -> None:
            if broken[0] and unlink_too and path.name.endswith(".tmp") and path.exists():
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            real_unlink(path, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "replace", replace)
        monkeypatch.setattr(Path, "unlink", unlink)
        return broken

    async def test_a_failed_rename_removes_the_tmp_file(self, tmp_path, monkeypatch):
        body = os.urandom(CHUNK)
        store = await _store(obj=body)
        self._broken_disk(monkeypatch, unlink_too=False)
        async with _cache(store, tmp_path, memory_chunks=0) as cache:
            obj = ObjectRef("obj", CHUNK)
            with capture_logs() as logs:
                assert body[:9] == await cache.read(obj, 0, 9)
                await cache.idle()
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
                "read_cache_write_failed"
            ]
            assert _files(tmp_path) == []
            assert cache.cached_bytes == 0
            assert not cache.is_cached(obj, 0)

    async def test_a_tmp_file_that_cannot_be_removed_stays_counted(self, tmp_path, monkeypatch):
        """The rename fails and so does the unlink: the ``.tmp`` counts in the budget, as an
        evicted file that cannot be removed does, and goes at an eviction once it can."""
        body = os.urandom(4 * CHUNK)
        store = await _store(obj=body)
        broken = self._broken_disk(monkeypatch, unlink_too=True)
        metrics = Metrics()
        async with _cache(
            store, tmp_path, max_bytes=2 * CHUNK, memory_chunks=0, metrics=metrics
        ) as cache:
            obj = ObjectRef("obj", len(body))
            with capture_logs() as logs:
                assert body[:9] == await cache.read(obj, 0, 9)
                await cache.idle()
            assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
                "read_cache_write_failed",
                "read_cache_unlink_failed",
            ]
            assert metrics.read_cache_unlink_errors._value.get() == 1.0
            assert [p.name.endswith(".tmp") for p in _files(tmp_path)] == [True]
            assert cache.cached_bytes == _disk_bytes(tmp_path) == CHUNK
            broken[0] = False
            for index in (1, 2):  # the second needs room: the .tmp goes first
                await cache.read(obj, index * CHUNK, 1)
                await cache.idle()
            assert not [p for p in _files(tmp_path) if p.name.endswith(".tmp")]
            assert cache.cached_bytes == _disk_bytes(tmp_path) == 2 * CHUNK
            assert cache.is_cached(obj, 1)
            assert cache.is_cached(obj, 2)


class _RefusingOs:
    """The cache module's ``os`` with an ``open`` that refuses (EACCES) every chunk file."""

    def open(self, path: Path, flags: int) -> int:
        if str(path).endswith(".chunk"):
            raise PermissionError(13, "Permission denied", str(path))
        return os.open(path, flags)

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


class TestChunkCacheOpenFailures:
    """A cached chunk whose file cannot be opened is a miss, not a failed read."""

    async def test_a_chunk_file_that_cannot_be_opened_gives_no_copy(self, tmp_path, monkeypatch):
        """``open_chunk`` of a file the disk refuses to open answers None (the caller then
        streams the range through the cache) and forgets the chunk, which the next read
        fetches again, instead of raising on every planned read of it."""
        body = os.urandom(CHUNK)
        store = await _store(obj=body)
        async with _cache(store, tmp_path, memory_chunks=0) as cache:
            obj = ObjectRef("obj", CHUNK)
            await cache.read(obj, 0, 1)
            await cache.idle()  # on disk, not in memory
            copy = cache.copy_id(obj, 0)
            assert copy is not None
            monkeypatch.setattr(cache_module, "os", _RefusingOs())
            with capture_logs() as logs:
                assert await cache.open_chunk(obj, 0, copy) is None
            monkeypatch.undo()
            assert [e["event"] for e in logs] == ["read_cache_read_failed"]
            assert not cache.is_cached(obj, 0)
            assert body[7:20] == await cache.read(obj, 7, 13)
            assert store.calls["get_range"] == 2
