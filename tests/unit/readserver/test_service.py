"""The read engine on fake tiered data: every offset served from the right segment along the
leader-epoch lineage (no duplicates, no gaps), whole CRC-checked batches, timestamps, byte ranges,
indexes, and the errors of each."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sidecar.errors import StorageError
from sidecar.kafka.checkpoints import (
    EpochEntry,
    format_leader_epoch_checkpoint,
    format_partition_metadata,
)
from sidecar.kafka.indexes import AbortedTxn
from sidecar.kafka.records import Compression, Record, decode_records
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from sidecar.readserver.cache import ChunkCache, MemoryCache
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
from sidecar.readserver.service import (
    Batch,
    ByteStream,
    FileRange,
    Plan,
    ReadService,
    decode_batch,
)
from sidecar.storage.keys import ObjectSuffix
from sidecar.storage.manifest import MANIFEST_MAX_BYTES, IndexKind
from tests.unit.readserver._tiered import (
    BASE_TS,
    LAYOUT,
    TP,
    data_batches,
    read_service,
    three_segments,
)


async def _collect(service: ReadService, tp: TopicIdPartition, offset: int, max_bytes: int):
    stream = await service.batches(tp, offset, max_bytes)
    return [batch async for batch in stream]


async def _range_bytes(stream: ByteStream | Plan) -> bytes:
    """The bytes of a streamed or planned range (the plan's files closed)."""
    if isinstance(stream, ByteStream):
        return b"".join([bytes(p) async for p in stream])
    try:
        return b"".join(
            os.pread(p.fd, p.length, p.offset) if isinstance(p, FileRange) else bytes(p)
            for p in stream.pieces
        )
    finally:
        stream.close()


def _stem(remote, segment) -> str:
    """What the keys of a segment's objects (log, indexes, manifest) start with."""
    return remote.layout.segment_key(
        topic=TP.topic,
        topic_id=TP.topic_id,
        partition=TP.partition,
        base_offset=segment.start_offset,
        segment_id=segment.segment_id.id,
        suffix=ObjectSuffix.LOG,
    ).removesuffix(".log")


class _Held:
    """The object store, with the key of each GET in the order they start; the GETs of one
    key (whole or ranged) wait until ``release`` is set (an Event, no sleeps)."""

    def __init__(self, inner, key: str) -> None:
        self.inner = inner
        self.key = key
        self.started: list[str] = []
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def _enter(self, key: str) -> None:
        self.started.append(key)
        if key == self.key:
            self.waiting.set()
            await self.release.wait()

    async def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        await self._enter(key)
        return await self.inner.get(key, max_bytes=max_bytes)

    async def get_range(
        self, key: str, start: int, end_inclusive: int, *, arrivals: object = None
    ) -> bytes:
        await self._enter(key)
        return await self.inner.get_range(key, start, end_inclusive)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@contextlib.asynccontextmanager
async def _held_service(remote, held: _Held, directory: Path) -> AsyncIterator[ReadService]:
    """The read engine over ``remote`` with its GETs through ``held``, and a cache of its own
    (as the ``chunks`` fixture's)."""
    async with ChunkCache(
        objects=held,
        directory=directory,
        max_bytes=1024 * 1024,
        chunk_size=64 * 1024,
        readahead_chunks=2,
        fetch_timeout_s=5.0,
    ) as chunks:
        service = read_service(dataclasses.replace(remote, objects=held), chunks)
        try:
            yield service
        finally:
            await service.aclose()


def _data(batches: list[Batch], offset: int) -> list[Record]:
    return [
        r
        for b in batches
        if not b.header.is_control
        for r in decode_records(b.tobytes())
        if r.offset >= offset
    ]


class TestRecordsByOffset:
    """Batches from the one holding the offset, across segments, byte for byte."""

    async def test_every_offset_starts_with_the_batch_that_holds_it(self, remote, service):
        """For every tiered offset, the first batch holds it and the records from there on
        equal what the broker wrote."""
        expected = await three_segments(remote)
        by_offset = {r.offset: i for i, r in enumerate(expected)}
        last = remote.segments[-1].end_offset
        for offset in range(last + 1):
            batches = await _collect(service, TP, offset, 4096)
            first = batches[0].header
            assert first.base_offset <= offset <= first.last_offset
            got = _data(batches, offset)
            if offset in by_offset:
                start = by_offset[offset]
                assert got == expected[start : start + len(got)]
                assert got
            else:  # a control record's offset: the data after it
                assert got[0].offset > offset

    async def test_read_ahead_runs_on_through_the_next_segments_up_to_a_gap(self, remote, service):
        """Segments smaller than the read-ahead: a read starts the GETs of the segments after
        the next one too, but never of one past a gap in the lineage."""
        a = await remote.upload(0, data_batches(0, 2))
        b = await remote.upload(10, data_batches(10, 2))
        c = await remote.upload(20, data_batches(20, 2))
        d = await remote.upload(100, data_batches(100, 2))  # after a gap (30-99)

        async def read(offset: int) -> None:
            assert [run async for run in await service.runs(TP, offset, 100)]
            await service.chunks.idle()

        def cached() -> list[bool]:
            return [service.chunks.is_cached(service.log_ref(s), 0) for s in (a, b, c, d)]

        await read(0)
        assert cached() == [True, True, True, False]  # two chunks ahead: b and c
        await read(10)
        assert cached() == [True, True, True, False]  # d is after the gap

    async def test_one_read_spans_segments_byte_for_byte(self, remote, service):
        """With room for everything, the batches are the three .log files concatenated."""
        await three_segments(remote)
        batches = await _collect(service, TP, 0, 10**9)
        assert b"".join(b.tobytes() for b in batches) == b"".join(remote.logs.values())

    async def test_runs_are_the_same_bytes_as_batches(self, remote, service):
        """The raw fast path (runs of batches) returns exactly the bytes of the per-batch path,
        for every offset and several budgets, batches larger than a chunk included."""
        await three_segments(remote)
        end = remote.segments[-1].end_offset + 1
        big = data_batches(end, 3, value_size=40_000)  # 200 KB batches over 64 KiB chunks
        await remote.upload(end, [*big, *data_batches(end + 15, 4)])
        last = remote.segments[-1].end_offset
        for max_bytes in (1, 3000, 70_000, 10**9):
            for offset in range(0, last + 1, 3 if max_bytes < 10**9 else 17):
                batches = await _collect(service, TP, offset, max_bytes)
                stream = await service.runs(TP, offset, max_bytes)
                runs = [run async for run in stream]
                assert b"".join(p for r in runs for p in r.pieces) == b"".join(
                    b.tobytes() for b in batches
                ), (offset, max_bytes)
                assert runs[0].base_offset == batches[0].header.base_offset
                assert runs[-1].next_offset == batches[-1].header.next_offset

    async def test_max_bytes_returns_whole_batches_and_at_least_one(self, remote, service):
        """max_bytes bounds the batches (never cut); 1 byte still returns one batch."""
        await three_segments(remote)
        one = await _collect(service, TP, 7, 1)
        assert len(one) == 1
        some = await _collect(service, TP, 0, 5000)
        assert sum(b.header.size for b in some) <= 5000
        more = await _collect(service, TP, 0, 5000 + some[-1].header.size)
        assert len(more) > len(some)

    async def test_offset_outside_the_tiered_range_is_416_with_the_range(self, remote, service):
        """Offsets past the end carry the available range; nothing tiered carries None."""
        with pytest.raises(OffsetOutOfRangeError) as nothing:
            await service.batches(TP, 0, 100)
        assert nothing.value.details["available"] is None
        await three_segments(remote)
        end = remote.segments[-1].end_offset
        with pytest.raises(OffsetOutOfRangeError) as past:
            await service.batches(TP, end + 2, 100)
        assert past.value.details["available"] == {"start_offset": 0, "end_offset": end}
        assert past.value.status == 416

    async def test_the_offset_after_the_range_reads_nothing(self, remote, service):
        """Right after the tiered range is the end of a log, not outside it: every read path
        answers nothing there, without an error."""
        await three_segments(remote)
        end = remote.segments[-1].end_offset
        assert [b async for b in await service.batches(TP, end + 1, 100)] == []
        assert [r async for r in await service.runs(TP, end + 1, 100)] == []
        assert await service.plan_records(TP, end + 1, 100) is None
        aborted, limit = await service.aborted_transactions(TP, end + 1, 100)
        assert (aborted, limit) == ([], end + 2)

    async def test_a_sequential_reader_needs_no_index(self, remote, service):
        """A reader from a segment's first offset starts at byte 0 and its next requests go on
        where the verified batches end: no manifest or index GET; an offset elsewhere reads
        the offset index. The records are the same either way."""
        await remote.upload(0, data_batches(0, 40))
        whole = b"".join(b.tobytes() for b in await _collect(service, TP, 0, 10**9))
        gets = remote.objects.calls["get"]
        assert gets == 0
        offset, got = 0, b""
        while offset <= remote.segments[-1].end_offset:
            stream = await service.runs(TP, offset, 3000)
            runs = [run async for run in stream]
            got += b"".join(p for r in runs for p in r.pieces)
            offset = runs[-1].next_offset
        assert got == whole
        assert remote.objects.calls["get"] == 0
        await remote.upload(200, data_batches(200, 10))
        batches = await _collect(service, TP, 207, 1)
        assert batches[0].header.base_offset <= 207 <= batches[0].header.last_offset
        assert remote.objects.calls["get"] > 0  # the new segment's manifest and index

    async def test_without_a_manifest_the_segment_is_scanned_from_its_start(self, remote, service):
        """A segment whose manifest is missing is still served (scanned from byte 0)."""
        await remote.upload(0, data_batches(0, 20), manifest=False)
        batches = await _collect(service, TP, 57, 1)
        assert batches[0].header.base_offset <= 57 <= batches[0].header.last_offset

    async def test_corrupt_remote_bytes_are_never_served(self, remote, service):
        """A flipped byte in S3 makes the batch that holds it an error, not data."""
        segment = await remote.upload(0, data_batches(0, 10))
        key = LAYOUT.segment_key(
            topic=TP.topic,
            topic_id=TP.topic_id,
            partition=0,
            base_offset=0,
            segment_id=segment.segment_id.id,
            suffix=ObjectSuffix.LOG,
        )
        body = bytearray(remote.objects.objects[key])
        body[100] ^= 0xFF  # inside the first batch's records
        await remote.objects.put(key, bytes(body))
        with pytest.raises(RemoteDataError, match="CRC"):
            await _collect(service, TP, 0, 10**9)

    async def test_corrupt_bytes_are_never_served_by_the_raw_path(self, remote, service):
        """The raw path (runs) checks every batch before handing it out: a flipped byte in the
        6th batch is an error, no byte from that batch on was returned, and the chunk is
        fetched again next time."""
        batches = data_batches(0, 10)
        segment = await remote.upload(0, batches)
        key = service.log_ref(segment).key
        bad_at = sum(len(b) for b in batches[:5])
        body = bytearray(remote.objects.objects[key])
        body[bad_at + 80] ^= 0xFF  # inside the 6th batch's records
        await remote.objects.put(key, bytes(body))
        got = bytearray()

        async def read_all() -> None:
            stream = await service.runs(TP, 0, 10**9)
            async for run in stream:
                got.extend(b"".join(run.pieces))

        with pytest.raises(RemoteDataError, match=r"offset 25 .* CRC"):
            await read_all()
        assert len(got) <= bad_at
        assert got == bytes(body[: len(got)])
        await remote.objects.put(key, b"".join(batches))  # repaired: read again, not cached
        stream = await service.runs(TP, 0, 10**9)
        assert b"".join([bytes(p) async for r in stream for p in r.pieces]) == b"".join(batches)

    async def test_a_second_copy_of_a_segment_is_read_once(self, remote, service):
        """Two FINISHED copies of one segment (a retried copy): every record exactly once."""
        batches = data_batches(0, 10)
        await remote.upload(0, batches)
        await remote.upload(0, batches)
        await remote.upload(50, data_batches(50, 10))
        got = _data(await _collect(service, TP, 0, 10**9), 0)
        assert [r.offset for r in got] == list(range(100))
        spans = await service.spans(TP)
        assert [(s.start_offset, s.end_offset) for s in spans] == [(0, 49), (50, 99)]

    async def test_a_stale_leaders_copy_outside_the_lineage_is_not_served(self, remote, service):
        """Epoch 0 wrote 0..49 then a stale leader kept writing epoch 0 to 99 (copied); the new
        leader's epoch 1 starts at 50. Offsets 50..99 come from epoch 1's segment only."""
        await remote.upload(0, data_batches(0, 10, epoch=0))
        await remote.upload(50, data_batches(50, 10, epoch=0, tag=b"STALE"))
        await remote.upload(50, data_batches(50, 10, epoch=1, tag=b"TRUE"))
        got = _data(await _collect(service, TP, 0, 10**9), 0)
        assert [r.offset for r in got] == list(range(100))
        assert all(r.value.startswith(b"TRUE") for r in got[50:])

    async def test_overlapping_copies_switch_segments_at_the_boundary(self, remote, service):
        """A new leader's segment 40..99 overlaps 0..49: 0..39 come from the first, the rest from
        the second, each offset once."""
        await remote.upload(0, data_batches(0, 10, tag=b"A"))
        second = [*data_batches(40, 2, tag=b"B"), *data_batches(50, 10, epoch=1, tag=b"B")]
        await remote.upload(40, second)
        got = _data(await _collect(service, TP, 0, 10**9), 0)
        assert [r.offset for r in got] == list(range(100))
        assert {r.value[:1] for r in got[:40]} == {b"A"}
        assert {r.value[:1] for r in got[40:]} == {b"B"}
        from_middle = _data(await _collect(service, TP, 45, 10**9), 45)
        assert [r.offset for r in from_middle] == list(range(45, 100))

    async def test_the_brokers_checkpoint_decides_the_lineage(self, remote, chunks, tmp_path):
        """With the broker's leader-epoch checkpoint (epoch 1 from 50), a stale epoch-0 copy of
        50..99 is not served even when no epoch-1 segment is tiered yet."""
        await remote.upload(0, data_batches(0, 10, epoch=0))
        await remote.upload(50, data_batches(50, 10, epoch=0, tag=b"STALE"))
        log_dir = tmp_path / "logs"
        partition_dir = log_dir / f"{TP.topic}-{TP.partition}"
        partition_dir.mkdir(parents=True)
        (partition_dir / "partition.metadata").write_bytes(format_partition_metadata(TP.topic_id))
        (partition_dir / "leader-epoch-checkpoint").write_bytes(
            format_leader_epoch_checkpoint([EpochEntry(0, 0), EpochEntry(1, 50)])
        )
        service = ReadService(
            store=remote.store,
            objects=remote.objects,
            layout=LAYOUT,
            chunks=chunks,
            log_dirs=[log_dir],
            lineage_ttl_s=0.0,
        )
        try:
            assert await service.tiered_range(TP) == (0, 49)
            # 50 is the end of the tiered log: nothing there, the stale copy least of all
            assert [b async for b in await service.batches(TP, 50, 100)] == []
            with pytest.raises(OffsetOutOfRangeError):
                await service.batches(TP, 51, 100)
            # a checkpoint the broker truncated from the start (local retention) still lets the
            # older tiered offsets be served from the derived lineage
            (partition_dir / "leader-epoch-checkpoint").write_bytes(
                format_leader_epoch_checkpoint([EpochEntry(1, 50)])
            )
            assert await service.tiered_range(TP) == (0, 49)
        finally:
            await service.aclose()


class TestTimestamps:
    """Kafka's findOffsetByTimestamp over the tiered segments."""

    async def test_first_record_at_or_after_each_timestamp(self, remote, service):
        """For timestamps between and at records, the answer is the first record at or after."""
        expected = await three_segments(remote)
        for target in (0, BASE_TS, BASE_TS + 5, BASE_TS + 10 * 61, BASE_TS + 901, BASE_TS + 904):
            answer = await service.offset_for_timestamp(TP, target)
            assert answer is not None
            best = min(
                (r for r in expected if r.timestamp >= target), key=lambda r: r.offset, default=None
            )
            if target == BASE_TS + 901:  # the commit marker is the first record there
                assert (answer.offset, answer.timestamp) == (81, BASE_TS + 901)
                continue
            assert best is not None
            assert (answer.offset, answer.timestamp) == (best.offset, best.timestamp)

    async def test_a_timestamp_after_every_record_has_no_offset(self, remote, service):
        """Later than every tiered record: None."""
        expected = await three_segments(remote)
        latest = max(r.timestamp for r in expected)
        assert await service.offset_for_timestamp(TP, latest + 1) is None


class TestSegmentsAndIndexes:
    """fetchLogSegment and fetchIndex semantics."""

    async def test_byte_ranges_are_inclusive_and_clamped(self, remote, service):
        """start..end is inclusive, an end past the object is clamped, no end = to the end;
        streamed through the cache first, then planned from the cached chunks."""
        segment = await remote.upload(0, data_batches(0, 40))
        log = remote.logs[segment.segment_id.id]
        sid = segment.segment_id.id
        kinds = []
        for _ in range(2):
            for start, end in ((0, 0), (10, 99_999), (1000, None), (len(log) - 1, None)):
                stream = await service.segment_range(TP, sid, start, end)
                kinds.append(type(stream))
                data = await _range_bytes(stream)
                stop = len(log) if end is None else min(end + 1, len(log))
                assert data == log[start:stop]
                assert stream.length == len(data)
            await service.chunks.idle()
        assert kinds[0] is ByteStream
        assert kinds[-4:] == [Plan] * 4

    async def test_a_window_at_a_segment_end_fetches_the_next_segments_start(self, remote, service):
        """The broker reads a partition's segments one after the other: a window whose
        read-ahead reaches its segment's end starts the GETs of the next segment's manifest,
        indexes and first chunk, so the broker's first calls for that segment (three indexes,
        then its first bytes) make no GET; after the last segment nothing is fetched."""
        first = await remote.upload(0, data_batches(0, 40))
        second = await remote.upload(first.end_offset + 1, data_batches(first.end_offset + 1, 40))
        size = first.segment_size_in_bytes
        window = await service.log_range(first, size - 100, None, readahead_end=size - 1)
        assert await _range_bytes(window) == remote.logs[first.segment_id.id][-100:]
        await service.manifest(second)  # joins the load the window started
        await service.chunks.idle()
        gets = (remote.objects.calls["get"], remote.objects.calls["get_range"])
        for kind in (IndexKind.OFFSET_INDEX, IndexKind.TIME_INDEX):
            assert await service.index_bytes(second, kind)
        start = await service.log_range(second, 0, 999, readahead_end=999)
        assert await _range_bytes(start) == remote.logs[second.segment_id.id][:1000]
        assert (remote.objects.calls["get"], remote.objects.calls["get_range"]) == gets
        # the last segment: its end read, nothing after it to fetch
        last = second.segment_size_in_bytes
        tail = await service.log_range(second, last - 100, None, readahead_end=last - 1)
        assert await _range_bytes(tail) == remote.logs[second.segment_id.id][-100:]

    async def test_the_next_segments_first_chunks_come_with_one_get(self, remote, service):
        """At a segment's end the next one's first ``readahead_chunks`` chunks are fetched
        with one GET, not its first chunk alone."""
        first = await remote.upload(0, data_batches(0, 40))
        second = await remote.upload(first.end_offset + 1, data_batches(first.end_offset + 1, 200))
        log = service.log_ref(second)
        chunks = service.chunks
        assert chunks.chunk_count(log.size) > chunks.readahead_chunks == 2
        size = first.segment_size_in_bytes
        before = remote.objects.calls["get_range"]
        window = await service.log_range(first, size - 100, None, readahead_end=size - 1)
        await _range_bytes(window)
        await service.manifest(second)
        await chunks.idle()
        assert [chunks.is_cached(log, i) for i in range(3)] == [True, True, False]
        # the first segment's last chunk, the second's indexes object and its two chunks
        assert remote.objects.calls["get_range"] - before == 3

    async def test_a_jump_to_a_segment_end_gets_its_bytes_before_the_next_segment(
        self, remote, tmp_path
    ):
        """A reader that jumps to a segment's end waits for those bytes: the next segment's
        manifest, indexes and first chunks are asked for only once they are here (fetched
        before, they competed with that GET), and still are then."""
        first = await remote.upload(0, data_batches(0, 40))
        second = await remote.upload(first.end_offset + 1, data_batches(first.end_offset + 1, 40))
        held = _Held(remote.objects, first_log := f"{_stem(remote, first)}.log")
        async with _held_service(remote, held, tmp_path / "gated-cache") as service:
            size = first.segment_size_in_bytes
            window = asyncio.create_task(
                service.log_range(first, size - 100, None, readahead_end=size - 1)
            )
            await held.waiting.wait()
            assert held.started[-1] == first_log
            assert not [k for k in held.started if k.startswith(_stem(remote, second))]
            held.release.set()
            data = await _range_bytes(await window)
            assert data == remote.logs[first.segment_id.id][-100:]
            await service.manifest(second)
            await service.chunks.idle()
            assert service.chunks.is_cached(service.log_ref(second), 0)

    @pytest.mark.parametrize("cached", [False, True], ids=["streamed", "planned"])
    async def test_a_failed_look_at_the_next_segment_fails_the_window_and_frees_it(
        self, remote, service, monkeypatch, cached
    ):
        """When finding the segment after a window's fails (the store's error), the window
        fails with it, and what was opened for it is closed: a primed stream, or a plan's
        files."""
        first = await remote.upload(0, data_batches(0, 40))
        await remote.upload(first.end_offset + 1, data_batches(first.end_offset + 1, 40))
        size = first.segment_size_in_bytes
        if cached:
            await _range_bytes(await service.log_range(first, 0, None))
            await service.chunks.idle()
        log = service.log_ref(first)
        assert service.chunks.is_cached(log, (size - 1) // service.chunks.chunk_size) == cached
        closed: list[object] = []
        kind = Plan if cached else ByteStream
        close_name = "close" if cached else "aclose"
        close = getattr(kind, close_name)

        def spy(answer):
            closed.append(answer)
            return close(answer)

        async def broken(segment):
            raise OSError("the metadata store cannot be read")

        monkeypatch.setattr(kind, close_name, spy)
        monkeypatch.setattr(service, "_prefetch_following", broken)
        with pytest.raises(OSError, match="cannot be read"):
            await service.log_range(first, size - 100, None, readahead_end=size - 1)
        assert [type(answer) for answer in closed] == [kind]
        await service.chunks.idle()
        monkeypatch.undo()
        window = await service.log_range(first, size - 100, None, readahead_end=size - 1)
        assert await _range_bytes(window) == remote.logs[first.segment_id.id][-100:]

    async def test_a_reader_of_windows_read_ahead_fetches_a_group_per_get(self, remote, tmp_path):
        """The broker reads segments in windows, one after the other. Once the read-ahead is
        ahead of it, each window is answered from cached chunks (a plan), and the read-ahead
        still fetches a group of chunks per GET, on into the next segment (its first group with
        one GET): a few GETs per segment, not one per chunk."""
        first = await remote.upload(0, data_batches(0, 150, value_size=4000))
        after = first.end_offset + 1
        second = await remote.upload(after, data_batches(after, 150, value_size=4000))
        async with ChunkCache(
            objects=remote.objects,
            directory=tmp_path / "cache",
            max_bytes=16 * 1024 * 1024,  # room for the groups read ahead
            chunk_size=64 * 1024,
            readahead_chunks=2,
            fetch_timeout_s=5.0,
        ) as chunks:
            service = read_service(remote, chunks)
            try:
                await self._read_in_windows(remote, service, first, second)
            finally:
                await service.aclose()

    @staticmethod
    async def _read_in_windows(remote, service, first, second) -> None:
        chunks = service.chunks
        step = chunks.chunk_size
        before = remote.objects.calls["get_range"]
        kinds = []
        for segment in (first, second):
            size = segment.segment_size_in_bytes
            log = remote.logs[segment.segment_id.id]
            for start in range(0, size, step):
                end = min(start + step, size) - 1
                window = await service.log_range(segment, start, end, readahead_end=size - 1)
                kinds.append(type(window))
                assert await _range_bytes(window) == log[start : end + 1]
                await chunks.idle()  # the read-ahead's GETs end before the next window
        count = sum(chunks.chunk_count(s.segment_size_in_bytes) for s in (first, second))
        assert count >= 4 * chunks.group_chunks
        assert kinds.count(Plan) >= len(kinds) - 2
        # the first chunk on demand, its read-ahead, then a group per GET; the next segment's
        # indexes object (two chunks) besides
        gets = remote.objects.calls["get_range"] - before
        assert gets <= count // chunks.group_chunks + 6, gets

    async def test_ranges_outside_the_segment_are_416(self, remote, service):
        """A start at or past the end, or an end before the start, is not satisfiable."""
        segment = await remote.upload(0, data_batches(0, 4))
        size = segment.segment_size_in_bytes
        for start, end in ((size, None), (10, 9)):
            with pytest.raises(RangeNotSatisfiableError) as caught:
                await service.segment_range(TP, segment.segment_id.id, start, end)
            assert caught.value.details == {"size": size}

    async def test_unfinished_and_unknown_segments_are_404(self, remote, service):
        """Only COPY_SEGMENT_FINISHED segments are readable."""
        started = await remote.upload(0, data_batches(0, 4), finish=False)
        with pytest.raises(UnknownSegmentError, match="COPY_SEGMENT_STARTED"):
            await service.segment_range(TP, started.segment_id.id, 0, None)
        with pytest.raises(UnknownSegmentError):
            await service.index(TP, uuid.uuid4(), IndexKind.OFFSET_INDEX)

    async def test_indexes_are_byte_exact_and_an_absent_txn_index_is_404(self, remote, service):
        """Each index comes back as uploaded; no transaction index is IndexNotFoundError."""
        plain = await remote.upload(0, data_batches(0, 10))
        aborted = AbortedTxn(0, 8, 52, 53, 52)
        with_txn = await remote.upload(50, data_batches(50, 10), aborted=[aborted])
        offset_index = await service.index(TP, plain.segment_id.id, IndexKind.OFFSET_INDEX)
        assert len(offset_index) % 8 == 0
        assert offset_index
        checkpoint = await service.index(TP, plain.segment_id.id, IndexKind.LEADER_EPOCH_CHECKPOINT)
        assert checkpoint == b"0\n1\n0 0\n"
        with pytest.raises(IndexNotFoundError):
            await service.index(TP, plain.segment_id.id, IndexKind.TXN_INDEX)
        txn = await service.index(TP, with_txn.segment_id.id, IndexKind.TXN_INDEX)
        assert len(txn) == 34

    async def test_a_corrupt_index_object_is_remote_data_error(self, remote, service):
        """Index bytes that do not match the manifest's CRC-32C are never used."""
        segment = await remote.upload(0, data_batches(0, 10))
        key = LAYOUT.segment_key(
            topic=TP.topic,
            topic_id=TP.topic_id,
            partition=0,
            base_offset=0,
            segment_id=segment.segment_id.id,
            suffix=ObjectSuffix.INDEXES,
        )
        body = bytearray(remote.objects.objects[key])
        body[3] ^= 0x01
        await remote.objects.put(key, bytes(body))
        with pytest.raises(RemoteDataError, match="CRC-32C"):
            await service.index(TP, segment.segment_id.id, IndexKind.OFFSET_INDEX)

    async def test_a_cold_segments_indexes_come_with_its_manifest(self, remote, tmp_path):
        """The first index read of a segment whose manifest is not cached GETs the indexes
        object's first chunk beside the manifest (its key comes from the segment alone), not
        one GET after it; the index is then read from that chunk, with no second GET."""
        segment = await remote.upload(0, data_batches(0, 10))
        stem = _stem(remote, segment)
        held = _Held(remote.objects, f"{stem}.manifest.json")
        async with _held_service(remote, held, tmp_path / "held-cache") as service:
            index = asyncio.create_task(service.index_bytes(segment, IndexKind.OFFSET_INDEX))
            await held.waiting.wait()  # the manifest's GET, held
            assert f"{stem}.indexes" in held.started
            held.release.set()
            offset_index = await index
            assert offset_index
            assert len(offset_index) % 8 == 0
            assert await service.index_bytes(segment, IndexKind.TIME_INDEX)
            assert held.started.count(f"{stem}.indexes") == 1

    async def test_a_failed_early_indexes_get_is_made_again(self, remote, service):
        """When the GET started beside the manifest fails, the index read makes its own."""
        segment = await remote.upload(0, data_batches(0, 10))
        remote.objects.fail_next("get_range", StorageError("S3 is down"))
        before = remote.objects.calls["get_range"]
        assert await service.index_bytes(segment, IndexKind.OFFSET_INDEX)
        assert remote.objects.calls["get_range"] - before == 2

    async def test_an_indexes_object_shorter_than_its_manifest_says_is_remote_data_error(
        self, remote, service
    ):
        """The GET beside the manifest cannot know the object's size: a shorter object than
        the manifest names is still RemoteDataError, and never served."""
        segment = await remote.upload(0, data_batches(0, 10))
        key = f"{_stem(remote, segment)}.indexes"
        body = remote.objects.objects[key]
        await remote.objects.put(key, body[: len(body) // 2])
        with pytest.raises(RemoteDataError, match="shorter"):
            await service.index(TP, segment.segment_id.id, IndexKind.LEADER_EPOCH_CHECKPOINT)
        with pytest.raises(RemoteDataError, match="shorter"):
            await service.index(TP, segment.segment_id.id, IndexKind.LEADER_EPOCH_CHECKPOINT)

    async def test_an_index_range_outside_its_object_is_remote_data_error(self, remote, service):
        """A manifest whose index range lies past the end of the indexes object is corrupt:
        RemoteDataError (502), never an internal error."""
        segment = await remote.upload(0, data_batches(0, 10))
        key = f"{_stem(remote, segment)}.manifest.json"
        doc = json.loads(remote.objects.objects[key])
        size = doc["objects"]["indexes"]["size"]
        doc["objects"]["indexes"]["ranges"]["offset_index"]["start"] = size + 10
        await remote.objects.put(key, json.dumps(doc).encode())
        with pytest.raises(RemoteDataError, match="offset_index"):
            await service.index(TP, segment.segment_id.id, IndexKind.OFFSET_INDEX)

    async def test_an_object_too_large_for_a_manifest_is_refused(self, remote, service):
        """An object over MANIFEST_MAX_BYTES at a manifest's key (corrupt, or put there by
        someone else) is RemoteDataError and a log line, not read into memory and parsed;
        the other segments are still served."""
        bad = await remote.upload(0, data_batches(0, 10))
        good = await remote.upload(10, data_batches(10, 10))
        key = f"{_stem(remote, bad)}.manifest.json"
        padded = remote.objects.objects[key] + b" " * MANIFEST_MAX_BYTES  # still valid JSON
        await remote.objects.put(key, padded)
        with capture_logs() as logs, pytest.raises(RemoteDataError, match="more than the"):
            await service.index(TP, bad.segment_id.id, IndexKind.OFFSET_INDEX)
        assert [e["key"] for e in logs if e["event"] == "manifest_too_large"] == [key]
        assert await service.index(TP, good.segment_id.id, IndexKind.OFFSET_INDEX)


class TestResolve:
    """Topic names become topic ids from the store."""

    async def test_unknown_topic_and_partition(self, remote, service):
        """An unknown name is unknown_topic; a missing partition lists the known ones."""
        await remote.upload(0, data_batches(0, 2))
        assert await service.resolve("orders", 0) == TP
        with pytest.raises(UnknownTopicError):
            await service.resolve("nope", 0)
        with pytest.raises(UnknownPartitionError) as caught:
            await service.resolve("orders", 3)
        assert caught.value.details == {"partitions": [0]}

    async def test_an_unknown_partition_is_looked_for_once_through_discover(self, remote, service):
        """Selective tailing: a partition the store does not hold yet is discovered (its
        metadata read) and the lookup retried once; a failed discovery keeps the error."""
        asked: list[tuple[str, int]] = []

        async def discover(topic: str, partition: int) -> bool:
            asked.append((topic, partition))
            if topic != "orders":
                return False
            await remote.upload(0, data_batches(0, 2))  # the metadata read meanwhile
            return True

        service.discover = discover
        assert await service.resolve("orders", 0) == TP
        assert asked == [("orders", 0)]
        with pytest.raises(UnknownTopicError):
            await service.resolve("nope", 0)
        assert asked[-1] == ("nope", 0)
        assert await service.resolve("orders", 0) == TP  # known now: not asked again
        assert len(asked) == 2

    async def test_a_name_with_two_topic_ids_is_ambiguous_unless_given(self, remote, service):
        """A re-created topic with data under both ids needs topic_id."""
        other = TopicIdPartition(uuid.UUID(int=99), "orders", 0)
        await remote.upload(0, data_batches(0, 2))
        await remote.upload(0, data_batches(0, 2), tp=other)
        with pytest.raises(AmbiguousTopicError) as caught:
            await service.resolve("orders", 0)
        assert len(caught.value.details["topic_ids"]) == 2
        assert await service.resolve("orders", 0, other.topic_id) == other

    async def test_a_name_resolves_to_the_new_id_once_the_old_ones_segments_are_deleted(
        self, remote, service
    ):
        """Kafka 4 deletes a topic's remote data segment by segment, with no partition-delete
        event; the old id's partition stays in the store until retention forgets it. The
        re-created topic is read by name meanwhile."""
        new = TopicIdPartition(uuid.UUID(int=99), "orders", 0)
        old = await remote.upload(0, data_batches(0, 2))
        await remote.upload(0, data_batches(0, 2), tp=new)
        remote.delete(old)
        assert TP in remote.store.partitions()  # still known: the old id is not forgotten yet
        assert await service.resolve("orders", 0) == new

    async def test_a_partition_delete_decides_before_the_segments_left(self, remote, service):
        """The old id being deleted (a partition-delete event) and the new one with no segment
        left (all expired): the new one, as the partition-delete event says; segments only
        break a tie between ids that have none."""
        new = TopicIdPartition(uuid.UUID(int=99), "orders", 0)
        await remote.upload(0, data_batches(0, 2))
        expired = await remote.upload(0, data_batches(0, 2), tp=new)
        remote.delete(expired)
        remote.store.apply(
            [
                PartitionDeleteMetadata(
                    topic_id_partition=TP,
                    broker_id=1,
                    event_timestamp_ms=2,
                    state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                )
            ]
        )
        assert await service.resolve("orders", 0) == new

    @pytest.mark.parametrize(
        "state",
        [
            pytest.param(s, id=s.name)
            for s in (
                RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                RemotePartitionDeleteState.DELETE_PARTITION_STARTED,
                RemotePartitionDeleteState.DELETE_PARTITION_FINISHED,
            )
        ],
    )
    async def test_a_name_whose_only_topic_id_is_being_deleted_is_unknown(
        self, remote, service, state
    ):
        """A topic deleted (a partition-delete event on its id) and re-created with nothing
        tiered yet: its name no longer reads the deleted incarnation, though it is the only id
        the store has for it; the old id can still be read when given explicitly, until the
        deletion finishes."""
        await remote.upload(0, data_batches(0, 2))
        assert await service.resolve("orders", 0) == TP
        states = [RemotePartitionDeleteState.DELETE_PARTITION_MARKED]
        if state is not states[0]:
            states.append(RemotePartitionDeleteState.DELETE_PARTITION_STARTED)
        if state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            states.append(state)
        result = remote.store.apply(
            [
                PartitionDeleteMetadata(
                    topic_id_partition=TP, broker_id=1, event_timestamp_ms=2, state=s
                )
                for s in states
            ]
        )
        assert not result.rejected
        with pytest.raises(UnknownTopicError):
            await service.resolve("orders", 0)
        if state is not RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            # (a finished deletion leaves nothing of the partition in the store)
            assert await service.resolve("orders", 0, TP.topic_id) == TP

    async def test_a_partition_being_deleted_is_unknown_beside_live_ones(self, remote, service):
        """``sidecar delete-partition`` on one partition: that partition is unknown by name,
        the topic's other partitions are read as before."""
        other = TopicIdPartition(TP.topic_id, "orders", 1)
        await remote.upload(0, data_batches(0, 2))
        await remote.upload(0, data_batches(0, 2), tp=other)
        remote.store.apply(
            [
                PartitionDeleteMetadata(
                    topic_id_partition=TP,
                    broker_id=1,
                    event_timestamp_ms=2,
                    state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                )
            ]
        )
        with pytest.raises(UnknownPartitionError) as caught:
            await service.resolve("orders", 0)
        assert caught.value.details == {"partitions": [1]}
        assert await service.resolve("orders", 1) == other


class TestDecode:
    """decode_batch turns a served batch into records."""

    async def test_decoded_records_keep_headers_and_timestamps(self, remote, service):
        """Keys, values, headers (a null header value too) and timestamps survive."""
        await remote.upload(0, data_batches(0, 1, codec=Compression.LZ4))
        (batch,) = await _collect(service, TP, 0, 1)
        records = decode_batch(batch)
        assert records[2].key == b"key-2"
        assert records[2].headers == [("n", b"2"), ("null", None)]
        assert records[2].timestamp == BASE_TS + 20


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """Where a second cache may live."""
    return tmp_path / "cache2"


class TestSmallIndexCache:
    """A memory cache too small for the indexes still serves correctly."""

    async def test_reads_work_with_a_zero_byte_index_cache(self, remote, cache_dir):
        """With no room for indexes they are loaded per read, and reads stay correct."""
        expected = await three_segments(remote)
        async with ChunkCache(
            objects=remote.objects, directory=cache_dir, max_bytes=1 << 20, chunk_size=4096
        ) as chunks:
            service = ReadService(
                store=remote.store,
                objects=remote.objects,
                layout=LAYOUT,
                chunks=chunks,
                indexes=MemoryCache(max_weight=0),
            )
            try:
                got = _data(await _collect(service, TP, 0, 10**9), 0)
            finally:
                await service.aclose()
        assert got == expected
