"""The read path's caches: remote objects in chunks on local disk, and small parsed objects
(manifests, offset and time indexes) in memory.

:class:`ChunkCache` keeps fixed-size chunks of remote objects under one directory, bounded in
bytes, least recently used evicted first (Aiven's ``DiskChunkCache``, Kafka's
``RemoteIndexCache`` file handling):

* **single flight**: concurrent reads of one chunk share one ranged GET. The cache keeps the
  fetch *task* while it runs and forgets it when it ends, so a failure reaches every waiter and is
  never cached: the next read starts a new GET.
* **read-ahead**: a read of chunk *i* starts GETs of the next ``readahead_chunks`` chunks (going
  on into a ``follow`` object, the next segment, past the end of this one), so a sequential
  reader finds them fetched or in flight.
* **deadlines and bounds**: every GET has a deadline (``fetch_timeout_s``, retries included);
  at most ``max_concurrent_fetches`` GETs run at once, and read-ahead takes at most half of them.
* **memory**: the last ``memory_chunks`` chunks fetched stay in memory too (a sequential
  reader reads a chunk right after its GET), and a chunk being written is served from memory.
* **files**: ``<dir>/<ab>/<blake2b(key)>-<chunk size>-<index>.chunk``, written to ``.tmp`` and
  renamed, so a file with the final name is complete. Opening the cache rescans the directory
  (oldest first), removes ``.tmp`` leftovers and evicts down to the budget. A file that vanished
  or is short is fetched again. One process per directory.
* **copies**: each cached copy of a chunk has a number (:meth:`ChunkCache.copy_id`) that changes
  when the chunk is evicted or invalidated and fetched again, so a caller that checked a copy's
  bytes (the read service verifies CRCs) can tell later that it still holds those bytes, and
  send them without reading them (:meth:`ChunkCache.open_chunk`: the chunk in memory, or an
  open file descriptor for ``sendfile``).

:class:`MemoryCache` is the same single-flight, never-cache-a-failure rule for parsed objects,
bounded by a weight (bytes).

This module knows nothing of Kafka formats or HTTP; blocking file work runs in worker threads.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from pathlib import Path
from types import TracebackType
from typing import Generic, NamedTuple, Self, TypeVar

from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.readserver.errors import RemoteDataError, StorageTimeoutError
from sidecar.storage.base import ObjectStore

__all__ = ["ChunkCache", "MemoryCache", "ObjectRef"]

log = get_logger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_SUFFIX = ".chunk"
_TMP_SUFFIX = ".tmp"


class ObjectRef(NamedTuple):
    """A remote object and its size in bytes (known from the metadata, never asked for)."""

    key: str
    size: int


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


def _pread(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _write_chunk(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    with tmp.open("wb") as out:
        out.write(data)
    tmp.replace(path)


def _scan(directory: Path) -> list[tuple[float, str, int]]:
    """(mtime, name, size) of every chunk file, oldest first; ``.tmp`` leftovers are removed."""
    directory.mkdir(parents=True, exist_ok=True)
    found: list[tuple[float, str, int]] = []
    for sub in directory.iterdir():
        if not sub.is_dir():
            continue
        for entry in os.scandir(sub):
            if entry.name.endswith(_TMP_SUFFIX):
                Path(entry.path).unlink(missing_ok=True)
            elif entry.name.endswith(_SUFFIX) and entry.is_file():
                stat = entry.stat()
                found.append((stat.st_mtime, entry.name[: -len(_SUFFIX)], stat.st_size))
    found.sort()
    return found


class ChunkCache:
    """Chunks of remote objects on local disk, LRU within ``max_bytes``; see the module doc.

    ``async with ChunkCache(...) as cache`` (or ``await cache.open()`` … ``await cache.aclose()``,
    idempotent). A closed cache cannot be reopened.
    """

    def __init__(
        self,
        *,
        objects: ObjectStore,
        directory: Path,
        max_bytes: int,
        chunk_size: int,
        readahead_chunks: int = 2,
        fetch_timeout_s: float = 30.0,
        max_concurrent_fetches: int = 16,
        memory_chunks: int = 4,
        metrics: Metrics | None = None,
    ) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, not {chunk_size}")
        if max_bytes < chunk_size:
            raise ValueError(f"max_bytes ({max_bytes}) must hold one chunk ({chunk_size})")
        if fetch_timeout_s <= 0 or max_concurrent_fetches < 1 or readahead_chunks < 0:
            raise ValueError("fetch_timeout_s > 0, max_concurrent_fetches >= 1, readahead >= 0")
        self._objects = objects
        self.directory = directory
        self.max_bytes = max_bytes
        self.chunk_size = chunk_size
        self.readahead_chunks = readahead_chunks
        self._timeout_s = fetch_timeout_s
        self._slots = asyncio.Semaphore(max_concurrent_fetches)
        self._max_prefetching = max(1, max_concurrent_fetches // 2)
        self._prefetching = 0
        self._metrics = metrics
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[str, asyncio.Task[bytes]] = {}
        #: chunks fetched and being written to disk, served from memory meanwhile
        self._writing: dict[str, bytes] = {}
        #: the last chunks fetched, kept in memory too: a sequential reader reads them right
        #: after the GET, and need not wait for the disk (bounded: ``memory_chunks``)
        self._recent: OrderedDict[str, bytes] = OrderedDict()
        self._memory_chunks = memory_chunks
        #: evicted while still being written: counted until the writer removes the file
        self._doomed: dict[str, int] = {}
        self._writers: set[asyncio.Task[None]] = set()
        #: the copy number of each cached chunk (assigned on first use)
        self._copies: dict[str, int] = {}
        self._next_copy = 0
        self._state = _State.NEW

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Index the chunks already on disk (oldest first) and evict down to the budget."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"ChunkCache.open on a cache that is {self._state.value}")
        found = await asyncio.to_thread(_scan, self.directory)
        for _mtime, name, size in found:
            self._lru[name] = size
            self._bytes += size
        await asyncio.to_thread(self._make_room, 0)
        self._state = _State.OPEN
        self._gauge()
        log.info("read_cache_opened", directory=str(self.directory), chunks=len(self._lru))

    async def aclose(self) -> None:
        """Cancel the GETs in flight and wait for them; idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._writers, return_exceptions=True)

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._state is not _State.OPEN:
            raise RuntimeError(f"ChunkCache is {self._state.value}")

    # -- what is cached ------------------------------------------------------------------

    @property
    def cached_bytes(self) -> int:
        """Bytes of the chunks on disk (and of chunks being written)."""
        return self._bytes

    @property
    def cached_chunks(self) -> int:
        """Chunks on disk."""
        return len(self._lru)

    def chunk_count(self, size: int) -> int:
        """How many chunks an object of ``size`` bytes has."""
        return -(-size // self.chunk_size)

    def is_cached(self, obj: ObjectRef, index: int) -> bool:
        """Whether chunk ``index`` of ``obj`` is on disk (or being written there)."""
        return self._name(obj.key, index) in self._lru

    async def idle(self) -> None:
        """Wait until no GET is in flight (read-ahead included); for tests and benchmarks."""
        while self._inflight or self._writers:
            await asyncio.gather(*self._inflight.values(), *self._writers, return_exceptions=True)

    def copy_id(self, obj: ObjectRef, index: int) -> int | None:
        """The number of the cached copy of chunk ``index`` of ``obj`` (None: not cached); it
        changes whenever the chunk is fetched again."""
        name = self._name(obj.key, index)
        if name not in self._lru:
            return None
        found = self._copies.get(name)
        if found is None:
            self._next_copy += 1
            found = self._copies[name] = self._next_copy
        return found

    async def open_chunk(self, obj: ObjectRef, index: int, copy: int) -> bytes | int | None:
        """Copy ``copy`` of chunk ``index`` of ``obj`` without reading it: its bytes when they
        are in memory, else a file descriptor opened on its file (the caller closes it); None
        when that copy is no longer cached. Refreshes the chunk's place in the LRU order."""
        self._check_open()
        name = self._name(obj.key, index)
        if self.copy_id(obj, index) != copy:
            return None
        self._lru.move_to_end(name)
        memory = self._writing.get(name) or self._recent.get(name)
        if memory is not None:
            return memory
        try:
            fd = await asyncio.to_thread(os.open, self._path(name), os.O_RDONLY)
        except FileNotFoundError:
            self._forget(name)
            return None
        if self._copies.get(name) != copy or name not in self._lru:
            os.close(fd)  # evicted (and maybe fetched again) while it was being opened
            return None
        self._count("hit")
        return fd

    def _name(self, key: str, index: int) -> str:
        digest = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
        return f"{digest}-{self.chunk_size:x}-{index}"

    def _path(self, name: str) -> Path:
        return self.directory / name[:2] / (name + _SUFFIX)

    # -- reading -------------------------------------------------------------------------

    async def read(
        self,
        obj: ObjectRef,
        start: int,
        length: int,
        *,
        readahead: bool = True,
        readahead_limit: int | None = None,
        follow: ObjectRef | None = None,
    ) -> bytes | memoryview:
        """Bytes ``[start, start + length)`` of ``obj``; the range must lie within one chunk
        (a view of the chunk when it is in memory, else bytes read from disk).

        With ``readahead``, GETs of the next chunks start: chunks that start before
        ``readahead_limit`` (a byte position) when one is given, else up to the object's end and
        on into ``follow``.
        Raises the object store's errors, :class:`StorageTimeoutError` after the deadline, and
        :class:`RemoteDataError` when the object is shorter than ``obj.size``.
        """
        self._check_open()
        size = self.chunk_size
        index = start // size
        chunk_start = index * size
        chunk_end = min(chunk_start + size, obj.size)
        if start < 0 or length <= 0 or start + length > chunk_end:
            raise ValueError(
                f"range {start}+{length} is not within one chunk of {obj.key} ({obj.size} bytes)"
            )
        ahead = readahead and self.readahead_chunks > 0
        name = self._name(obj.key, index)
        written = self._writing.get(name) or self._recent.get(name)
        if written is not None:
            if name in self._lru:
                self._lru.move_to_end(name)
            if ahead:
                self._read_ahead(obj, index, follow, readahead_limit)
            self._count("hit")
            offset = start - chunk_start
            return memoryview(written)[offset : offset + length]
        if name in self._lru:
            self._lru.move_to_end(name)
            if ahead:
                self._read_ahead(obj, index, follow, readahead_limit)
            try:
                data = await asyncio.to_thread(
                    _pread, self._path(name), start - chunk_start, length
                )
            except FileNotFoundError:
                data = b""
            if len(data) == length:
                self._count("hit")
                return data
            self._forget(name)  # vanished or short: fetch it again
        task = self._inflight.get(name)
        if task is None:
            self._count("miss")
            task = self._spawn(obj, index, "demand")  # before read-ahead: it is needed first
        else:
            self._count("joined")
        if ahead:
            self._read_ahead(obj, index, follow, readahead_limit)
        chunk = await asyncio.shield(task)
        offset = start - chunk_start
        return memoryview(chunk)[offset : offset + length]

    def prefetch(self, obj: ObjectRef, index: int) -> None:
        """Start fetching chunk ``index`` of ``obj`` unless it is cached or in flight."""
        self._check_open()
        if 0 <= index < self.chunk_count(obj.size):
            self._start_prefetch(obj, index)

    def _read_ahead(
        self, obj: ObjectRef, index: int, follow: ObjectRef | None, limit: int | None
    ) -> None:
        count = self.chunk_count(obj.size)
        if limit is not None:
            count = min(count, self.chunk_count(limit))
            follow = None
        for ahead in range(index + 1, index + 1 + self.readahead_chunks):
            target, target_index = obj, ahead
            if ahead >= count:
                if follow is None or ahead - count >= self.chunk_count(follow.size):
                    return
                target, target_index = follow, ahead - count
            if not self._start_prefetch(target, target_index):
                return

    def _start_prefetch(self, obj: ObjectRef, index: int) -> bool:
        """False when read-ahead has all the GETs it may have."""
        name = self._name(obj.key, index)
        if name in self._lru or name in self._inflight or name in self._writing:
            return True
        if self._prefetching >= self._max_prefetching:
            return False
        self._prefetching += 1
        task = self._spawn(obj, index, "prefetch")
        task.add_done_callback(self._prefetch_done)
        return True

    def _prefetch_done(self, _task: asyncio.Task[bytes]) -> None:
        self._prefetching -= 1

    def _spawn(self, obj: ObjectRef, index: int, kind: str) -> asyncio.Task[bytes]:
        name = self._name(obj.key, index)
        task = asyncio.create_task(self._fetch(obj, index, name, kind), name=f"chunk {name}")
        self._inflight[name] = task
        task.add_done_callback(functools.partial(self._fetch_done, name))
        return task

    def _fetch_done(self, name: str, task: asyncio.Task[bytes]) -> None:
        if self._inflight.get(name) is task:
            del self._inflight[name]  # ended either way: a failure is never cached
        if not task.cancelled():
            task.exception()  # retrieved here: waiters see it, read-ahead only counts it

    async def _fetch(self, obj: ObjectRef, index: int, name: str, kind: str) -> bytes:
        start = index * self.chunk_size
        end = min(start + self.chunk_size, obj.size) - 1
        async with self._slots:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._timeout_s):
                    data = await self._objects.get_range(obj.key, start, end)
            except TimeoutError as exc:
                self._fetched(kind, "timeout")
                raise StorageTimeoutError(
                    f"GET {obj.key} bytes {start}-{end} took more than {self._timeout_s} s"
                ) from exc
            except BaseException:
                self._fetched(kind, "error")
                raise
        if len(data) != end - start + 1:
            self._fetched(kind, "error")
            raise RemoteDataError(
                f"{obj.key} is shorter than its metadata says ({obj.size} bytes): bytes "
                f"{start}-{end} returned {len(data)}"
            )
        self._fetched(kind, "ok", seconds=time.monotonic() - started, size=len(data))
        if self._state is _State.OPEN:
            # waiters get the bytes now; the disk write runs behind, served from memory
            # in the LRU order from now (reads come from memory until the file is written)
            self._writing[name] = data
            if self._memory_chunks:
                self._recent[name] = data
                while len(self._recent) > self._memory_chunks:
                    self._recent.popitem(last=False)
            self._make_room(len(data))
            self._copies.pop(name, None)  # a new copy
            self._lru[name] = len(data)
            self._bytes += len(data)
            self._gauge()
            writer = asyncio.create_task(self._store(name, data), name=f"write {name}")
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        return data

    async def _store(self, name: str, data: bytes) -> None:
        try:
            await asyncio.to_thread(_write_chunk, self._path(name), data)
        except OSError as exc:
            log.warning("read_cache_write_failed", error=str(exc))
            self._forget(name)
            return
        finally:
            self._writing.pop(name, None)
            doomed = self._doomed.pop(name, None)
            if doomed is not None:
                self._bytes -= doomed
        if name not in self._lru:  # evicted (or the cache closed) while it was being written
            self._path(name).unlink(missing_ok=True)
            self._gauge()

    def _make_room(self, incoming: int) -> None:
        """Evict least recently used chunks until ``incoming`` more bytes fit. The files are
        unlinked at once (a metadata operation of microseconds), so the disk never holds more
        than the budget, whatever order the writes finish in."""
        evicted = 0
        while self._lru and self._bytes + incoming > self.max_bytes:
            name, size = self._lru.popitem(last=False)
            self._recent.pop(name, None)
            self._copies.pop(name, None)
            evicted += 1
            if name in self._writing:
                self._doomed[name] = size
                continue
            self._bytes -= size
            self._path(name).unlink(missing_ok=True)
        if evicted and self._metrics is not None:
            self._metrics.read_cache_evictions.inc(evicted)

    def _forget(self, name: str) -> None:
        self._recent.pop(name, None)
        self._copies.pop(name, None)
        size = self._lru.pop(name, None)
        if size is not None:
            self._bytes -= size
            self._gauge()

    def invalidate(self, obj: ObjectRef, start: int, end_inclusive: int) -> None:
        """Forget the chunks holding bytes ``start..end_inclusive`` (e.g. after a CRC failure);
        their files are replaced by the next fetch."""
        for index in range(start // self.chunk_size, end_inclusive // self.chunk_size + 1):
            self._forget(self._name(obj.key, index))

    # -- metrics -------------------------------------------------------------------------

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.read_cache_lookups.labels(result).inc()

    def _fetched(self, kind: str, outcome: str, *, seconds: float = 0.0, size: int = 0) -> None:
        if self._metrics is None:
            return
        self._metrics.read_fetches.labels(kind, outcome).inc()
        if outcome == "ok":
            self._metrics.read_fetch_bytes.inc(size)
            self._metrics.read_fetch_seconds.observe(seconds)

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.read_cache_bytes.set(self._bytes)


class MemoryCache(Generic[K, V]):
    """Parsed objects in memory, LRU within ``max_weight``; loads are single-flight and a failed
    load is never cached. :meth:`aclose` cancels loads in flight (idempotent)."""

    def __init__(self, *, max_weight: int, metrics: Metrics | None = None) -> None:
        if max_weight < 0:
            raise ValueError(f"max_weight must be >= 0, not {max_weight}")
        self.max_weight = max_weight
        self._metrics = metrics
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._loading: dict[K, asyncio.Task[V]] = {}
        self._closed = False

    @property
    def weight(self) -> int:
        """The summed weight of the cached values."""
        return self._weight

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    async def get(self, key: K, load: Callable[[], Awaitable[V]], weigh: Callable[[V], int]) -> V:
        """The cached value of ``key``, or ``load()``'s (shared by concurrent callers)."""
        if self._closed:
            raise RuntimeError("MemoryCache is closed")
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            self._count("hit")
            return found[0]
        task = self._loading.get(key)
        if task is None:
            self._count("miss")
            task = asyncio.create_task(self._load(key, load, weigh))
            self._loading[key] = task
            task.add_done_callback(functools.partial(self._loaded, key))
        return await asyncio.shield(task)

    def warm(self, key: K, load: Callable[[], Awaitable[V]], weigh: Callable[[V], int]) -> None:
        """Start loading ``key`` in the background unless it is cached or loading (read-ahead
        of the next segment's index); a failure is forgotten."""
        if self._closed or key in self._items or key in self._loading:
            return
        task = asyncio.create_task(self._load(key, load, weigh))
        self._loading[key] = task
        task.add_done_callback(functools.partial(self._loaded, key))

    async def _load(self, key: K, load: Callable[[], Awaitable[V]], weigh: Callable[[V], int]) -> V:
        value = await load()
        weight = max(1, weigh(value))
        if weight <= self.max_weight and not self._closed:
            self._items[key] = (value, weight)
            self._weight += weight
            while self._weight > self.max_weight:
                _, (_, dropped) = self._items.popitem(last=False)
                self._weight -= dropped
        return value

    def _loaded(self, key: K, task: asyncio.Task[V]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled():
            task.exception()

    def discard(self, key: K) -> None:
        """Forget ``key`` (the next ``get`` loads it again)."""
        found = self._items.pop(key, None)
        if found is not None:
            self._weight -= found[1]

    async def aclose(self) -> None:
        """Cancel loads in flight; idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._loading.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.read_index_lookups.labels(result).inc()
