"""The read path's caches: remote objects in chunks on local disk, and small parsed objects
(manifests, offset and time indexes) in memory.

:class:`ChunkCache` keeps fixed-size chunks of remote objects under one directory, bounded in
bytes, least recently used evicted first (Aiven's ``DiskChunkCache``, Kafka's
``RemoteIndexCache`` file handling):

* **single flight**: concurrent reads of one chunk share one ranged GET. The cache keeps the
  fetch *task* while it runs and forgets it when it ends, so a failure reaches every waiter and is
  never cached: the next read starts a new GET.
* **read-ahead**: a read of chunk *i* starts GETs of the next ``readahead_chunks`` chunks (going
  on into the ``follow`` objects, the next segments, past the end of this one), so a sequential
  reader finds them fetched or in flight. A reader seen to go on chunk after chunk of an object
  (its reads went from chunk *i* to *i + 1*) is read ahead deeper, two groups of
  ``group_chunks`` chunks (by default 16 MiB of chunks, at most 16, a group), and consecutive
  missing chunks are fetched ``group_chunks`` at a time with one ranged GET: each GET costs the
  S3 client (botocore) milliseconds of CPU, so a sequential read makes fewer, larger GETs. The
  chunks of a group GET are cached one by one, as if fetched alone; its failure reaches the
  waiters of every chunk. A sequential reader that has to wait for a chunk its read-ahead
  already asked for is faster than the GETs ahead of it can deliver (a far object store: each
  GET's first-byte latency, and a connection's throughput, about 90 MB/s on Amazon S3), so its
  read-ahead doubles, up to every GET read-ahead may have, as long as each doubling made it
  read at least a quarter faster; a depth that did not is given up for the one before (an
  object store on the same host: the waits are the CPU that the GETs take, and more GETs only
  compete for it). It starts at two groups, and is measured again, when the reader jumps.
* **deadlines and bounds**: every GET has a deadline (``fetch_timeout_s``, retries included);
  at most ``max_concurrent_fetches`` GETs run at once, and read-ahead takes at most half of them.
* **memory**: the last ``memory_chunks`` chunks fetched (at least three groups) stay in memory
  too (a sequential reader reads a chunk right after its GET), and a chunk being written is
  served from memory. The writes behind are bounded (``max_pending_write_bytes``): when the disk
  is slower than S3 and the bound is reached, a fetched chunk is served from memory only and not
  written (counted in ``read_cache_writes_skipped_total``) rather than queued without limit.
* **files**: ``<dir>/<ab>/<blake2b(key)>-<chunk size>-<index>.chunk``, written to ``.tmp`` and
  renamed, so a file with the final name is complete (a ``.tmp`` whose rename fails is removed
  at once; one the filesystem will not remove stays in the byte count, as an evicted file that
  cannot be removed does, until a later eviction removes it). The chunks of one group GET go
  in one file, ``...-<index>+<count>.chunk`` (at most an eighth of the budget): each new file costs
  the filesystem an inode, and on the test VM's ext4, after many deletions, creating one took
  about 0.9 ms of CPU, a tenth of the read server's CPU in a cold sequential read of 4 MiB
  chunks. Such a file is cached, evicted and forgotten whole (a CRC failure in one of its
  chunks drops it all). Opening the cache rescans the directory
  (oldest first), removes ``.tmp`` leftovers and evicts down to the budget. A file that vanished
  or is short is fetched again. One process per directory: an open cache holds an
  exclusive ``flock`` of ``<dir>/.lock``, and a second process's cache refuses to open
  (:class:`~sidecar.errors.CacheDirInUseError`) rather than evict the first one's files
  and remove its ``.tmp`` files mid-write. While the cache fills, files are written with
  ``O_DIRECT`` and read back into the page cache (``direct_io``, see ``_direct``): a tenth of
  the CPU of a buffered write into fresh pages on the test VM's ext4. At its budget each write
  follows an eviction whose pages a buffered write reuses, at about half the CPU of ``O_DIRECT``
  and the read-back: from then on writes are buffered. A filesystem that refuses
  ``O_DIRECT`` gets buffered writes.
* **copies**: each cached copy of a chunk has a number (:meth:`ChunkCache.copy_id`) that changes
  when the chunk is evicted or invalidated and fetched again, so a caller that checked a copy's
  bytes (the read service verifies CRCs) can tell later that it still holds those bytes, and
  send them without reading them (:meth:`ChunkCache.open_chunk`: the chunk in memory, or an
  open file descriptor for ``sendfile``).

:class:`MemoryCache` is the same single-flight, never-cache-a-failure rule for parsed objects,
bounded by a weight (bytes).

This module knows nothing of Kafka formats or HTTP; blocking file work runs in worker threads.
The chunk writes have threads of their own (:data:`WRITE_THREADS`): a cold sequential read keeps
several 16 MiB writes going, and in the shared default executor every other piece of file work
of the process (opening a chunk file for ``sendfile``, reading one back) queued behind them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import fcntl
import functools
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Generic, NamedTuple, Self, TypeVar

from sidecar.errors import CacheDirInUseError
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.readserver._direct import write_file
from sidecar.readserver.errors import RemoteDataError, StorageTimeoutError
from sidecar.storage.base import ObjectStore

__all__ = ["WRITE_THREADS", "ChunkCache", "ChunkFile", "MemoryCache", "ObjectRef", "WrittenChunk"]

log = get_logger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_SUFFIX = ".chunk"
_TMP_SUFFIX = ".tmp"
#: the mode of the cache's subdirectories (less the umask), as its files' (``_direct``)
_DIR_MODE = 0o750
#: the file in the cache's directory whose ``flock`` the open cache holds (one per directory)
_LOCK_NAME = ".lock"
#: the bytes a sequential reader's read-ahead fetches with one GET, by default
_GROUP_BYTES = 16 * 1024 * 1024
#: ... and at most this many chunks (small chunks: read-ahead looks at 2 groups per read)
_GROUP_CHUNKS = 16
#: objects whose last chunk read is remembered (to tell sequential readers)
_READERS_REMEMBERED = 4096
#: groups a sequential reader reads ahead at first (it gets more when it has to wait)
_READAHEAD_GROUPS = 2
#: a deeper read-ahead is kept only if the reader reads at least this much faster with it
_DEEPER_GAIN = 1.25
#: a chunk in memory: its own bytes, or a view of a GET's body that held several chunks
_Chunk = bytes | memoryview
#: files that could not be removed, tried again per eviction that needs room (at most)
_RETRY_FILES = 8
#: threads that write chunk files, per cache (a cold read at 200 MiB/s keeps one or two busy)
WRITE_THREADS = 4


@functools.lru_cache(maxsize=65536)
def _chunk_name(key: str, chunk_size: int, index: int) -> str:
    digest = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
    return f"{digest}-{chunk_size:x}-{index}"


def _members(file: str) -> tuple[str, ...]:
    """The chunk names a file of the cache holds: ``<prefix>-<index>`` alone, or
    ``<prefix>-<index>+<count>`` for ``count`` chunks from ``index``."""
    prefix, _, position = file.rpartition("-")
    first, plus, count = position.partition("+")
    if not plus or not first.isdigit() or not count.isdigit() or int(count) < 1:
        return (file,)
    start = int(first)
    return tuple(f"{prefix}-{i}" for i in range(start, start + int(count)))


class ChunkFile(NamedTuple):
    """A cached chunk on disk: an open file descriptor (the caller closes it) and the chunk's
    first byte in that file."""

    fd: int
    offset: int


class WrittenChunk(NamedTuple):
    """Where a cached chunk is on disk, not opened: the file (complete under that name, never
    rewritten in place: a file fetched again replaces it by a rename) and the chunk's first
    byte in it."""

    path: Path
    offset: int


class ObjectRef(NamedTuple):
    """A remote object and its size in bytes (known from the metadata, never asked for)."""

    key: str
    size: int


class _Probe:
    """How fast one sequential reader goes at its read-ahead depth: chunks read since
    ``since``, the rate it had at the depth before (None: its first group, not measured; 0.0:
    measuring its first depth), and whether a deeper read-ahead was found to read no faster
    (then it stays where it is)."""

    __slots__ = ("rate_before", "reads", "settled", "since")

    def __init__(self, since: float) -> None:
        self.since = since
        self.reads = 0
        self.rate_before: float | None = None
        self.settled = False


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


def _write_tmp(path: Path, data: bytes | memoryview, tag: int, direct: bool) -> tuple[Path, bool]:
    """Write ``data`` next to ``path`` under a name of its own (``tag``), around the page cache
    when ``direct`` (see ``_direct``); the caller renames it to ``path`` if it is still the
    chunk's current copy. Returns the file and whether it was written with ``O_DIRECT``."""
    path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{tag}{_TMP_SUFFIX}")
    return tmp, write_file(tmp, data, direct=direct)


