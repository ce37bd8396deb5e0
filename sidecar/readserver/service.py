"""The read engine: (topic, partition, offset) → the COPY_SEGMENT_FINISHED segment that holds the
offset along the partition's leader-epoch lineage → its remote offset index → a byte position →
record batches, read through the disk chunk cache. Kafka's path is
``RemoteLogManager.read`` (kafka-kip405-internals.md §3.8); this is the same walk.

* **Lineage** (:meth:`ReadService.spans`): the store's ``finished_lineage`` turns the finished
  segments into non-overlapping spans, each offset served by exactly one segment (superseded
  copies from leader changes left out: no duplicates, no gaps). The lineage is the broker's own
  ``leader-epoch-checkpoint`` when this broker has the partition (the truth, as Kafka uses its
  epoch cache); below its first entry (the broker truncates it as local segments go), and when
  the broker has no copy, it is derived from the segments' epoch maps. A partition's spans are
  cached until the store applies an event of that partition; every ``lineage_ttl_s`` the
  broker's checkpoint is read again and the store asked whether another process wrote it (a
  read server alone), and only a change there computes them again.
* **Positions**: the manifest (cached) gives each index's byte range in the ``indexes`` object;
  indexes are read through the chunk cache, CRC-32C checked against the manifest, parsed once
  and kept in memory (Kafka's ``RemoteIndexCache``). No manifest: scan from byte 0.
* **Batches**: a walk from the index position skips batches that end before the offset and
  stops at the span's end; every batch's CRC-32C is checked before it is handed out, so a read
  returns the bytes the broker wrote or an error (invariant 6).
* **Timestamps**: Kafka's ``findOffsetByTimestamp`` over remote segments: the first segment of
  the lineage whose max timestamp reaches the target, its time index, then the first record at
  or after the target; and ListOffsets' EARLIEST (-2), LATEST (-1) and MAX_TIMESTAMP (-3).
* **Transactions** (read_committed): the aborted transactions a response must carry, from the
  transaction indexes of the segments from the offset on and, when the remote ones do not
  settle it, the broker's local ones (Kafka's ``collectAbortedTransactions``); the response is
  cut below an upper bound estimated from the offset index, so the list covers every batch.
  Only indexes that follow the data without a gap settle it. When none does, the response
  also stops at the archive's last stable offset (a transaction open at the end of the tiered
  data, from the last segment's producer snapshot, or the one before it when that snapshot is
  unusable): its marker is not tiered, so whether it aborted is not known here.
* **Planned responses**: a walk that continues a segment's verified prefix (from byte 0)
  records each CRC-checked batch (position, offsets) and the cached copy of each chunk it came
  from. Later responses over that prefix are computed from the map alone and sent from the
  chunk files (``sendfile``) with a Content-Length, as long as those very copies are cached: a
  chunk fetched again is walked (and CRC-checked) again before it is trusted (invariant 6).

Errors: the read errors of :mod:`sidecar.readserver.errors`, and the storage, format and metadata
errors of the layers below, unchanged (the routes map them to HTTP in one table). No HTTP here.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import os
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, Literal, NamedTuple, Self, TypeVar, overload

import crc32c

from sidecar.errors import (
    CheckpointFormatError,
    FormatError,
    KeyNotFoundError,
    ObjectTooLargeError,
)
from sidecar.kafka.checkpoints import (
    EpochEntry,
    encode_kafka_uuid,
    parse_producer_snapshot,
    read_leader_epoch_checkpoint,
    read_partition_metadata,
)
from sidecar.kafka.indexes import AbortedTxn, OffsetIndex, TimeIndex, TxnIndex
from sidecar.kafka.records import (
    BATCH_HEADER,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Record,
    decode_records,
    parse_batch_header,
)
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore, SegmentSpan
from sidecar.observability.logging import get_logger
from sidecar.readserver._txn import AbortedTransaction
from sidecar.readserver.cache import ChunkCache, ChunkFile, MemoryCache, ObjectRef
from sidecar.readserver.errors import (
    AmbiguousTopicError,
    IndexNotFoundError,
    OffsetOutOfRangeError,
    RangeNotSatisfiableError,
    RemoteDataError,
    UnknownPartitionError,
    UnknownSegmentError,
    UnknownTopicError,
)
from sidecar.storage.base import ObjectStore
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import (
    MANIFEST_MAX_BYTES,
    IndexKind,
    ManifestFormatError,
    SegmentManifest,
)

__all__ = [
    "Batch",
    "BatchStream",
    "ByteStream",
    "FileRange",
    "NamedFiles",
    "NamedRange",
    "Plan",
    "ReadService",
    "Run",
    "RunStream",
    "Stream",
    "TimestampAnswer",
    "TopicSummary",
    "decode_batch",
]

log = get_logger(__name__)

T = TypeVar("T")

_FINISHED: Final = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_CRC_START: Final = 21  # a batch's CRC-32C covers bytes [21, end)
#: bytes read from the chunk cache at a time (a window never spans two chunks): a small first
#: window for a quick first byte, then large ones for throughput
_FIRST_IO_BYTES: Final = 256 * 1024
_IO_BYTES: Final = 1024 * 1024
#: manifests are small; this is their weight in the memory cache
_MANIFEST_WEIGHT: Final = 2048
_SEQUENTIAL_MEMORY: Final = 4096
#: a walk's read-ahead goes on through at most this many following segments
_FOLLOW_SPANS: Final = 8
_KEYS_REMEMBERED: Final = 65536
_NO_LIMIT: Final = 2**63
#: ListOffsets' special timestamps (``ListOffsetsRequest``)
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
MAX_TIMESTAMP: Final = -3
_NO_TIMESTAMP: Final = -1
_TXN_ENTRY: Final = 34


class Batch(NamedTuple):
    """One record batch: its parsed header and its bytes, as views of cached chunks."""

    header: BatchHeader
    pieces: list[memoryview]

    def tobytes(self) -> bytes:
        """The batch's bytes in one buffer (copied when it spans windows)."""
        if len(self.pieces) == 1:
            return self.pieces[0].tobytes()
        return b"".join(self.pieces)


class TimestampAnswer(NamedTuple):
    """Kafka's ``TimestampAndOffset``: the first record at or after a timestamp."""

    offset: int
    timestamp: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class TopicSummary:
    """A topic the store knows, with its tiered partitions."""

    topic: str
    topic_id: uuid.UUID
    partitions: tuple[int, ...]


class Run(NamedTuple):
    """Consecutive whole record batches, each CRC-checked: their bytes (views of cached chunks),
    the first one's base offset and the offset after the last."""

    pieces: list[memoryview]
    base_offset: int
    next_offset: int


class Stream(Generic[T]):
    """Items read ahead of a response, primed: the first item (or the absence of any) is known
    before the status line goes out, so early errors become proper HTTP errors. Iterate once,
    or :meth:`aclose` it."""

    def __init__(self, first: T | None, rest: AsyncGenerator[T, None]) -> None:
        self._first = first
        self._rest = rest

    @classmethod
    async def prime(cls, items: AsyncGenerator[T, None], **attributes: int) -> Self:
        """Read the first item of ``items`` (closing them on failure)."""
        try:
            first: T | None = await anext(items)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await items.aclose()
            raise
        stream = cls(first, items)
        for name, value in attributes.items():
            setattr(stream, name, value)
        return stream

    async def __aiter__(self) -> AsyncIterator[T]:
        async with aclosing(self._rest) as rest:
            if self._first is None:
                return
            first, self._first = self._first, None
            yield first
            async for item in rest:
                yield item

    async def aclose(self) -> None:
        """Stop reading (idempotent)."""
        self._first = None
        await self._rest.aclose()


class BatchStream(Stream[Batch]):
    """Record batches from an offset, one at a time (for decoding)."""

    #: the requested offset (records below it in the first batch are not data to return)
    offset: int = 0


class RunStream(Stream[Run]):
    """Record batches from an offset as runs of consecutive batches (for raw responses)."""

    #: the requested offset
    offset: int = 0


class ByteStream(Stream[memoryview]):
    """A byte range of a remote object as pieces."""

    #: bytes the stream yields in total
    length: int = 0


class _Budget:
    """Bytes a response from ``offset`` may still take: whole batches, at least one (Kafka's
    minOneMessage); with ``limit_offset``, only batches that end below it (the first one
    excepted), and none when it is at or below ``offset`` (a read_committed read from the last
    stable offset on)."""

    __slots__ = ("first", "limit_offset", "max_bytes", "sent", "stopped")

    def __init__(self, max_bytes: int, limit_offset: int | None = None, offset: int = 0) -> None:
        self.max_bytes = max_bytes
        self.limit_offset = _NO_LIMIT if limit_offset is None else limit_offset
        #: the first batch goes whatever its size and last offset
        self.first = self.limit_offset > offset
        self.sent = 0
        #: the response is complete (budget spent, or the span ended where a gap follows)
        self.stopped = False

    def allows(self, size: int, last_offset: int) -> bool:
        return (self.sent == 0 and self.first) or (
            self.sent + size <= self.max_bytes and last_offset < self.limit_offset
        )

    @property
    def exhausted(self) -> bool:
        return self.sent >= self.max_bytes


