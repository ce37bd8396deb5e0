"""What the uploader checks before anything is published: batch CRCs and the files; the part
CRC-32Cs the same read gives the upload."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from pathlib import Path

import pytest

from sidecar.errors import SegmentVanishedError
from sidecar.kafka.logdir import scan_partition_dir
from sidecar.metadata.events import RemoteLogSegmentId, SegmentMetadata, TopicIdPartition
from sidecar.storage import MemoryObjectStore, plan_parts
from sidecar.storage._crc import crc32c
from sidecar.storage.keys import KeyLayout
from sidecar.storage.manifest import IndexKind
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering import uploader
from sidecar.tiering.uploader import (
    CorruptSegmentError,
    SegmentUploader,
    _open_segment,
    write_segment_objects,
)


def _partition(tmp_path: Path):
    batches = [[build_batch([TestRecord(b"k", b"v" * 50)]) for _ in range(5)] for _ in range(3)]
    scan = scan_partition_dir(write_partition(tmp_path, "orders", 0, batches))
    assert scan is not None
    return scan


class TestOpenSegment:
    def test_valid_segment_opens_with_its_files(self, tmp_path):
        """A rolled segment opens with every Kafka file that travels with it."""
        scan = _partition(tmp_path)
        opened = _open_segment(scan, scan.segments[0])
        try:
            assert opened.size == scan.segments[0].log_path.stat().st_size
            assert opened.index_files[IndexKind.PRODUCER_SNAPSHOT] is not None
            assert opened.index_files[IndexKind.TXN_INDEX] is None
            assert opened.index_files[IndexKind.LEADER_EPOCH_CHECKPOINT].startswith(b"0\n")
            # the descriptor path keeps reading after the broker renames the file
            scan.segments[0].log_path.rename(str(scan.segments[0].log_path) + ".deleted")
            assert Path(opened.log_path).read_bytes()[:8] == (0).to_bytes(8, "big")
        finally:
            opened.log.close()

    def test_bad_crc_is_corrupt(self, tmp_path):
        """A flipped byte inside a batch makes the segment corrupt: it is never uploaded."""
        scan = _partition(tmp_path)
        path = scan.segments[1].log_path
        data = bytearray(path.read_bytes())
        data[70] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(CorruptSegmentError, match="corrupt") as info:
            _open_segment(scan, scan.segments[1])
        assert str(path) in str(info.value)

    def test_trailing_garbage_is_corrupt(self, tmp_path):
        """Bytes after the last batch that do not form a batch make the segment corrupt."""
        scan = _partition(tmp_path)
        path = scan.segments[0].log_path
        path.write_bytes(path.read_bytes() + b"\x00" * 7)
        with pytest.raises(CorruptSegmentError):
            _open_segment(scan, scan.segments[0])


def _big_partition(tmp_path: Path):
    """Batches of about 300 KiB: the batch walk's 1 MiB windows overlap at batch headers."""
    value = bytes(range(256)) * 1200
    batches = [[build_batch([TestRecord(b"k", value)]) for _ in range(10)] for _ in range(2)]
    scan = scan_partition_dir(write_partition(tmp_path, "orders", 0, batches))
    assert scan is not None
    return scan


class TestPartChecksumsFromTheBatchCheck:
    def test_the_batch_check_gives_every_parts_crc(self, tmp_path):
        """The CRC check reads every byte once; the same bytes give the CRC-32C of each part
        the upload cuts the segment into (one for a single PUT), so the upload never reads the
        file to compute them."""
        scan = _big_partition(tmp_path)
        segment = scan.segments[0]
        data = segment.log_path.read_bytes()
        assert len(data) > 2 * 1024 * 1024  # the walk's 1 MiB windows overlap at headers
        opened = _open_segment(scan, segment, 2 * 1024 * 1024)
        try:
            assert (opened.part_crcs, opened.crc_part_size) == ((crc32c(data),), 2 * 1024 * 1024)
        finally:
            opened.log.close()
        part = 1024 * 1024
        assert len(plan_parts(len(data), part)) == 3
        opened = _open_segment(scan, segment, part)
        opened.log.close()
        assert opened.part_crcs == tuple(
            crc32c(data[p.offset : p.offset + p.length]) for p in plan_parts(len(data), part)
        )

    async def test_the_upload_hands_them_to_the_store(self, tmp_path, monkeypatch):
        """``write_segment_objects`` passes them to ``put_file`` for the part size they were
        computed for, and none for another."""
        scan = _big_partition(tmp_path)
        segment = scan.segments[0]
        seen: list[object] = []
        put_file = MemoryObjectStore.put_file

        async def spy(self, key, path, **kwargs):
            seen.append(kwargs.get("part_crcs"))
            return await put_file(self, key, path, **kwargs)

        monkeypatch.setattr(MemoryObjectStore, "put_file", spy)
        tip = TopicIdPartition(uuid.uuid4(), "orders", 0)
        metadata = SegmentMetadata(
            segment_id=RemoteLogSegmentId(tip, uuid.uuid4()),
            start_offset=segment.base_offset,
            end_offset=segment.end_offset or 0,
            broker_id=1,
            max_timestamp_ms=0,
            event_timestamp_ms=0,
            segment_leader_epochs=((0, 0),),
            segment_size_in_bytes=segment.log_path.stat().st_size,
            txn_index_empty=True,
        )
        store = MemoryObjectStore()
        for part_size in (5 * 1024 * 1024, 6 * 1024 * 1024):
            opened = _open_segment(scan, segment, 5 * 1024 * 1024)
            try:
                await write_segment_objects(
                    store, KeyLayout(), metadata, opened, part_size=part_size, concurrency=2
                )
            finally:
                opened.log.close()
        assert seen == [opened.part_crcs, None]
        assert seen[0] == (crc32c(segment.log_path.read_bytes()),)


async def test_a_segment_check_that_hangs_leaves_the_default_executor_free(tmp_path, monkeypatch):
    """The check before an upload reads the whole segment (seconds on a slow disk): with it
    stuck in its thread, other work still gets a default executor thread (the only one here),
    which is what lets the check go on."""
    loop = asyncio.get_running_loop()
    default = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(default)
    scan = _partition(tmp_path)
    started = asyncio.Event()
    released = threading.Event()
    seen: list[bool] = []

    def stuck_check(*args):
        loop.call_soon_threadsafe(started.set)
        seen.append(released.wait(timeout=10))
        raise SegmentVanishedError("deleted by the broker meanwhile")

    monkeypatch.setattr(uploader, "_open_segment", stuck_check)
    segment_uploader = SegmentUploader(
        objects=MemoryObjectStore(),
        publisher=None,  # never reached
        layout=KeyLayout(),
        broker_id=1,
        part_size=5 * 1024 * 1024,
        concurrency=2,
    )
    upload = asyncio.ensure_future(segment_uploader.upload(scan, scan.segments[0]))
    await started.wait()
    await asyncio.to_thread(released.set)
    with pytest.raises(SegmentVanishedError, match="deleted by the broker"):
        await upload
    default.shutdown()
    assert seen == [True]