def _lock(directory: Path) -> int | None:
    """Create ``directory`` and take its lock: an exclusive ``flock`` of its ``.lock`` file,
    held while the returned fd is open (the kernel drops it when the process dies, so a crash
    leaves no stale lock). :class:`CacheDirInUseError` when another process holds it; None,
    logged, when the lock cannot be had at all (a filesystem without locks, a lock file that
    cannot be created): the cache then runs without it."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        _unlocked(directory, exc)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise CacheDirInUseError(
            f"read_server.cache_dir {directory}: another process (a running sidecar or read"
            " server) uses it; stop it, or give each process a cache directory of its own"
        ) from exc
    except OSError as exc:
        os.close(fd)
        _unlocked(directory, exc)
        return None
    return fd


def _unlocked(directory: Path, exc: OSError) -> None:
    log.warning(
        "read_cache_unlocked",
        directory=str(directory),
        error=str(exc),
        detail="the cache directory cannot be locked: nothing stops a second process from"
        " using it too",
    )


def _scan(directory: Path) -> list[tuple[float, str, int]]:
    """(mtime, name, size) of every chunk file, oldest first; ``.tmp`` leftovers are removed."""
    directory.mkdir(parents=True, exist_ok=True)
    found: list[tuple[float, str, int]] = []
    for sub in directory.iterdir():
        if not sub.is_dir():
            continue
        for entry in os.scandir(sub):
            if entry.name.endswith(_TMP_SUFFIX):
                try:
                    Path(entry.path).unlink(missing_ok=True)
                except OSError as exc:  # not a chunk file: never served, only left behind
                    log.warning("read_cache_unlink_failed", file=entry.name, error=str(exc))
            elif entry.name.endswith(_SUFFIX) and entry.is_file():
                stat = entry.stat()
                found.append((stat.st_mtime, entry.name[: -len(_SUFFIX)], stat.st_size))
    found.sort()
    return found


class _Arrival:
    """The bytes of one GET as they arrive (:class:`~sidecar.storage.base.Arrivals`), for
    readers that take them before the GET ends (:meth:`ChunkCache.read` with ``early``)."""

    __slots__ = ("_waiters", "body", "count", "ended")

    def __init__(self) -> None:
        self.body: memoryview | None = None
        self.count = 0
        self.ended = False
        #: readers waiting: the bytes each needs in, and where it gets the body that has them
        self._waiters: list[tuple[int, asyncio.Future[memoryview | None]]] = []

    def receiving(self, body: memoryview) -> None:
        self.body, self.count = body, 0  # a GET made again starts over, in a new body

    def arrived(self, count: int) -> None:
        self.count = count
        if self._waiters:
            self._wake()

    def end(self) -> None:
        """The GET ended (either way): its waiters go on to its result."""
        self.ended = True
        self.body = None
        self._wake()

    def _wake(self) -> None:
        # a waiter gets the body that has its bytes now: the next attempt's may not yet
        waiting: list[tuple[int, asyncio.Future[memoryview | None]]] = []
        for needed, woken in self._waiters:
            if not self.ended and (self.body is None or needed > self.count):
                waiting.append((needed, woken))
            elif not woken.done():  # a reader cancelled meanwhile is done already
                woken.set_result(self.body)
        self._waiters = waiting

    async def until(self, end: int) -> memoryview | None:
        """A body whose bytes ``[0, end)`` are in; None when the GET ended first."""
        if self.ended:
            return None
        if self.body is not None and self.count >= end:
            return self.body
        woken: asyncio.Future[memoryview | None] = asyncio.get_running_loop().create_future()
        self._waiters.append((end, woken))
        return await woken


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
        group_chunks: int | None = None,
        max_pending_write_bytes: int = 256 * 1024 * 1024,
        direct_io: bool = True,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, not {chunk_size}")
        if max_bytes < chunk_size:
            raise ValueError(f"max_bytes ({max_bytes}) must hold one chunk ({chunk_size})")
        if fetch_timeout_s <= 0 or max_concurrent_fetches < 1 or readahead_chunks < 0:
            raise ValueError("fetch_timeout_s > 0, max_concurrent_fetches >= 1, readahead >= 0")
        if group_chunks is None:
            group_chunks = max(1, min(_GROUP_CHUNKS, _GROUP_BYTES // chunk_size))
        if group_chunks < 1:
            raise ValueError(f"group_chunks must be >= 1, not {group_chunks}")
        if max_pending_write_bytes < 0:
            raise ValueError(f"max_pending_write_bytes must be >= 0, not {max_pending_write_bytes}")
        self._objects = objects
        self._write_threads = concurrent.futures.ThreadPoolExecutor(
            WRITE_THREADS, thread_name_prefix="chunk-cache-write"
        )
        self.directory = directory
        self.max_bytes = max_bytes
        self.chunk_size = chunk_size
        self.readahead_chunks = readahead_chunks
        #: chunks a sequential reader's read-ahead fetches with one GET (1: no groups)
        self.group_chunks = group_chunks if readahead_chunks > 0 else 1
        self._timeout_s = fetch_timeout_s
        self._slots = asyncio.Semaphore(max_concurrent_fetches)
        self._max_prefetching = max(1, max_concurrent_fetches // 2)
        self._prefetching = 0
        self._metrics = metrics
        #: the files on disk (or being written), least recently used first: name -> bytes
        self._lru: OrderedDict[str, int] = OrderedDict()
        #: every cached chunk: the file that holds it and its first byte there
        self._file_of: dict[str, tuple[str, int]] = {}
        self._bytes = 0
        #: the chunks being fetched: each resolves when the GET that fetches it ends
        self._inflight: dict[str, asyncio.Future[_Chunk]] = {}
        #: the GETs in flight (one may fetch several chunks)
        self._gets: set[asyncio.Task[list[_Chunk]]] = set()
        #: each chunk being fetched: its GET's bytes as they arrive, and where it starts there
        self._arrivals: dict[str, tuple[_Arrival, int]] = {}
        #: chunks fetched and being written to disk, served from memory meanwhile
        self._writing: dict[str, _Chunk] = {}
        #: the last chunks fetched, kept in memory too: a sequential reader reads them right
        #: after the GET, and need not wait for the disk (bounded: ``memory_chunks``)
        self._recent: OrderedDict[str, _Chunk] = OrderedDict()
        #: object key -> (the last chunk read, whether the reads went on chunk after chunk, the
        #: groups a sequential reader of it reads ahead)
        self._last_read: OrderedDict[str, tuple[int, bool, int]] = OrderedDict()
        #: object key -> how fast its sequential reader goes at its depth (shared with the
        #: objects it goes on into)
        self._probes: dict[str, _Probe] = {}
        self._clock = clock
        #: a sequential reader's read-ahead fetches two groups ahead of the one it reads: those
        #: three stay in memory, so it reads none of them back from disk (at first: a reader
        #: whose read-ahead deepened may)
        self._memory_chunks = (
            max(memory_chunks, (_READAHEAD_GROUPS + 1) * self.group_chunks) if memory_chunks else 0
        )
        #: chunks one file holds at most: a group, unless that is more than an eighth of the
        #: budget (a file is evicted whole)
        self._file_chunks = max(1, min(self.group_chunks, max_bytes // (8 * chunk_size)))
        #: files evicted while still being written, by (file, write tag): counted until that
        #: write ends (a file fetched again may be evicted again while both writes run)
        self._doomed: dict[tuple[str, int], int] = {}
        #: files evicted or forgotten (or ``.tmp`` files whose rename failed) that the
        #: filesystem refused to remove, and their sizes: still on disk, so still in ``_bytes``
        #: (see ``_unlink``)
        self._stranded: dict[Path, int] = {}
        self._writers: set[asyncio.Task[None]] = set()
        #: bytes held by the writes in flight, at most ``_max_pending`` (one write always may)
        self._pending_write_bytes = 0
        self._max_pending = max_pending_write_bytes
        #: chunk files are written with O_DIRECT until the filesystem refuses it once
        self._direct = direct_io
        #: file opens in worker threads, and those whose caller was cancelled (their fd is
        #: closed when it arrives)
        self._opening: set[asyncio.Task[int]] = set()
        self._unclaimed: set[asyncio.Task[int]] = set()
        #: the write of each file's current copy (a forgotten or evicted copy's write never
        #: becomes the file, whatever order the writes end in)
        self._write_tags: dict[str, int] = {}
        self._next_tag = 0
        #: the copy number of each cached chunk (assigned on first use)
        self._copies: dict[str, int] = {}
        self._next_copy = 0
        #: the fd whose flock keeps other processes out of ``directory`` while open
        self._lock_fd: int | None = None
        self._state = _State.NEW

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Lock the directory (:class:`~sidecar.errors.CacheDirInUseError` when another
        process has it), index the chunks already on disk (oldest first) and evict down to
        the budget."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"ChunkCache.open on a cache that is {self._state.value}")
        # on the loop, not in a thread: a cancelled await would leave the thread's flock held
        # by an fd nobody closes (a mkdir, an open and a non-blocking flock, once at start)
        self._lock_fd = _lock(self.directory)
        try:
            found = await asyncio.to_thread(_scan, self.directory)
            for _mtime, file, size in found:
                self._add_file(file, size)
            await asyncio.to_thread(self._make_room, 0)
        except BaseException:
            self._unlock()
            raise
        self._state = _State.OPEN
        self._gauge()
        log.info("read_cache_opened", directory=str(self.directory), chunks=len(self._file_of))

    async def aclose(self) -> None:
        """Cancel the GETs in flight and wait for them; idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        try:
            gets = list(self._gets)
            for task in gets:
                task.cancel()
            await asyncio.gather(*gets, *self._writers, *self._opening, return_exceptions=True)
            for future in list(self._inflight.values()):
                future.cancel()
            while self._writers:  # writes a GET that ended meanwhile started
                await asyncio.gather(*self._writers, return_exceptions=True)
            self._write_threads.shutdown(wait=False)  # no write is left to run
        finally:
            self._unlock()  # a cancelled close too: a later aclose returns at once

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

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
        return len(self._file_of)

    def chunk_count(self, size: int) -> int:
        """How many chunks an object of ``size`` bytes has."""
        return -(-size // self.chunk_size)

    def is_cached(self, obj: ObjectRef, index: int) -> bool:
        """Whether chunk ``index`` of ``obj`` is on disk (or being written there)."""
        return self._name(obj.key, index) in self._file_of

    def resident(self, obj: ObjectRef, index: int) -> bool:
        """Whether chunk ``index`` of ``obj`` is in memory or being fetched (a read of it then
        returns a view of memory, whatever its length)."""
        name = self._name(obj.key, index)
        return name in self._writing or name in self._recent or name in self._inflight

    async def idle(self) -> None:
        """Wait until no GET is in flight (read-ahead included); for tests and benchmarks."""
        while self._gets or self._inflight or self._writers or self._opening:
            await asyncio.gather(
                *self._gets,
                *self._inflight.values(),
                *self._writers,
                *self._opening,
                return_exceptions=True,
            )

    def copy_id(self, obj: ObjectRef, index: int) -> int | None:
        """The number of the cached copy of chunk ``index`` of ``obj`` (None: not cached); it
        changes whenever the chunk is fetched again."""
        name = self._name(obj.key, index)
        if name not in self._file_of:
            return None
        found = self._copies.get(name)
        if found is None:
            self._next_copy += 1
            found = self._copies[name] = self._next_copy
        return found

    async def open_chunk(
        self, obj: ObjectRef, index: int, copy: int
    ) -> bytes | memoryview | ChunkFile | None:
        """Copy ``copy`` of chunk ``index`` of ``obj`` without reading it: its bytes when they
        are in memory, else a file descriptor opened on its file and where the chunk starts
        there (the caller closes it); None when that copy is no longer cached, or its file
        cannot be opened (then it is forgotten, and fetched again when next read). Refreshes
        the chunk's place in the LRU order."""
        self._check_open()
        name = self._name(obj.key, index)
        if self.copy_id(obj, index) != copy:
            return None
        file, offset = self._file_of[name]
        self._lru.move_to_end(file)
        memory = self._writing.get(name)
        if memory is None:
            memory = self._recent.get(name)
        if memory is not None:
            return memory
        try:
            fd = await self._open_file(self._path(file))
        except FileNotFoundError:
            self._forget(name)
            return None
        except OSError as exc:  # EACCES, EIO, no fds left: the bucket still has it
            log.warning("read_cache_read_failed", file=file, error=str(exc))
            self._forget(name)
            return None
        if self._copies.get(name) != copy or name not in self._file_of:
            os.close(fd)  # evicted (and maybe fetched again) while it was being opened
            return None
        self._count("hit")
        return ChunkFile(fd, offset)

    def written_chunk(self, obj: ObjectRef, index: int, copy: int) -> WrittenChunk | None:
        """Where copy ``copy`` of chunk ``index`` of ``obj`` is on disk, for a reader that opens
        the file itself: None unless that copy is cached and its file written (renamed into
        place). Nothing is opened here, so nothing holds the file: it may be evicted as soon
        as this returns, and its reader must expect that. Refreshes the chunk's place in the
        LRU order."""
        self._check_open()
        name = self._name(obj.key, index)
        if self.copy_id(obj, index) != copy or name in self._writing:
            return None
        file, offset = self._file_of[name]
        self._lru.move_to_end(file)
        self._count("hit")
        return WrittenChunk(self._path(file), offset)

    async def _open_file(self, path: Path) -> int:
        """``os.open`` in a worker thread. The thread cannot be stopped: if the caller is
        cancelled meanwhile, the fd it opens is closed when it arrives instead of leaking."""
        opening = asyncio.create_task(asyncio.to_thread(os.open, path, os.O_RDONLY))
        self._opening.add(opening)
        opening.add_done_callback(self._opened)
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            self._unclaimed.add(opening)
            if opening.done():  # its callback may have run already: close it here
                self._opened(opening)
            raise

    def _opened(self, opening: asyncio.Task[int]) -> None:
        """An open ended: one whose caller was cancelled gets its fd closed here."""
        if opening in self._unclaimed:
            self._unclaimed.discard(opening)
            if not opening.cancelled() and opening.exception() is None:
                os.close(opening.result())
        self._opening.discard(opening)

    def _name(self, key: str, index: int) -> str:
        return _chunk_name(key, self.chunk_size, index)

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
        follow: tuple[ObjectRef, ...] = (),
        early: bool = False,
    ) -> bytes | memoryview:
        """Bytes ``[start, start + length)`` of ``obj``; the range must lie within one chunk
        (a view of the chunk when it is in memory, else bytes read from disk).

        With ``early``, a chunk being fetched is read as its GET's bytes arrive: the call
        returns once the range is in, before the rest of the chunk (or of a group GET). The
        bytes are the store's answer to that GET, checked against the range asked for; the GET
        may still fail after them (an object shorter than ``obj.size`` fails only the reads
        past its end), and a reader that goes on then gets its error.

        With ``readahead``, GETs of the next chunks start: chunks that start before
        ``readahead_limit`` (a byte position) when one is given, else up to the object's end and
        on into the objects of ``follow`` (the next segments, in order).
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
        sequential = ahead and self._note_read(obj.key, index)
        name = self._name(obj.key, index)
        written = self._writing.get(name) or self._recent.get(name)
        where = self._file_of.get(name)
        if written is not None:
            if where is not None:
                self._lru.move_to_end(where[0])
            if ahead:
                self._read_ahead(obj, index, follow, readahead_limit, sequential)
            offset = start - chunk_start
            if len(written) >= offset + length:
                self._count("hit")
                return memoryview(written)[offset : offset + length]
            self._forget(name)  # shorter than the object's size says: fetch it again
            where = None
        if where is not None:
            file, base = where
            self._lru.move_to_end(file)
            if ahead:
                self._read_ahead(obj, index, follow, readahead_limit, sequential)
            try:
                data = await asyncio.to_thread(
                    _pread, self._path(file), base + start - chunk_start, length
                )
            except FileNotFoundError:
                data = b""
            except OSError as exc:  # a bad sector, no fds left: the bucket still has it
                log.warning("read_cache_read_failed", file=file, error=str(exc))
                data = b""
            if len(data) == length:
                self._count("hit")
                return data
            self._forget(name)  # vanished, short or unreadable: fetch it again
        task = self._inflight.get(name)
        if task is not None and task.done() and (task.cancelled() or task.exception()):
            task = None  # a GET that just failed (not yet forgotten): a failure is not cached
        if task is None:
            self._count("miss")
            task = self._spawn(obj, index, 1, "demand")  # before read-ahead: needed first
        else:
            self._count("joined")
            if sequential:  # its read-ahead asked for this chunk, not early enough
                self._deepen(obj.key)
        if ahead:
            self._read_ahead(obj, index, follow, readahead_limit, sequential)
        arriving = self._arrivals.get(name) if early else None
        if arriving is not None:
            arrival, base = arriving
            at = base + start - chunk_start
            body = await arrival.until(at + length)
            if body is not None:
                if self._metrics is not None:
                    self._metrics.read_early_bytes.inc(length)
                return body[at : at + length]
        chunk = await asyncio.shield(task)
        offset = start - chunk_start
        if len(chunk) < offset + length:  # a GET made before the object's size was known
            self._forget(name)
            raise RemoteDataError(
                f"{obj.key} is shorter than its metadata says ({obj.size} bytes): chunk"
                f" {index} has {len(chunk)} bytes"
            )
        return memoryview(chunk)[offset : offset + length]

    def fetch_first(self, key: str) -> None:
        """Start the GET of the first chunk of ``key`` before its size is known (the first
        ``chunk_size`` bytes; the store ends the range at the object's end), unless it is
        cached or in flight: the indexes object of a segment whose manifest, which gives its
        size, is still on its way. A read that then names the object with its size joins
        that GET; one that finds fewer bytes than the size says gets :class:`RemoteDataError`."""
        self._check_open()
        if not self._present(self._name(key, 0)):
            self._spawn(ObjectRef(key, self.chunk_size), 0, 1, "prefetch", exact=False)

    def prefetch(self, obj: ObjectRef, index: int, count: int = 1) -> None:
        """Start fetching chunks ``index .. index + count - 1`` of ``obj`` that are neither
        cached nor in flight, consecutive missing ones with one GET (up to ``group_chunks``)."""
        self._check_open()
        end = min(index + count, self.chunk_count(obj.size))
        at = max(index, 0)
        while at < end:
            run = self._missing_run(obj.key, at, min(self.group_chunks, end - at))
            if run and not self._start_prefetch(obj, at, run):
                return
            at += max(run, 1)

    def read_ahead(
        self, obj: ObjectRef, start: int, end_inclusive: int, *, limit: int | None = None
    ) -> None:
        """Bytes ``start..end_inclusive`` of ``obj`` were served from cached chunks without
        :meth:`read` (a planned response): they count as reads of their chunks, and read-ahead
        starts as :meth:`read` would start it after the last one. So a sequential reader whose
        chunks arrive before it asks keeps its read-ahead in groups, as deep as it had it
        (without this it would fall back to single-chunk GETs, ``readahead_chunks`` ahead).
        ``limit`` is :meth:`read`'s ``readahead_limit``."""
        self._check_open()
        if self.readahead_chunks <= 0 or end_inclusive < start:
            return
        first, last = start // self.chunk_size, end_inclusive // self.chunk_size
        sequential = False
        for index in range(first, last + 1):
            sequential = self._note_read(obj.key, index)
        self._read_ahead(obj, last, (), limit, sequential)

    def go_on_into(self, obj: ObjectRef, following: ObjectRef) -> None:
        """The reader of ``obj`` is about to reach its end and go on into ``following`` (the
        next segment): fetch the first chunks of ``following`` now. A reader that goes through
        ``obj`` chunk after chunk is sequential in ``following`` from its first chunk, with
        the read-ahead it has, and gets a group; any other reader ``readahead_chunks``."""
        self._check_open()
        last = self._last_read.get(obj.key)
        count = self.readahead_chunks
        if last is not None and last[1]:
            count = max(count, self.group_chunks)
            self._goes_on(obj.key, following.key, last[2])
        self.prefetch(following, 0, max(1, count))

    def _goes_on(self, key: str, following: str, groups: int) -> None:
        """The sequential reader of ``key`` goes on into the object ``following``: it is
        sequential there too, with (at least) the ``groups`` of read-ahead it has here, and its
        depth measurement goes on with it. (The next read trims the readers remembered.)"""
        last, going_on, had = self._last_read.get(following, (-1, True, groups))
        self._last_read[following] = (last, going_on, max(had, groups))
        probe = self._probes.get(key)
        if probe is not None and following not in self._probes:
            self._probes[following] = probe

    def _note_read(self, key: str, index: int) -> bool:
        """Record a read of chunk ``index`` of ``key``; True when the reads of that object go
        on chunk after chunk (this one follows the last one read, or is it again)."""
        last = self._last_read.get(key)
        sequential = last is not None and (last[0] + 1 == index or (last[0] == index and last[1]))
        groups = last[2] if last is not None and sequential else _READAHEAD_GROUPS
        self._last_read[key] = (index, sequential, groups)
        self._last_read.move_to_end(key)
        probe = self._probes.get(key)
        if not sequential or probe is None:
            self._probes[key] = _Probe(self._clock())
        elif last is not None and last[0] != index:
            probe.reads += 1
            if probe.rate_before is None and probe.reads == self.group_chunks:
                # the first group's reads paid for the first GETs: the rate is measured after
                probe.since, probe.reads, probe.rate_before = self._clock(), 0, 0.0
        while len(self._last_read) > _READERS_REMEMBERED:
            gone, _ = self._last_read.popitem(last=False)
            self._probes.pop(gone, None)
        return sequential

    def _deepen(self, key: str) -> None:
        """The sequential reader of ``key`` waited for its read-ahead: twice the read-ahead, up
        to as many groups as read-ahead may have GETs, once it has read at its depth a while,
        and only while going deeper makes it read faster.

        A far object store needs the depth (each GET's first-byte latency, and a connection's
        throughput); on an object store on the same host the reader's waits are the CPU that
        the GETs themselves take, and more of them only compete for it. So each depth is
        measured (the chunks read per second over as many groups as it is deep), and a depth
        that read less than ``_DEEPER_GAIN`` times faster than the one before is given up for
        that one, for the rest of the reader's run."""
        index, sequential, groups = self._last_read[key]
        probe = self._probes.get(key)
        if probe is None or probe.settled or groups >= self._max_prefetching:
            return
        if probe.rate_before is None or probe.reads < groups * self.group_chunks:
            return  # this depth is not measured yet
        now = self._clock()
        rate = probe.reads / max(now - probe.since, 1e-9)
        if probe.rate_before and rate < _DEEPER_GAIN * probe.rate_before:
            probe.settled = True
            groups = max(_READAHEAD_GROUPS, groups // 2)
            self._count_depth("back")
        else:
            probe.since, probe.reads, probe.rate_before = now, 0, rate
            groups = min(2 * groups, self._max_prefetching)
            self._count_depth("deeper")
        self._last_read[key] = (index, sequential, groups)

    def readahead_groups(self, key: str) -> int:
        """The groups of read-ahead a sequential reader of ``key`` gets now."""
        last = self._last_read.get(key)
        return _READAHEAD_GROUPS if last is None else last[2]

    def _present(self, name: str) -> bool:
        return name in self._file_of or name in self._inflight or name in self._writing

    def _read_ahead(
        self,
        obj: ObjectRef,
        index: int,
        follow: tuple[ObjectRef, ...],
        limit: int | None,
        sequential: bool = False,
    ) -> None:
        count = self.chunk_count(obj.size)
        if limit is not None:
            count = min(count, self.chunk_count(limit))
            follow = ()
        depth, group = self.readahead_chunks, 1
        groups = self.readahead_groups(obj.key)
        if sequential:
            depth, group = max(depth, groups * self.group_chunks), self.group_chunks
        # chunks ahead count on through ``follow``: the objects after ``obj``, in order
        target, target_count, first = obj, count, 0  # ``first``: the chunk number of target's 0
        queue = iter(follow)
        ahead = index + 1
        while ahead < index + 1 + depth:
            while ahead - first >= target_count:
                following = next(queue, None)
                if following is None:
                    return
                first += target_count
                target, target_count = following, self.chunk_count(following.size)
                if sequential:
                    self._goes_on(obj.key, target.key, groups)
            target_index = ahead - first
            # a run of up to ``group`` missing chunks, fetched with one GET
            run = self._missing_run(
                target.key, target_index, min(group, target_count - target_index)
            )
            if run and not self._start_prefetch(target, target_index, run):
                return
            ahead += max(run, 1)

    def _missing_run(self, key: str, index: int, limit: int) -> int:
        """How many chunks from ``index`` of ``key`` (at most ``limit``) are neither cached nor
        in flight, one after the other."""
        run = 0
        while run < limit and not self._present(self._name(key, index + run)):
            run += 1
        return run

    def _start_prefetch(self, obj: ObjectRef, index: int, count: int = 1) -> bool:
        """Fetch ``count`` chunks from ``index`` with one GET (the caller checked that they are
        neither cached nor in flight; with ``count`` 1, that is checked here); False when
        read-ahead has all the GETs it may have."""
        if count == 1 and self._present(self._name(obj.key, index)):
            return True
        if self._prefetching >= self._max_prefetching:
            return False
        self._prefetching += 1
        task = self._spawn(obj, index, count, "prefetch")
        task.add_done_callback(self._prefetch_done)
        return True

    def _prefetch_done(self, _task: asyncio.Future[_Chunk]) -> None:
        self._prefetching -= 1

    def _spawn(
        self, obj: ObjectRef, index: int, count: int, kind: str, *, exact: bool = True
    ) -> asyncio.Future[_Chunk]:
        """One GET of chunks ``index .. index + count - 1``; returns the first one's future (each
        chunk's is in ``_inflight`` until the GET ends). Without ``exact``, ``obj.size`` is an
        upper bound (the object may end sooner)."""
        names = [self._name(obj.key, i) for i in range(index, index + count)]
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[_Chunk]] = []
        arrival = _Arrival()
        for i, name in enumerate(names):
            future: asyncio.Future[_Chunk] = loop.create_future()
            self._inflight[name] = future
            future.add_done_callback(functools.partial(self._fetch_done, name))
            futures.append(future)
            self._arrivals[name] = (arrival, i * self.chunk_size)
        task = asyncio.create_task(
            self._fetch(obj, index, names, kind, arrival, exact=exact), name=f"chunk {names[0]}"
        )
        self._gets.add(task)
        task.add_done_callback(functools.partial(self._get_done, names, futures, arrival))
        return futures[0]

    def _get_done(
        self,
        names: list[str],
        futures: list[asyncio.Future[_Chunk]],
        arrival: _Arrival,
        task: asyncio.Task[list[_Chunk]],
    ) -> None:
        self._gets.discard(task)
        for name in names:
            if self._arrivals.get(name, (None, 0))[0] is arrival:
                del self._arrivals[name]
        arrival.end()
        if task.cancelled():
            for future in futures:
                future.cancel()
            return
        exc = task.exception()
        for i, future in enumerate(futures):
            if future.done():
                continue
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(task.result()[i])

    def _fetch_done(self, name: str, future: asyncio.Future[_Chunk]) -> None:
        if self._inflight.get(name) is future:
            del self._inflight[name]  # ended either way: a failure is never cached
        if not future.cancelled():
            future.exception()  # retrieved here: waiters see it, read-ahead only counts it

    async def _fetch(
        self,
        obj: ObjectRef,
        index: int,
        names: list[str],
        kind: str,
        arrival: _Arrival,
        *,
        exact: bool = True,
    ) -> list[_Chunk]:
        size = self.chunk_size
        start = index * size
        end = min(start + len(names) * size, obj.size) - 1
        async with self._slots:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._timeout_s):
                    data = await self._objects.get_range(obj.key, start, end, arrivals=arrival)
            except TimeoutError as exc:
                self._fetched(kind, "timeout")
                raise StorageTimeoutError(
                    f"GET {obj.key} bytes {start}-{end} took more than {self._timeout_s} s"
                ) from exc
            except asyncio.CancelledError:
                raise  # the cache is closing: the GET did not fail, it was given up
            except BaseException:
                self._fetched(kind, "error")
                raise
        asked = end - start + 1
        # without ``exact`` the object may end sooner: any bytes up to what was asked will do
        if len(data) != asked and (exact or not 0 < len(data) < asked):
            self._fetched(kind, "error")
            raise RemoteDataError(
                f"{obj.key} is shorter than its metadata says ({obj.size} bytes): bytes "
                f"{start}-{end} returned {len(data)}"
            )
        self._fetched(kind, "ok", seconds=time.monotonic() - started, size=len(data))
        chunks: list[_Chunk] = (
            [data]
            if len(names) == 1
            else [memoryview(data)[i * size : (i + 1) * size] for i in range(len(names))]
        )
        if self._state is _State.OPEN:
            self._keep(names, chunks, data)
        return chunks

    def _keep(self, names: list[str], chunks: list[_Chunk], data: _Chunk) -> None:
        """The chunks of one GET just fetched (``data``, all of them in order): each run of
        ``_file_chunks`` of them becomes one file."""
        per_file = self._file_chunks
        if len(names) <= per_file:
            self._keep_file(names, chunks, data)
            return
        view = memoryview(data)
        for at in range(0, len(names), per_file):
            run = chunks[at : at + per_file]
            start = at * self.chunk_size
            end = start + sum(len(chunk) for chunk in run)
            self._keep_file(names[at : at + per_file], run, view[start:end])

    def _keep_file(self, names: list[str], chunks: list[_Chunk], data: _Chunk) -> None:
        """Consecutive chunks just fetched (``data``, all of them in order): served from
        memory at once, written to disk behind as one file (unless the writes behind already
        hold ``max_pending_write_bytes``, or files that could not be removed hold the budget:
        then from memory only)."""
        for name in names:
            if name in self._file_of:  # not expected (the GET asked for missing chunks only)
                self._forget(name)
        # a cache at its budget frees the pages of the chunks it evicts, and a buffered write
        # reuses them: cheaper than O_DIRECT and the read-back (see ``_direct``)
        direct = self._direct and self._bytes + len(data) <= self.max_bytes
        # the disk is behind: queueing more would hold fetched bytes without bound
        behind = bool(self._writers) and self._pending_write_bytes + len(data) > self._max_pending
        if not behind:
            self._make_room(len(data))
        if behind or (self._stranded and self._bytes + len(data) > self.max_bytes):
            for name, chunk in zip(names, chunks, strict=True):
                self._remember(name, chunk)
            if self._metrics is not None:
                self._metrics.read_cache_writes_skipped.inc(len(names))
            return
        # waiters get the bytes now; the disk write runs behind, served from memory
        # in the LRU order from now (reads come from memory until the file is written)
        for name, chunk in zip(names, chunks, strict=True):
            self._writing[name] = chunk
            self._remember(name, chunk)
        file = names[0] if len(names) == 1 else f"{names[0]}+{len(names)}"
        self._add_file(file, len(data), names)
        self._gauge()
        self._next_tag += 1
        self._write_tags[file] = self._next_tag
        self._pending_write_bytes += len(data)
        self._gauge_pending()
        writer = asyncio.create_task(
            self._store(file, names, chunks, data, self._next_tag, direct), name=f"write {file}"
        )
        self._writers.add(writer)
        writer.add_done_callback(self._writers.discard)

    def _add_file(self, file: str, size: int, names: Sequence[str] | None = None) -> None:
        """Index ``file`` (``size`` bytes) and the chunks it holds, as the most recently used."""
        members = _members(file) if names is None else names
        self._lru[file] = size
        self._bytes += size
        for i, name in enumerate(members):
            self._file_of[name] = (file, i * self.chunk_size)
            self._copies.pop(name, None)  # a new copy

    def _indexed(self, file: str) -> list[str]:
        """The chunks of ``file`` that the index says it holds."""
        return [name for name in _members(file) if self._file_of.get(name, (None,))[0] == file]

    def _drop_file(self, file: str) -> int | None:
        """Forget ``file`` and its chunks (their copies, and their bytes in memory unless
        they are being written); returns its size, None when it was not indexed."""
        size = self._lru.pop(file, None)
        if size is None:
            return None
        for name in self._indexed(file):
            del self._file_of[name]
        for name in _members(file):
            self._recent.pop(name, None)
            self._copies.pop(name, None)
        return size

    def _remember(self, name: str, data: _Chunk) -> None:
        """Keep ``data`` among the last ``memory_chunks`` chunks fetched."""
        if self._memory_chunks:
            self._recent[name] = data
            while len(self._recent) > self._memory_chunks:
                self._recent.popitem(last=False)

    async def _store(
        self,
        file: str,
        names: list[str],
        chunks: list[_Chunk],
        data: _Chunk,
        tag: int,
        direct: bool,
    ) -> None:
        try:
            await self._write(file, data, tag, direct)
        finally:
            for name, chunk in zip(names, chunks, strict=True):
                if self._writing.get(name) is chunk:
                    del self._writing[name]
            self._pending_write_bytes -= len(data)
            self._gauge_pending()

    async def _write(self, file: str, data: _Chunk, tag: int, direct: bool) -> None:
        path = self._path(file)
        current = False
        #: the ``.tmp`` file while it is on disk under that name
        tmp: Path | None = None
        try:
            written, wrote_direct = await asyncio.get_running_loop().run_in_executor(
                self._write_threads, _write_tmp, path, data, tag, direct
            )
            tmp = written
            if direct and not wrote_direct and self._direct:
                self._direct = False
                log.warning(
                    "read_cache_direct_io_refused",
                    directory=str(self.directory),
                    detail="the filesystem refused O_DIRECT: chunk files are written through"
                    " the page cache from now on",
                )
            current = self._write_tags.get(file) == tag and file in self._lru
            if current:  # a rename: a metadata operation of microseconds
                written.replace(path)
                tmp = None
                stranded = self._stranded.pop(path, None)
                if stranded is not None:  # the old copy that could not be removed is gone now
                    self._bytes -= stranded
            else:  # forgotten, evicted or fetched again meanwhile
                tmp = None
                self._unlink(written, len(data))
        except OSError as exc:
            log.warning("read_cache_write_failed", error=str(exc))
            if self._write_tags.get(file) == tag:
                self._forget_file(file)
            if tmp is not None:  # the rename failed: its bytes are not the cache's any more
                self._unlink(tmp, len(data))
                self._gauge()
            return
        finally:
            if self._write_tags.get(file) == tag:
                del self._write_tags[file]
            doomed = self._doomed.pop((file, tag), None)
            if doomed is not None:
                self._bytes -= doomed
        if not current and file not in self._lru:  # evicted (or closed) while being written
            self._remove(file, len(data))
            self._gauge()

    def _make_room(self, incoming: int) -> None:
        """Evict least recently used files until ``incoming`` more bytes fit. The files are
        unlinked at once (a metadata operation of microseconds), so the disk never holds more
        than the budget, whatever order the writes finish in."""
        if self._stranded and self._bytes + incoming > self.max_bytes:
            self._remove_stranded()
        evicted = 0
        while self._lru and self._bytes + incoming > self.max_bytes:
            file, size = next(iter(self._lru.items()))
            evicted += len(_members(file))
            self._drop_file(file)
            writing = self._write_tags.get(file)
            if writing is not None:
                self._doomed[(file, writing)] = size
                continue
            self._bytes -= size
            self._remove(file, size)
        if evicted and self._metrics is not None:
            self._metrics.read_cache_evictions.inc(evicted)

    def _remove(self, file: str, size: int) -> None:
        """Unlink ``file`` (``size`` bytes, just taken off the count), see ``_unlink``."""
        self._unlink(self._path(file), size)

    def _unlink(self, path: Path, size: int) -> None:
        """Unlink ``path`` (``size`` bytes, not in the count). One the filesystem refuses to
        remove (``EACCES``, ``EIO``, ``EROFS``) is logged and counted, and counted in the
        cache's bytes while it stays on disk: the next eviction that needs room tries it
        again."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("read_cache_unlink_failed", file=path.name, error=str(exc))
            if self._metrics is not None:
                self._metrics.read_cache_unlink_errors.inc()
            if path not in self._stranded:  # else the file on disk is the copy counted there
                self._stranded[path] = size
                self._bytes += size

    def _remove_stranded(self) -> None:
        """Try again to unlink up to ``_RETRY_FILES`` files that could not be removed (the
        longest waiting first; a failing one goes to the back)."""
        for _ in range(min(_RETRY_FILES, len(self._stranded))):
            path, size = next(iter(self._stranded.items()))
            del self._stranded[path]
            try:
                path.unlink(missing_ok=True)
            except OSError:
                self._stranded[path] = size
                continue
            self._bytes -= size

    def _forget(self, name: str) -> None:
        """Forget chunk ``name`` and the other chunks of its file; a chunk of it being written
        is dropped too: no read serves it, its write never lands."""
        where = self._file_of.get(name)
        if where is None:
            self._writing.pop(name, None)
            self._recent.pop(name, None)
            self._copies.pop(name, None)
            return
        self._forget_file(where[0])

    def _forget_file(self, file: str) -> None:
        for name in self._indexed(file):
            self._writing.pop(name, None)
        writing = self._write_tags.pop(file, None) is not None
        size = self._drop_file(file)
        if size is not None:
            self._bytes -= size
            if not writing:  # a write in flight removes its own file
                self._remove(file, size)
            self._gauge()

    def invalidate(self, obj: ObjectRef, start: int, end_inclusive: int) -> None:
        """Forget the chunks holding bytes ``start..end_inclusive`` (e.g. after a CRC failure),
        with the other chunks of their files; they are fetched again when next read."""
        for index in range(start // self.chunk_size, end_inclusive // self.chunk_size + 1):
            self._forget(self._name(obj.key, index))

    # -- metrics -------------------------------------------------------------------------

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.read_cache_lookups.labels(result).inc()

    def _count_depth(self, change: str) -> None:
        if self._metrics is not None:
            self._metrics.read_readahead_changes.labels(change).inc()

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

    def _gauge_pending(self) -> None:
        if self._metrics is not None:
            self._metrics.read_cache_pending_write_bytes.set(self._pending_write_bytes)


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