@dataclass(slots=True)
class _Lineage:
    spans: list[SegmentSpan]
    starts: list[int]
    #: the store's version of the partition the spans were computed at
    version: int
    #: what the store cannot version: the broker's checkpoint, other processes' writes
    outside: tuple[tuple[EpochEntry, ...] | None, int]
    #: when ``outside`` was last read
    at: float


class _ObjectReader:
    """Sequential reads of one remote object through the chunk cache, one window at a time."""

    def __init__(self, cache: ChunkCache, obj: ObjectRef, *, follow: tuple[ObjectRef, ...]) -> None:
        self._cache = cache
        self._obj = obj
        self._follow = follow
        self._start = 0
        self._data = memoryview(b"")
        self._io = _FIRST_IO_BYTES
        self.copies = {}

    async def pieces(self, position: int, length: int) -> list[memoryview]:
        """Views covering ``[position, position + length)``, clamped to the object's end."""
        end = min(position + length, self._obj.size)
        out: list[memoryview] = []
        while position < end:
            offset = position - self._start
            if not 0 <= offset < len(self._data):
                await self._load(position)
                offset = 0
            take = min(end - position, len(self._data) - offset)
            out.append(self._data[offset : offset + take])
            position += take
        return out

    async def window_at(self, position: int) -> memoryview:
        """The bytes from ``position`` to the end of its window (loaded to start there)."""
        if self._start != position or not self._data:
            await self._load(position)
        return self._data

    async def _load(self, position: int) -> None:
        chunk_size = self._cache.chunk_size
        index = position // chunk_size
        chunk_end = min((index + 1) * chunk_size, self._obj.size)
        length = chunk_end - position
        if not self._cache.resident(self._obj, index):
            # read from disk: a small first read for a quick first byte, then large ones
            length = min(self._io, length)
            self._io = _IO_BYTES
        # else: in memory or being fetched (then in memory): the rest of the chunk at once,
        # no copy, and fewer batches that cross a window's end (the careful path)
        before = self._cache.copy_id(self._obj, index)
        self._data = memoryview(
            await self._cache.read(self._obj, position, length, follow=self._follow)
        )
        after = self._cache.copy_id(self._obj, index)
        # the copy the bytes came from: None if the chunk changed copies meanwhile, or since
        # an earlier window of it was read
        seen = self.copies.get(index, after)
        self.copies[index] = after if before in (None, after) and seen == after else None
        self.copy = self.copies[index]
        self._start = position

    #: chunk index -> the cached copy each window was read from
    copies: dict[int, int | None]
    #: the copy of the current window's chunk
    copy: int | None = None


class FileRange(NamedTuple):
    """Bytes of an open chunk file: sent with ``sendfile``, never read into memory."""

    fd: int
    offset: int
    length: int


class NamedRange(NamedTuple):
    """Bytes of a written chunk file, by its path (not opened)."""

    path: Path
    offset: int
    length: int


class NamedFiles(NamedTuple):
    """A range whose chunks are all in written cache files, named for a reader on this host
    that opens them itself; consecutive chunks of one file are one range. Nothing holds the
    files open: the reader must expect one evicted before it opens it."""

    ranges: list[NamedRange]
    length: int


class Plan:
    """A response whose bytes are known before it starts: verified batches (or a raw range) in
    cached chunks, as in-memory pieces and open file ranges; :meth:`close` closes the files."""

    def __init__(self, pieces: list[memoryview | FileRange], fds: list[int]) -> None:
        self.pieces = pieces
        self.length = sum(p.length if isinstance(p, FileRange) else len(p) for p in pieces)
        self._fds = fds

    def close(self) -> None:
        """Close the chunk files (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


class _SegmentMap:
    """The CRC-checked batches of a segment's ``.log`` prefix ``[0, end)``: where each starts
    and ends, its base and last offsets, and the cached copy of every chunk they were read from
    (a map is good only while those copies are cached)."""

    __slots__ = ("bases", "copies", "ends", "lasts", "positions")

    def __init__(self) -> None:
        self.positions = array("q")
        self.ends = array("q")
        self.bases = array("q")
        self.lasts = array("q")
        self.copies: dict[int, int] = {}

    @property
    def end(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __len__(self) -> int:
        return len(self.ends)

    def add(
        self, position: int, size: int, base: int, last: int, copies: dict[int, int | None]
    ) -> bool:
        """Append a batch at ``end`` read from ``copies`` (chunk -> copy); False (nothing
        added) when a copy is unknown or differs from one the map already relies on."""
        for index, copy in copies.items():
            if copy is None or self.copies.setdefault(index, copy) != copy:
                return False
        self.positions.append(position)
        self.ends.append(position + size)
        self.bases.append(base)
        self.lasts.append(last)
        return True


#: what a segment map costs before its first batch, in batches: about 800 bytes (four arrays,
#: the chunk-copy dict, the key and its place in the LRU) against 32 bytes per batch. Counted, so
#: maps that stay empty (a walk from byte 0 that found no cached chunk) cannot grow unbounded.
_MAP_COST = 25


class _SegmentMaps:
    """Segment maps by ``.log`` key, least recently used dropped beyond ``max_batches`` (each
    map counted as its batches plus :data:`_MAP_COST`)."""

    def __init__(self, max_batches: int) -> None:
        self.max_batches = max_batches
        self._maps: OrderedDict[str, _SegmentMap] = OrderedDict()
        self._batches = 0

    def get(self, key: str) -> _SegmentMap | None:
        found = self._maps.get(key)
        if found is not None:
            self._maps.move_to_end(key)
        return found

    def recording(self, key: str, position: int) -> _SegmentMap | None:
        """The map a walk from ``position`` can extend (a new one from byte 0)."""
        if self.max_batches <= 0:
            return None
        found = self.get(key)
        if found is None and position == 0:
            found = self._maps[key] = _SegmentMap()
            self._count(_MAP_COST)
        return found if found is not None and found.end >= position else None

    def added(self, key: str, smap: _SegmentMap, count: int) -> None:
        """``count`` batches were added to ``smap``, the map of ``key``. Counted only while it
        is still kept: a walk goes on with the map it holds, which another walk's batches or
        a refetched chunk may have dropped meanwhile (its batches were taken off then)."""
        if self._maps.get(key) is not smap:
            return
        self._count(count)

    def drop(self, key: str) -> None:
        found = self._maps.pop(key, None)
        if found is not None:
            self._batches -= len(found) + _MAP_COST

    def _count(self, added: int) -> None:
        """Count ``added`` more; drop the least recently used maps (never the newest) while
        the count is over the budget."""
        self._batches += added
        while self._batches > self.max_batches and len(self._maps) > 1:
            _, dropped = self._maps.popitem(last=False)
            self._batches -= len(dropped) + _MAP_COST


def _join(pieces: list[memoryview]) -> memoryview:
    return pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))


def _crc_matches(header: BatchHeader, pieces: list[memoryview]) -> bool:
    value = 0
    skip = _CRC_START
    for piece in pieces:
        if skip >= len(piece):
            skip -= len(piece)
            continue
        value = crc32c.crc32c(piece[skip:], value)
        skip = 0
    return int(value) == header.crc


class ReadService:
    """Reads of tiered data by topic and partition; see the module docstring.

    It owns the memory cache of manifests and indexes; the chunk cache, store and object store
    belong to the caller. :meth:`aclose` is idempotent.
    """

    def __init__(
        self,
        *,
        store: RemoteSegmentStore,
        objects: ObjectStore,
        layout: KeyLayout,
        chunks: ChunkCache,
        index_cache_bytes: int = 64 * 1024 * 1024,
        log_dirs: Sequence[Path] = (),
        fetch_timeout_s: float = 30.0,
        lineage_ttl_s: float = 1.0,
        indexes: MemoryCache[tuple[str, uuid.UUID], object] | None = None,
        map_batches: int = 1_000_000,
        plan_responses: bool = True,
        plan_min_bytes: int = 256 * 1024,
    ) -> None:
        self._store = store
        self._objects = objects
        self._layout = layout
        self.chunks = chunks
        self._indexes: MemoryCache[tuple[str, uuid.UUID], object] = (
            indexes if indexes is not None else MemoryCache(max_weight=index_cache_bytes)
        )
        self._log_dirs = tuple(log_dirs)
        self._timeout_s = fetch_timeout_s
        self._lineage_ttl_s = lineage_ttl_s
        self._lineages: dict[TopicIdPartition, _Lineage] = {}
        #: (applied, when, the store's partitions, those with a partition-delete event)
        self._partitions: (
            tuple[int, float, list[TopicIdPartition], frozenset[TopicIdPartition]] | None
        ) = None
        #: asked when a topic or partition is not in the store: starts reading its metadata
        #: (a sidecar reads only its broker's partitions'), True once that is done
        self.discover: Callable[[str, int], Awaitable[bool]] | None = None
        self._range_ends: OrderedDict[str, int] = OrderedDict()
        #: verified batch maps of segments read from their start (32 bytes a batch)
        self._maps = _SegmentMaps(map_batches if plan_responses else 0)
        self._plan = plan_responses
        #: object keys by (segment id, start offset, suffix): a key is rebuilt from the
        #: metadata for every span of every request otherwise
        self._keys: dict[tuple[uuid.UUID, int, ObjectSuffix], str] = {}
        #: smaller responses are streamed (one read of the cache beats opening files)
        self._plan_min_bytes = plan_min_bytes

    async def aclose(self) -> None:
        """Cancel manifest and index loads in flight; idempotent."""
        await self._indexes.aclose()

    # -- topics and partitions -----------------------------------------------------------

    def _applied(self) -> int:
        return self._store.counters().applied

    async def _all_partitions(self) -> list[TopicIdPartition]:
        return (await self._known_partitions())[0]

    async def _known_partitions(
        self,
    ) -> tuple[list[TopicIdPartition], frozenset[TopicIdPartition]]:
        """The store's partitions, and those of them being deleted (with a partition-delete
        event), cached until the store applies more events."""
        applied = self._applied()
        cached = self._partitions
        now = time.monotonic()
        if cached is not None and cached[0] == applied and now - cached[1] < self._lineage_ttl_s:
            return cached[2], cached[3]
        found, deleting = await asyncio.to_thread(self._load_partitions)
        self._partitions = (applied, now, found, deleting)
        known = set(found)
        for tp in [tp for tp in self._lineages if tp not in known]:
            del self._lineages[tp]  # dropped from the store (its topic deleted and forgotten)
        return found, deleting

    def _load_partitions(self) -> tuple[list[TopicIdPartition], frozenset[TopicIdPartition]]:
        """(thread) The store's partitions and its partitions with a partition-delete event."""
        return self._store.partitions(), frozenset(self._store.partition_deletes())

    async def topics(self) -> list[TopicSummary]:
        """Every topic the store has tiered partitions of, by name then topic id."""
        by_id: dict[tuple[str, uuid.UUID], list[int]] = {}
        for tp in await self._all_partitions():
            by_id.setdefault((tp.topic, tp.topic_id), []).append(tp.partition)
        return [
            TopicSummary(topic, topic_id, tuple(sorted(parts)))
            for (topic, topic_id), parts in sorted(by_id.items(), key=lambda kv: kv[0][0])
        ]

    async def resolve(
        self, topic: str, partition: int, topic_id: uuid.UUID | None = None
    ) -> TopicIdPartition:
        """The partition's topic id from the store. A name with several topic ids (deleted and
        re-created) resolves to the one whose data is not deleted, else needs ``topic_id``. A
        partition being deleted (a partition-delete event) is not found by name, even under the
        name's only topic id: its topic was deleted, and may be re-created with nothing tiered
        yet; ``topic_id`` still reads it. A partition the store does not know is looked for
        once through ``discover``, if set."""
        try:
            return await self._resolve(topic, partition, topic_id)
        except (UnknownTopicError, UnknownPartitionError):
            if self.discover is None or not await self.discover(topic, partition):
                raise
        self._partitions = None
        return await self._resolve(topic, partition, topic_id)

    async def _resolve(
        self, topic: str, partition: int, topic_id: uuid.UUID | None
    ) -> TopicIdPartition:
        found, deleting = await self._known_partitions()
        named = [
            tp
            for tp in found
            if tp.topic == topic and (topic_id is None or tp.topic_id == topic_id)
        ]
        if not named:
            suffix = "" if topic_id is None else f" with topic id {topic_id}"
            raise UnknownTopicError(f"no tiered data for topic {topic!r}{suffix}")
        ids = sorted({tp.topic_id for tp in named})
        if len(ids) > 1:
            live = await asyncio.to_thread(self._live_topic_ids, named, ids)
            if len(live) != 1:
                raise AmbiguousTopicError(
                    f"topic {topic!r} has tiered data under several topic ids; pass topic_id",
                    topic_ids=[encode_kafka_uuid(i) for i in ids],
                )
            named = [tp for tp in named if tp.topic_id == live[0]]
        if topic_id is None and deleting:
            kept = [tp for tp in named if tp not in deleting]
            if not kept:
                raise UnknownTopicError(
                    f"no tiered data for topic {topic!r}: its topic id"
                    f" {encode_kafka_uuid(named[0].topic_id)} is being deleted"
                )
            named = kept
        for tp in named:
            if tp.partition == partition:
                return tp
        raise UnknownPartitionError(
            f"topic {topic!r} has no tiered partition {partition}",
            partitions=sorted(tp.partition for tp in named),
        )

    def _live_topic_ids(
        self, named: list[TopicIdPartition], ids: list[uuid.UUID]
    ) -> list[uuid.UUID]:
        """(thread) Of a name's topic ids, those not being deleted: with no partition-delete
        event; of several such, those with a segment left in one of their partitions (Kafka 4
        deletes a topic's remote data segment by segment, with no partition-delete event; the
        old id's partitions stay in the store until retention forgets them)."""
        live = [
            topic_id
            for topic_id in ids
            if self._store.partition_delete(next(tp for tp in named if tp.topic_id == topic_id))
            is None
        ]
        if len(live) <= 1:
            return live
        return [
            topic_id
            for topic_id in live
            if any(self._store.segments(tp) for tp in named if tp.topic_id == topic_id)
        ]

    # -- lineage -------------------------------------------------------------------------

    async def spans(self, tp: TopicIdPartition) -> list[SegmentSpan]:
        """The partition's finished segments along its leader-epoch lineage, in offset order."""
        return (await self._lineage(tp)).spans

    async def tiered_range(self, tp: TopicIdPartition) -> tuple[int, int] | None:
        """First and last offset of the tiered data, or None when nothing is tiered."""
        spans = await self.spans(tp)
        if not spans:
            return None
        return spans[0].start_offset, spans[-1].end_offset

    async def _lineage(self, tp: TopicIdPartition) -> _Lineage:
        version = self._store.partition_version(tp)
        now = time.monotonic()
        cached = self._lineages.get(tp)
        if cached is not None and cached.version == version:
            if now - cached.at < self._lineage_ttl_s:
                return cached
            outside = await asyncio.to_thread(self._outside, tp)
            if outside == cached.outside and self._store.partition_version(tp) == version:
                cached.at = now
                return cached
        outside, spans = await asyncio.to_thread(self._compute_spans, tp)
        lineage = _Lineage(spans, [s.start_offset for s in spans], version, outside, now)
        self._lineages[tp] = lineage
        return lineage

    def _outside(self, tp: TopicIdPartition) -> tuple[tuple[EpochEntry, ...] | None, int]:
        """(thread) The broker's checkpoint of ``tp`` and the store's count of other
        processes' commits."""
        return self._local_epochs(tp), self._store.external_changes()

    def _compute_spans(
        self, tp: TopicIdPartition
    ) -> tuple[tuple[tuple[EpochEntry, ...] | None, int], list[SegmentSpan]]:
        """(thread) What the spans depend on outside the store, read first (a change while they
        are computed is seen next time), and the spans."""
        outside = self._outside(tp)
        return outside, self._spans_along(tp, outside[0])

    def _spans_along(
        self, tp: TopicIdPartition, local: tuple[EpochEntry, ...] | None
    ) -> list[SegmentSpan]:
        """(thread) The derived lineage below the broker's checkpoint, the checkpoint above."""
        derived = self._store.finished_lineage(tp)
        if not local:
            return derived
        first = local[0].start_offset
        try:
            above = self._store.finished_lineage(tp, [(e.epoch, e.start_offset) for e in local])
        except ValueError as exc:
            log.warning("leader_epoch_checkpoint_unusable", topic=tp.topic, error=str(exc))
            return derived
        below = [
            SegmentSpan(s.segment, s.start_offset, min(s.end_offset, first - 1))
            for s in derived
            if s.start_offset < first
        ]
        return below + above

    def _local_epochs(self, tp: TopicIdPartition) -> tuple[EpochEntry, ...] | None:
        """(thread) The broker's leader-epoch checkpoint of ``tp`` when the broker has this
        incarnation of the partition (same topic id); None otherwise."""
        for log_dir in self._log_dirs:
            directory = log_dir / f"{tp.topic}-{tp.partition}"
            try:
                if read_partition_metadata(directory / "partition.metadata").topic_uuid != (
                    tp.topic_id
                ):
                    continue
                return read_leader_epoch_checkpoint(directory / "leader-epoch-checkpoint")
            except (OSError, FormatError, CheckpointFormatError, ValueError):
                continue
        return None

    def _out_of_range(self, tp: TopicIdPartition, offset: int, lineage: _Lineage) -> Exception:
        spans = lineage.spans
        where = f"offset {offset} of {tp.topic}-{tp.partition}"
        if not spans:
            return OffsetOutOfRangeError(
                f"{where}: nothing is tiered", offset=offset, available=None
            )
        first, last = spans[0].start_offset, spans[-1].end_offset
        return OffsetOutOfRangeError(
            f"{where} is not in the tiered range {first}..{last}",
            offset=offset,
            available={"start_offset": first, "end_offset": last},
        )

    # -- objects, manifests, indexes -----------------------------------------------------

    def key(self, segment: SegmentMetadata, suffix: ObjectSuffix) -> str:
        """An object key of ``segment``, derived from its metadata alone."""
        memo = (segment.segment_id.id, segment.start_offset, suffix)
        found = self._keys.get(memo)
        if found is None:
            found = self._keys[memo] = self._segment_key(segment, suffix)
            if len(self._keys) > _KEYS_REMEMBERED:
                del self._keys[next(iter(self._keys))]
        return found

    def _segment_key(self, segment: SegmentMetadata, suffix: ObjectSuffix) -> str:
        tp = segment.segment_id.topic_id_partition
        return self._layout.segment_key(
            topic=tp.topic,
            topic_id=tp.topic_id,
            partition=tp.partition,
            base_offset=segment.start_offset,
            segment_id=segment.segment_id.id,
            suffix=suffix,
        )

    def log_ref(self, segment: SegmentMetadata) -> ObjectRef:
        """The segment's ``.log`` object."""
        return ObjectRef(self.key(segment, ObjectSuffix.LOG), segment.segment_size_in_bytes)

    async def manifest(
        self, segment: SegmentMetadata, *, indexes: bool = False
    ) -> SegmentManifest | None:
        """The segment's manifest (cached), or None when the bucket has none. With
        ``indexes`` (an index read follows), a manifest not cached yet comes with the GET of
        its indexes object's first chunk: that object is named by the segment alone, so both
        GETs go at once, not one after the other."""
        memo = ("manifest", segment.segment_id.id)
        if indexes and memo not in self._indexes:
            self.chunks.fetch_first(self.key(segment, ObjectSuffix.INDEXES))
        found = await self._indexes.get(memo, self._manifest_loader(segment), _manifest_weight)
        return found if isinstance(found, SegmentManifest) else None

    def _manifest_loader(
        self, segment: SegmentMetadata, *, prefetch_indexes: bool = False
    ) -> Callable[[], Awaitable[SegmentManifest | None]]:
        """A load of the segment's manifest from the bucket; with ``prefetch_indexes``, the
        GET of its indexes object starts as soon as the manifest names it."""
        key = self.key(segment, ObjectSuffix.MANIFEST)

        async def load() -> SegmentManifest | None:
            try:
                async with asyncio.timeout(self._timeout_s):
                    data = await self._objects.get(key, max_bytes=MANIFEST_MAX_BYTES)
            except KeyNotFoundError:
                return None
            except ObjectTooLargeError as exc:
                log.warning("manifest_too_large", key=key, error=str(exc))
                raise RemoteDataError(f"manifest {key} is not a manifest: {exc}") from exc
            try:
                manifest = SegmentManifest.from_json(data, key=key)
            except ManifestFormatError as exc:
                raise RemoteDataError(str(exc)) from exc
            if (
                manifest.segment_id != segment.segment_id.id
                or manifest.start_offset != segment.start_offset
                or manifest.end_offset != segment.end_offset
            ):
                raise RemoteDataError(f"manifest {key} describes another segment")
            if prefetch_indexes and manifest.indexes.size > 0:
                indexes = ObjectRef(manifest.indexes.key, manifest.indexes.size)
                for index in range(min(self.chunks.chunk_count(indexes.size), 2)):
                    self.chunks.prefetch(indexes, index)
            return manifest

        return load

    async def _prefetch_following(self, segment: SegmentMetadata) -> None:
        """Start fetching what a read of the segment after ``segment`` needs first: its
        manifest, its indexes object and its first chunks (``readahead_chunks``, one GET). The
        broker reads a partition's remote segments one after the other, and its first read of
        each new one asks for three indexes and then the segment's first bytes; fetched while
        the end of ``segment`` is read, none of that waits for a GET. Nothing happens when the
        store knows no segment after it."""
        tp = segment.segment_id.topic_id_partition
        lineage = await self._lineage(tp)
        at = bisect.bisect_right(lineage.starts, segment.end_offset + 1) - 1
        if at < 0 or at >= len(lineage.spans):
            return
        span = lineage.spans[at]
        following = span.segment
        if following.segment_id == segment.segment_id or span.end_offset <= segment.end_offset:
            return
        # as deep as the read-ahead within a segment (a group for a sequential reader): with
        # segments of a few chunks, their first chunk alone leaves the reader one GET ahead at
        # the start of each
        self.chunks.go_on_into(self.log_ref(segment), self.log_ref(following))
        self._indexes.warm(
            ("manifest", following.segment_id.id),
            self._manifest_loader(following, prefetch_indexes=True),
            _manifest_weight,
        )

    async def index_bytes(self, segment: SegmentMetadata, kind: IndexKind) -> bytes | None:
        """One index file of the segment, byte-exact and CRC-checked; None when it has none."""
        manifest = await self.manifest(segment, indexes=True)
        if manifest is None:
            return None
        found = manifest.indexes.ranges.get(kind)
        if found is None:
            return None
        if found.length == 0:
            data = b""
        else:
            obj = ObjectRef(manifest.indexes.key, manifest.indexes.size)
            pieces = self.read_range(obj, found.start, found.end_inclusive, readahead=False)
            data = b"".join([piece async for piece in pieces])
        if len(data) != found.length or crc32c.crc32c(data) != found.crc32c:
            self.chunks.invalidate(
                ObjectRef(manifest.indexes.key, manifest.indexes.size),
                found.start,
                max(found.start, found.end_inclusive),
            )
            raise RemoteDataError(
                f"{kind.value} of segment {segment.segment_id.id} does not match its CRC-32C"
            )
        return data

    def _offset_index_loader(
        self, segment: SegmentMetadata
    ) -> Callable[[], Awaitable[OffsetIndex | None]]:
        async def load() -> OffsetIndex | None:
            data = await self.index_bytes(segment, IndexKind.OFFSET_INDEX)
            if data is None:
                return None
            try:
                return OffsetIndex.parse(data, base_offset=segment.start_offset)
            except FormatError as exc:
                raise RemoteDataError(f"offset index: {exc}") from exc

        return load

    async def _offset_index(self, segment: SegmentMetadata) -> OffsetIndex | None:
        key = ("offset", segment.segment_id.id)
        found = await self._indexes.get(key, self._offset_index_loader(segment), _index_weight)
        return found if isinstance(found, OffsetIndex) else None

    def _warm_next(self, spans: list[SegmentSpan], i: int) -> None:
        """Load the next span's manifest and offset index while this span is read; not when
        walks record segment maps: a walk that goes on into the next segment starts there at
        byte 0 and maps it, and a later request inside it finds its position in the map."""
        if i + 1 < len(spans) and self._maps.max_batches <= 0:
            segment = spans[i + 1].segment
            key = ("offset", segment.segment_id.id)
            self._indexes.warm(key, self._offset_index_loader(segment), _index_weight)

    async def _time_index(self, segment: SegmentMetadata) -> TimeIndex | None:
        async def load() -> TimeIndex | None:
            data = await self.index_bytes(segment, IndexKind.TIME_INDEX)
            if data is None:
                return None
            try:
                return TimeIndex.parse(data, base_offset=segment.start_offset)
            except FormatError as exc:
                raise RemoteDataError(f"time index: {exc}") from exc

        found = await self._indexes.get(("time", segment.segment_id.id), load, _index_weight)
        return found if isinstance(found, TimeIndex) else None

    async def position_for(self, segment: SegmentMetadata, offset: int) -> int:
        """Where to start scanning the ``.log`` for ``offset``: byte 0 for the segment's first
        offset, the batch that holds it when the segment's map reaches it (batches a walk
        verified) or the map's end when ``offset`` follows its last batch (a sequential reader's
        next request), else ``OffsetIndex.lookup``. The walk from there checks every batch."""
        if offset <= segment.start_offset:
            return 0
        smap = self._maps.get(self.key(segment, ObjectSuffix.LOG))
        if smap is not None and len(smap):
            if smap.lasts[-1] >= offset:
                return smap.positions[bisect.bisect_left(smap.lasts, offset)]
            if smap.lasts[-1] + 1 == offset and smap.end < segment.segment_size_in_bytes:
                return smap.end  # the batch after the last one mapped: where a reader goes on
        index = await self._offset_index(segment)
        if index is None:
            return 0
        position = index.lookup(offset).position
        if not 0 <= position < segment.segment_size_in_bytes:
            raise RemoteDataError(
                f"offset index of segment {segment.segment_id.id} points at byte {position},"
                f" outside its {segment.segment_size_in_bytes} bytes"
            )
        return position

    # -- byte ranges ---------------------------------------------------------------------

    async def read_range(
        self,
        obj: ObjectRef,
        start: int,
        end_inclusive: int,
        *,
        readahead: bool = True,
        readahead_limit: int | None = None,
    ) -> AsyncGenerator[memoryview, None]:
        """Bytes ``start..end_inclusive`` of ``obj`` as views, one cache window at a time;
        read-ahead (when on) stays below ``readahead_limit`` when one is given."""
        chunk_size = self.chunks.chunk_size
        position = start
        io = _FIRST_IO_BYTES
        while position <= end_inclusive:
            chunk_end = min((position // chunk_size + 1) * chunk_size, obj.size)
            length = min(io, chunk_end - position, end_inclusive - position + 1)
            io = _IO_BYTES
            # as the chunk's GET delivers them: a reader that jumped here has its first bytes
            # before the rest of the chunk
            data = await self.chunks.read(
                obj,
                position,
                length,
                readahead=readahead,
                readahead_limit=readahead_limit,
                early=True,
            )
            yield memoryview(data)
            position += length

    # -- the endpoints' operations -------------------------------------------------------

    async def segments(
        self,
        tp: TopicIdPartition,
        states: Collection[RemoteLogSegmentState] = RemoteSegmentStore.LIVE_STATES,
    ) -> list[SegmentMetadata]:
        """The partition's segments in ``states``, by start offset."""
        return await asyncio.to_thread(self._store.segments, tp, states=states)

    async def finished_segment(
        self, tp: TopicIdPartition, segment_id: uuid.UUID
    ) -> SegmentMetadata:
        """A COPY_SEGMENT_FINISHED segment of ``tp`` (fetchLogSegment and fetchIndex serve only
        those); else :class:`UnknownSegmentError`."""
        segment = await asyncio.to_thread(self._store.segment, RemoteLogSegmentId(tp, segment_id))
        if segment is None:
            raise UnknownSegmentError(
                f"{tp.topic}-{tp.partition} has no remote segment {segment_id}"
            )
        if segment.state is not _FINISHED:
            raise UnknownSegmentError(
                f"remote segment {segment_id} is {segment.state.name}, not readable",
                state=segment.state.name,
            )
        return segment

    async def segment_range(
        self, tp: TopicIdPartition, segment_id: uuid.UUID, start: int, end_inclusive: int | None
    ) -> ByteStream | Plan:
        """Bytes ``start..end_inclusive`` of a segment's ``.log`` (``fetchLogSegment``: the end is
        inclusive and clamped to the last byte; no end = to the end of the segment): a
        :class:`Plan` when every chunk of them is cached, else a stream through the cache."""
        segment = await self.finished_segment(tp, segment_id)
        return await self.log_range(segment, start, end_inclusive)

    @overload
    async def log_range(
        self,
        segment: SegmentMetadata,
        start: int,
        end_inclusive: int | None,
        *,
        readahead_end: int | None = None,
        files: Literal[False] = False,
    ) -> ByteStream | Plan: ...

    @overload
    async def log_range(
        self,
        segment: SegmentMetadata,
        start: int,
        end_inclusive: int | None,
        *,
        readahead_end: int | None = None,
        files: bool,
    ) -> ByteStream | Plan | NamedFiles: ...

    async def log_range(
        self,
        segment: SegmentMetadata,
        start: int,
        end_inclusive: int | None,
        *,
        readahead_end: int | None = None,
        files: bool = False,
    ) -> ByteStream | Plan | NamedFiles:
        """:meth:`segment_range` of ``segment`` as given (the broker plugin's metadata: the
        store need not have seen it). ``readahead_end`` (inclusive) is the end of a longer range
        that this one is a window of: the chunk prefetch goes on into it. ``files``: a reader
        that opens cached chunk files itself; a range whose chunks are all in written files
        is then answered with their names (:class:`NamedFiles`), opening none of them."""
        size = segment.segment_size_in_bytes
        if start < 0 or start >= size or (end_inclusive is not None and end_inclusive < start):
            raise RangeNotSatisfiableError(
                f"bytes {start}-{'' if end_inclusive is None else end_inclusive} are not within"
                f" segment {segment.segment_id.id} ({size} bytes)",
                size=size,
            )
        end = size - 1 if end_inclusive is None else min(end_inclusive, size - 1)
        obj = self.log_ref(segment)
        # read ahead past the range only for a reader that continues where it stopped, or into
        # the rest of the range a window belongs to
        sequential = self._range_ends.get(obj.key) == start - 1
        self._range_ends[obj.key] = end
        self._range_ends.move_to_end(obj.key)
        while len(self._range_ends) > _SEQUENTIAL_MEMORY:
            self._range_ends.popitem(last=False)
        ahead_to = None if sequential else end
        if readahead_end is not None:
            ahead_to = min(size - 1, max(readahead_end, end))
        chunk = self.chunks.chunk_size
        at_end = end // chunk + self.chunks.readahead_chunks >= (size - 1) // chunk
        # the read-ahead has reached this segment's end: the reader goes on into the next
        goes_on = ahead_to == size - 1 and at_end
        planned = (self._plan or files) and end - start + 1 >= self._plan_min_bytes
        limit = None if ahead_to is None else ahead_to + 1
        answer: ByteStream | Plan | NamedFiles | None = None
        if planned:
            answer = self._name_range(obj, start, end) if files else None
            if answer is None:
                answer = await self._open_range(obj, start, end)
        if answer is not None:
            # the reader goes on: fetch what follows while this is sent, as a streamed read
            # would (a sequential reader's read-ahead in groups)
            self.chunks.read_ahead(obj, start, end, limit=limit)
        else:
            pieces = self.read_range(obj, start, end, readahead_limit=limit)
            answer = await ByteStream.prime(pieces, length=end - start + 1)
        if goes_on:
            # only once this range's first bytes are here: a reader that jumped into the
            # segment waits for them, and its GET would otherwise queue behind the next
            # segment's (a sequential reader's bytes are cached by now, so its next segment
            # is not later for it)
            try:
                await self._prefetch_following(segment)
            except BaseException:
                if isinstance(answer, ByteStream):
                    await answer.aclose()
                elif isinstance(answer, Plan):
                    answer.close()
                raise
        return answer

    async def index(self, tp: TopicIdPartition, segment_id: uuid.UUID, kind: IndexKind) -> bytes:
        """One index of a finished segment, byte-exact (``fetchIndex``); an absent one (a
        transaction index of a segment without aborts) is :class:`IndexNotFoundError`."""
        segment = await self.finished_segment(tp, segment_id)
        data = await self.index_bytes(segment, kind)
        if data is None:
            raise IndexNotFoundError(f"remote segment {segment_id} has no {kind.value}")
        return data

    def _start(self, tp: TopicIdPartition, offset: int, lineage: _Lineage) -> int:
        """The span holding ``offset``; ``len(spans)`` for the offset right after the tiered
        range (a read there is a fetch at the end of a log: no batches, no error), so a reader
        whose last batch was a transaction marker ends cleanly."""
        spans = lineage.spans
        if spans and offset == spans[-1].end_offset + 1:
            return len(spans)
        at = bisect.bisect_right(lineage.starts, offset) - 1
        if at < 0 or offset > lineage.spans[at].end_offset:
            raise self._out_of_range(tp, offset, lineage)
        return at

    async def batches(
        self, tp: TopicIdPartition, offset: int, max_bytes: int, *, limit_offset: int | None = None
    ) -> BatchStream:
        """Record batches from the one that holds ``offset``, whole batches up to ``max_bytes``
        (at least one, as Kafka's ``minOneMessage``), across segments while they are contiguous;
        with ``limit_offset``, only batches ending below it after the first, and none when it is
        at or below ``offset``.
        :class:`OffsetOutOfRangeError` (with the tiered range) outside the tiered data."""
        lineage = await self._lineage(tp)
        at = self._start(tp, offset, lineage)
        budget = _Budget(max_bytes, limit_offset, offset)
        items = self._batches_from(lineage.spans, at, offset, budget)
        return await BatchStream.prime(items, offset=offset)

    async def runs(
        self, tp: TopicIdPartition, offset: int, max_bytes: int, *, limit_offset: int | None = None
    ) -> RunStream:
        """The batches of :meth:`batches`, as runs of consecutive batches: the fast path of raw
        responses (a header parse and a CRC per batch, no per-batch objects)."""
        lineage = await self._lineage(tp)
        at = self._start(tp, offset, lineage)
        budget = _Budget(max_bytes, limit_offset, offset)
        items = self._runs_from(lineage.spans, at, offset, budget)
        return await RunStream.prime(items, offset=offset)

    # -- planned responses ---------------------------------------------------------------

    async def plan_records(
        self, tp: TopicIdPartition, offset: int, max_bytes: int, *, limit_offset: int | None = None
    ) -> Plan | None:
        """The response :meth:`runs` would stream, when its batches were verified before and
        their chunks are still cached: no read, no CRC walk, the length known up front (it may
        end earlier than :meth:`runs`, where a verified prefix ends). None when the first batch
        is not mapped, or ``limit_offset`` leaves none. The same errors as :meth:`runs` for
        offsets outside the tiered range."""
        lineage = await self._lineage(tp)
        at = self._start(tp, offset, lineage)
        if not self._plan or (limit_offset is not None and limit_offset <= offset):
            return None
        spans = lineage.spans
        limit = _NO_LIMIT if limit_offset is None else limit_offset
        ranges: list[tuple[ObjectRef, _SegmentMap, int, int]] = []
        sent = 0
        next_offset = offset
        for i in range(at, len(spans)):
            span = spans[i]
            if i > at and span.start_offset != spans[i - 1].end_offset + 1:
                break  # a gap in the lineage
            obj = self.log_ref(span.segment)
            smap = self._maps.get(obj.key)
            if smap is None:
                break
            count = len(smap)
            first = bisect.bisect_left(smap.lasts, max(next_offset, span.start_offset))
            if first >= count:
                break
            if smap.bases[first] > span.end_offset:
                continue  # nothing of this span left (a superseded tail follows)
            in_span = bisect.bisect_right(smap.bases, span.end_offset)
            start = smap.positions[first]
            stop = min(
                in_span,
                bisect.bisect_left(smap.lasts, limit),
                bisect.bisect_right(smap.ends, start + max_bytes - sent),
            )
            if sent == 0:
                stop = max(stop, first + 1)  # at least one batch (minOneMessage)
            if stop <= first:
                break
            ranges.append((obj, smap, start, smap.ends[stop - 1]))
            sent += smap.ends[stop - 1] - start
            next_offset = smap.lasts[stop - 1] + 1
            if stop < in_span or (stop == count and smap.lasts[-1] < span.end_offset):
                break  # budget or limit reached, or the map ends inside the span
        if not ranges or sent < self._plan_min_bytes:
            return None
        return await self._open_plan(ranges)

    async def _open_plan(
        self, ranges: list[tuple[ObjectRef, _SegmentMap, int, int]]
    ) -> Plan | None:
        """The cached chunks of ``ranges`` (each ``[start, end)`` of an object whose batches
        ``smap`` verified in the exact copies it names), or None when one was fetched again."""
        parts = [(obj, start, end, smap.copies.get) for obj, smap, start, end in ranges]
        opened = await self._open_chunks(parts)
        if isinstance(opened, Plan):
            return opened
        self._maps.drop(opened.key)  # a chunk its map relies on was fetched again
        return None

    def _name_range(self, obj: ObjectRef, start: int, end_inclusive: int) -> NamedFiles | None:
        """Bytes ``start..end_inclusive`` of ``obj`` by the files that hold them, when every
        chunk of them is cached and written."""
        size = self.chunks.chunk_size
        ranges: list[NamedRange] = []
        for index in range(start // size, end_inclusive // size + 1):
            copy = self.chunks.copy_id(obj, index)
            found = None if copy is None else self.chunks.written_chunk(obj, index, copy)
            if found is None:
                return None
            low = max(start, index * size) - index * size
            high = min(end_inclusive + 1, (index + 1) * size) - index * size
            offset = found.offset + low
            last = ranges[-1] if ranges else None
            if last and last.path == found.path and last.offset + last.length == offset:
                ranges[-1] = last._replace(length=last.length + high - low)
            else:
                ranges.append(NamedRange(found.path, offset, high - low))
        return NamedFiles(ranges, end_inclusive + 1 - start)

    async def _open_range(self, obj: ObjectRef, start: int, end_inclusive: int) -> Plan | None:
        """Bytes ``start..end_inclusive`` of ``obj`` when every chunk of them is cached."""
        opened = await self._open_chunks(
            [(obj, start, end_inclusive + 1, functools.partial(self.chunks.copy_id, obj))]
        )
        return opened if isinstance(opened, Plan) else None

    async def _open_chunks(
        self, parts: Sequence[tuple[ObjectRef, int, int, Callable[[int], int | None]]]
    ) -> Plan | ObjectRef:
        """Open the chunks holding bytes ``[start, end)`` of each part's object, in the copy
        ``copy_of(index)`` names: a plan of file ranges and in-memory slices, or the object one
        of whose chunks is missing or is no longer that copy."""
        size = self.chunks.chunk_size
        pieces: list[memoryview | FileRange] = []
        fds: list[int] = []
        try:
            for obj, start, end, copy_of in parts:
                for index in range(start // size, (end - 1) // size + 1):
                    copy = copy_of(index)
                    found = None if copy is None else await self.chunks.open_chunk(obj, index, copy)
                    if found is None:
                        for fd in fds:
                            os.close(fd)
                        return obj
                    low = max(start, index * size) - index * size
                    high = min(end, (index + 1) * size) - index * size
                    if isinstance(found, ChunkFile):
                        fds.append(found.fd)
                        pieces.append(FileRange(found.fd, found.offset + low, high - low))
                    else:
                        pieces.append(memoryview(found)[low:high])
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return Plan(pieces, fds)

    # -- transactions --------------------------------------------------------------------

    async def aborted_transactions(
        self, tp: TopicIdPartition, offset: int, max_bytes: int, *, cap: int | None = None
    ) -> tuple[list[AbortedTransaction], int]:
        """The aborted transactions a read_committed response from ``offset`` of ``max_bytes``
        must carry, and the offset the response must stop below (``limit_offset`` of
        :meth:`runs` and :meth:`batches`).

        Kafka's ``collectAbortedTransactions``: an upper bound of the response's offsets from the
        remote offset index (``fetchUpperBoundOffset``), then the transaction indexes of this
        segment and the following ones, keeping entries with ``last >= offset`` and
        ``first < bound``, until one entry's last stable offset reaches the bound; if none
        does, the broker's local transaction indexes (when this host has the partition). If
        that does not settle it either (no local copy, or the markers are not in it), a
        transaction open at the end of the tiered data may still abort with its marker not
        tiered: the bound moves down to the archive's last stable offset (:meth:`_stable_end`),
        as a broker never returns data past its LSO to a read_committed fetch; a read from
        there on gets no batches. With ``cap``, at most ``cap`` transactions that start after
        ``offset`` are kept and the bound moves down to the first one left out.
        """
        lineage = await self._lineage(tp)
        at = self._start(tp, offset, lineage)
        spans = lineage.spans
        bound = max(offset + 1, await self._upper_bound(spans, at, offset, max_bytes))
        found: set[AbortedTransaction] = set()
        complete = False
        seen: set[uuid.UUID] = set()
        # only indexes that follow the data without a gap can settle it: a marker may be in
        # the gap, and an abort past it says nothing of the transactions before
        last = _contiguous_end(spans, at)
        run = spans[at : last + 1] if last is not None else []
        for span in run:
            segment = span.segment
            if segment.txn_index_empty or segment.segment_id.id in seen:
                continue
            seen.add(segment.segment_id.id)
            complete = _collect(await self._txn_entries(segment), offset, bound, found)
            if complete:
                break
        if not complete and self._log_dirs and last is not None:
            # settled only by an abort whose last stable offset reaches the bound (that a
            # transaction committed leaves no entry, and a local replica that is behind may
            # not have its marker yet), in a local log that goes on from the tiered data
            local, local_start = await asyncio.to_thread(self._local_txn_entries, tp, offset)
            settles = _collect(local, offset, bound, found)
            follows = local_start is not None and local_start <= spans[last].end_offset + 1
            complete = settles and follows
        if not complete and last is not None:
            stable = await self._stable_end(spans, at, last)
            if stable is not None and stable < bound:
                bound = stable
                found = {a for a in found if a.first_offset < bound}
        ordered = sorted(found, key=lambda a: (a.first_offset, a.producer_id))
        if cap is not None:
            later = [a for a in ordered if a.first_offset > offset]
            if len(later) > cap:
                # no transaction starts within the batch holding ``offset`` after it (that
                # batch is one producer's), so the first batch is always fully covered
                bound = later[cap].first_offset
                ordered = [a for a in ordered if a.first_offset < bound]
        return ordered, bound

    async def _stable_end(self, spans: list[SegmentSpan], at: int, last: int) -> int | None:
        """The last stable offset of the tiered run ``spans[at : last + 1]`` (a read's data up
        to a gap): the first offset of a transaction still open at the end of its last segment,
        from that segment's producer snapshot; None when none is open. The Spark source stops
        its read_committed ranges at the same offset.

        A snapshot that is missing or does not parse (Kafka uploads an older snapshot that
        fails its CRC as it is) says nothing: the one of the segment before it does, and the
        spans after that one are then past the last stable offset too. With no usable snapshot
        back to span ``at``, nothing from there on is settled."""
        for i in range(last, at - 1, -1):
            found = await self._snapshot_stable(spans[i].segment)
            if found == [_UNUSABLE]:
                continue
            stable = found[0] if found else None
            if i == last:
                return stable
            cut = spans[i + 1].start_offset  # what follows span i is not settled
            return cut if stable is None else min(stable, cut)
        return spans[at].start_offset

    async def _snapshot_stable(self, segment: SegmentMetadata) -> list[int]:
        """[the first offset of a transaction open at the end of ``segment``] from its producer
        snapshot, [] when none is, [_UNUSABLE] when the snapshot is missing or does not parse
        (logged once: the answer is cached like a transaction index)."""

        async def load() -> list[int]:
            data = await self.index_bytes(segment, IndexKind.PRODUCER_SNAPSHOT)
            problem: str | None = "no producer snapshot" if data is None else None
            if data is not None:
                try:
                    stable = parse_producer_snapshot(data).last_stable_offset()
                except FormatError as exc:
                    problem = str(exc)
                else:
                    return [] if stable is None else [stable]
            log.warning(
                "producer_snapshot_unusable",
                segment_id=str(segment.segment_id.id),
                start_offset=segment.start_offset,
                error=problem,
                detail="read_committed reads take the transactions open at this segment's end"
                " from an earlier segment's snapshot, and stop before this segment",
            )
            return [_UNUSABLE]

        found = await self._indexes.get(("snapshot", segment.segment_id.id), load, _txn_weight)
        return found if isinstance(found, list) else [_UNUSABLE]

    async def _upper_bound(
        self, spans: list[SegmentSpan], at: int, offset: int, max_bytes: int
    ) -> int:
        """An offset above every offset a response of ``max_bytes`` from ``offset`` can hold
        (the response is also cut there, so an estimate too low only shortens it)."""
        remaining = max_bytes
        for i in range(at, len(spans)):
            span = spans[i]
            if i > at and span.start_offset != spans[i - 1].end_offset + 1:
                return spans[i - 1].end_offset + 1
            segment = span.segment
            position = await self.position_for(segment, offset if i == at else span.start_offset)
            target = position + remaining
            size = segment.segment_size_in_bytes
            if target < size:
                index = await self._offset_index(segment)
                if index is not None:
                    found = _first_entry_at_or_after(index, target)
                    if found is not None and found <= span.end_offset:
                        return found
                return span.end_offset + 1
            remaining = target - size
        return spans[-1].end_offset + 1

    async def _txn_entries(self, segment: SegmentMetadata) -> list[AbortedTxn]:
        async def load() -> list[AbortedTxn]:
            data = await self.index_bytes(segment, IndexKind.TXN_INDEX)
            if not data:
                return []
            try:
                return list(TxnIndex.parse(data, base_offset=segment.start_offset))
            except FormatError as exc:
                raise RemoteDataError(f"transaction index: {exc}") from exc

        found = await self._indexes.get(("txn", segment.segment_id.id), load, _txn_weight)
        return found if isinstance(found, list) else []

    def _local_txn_entries(
        self, tp: TopicIdPartition, offset: int
    ) -> tuple[list[AbortedTxn], int | None]:
        """(thread) The aborted transactions of the broker's local segments of ``tp`` (this
        incarnation) that can hold markers at or after ``offset``, in offset order, and the
        base offset of the first local segment (None without a local copy); read only, a file
        being appended to is read up to its last whole entry."""
        for log_dir in self._log_dirs:
            directory = log_dir / f"{tp.topic}-{tp.partition}"
            try:
                if read_partition_metadata(directory / "partition.metadata").topic_uuid != (
                    tp.topic_id
                ):
                    continue
                bases = sorted(
                    int(path.stem)
                    for path in directory.iterdir()
                    if path.suffix == ".log" and path.stem.isdigit()
                )
            except (OSError, FormatError, CheckpointFormatError, ValueError):
                continue
            entries: list[AbortedTxn] = []
            for i, base in enumerate(bases):
                if i + 1 < len(bases) and bases[i + 1] <= offset:
                    continue  # its markers all lie below ``offset``
                try:
                    data = (directory / f"{base:020d}.txnindex").read_bytes()
                except OSError:
                    continue  # no aborts in that segment, or deleted meanwhile
                try:
                    index = TxnIndex.parse(
                        data[: len(data) - len(data) % _TXN_ENTRY], base_offset=base
                    )
                except FormatError as exc:
                    log.warning("local_txn_index_unusable", topic=tp.topic, error=str(exc))
                    continue
                entries.extend(index)
            return entries, (bases[0] if bases else None)
        return [], None

    def _walk(
        self, spans: list[SegmentSpan], at: int, offset: int
    ) -> Iterator[tuple[SegmentSpan, tuple[ObjectRef, ...]]]:
        """The spans from ``at`` on while they are contiguous, each with the ``.log`` objects of
        the next ones (up to :data:`_FOLLOW_SPANS`, up to a gap), for the read-ahead: with
        segments of a few chunks, one segment ahead is one GET ahead, and a reader that is
        faster than one GET waits at every segment."""
        for i in range(at, len(spans)):
            if i > at and spans[i].start_offset != spans[i - 1].end_offset + 1:
                return  # a gap in the lineage: the next request gets the 416
            self._warm_next(spans, i)
            follow: list[ObjectRef] = []
            for j in range(i + 1, min(i + 1 + _FOLLOW_SPANS, len(spans))):
                if spans[j].start_offset != spans[j - 1].end_offset + 1:
                    break
                follow.append(self.log_ref(spans[j].segment))
            yield spans[i], tuple(follow)

    async def _batches_from(
        self, spans: list[SegmentSpan], at: int, offset: int, budget: _Budget
    ) -> AsyncGenerator[Batch, None]:
        next_offset = offset
        for span, follow in self._walk(spans, at, offset):
            target = max(next_offset, span.start_offset)
            async for batch in self._span_batches(span, target, follow=follow):
                if not budget.allows(batch.header.size, batch.header.last_offset):
                    return
                yield batch
                budget.sent += batch.header.size
                next_offset = max(next_offset, batch.header.next_offset)
                if budget.exhausted:
                    return

    async def _runs_from(
        self, spans: list[SegmentSpan], at: int, offset: int, budget: _Budget
    ) -> AsyncGenerator[Run, None]:
        next_offset = offset
        for span, follow in self._walk(spans, at, offset):
            target = max(next_offset, span.start_offset)
            async for run in self._span_runs(span, target, follow=follow, budget=budget):
                yield run
                next_offset = max(next_offset, run.next_offset)
            if budget.exhausted or budget.stopped:
                return

    async def _span_runs(
        self, span: SegmentSpan, target: int, *, follow: tuple[ObjectRef, ...], budget: _Budget
    ) -> AsyncGenerator[Run, None]:
        """Runs of ``span``'s batches from the one holding ``target``: within a window, a tight
        loop over headers and CRCs; a batch that crosses a window (chunk) boundary goes through
        :meth:`_span_batches`' careful path."""
        segment = span.segment
        obj = self.log_ref(segment)
        position = await self.position_for(segment, target)
        reader = _ObjectReader(self.chunks, obj, follow=follow)
        end_offset = span.end_offset
        unpack = BATCH_HEADER.unpack_from
        overhead = RECORD_BATCH_OVERHEAD
        chunk_size = self.chunks.chunk_size
        # a walk that reaches the end of the segment's verified prefix extends its map
        smap = self._maps.recording(obj.key, position)
        while position < obj.size:
            data = await reader.window_at(position)
            n = len(data)
            off = run_start = 0
            run_base = next_offset = -1
            span_done = False
            copies = {position // chunk_size: reader.copy}
            recorded, recording = 0, smap  # batches added to this map in this window
            while off + overhead <= n:
                fields = unpack(data, off)
                size = fields[1] + LOG_OVERHEAD
                if fields[3] != 2 or size < overhead or off + size > n:
                    break  # malformed or crossing the window: the careful path decides
                base = fields[0]
                if base > end_offset:
                    span_done = True
                    break
                last = base + fields[6]
                if last < target:
                    if off != run_start:
                        raise RemoteDataError(f"offsets go backwards in {obj.key} at {position}")
                    off += size
                    run_start = off
                    continue
                if not budget.allows(size, last):
                    budget.stopped = True
                    break
                if crc32c.crc32c(data[off + _CRC_START : off + size]) != fields[4]:
                    self.chunks.invalidate(obj, position + off, position + off + size - 1)
                    raise RemoteDataError(
                        f"record batch at offset {base} of {obj.key} (byte {position + off})"
                        " fails its CRC-32C; it was not served"
                    )
                if run_base < 0:
                    run_base = base
                if smap is not None:
                    if position + off == smap.end and smap.add(
                        position + off, size, base, last, copies
                    ):
                        recorded += 1
                    else:
                        smap = None
                budget.sent += size
                next_offset = last + 1
                off += size
                if budget.exhausted:
                    budget.stopped = True
                    break
            if recorded and recording is not None:
                self._maps.added(obj.key, recording, recorded)
            if off > run_start:
                yield Run([data[run_start:off]], run_base, next_offset)
            if budget.stopped or span_done:
                return
            if off > 0:
                position += off
                continue
            # no progress at a window's start: one batch the careful way (it spans windows,
            # is larger than one, or is malformed, which raises)
            read_copies: dict[int, int | None] = {}
            careful = self._span_batches(
                span, target, follow=follow, start=position, limit=1, copies=read_copies
            )
            async with aclosing(careful) as batches:
                found = [batch async for batch in batches]
            if not found:
                return
            header = found[0].header
            if header.last_offset >= target:
                if not budget.allows(header.size, header.last_offset):
                    budget.stopped = True
                    return
                if smap is not None:
                    spanned = range(position // chunk_size, (header.end_position - 1) // chunk_size)
                    needed = {i: read_copies.get(i) for i in (*spanned, spanned.stop)}
                    if position == smap.end and smap.add(
                        position, header.size, header.base_offset, header.last_offset, needed
                    ):
                        self._maps.added(obj.key, smap, 1)
                    else:
                        smap = None
                budget.sent += header.size
                yield Run(found[0].pieces, header.base_offset, header.next_offset)
                if budget.exhausted:
                    budget.stopped = True
                    return
            position = header.end_position

    async def _span_batches(
        self,
        span: SegmentSpan,
        target: int,
        *,
        follow: tuple[ObjectRef, ...],
        start: int | None = None,
        limit: int | None = None,
        copies: dict[int, int | None] | None = None,
    ) -> AsyncGenerator[Batch, None]:
        """Batches of ``span``'s segment that end at or after ``target`` and start within the
        span, CRC-checked; from byte ``start`` (else the offset index's position) and at most
        ``limit`` batches looked at (skipped ones included). ``copies`` receives the cached
        copy each chunk was read from."""
        segment = span.segment
        obj = self.log_ref(segment)
        position = await self.position_for(segment, target) if start is None else start
        reader = _ObjectReader(self.chunks, obj, follow=follow)
        if copies is not None:
            reader.copies = copies
        seen = 0
        while position < obj.size and (limit is None or seen < limit):
            seen += 1
            head = await reader.pieces(position, RECORD_BATCH_OVERHEAD)
            try:
                header = parse_batch_header(
                    _join(head), position=position, path=obj.key, available=obj.size - position
                )
            except FormatError as exc:
                self.chunks.invalidate(obj, position, position + RECORD_BATCH_OVERHEAD)
                raise RemoteDataError(str(exc)) from exc
            if header.base_offset > span.end_offset:
                return
            if header.last_offset >= target or limit is not None:
                pieces = await reader.pieces(position, header.size)
                if not _crc_matches(header, pieces):
                    self.chunks.invalidate(obj, position, header.end_position - 1)
                    raise RemoteDataError(
                        f"record batch at offset {header.base_offset} of {obj.key} (byte"
                        f" {position}) fails its CRC-32C; it was not served"
                    )
                yield Batch(header, pieces)
            position = header.end_position

    async def list_offset(self, tp: TopicIdPartition, timestamp: int) -> TimestampAnswer | None:
        """Kafka's ListOffsets over the tiered data: a timestamp (:meth:`offset_for_timestamp`),
        or ``-2`` (EARLIEST: the first tiered offset), ``-1`` (LATEST: the last tiered offset
        + 1, the remote log's end) with timestamp -1, or ``-3`` (MAX_TIMESTAMP: the first
        record with the largest timestamp). None when nothing tiered answers."""
        if timestamp >= 0:
            return await self.offset_for_timestamp(tp, timestamp)
        spans = await self.spans(tp)
        if not spans:
            return None
        if timestamp == EARLIEST_TIMESTAMP:
            first = spans[0]
            epoch = _epoch_at(first.segment, first.start_offset)
            return TimestampAnswer(first.start_offset, _NO_TIMESTAMP, epoch)
        if timestamp == LATEST_TIMESTAMP:
            last = spans[-1]
            epoch = _epoch_at(last.segment, last.end_offset)
            return TimestampAnswer(last.end_offset + 1, _NO_TIMESTAMP, epoch)
        if timestamp == MAX_TIMESTAMP:
            # the segments' max timestamps are in the metadata: the first record reaching
            # the largest one is the answer (a later tie is not the first)
            largest = max(span.segment.max_timestamp_ms for span in spans)
            return await self.offset_for_timestamp(tp, largest)
        raise ValueError(f"timestamp {timestamp} is neither >= 0 nor -1, -2, -3")

    async def offset_for_timestamp(
        self, tp: TopicIdPartition, timestamp: int
    ) -> TimestampAnswer | None:
        """The first record (control records included, as Kafka answers ListOffsets) whose
        timestamp is at or after ``timestamp`` in the tiered data, or None."""
        lineage = await self._lineage(tp)
        for span in lineage.spans:
            segment = span.segment
            if segment.max_timestamp_ms < timestamp:
                continue
            index = await self._time_index(segment)
            target = span.start_offset
            if index is not None:
                target = max(target, index.lookup(timestamp).offset)
            async for batch in self._span_batches(span, target, follow=()):
                header = batch.header
                if header.max_timestamp < timestamp:
                    continue
                records = _decode(batch)
                for record in records:
                    if record.timestamp >= timestamp and span.start_offset <= record.offset:
                        return TimestampAnswer(
                            record.offset, record.timestamp, header.partition_leader_epoch
                        )
        return None


def _decode(batch: Batch) -> list[Record]:
    try:
        return decode_records(batch.tobytes(), verify_crc=False, position=batch.header.position)
    except FormatError as exc:
        raise RemoteDataError(str(exc)) from exc


def decode_batch(batch: Batch) -> list[Record]:
    """The records of a batch (its CRC was checked when it was read)."""
    return _decode(batch)


def _epoch_at(segment: SegmentMetadata, offset: int) -> int:
    """The leader epoch of ``offset`` from the segment's epoch map (-1 when unknown)."""
    found = -1
    for epoch, start in segment.segment_leader_epochs:
        if start > offset:
            break
        found = epoch
    return found


#: a producer snapshot that is missing or does not parse (:meth:`ReadService._snapshot_stable`)
_UNUSABLE: Final = -1


def _contiguous_end(spans: Sequence[SegmentSpan], at: int) -> int | None:
    """The index of the last span of the contiguous run from span ``at`` (up to a gap), or
    None when ``at`` is past the spans."""
    if at >= len(spans):
        return None
    last = at
    while last + 1 < len(spans) and spans[last + 1].start_offset == spans[last].end_offset + 1:
        last += 1
    return last


def _collect(
    entries: Iterable[AbortedTxn], offset: int, bound: int, found: set[AbortedTransaction]
) -> bool:
    """``TransactionIndex.collectAbortedTxns``: add the entries overlapping ``[offset, bound)``;
    True once an entry's last stable offset reaches ``bound`` (the search is complete)."""
    for txn in entries:
        if txn.last_offset >= offset and txn.first_offset < bound:
            found.add(AbortedTransaction(txn.producer_id, txn.first_offset))
        if txn.last_stable_offset >= bound:
            return True
    return False


def _first_entry_at_or_after(index: OffsetIndex, position: int) -> int | None:
    """``OffsetIndex.fetchUpperBoundOffset``: the offset of the first entry at or after
    ``position``, or None."""
    at = bisect.bisect_left(range(len(index)), position, key=lambda i: index[i].position)
    return index[at].offset if at < len(index) else None


def _txn_weight(value: object) -> int:
    return 64 + (len(value) * 64 if isinstance(value, list) else 0)


def _manifest_weight(_value: object) -> int:
    return _MANIFEST_WEIGHT


def _index_weight(value: object) -> int:
    if isinstance(value, OffsetIndex | TimeIndex):
        return len(value.data) + 128
    return 64
