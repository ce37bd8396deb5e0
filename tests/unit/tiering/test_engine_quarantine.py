"""The engine tells unreadable from corrupt: a read error is retried with backoff until the
segment is FINISHED; corrupt bytes quarantine the segment (by topic id), the segments after it
still tier, and a clear made by another process (the CLI) is seen and the segment checked again.

The same rig as ``test_engine`` (real uploader and store, in-memory bucket, faked Kafka)."""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sidecar.kafka.records as records
from sidecar.kafka.logdir import (
    FileKind,
    NotReadyReason,
    scan_partition_dir,
    segment_file_name,
)
from sidecar.metadata.events import RemoteLogSegmentState
from sidecar.storage.keys import ObjectSuffix
from sidecar.tiering.quarantine import Quarantine, QuarantineEntry
from tests.read_faults import failing_opener
from tests.unit.tiering.test_engine import Rig

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def _metric(r: Rig, name: str, **labels: str) -> float:
    value = r.metrics.registry.get_sample_value(f"kafka_tiered_sidecar_{name}", labels)
    return 0.0 if value is None else value


def _flip(path: Path, position: int) -> None:
    """Flip one byte inside a batch's records: its CRC no longer matches (flip again: fixed)."""
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def _cli_quarantine(r: Rig) -> Quarantine:
    """What ``sidecar quarantine`` opens: the same file, in another process."""
    return Quarantine(r.engine.quarantine.path)


class TestReadErrors:
    """A segment file that cannot be read is retried, never quarantined."""

    async def test_transient_eio_is_retried_until_finished(self, rig, monkeypatch):
        """Two EIOs while the first segment's CRCs are checked: retried with backoff, counted
        by reason, and every segment ends FINISHED; nothing is quarantined."""
        r = rig()
        opener, handed = failing_opener(r.rolled[0].log_path, 2, records.open_with_deleted_fallback)
        monkeypatch.setattr(records, "open_with_deleted_fallback", opener)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert handed() == 2
        assert len(r.engine.quarantine) == 0
        assert _metric(r, "segment_read_retries_total", reason="eio") == 2
        assert _metric(r, "upload_errors_total", kind="UnreadableFileError") == 2
        assert _metric(r, "upload_errors_total", kind="CorruptSegmentError") == 0
        assert _metric(r, "quarantined_segments") == 0

    async def test_eio_while_uploading_the_log_is_retried(self, rig, monkeypatch):
        """An OSError from reading the .log during the upload itself (not the CRC walk) is a
        read error too: the copy is cleaned up and retried, and the engine keeps running."""
        r = rig()
        real = r.objects.put_file
        failures = iter([OSError(errno.EIO, os.strerror(errno.EIO))])

        async def put_file(key: str, path: Any, **kwargs: Any) -> Any:
            failure = next(failures, None)
            if failure is not None:
                raise failure
            return await real(key, path, **kwargs)

        monkeypatch.setattr(r.objects, "put_file", put_file)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert _metric(r, "segment_read_retries_total", reason="eio") == 1
        assert len(r.engine.quarantine) == 0
        assert set(r.objects.objects) == r.expected_objects()

    @pytest.mark.parametrize(
        "failure",
        [
            pytest.param(
                TimeoutError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT)), id="etimedout"
            ),
            pytest.param(
                ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET)),
                id="econnreset",
            ),
        ],
    )
    async def test_network_file_system_errors_are_read_errors(self, rig, monkeypatch, failure):
        """ETIMEDOUT or ECONNRESET from a file call (a log dir on NFS or EFS) while the .log is
        uploaded is a read error like EIO: retried, counted by its errno, and the engine keeps
        running until every segment is FINISHED."""
        r = rig()
        self._fail_put_file_once(r, monkeypatch, failure)
        r.start()
        assert r.task is not None
        await r.until(lambda: r.task.done() or r.all_tiered())
        assert not r.task.done()
        await r.stop()
        reason = errno.errorcode[failure.errno].lower()
        assert _metric(r, "segment_read_retries_total", reason=reason) == 1
        assert _metric(r, "upload_errors_total", kind="UnreadableFileError") == 1
        assert len(r.engine.quarantine) == 0
        assert set(r.objects.objects) == r.expected_objects()

    async def test_an_untranslated_timeout_is_retried_not_fatal(self, rig, monkeypatch):
        """A TimeoutError without an errno (a deadline, not a file call) that reaches the
        engine untranslated is a retriable upload failure, not a read error of the segment."""
        r = rig()
        self._fail_put_file_once(r, monkeypatch, TimeoutError())
        r.start()
        assert r.task is not None
        await r.until(lambda: r.task.done() or r.all_tiered())
        assert not r.task.done()
        await r.stop()
        assert _metric(r, "upload_errors_total", kind="UploadIOError") == 1
        assert _metric(r, "segment_read_retries_total", reason="unknown") == 0
        assert set(r.objects.objects) == r.expected_objects()

    @staticmethod
    def _fail_put_file_once(r: Rig, monkeypatch: Any, failure: BaseException) -> None:
        real = r.objects.put_file
        failures = iter([failure])

        async def put_file(key: str, path: Any, **kwargs: Any) -> Any:
            raised = next(failures, None)
            if raised is not None:
                raise raised
            return await real(key, path, **kwargs)

        monkeypatch.setattr(r.objects, "put_file", put_file)


class TestCorruptSegments:
    """Only bytes proven corrupt quarantine a segment, keyed by topic id."""

    async def test_corrupt_segment_is_quarantined_and_later_segments_tier(self, rig):
        """A bad CRC in the middle segment quarantines it (by topic id, with the gauges), and
        the segments before and after it are tiered."""
        r = rig()
        bad = r.rolled[1]
        _flip(bad.log_path, 70)
        r.start()
        await r.until(lambda: len(r.finished()) == 2)
        await r.stop()
        assert r.finished() == [(s.base_offset, s.end_offset) for s in (r.rolled[0], r.rolled[2])]
        assert r.engine.quarantine.offsets(r.tip.topic_id, 0) == {bad.base_offset}
        [entry] = r.engine.quarantine.entries()
        assert (entry.topic, entry.partition, entry.end_offset) == ("orders", 0, bad.end_offset)
        assert "corrupt" in entry.reason
        assert _metric(r, "quarantined_segments") == 1
        assert _metric(r, "quarantined_bytes") == bad.size
        assert _metric(r, "segment_read_retries_total", reason="eio") == 0

    async def test_other_topic_id_of_the_same_name_is_not_quarantined(self, rig):
        """An entry left by an earlier topic of the same name (another id) holds nothing back."""
        r = rig()
        r.engine.quarantine.add(
            QuarantineEntry(
                topic_id=uuid.uuid4(),
                topic="orders",
                partition=0,
                base_offset=r.rolled[0].base_offset,
                end_offset=r.rolled[0].end_offset,
                size_bytes=1,
                reason="corrupt",
                since_ms=0,
            )
        )
        r.start()
        await r.until(r.all_tiered)
        await r.stop()

    async def test_an_entry_of_another_segment_at_the_same_offset_is_superseded(self, rig):
        """An entry names its segment (base offset, end offset, size): a segment rebuilt at
        the same base offset with good bytes (a replica fetched again from the leader) tiers
        with the rest, and the entry, which names data no longer local, is dropped."""
        r = rig()
        first = r.rolled[0]
        assert (first.end_offset, first.size) != (999, 5_000_000)
        r.engine.quarantine.add(
            QuarantineEntry(
                topic_id=r.tip.topic_id,
                topic="orders",
                partition=0,
                base_offset=first.base_offset,
                end_offset=999,
                size_bytes=5_000_000,
                reason="corrupt",
                since_ms=0,
            )
        )
        r.start()
        await r.until(lambda: r.all_tiered() and len(r.engine.quarantine) == 0)
        await r.stop()
        assert len(_cli_quarantine(r)) == 0
        assert _metric(r, "quarantined_segments") == 0
        assert _metric(r, "quarantined_bytes") == 0

    async def test_a_clear_read_while_the_worker_runs_is_acted_on_when_it_ends(
        self, rig, monkeypatch
    ):
        """The clear is read while the worker that quarantined the segment has not ended:
        when it ends, the partition is planned again at once (not at the idle recheck, an
        hour here), and the still corrupt segment is quarantined again."""
        r = rig(idle_recheck_s=3600.0, idle_recheck_max_s=3600.0)
        bad = r.rolled[-1]
        _flip(bad.log_path, 70)
        real = r.engine._work_partition
        held, release = asyncio.Event(), asyncio.Event()

        async def work(key: Any) -> bool:
            waiting = await real(key)
            if not held.is_set():  # the first worker: hold it before it ends
                held.set()
                await release.wait()
            return waiting

        monkeypatch.setattr(r.engine, "_work_partition", work)
        r.start()
        await held.wait()
        assert r.engine.quarantine.offsets(r.tip.topic_id, 0) == {bad.base_offset}
        assert _cli_quarantine(r).clear(topic="orders", partition=0)
        await r.until(lambda: r.engine._quarantine_reloads == 1)
        release.set()
        await r.until(
            lambda: (
                _metric(r, "upload_errors_total", kind="CorruptSegmentError") == 2
                and r.engine.quarantine.offsets(r.tip.topic_id, 0) == {bad.base_offset}
            )
        )
        await r.stop()

    async def test_clear_is_seen_and_the_segment_checked_again(self, rig):
        """A clear by another process is picked up: still corrupt, the segment is quarantined
        again; repaired and cleared once more, it is tiered and the gauge drops to 0."""
        r = rig()
        bad = r.rolled[-1]
        _flip(bad.log_path, 70)

        def quarantined(times: int) -> Callable[[], bool]:
            return lambda: (
                _metric(r, "upload_errors_total", kind="CorruptSegmentError") == times
                and r.engine.quarantine.offsets(r.tip.topic_id, 0) == {bad.base_offset}
            )

        r.start()
        await r.until(quarantined(1))
        assert len(r.finished()) == len(r.rolled) - 1

        assert _cli_quarantine(r).clear(topic="orders", partition=0)  # bytes still bad
        await r.until(quarantined(2))

        _flip(bad.log_path, 70)  # repaired
        assert _cli_quarantine(r).clear(topic="orders", partition=0, base_offset=bad.base_offset)
        await r.until(r.all_tiered)
        await r.until(lambda: _metric(r, "quarantined_segments") == 0)
        await r.stop()
        assert len(r.engine.quarantine) == 0


class TestSegmentsThatStayNotReady:
    """A rolled segment that never becomes ready neither stops its partition silently nor, if
    it can be tiered as Kafka tiers it, stops it at all."""

    async def test_a_corrupt_older_producer_snapshot_is_uploaded_as_it_is(self, rig):
        """An older <nextBase>.snapshot that fails its CRC never heals: the segment is tiered
        with that file as it is (Kafka's RLM uploads it unchecked), with a warning metric, and
        the segments after it tier too; nothing is reported stalled."""
        r = rig()
        second = r.rolled[1]
        assert second.next_base_offset is not None
        snap = r.scan.path / segment_file_name(second.next_base_offset, FileKind.SNAPSHOT)
        data = bytearray(snap.read_bytes())
        data[-1] ^= 0xFF
        snap.write_bytes(bytes(data))
        scan = scan_partition_dir(r.scan.path)
        assert scan is not None
        assert scan.segments[1].not_ready is NotReadyReason.SNAPSHOT_CORRUPT
        r.scan = scan
        r.start()
        assert r.task is not None
        await r.until(lambda: r.task.done() or r.all_tiered())
        assert not r.task.done()
        await r.stop()
        assert _metric(r, "corrupt_snapshots_tiered_total", topic="orders") == 1
        [copy] = [
            m
            for m in r.store.segments(r.tip, states={FINISHED})
            if m.start_offset == second.base_offset
        ]
        indexes = next(k for k in r.keys_of(copy) if k.endswith(ObjectSuffix.INDEXES))
        assert bytes(data) in r.objects.objects[indexes]
        assert r.engine.last_errors == {}
        assert _metric(r, "stalled_partitions", reason="snapshot_corrupt") == 0

    async def test_a_missing_older_snapshot_stalls_and_is_reported_after_the_bound(self, rig):
        """An older segment without its <nextBase>.snapshot cannot be tiered (Kafka needs the
        file): the partition waits, and once the wait has lasted ``stall_report_s`` it is
        reported (last_errors, the gauge); when the file is back the segment tiers and the
        report ends."""
        clock = [0.0]
        r = rig(stall_report_s=300.0, idle_recheck_s=30.0, monotonic=lambda: clock[0])
        first = r.rolled[0]
        assert first.next_base_offset is not None
        snap = r.scan.path / segment_file_name(first.next_base_offset, FileKind.SNAPSHOT)
        saved = snap.read_bytes()
        snap.unlink()
        scan = scan_partition_dir(r.scan.path)
        assert scan is not None
        assert scan.segments[0].not_ready is NotReadyReason.SNAPSHOT_MISSING
        r.scan = scan
        key = ("orders", 0)
        r.start()
        await r.until(lambda: key in r.engine._stalls and r.engine.busy_partitions == [])
        assert r.finished() == []
        assert key not in r.engine.last_errors
        assert _metric(r, "stalled_partitions", reason="snapshot_missing") == 0

        clock[0] = 300.0  # the bound: the partition is looked at again and reported
        await r.until(lambda: key in r.engine.last_errors)
        assert "not ready" in r.engine.last_errors[key][1]
        assert _metric(r, "stalled_partitions", reason="snapshot_missing") == 1

        snap.write_bytes(saved)
        fixed = scan_partition_dir(r.scan.path)
        assert fixed is not None
        r.scan = fixed
        r.engine.poke()
        await r.until(r.all_tiered)
        await r.until(lambda: key not in r.engine.last_errors)
        await r.stop()
        assert _metric(r, "stalled_partitions", reason="snapshot_missing") == 0

    async def test_an_unreadable_index_stalls_and_is_reported(self, rig):
        """A .timeindex that cannot be read (here a directory in its place, which root cannot
        read either) keeps the segment waiting, never uploaded or quarantined, and the stall
        is reported with its reason."""
        r = rig(stall_report_s=0.0)
        first = r.rolled[0]
        assert first.timeindex_path is not None
        first.timeindex_path.unlink()
        first.timeindex_path.mkdir()
        scan = scan_partition_dir(r.scan.path)
        assert scan is not None
        assert scan.segments[0].not_ready is NotReadyReason.UNREADABLE
        r.scan = scan
        key = ("orders", 0)
        r.start()
        await r.until(lambda: key in r.engine.last_errors)
        await r.stop()
        assert r.finished() == []
        assert len(r.engine.quarantine) == 0
        assert "cannot be read" in r.engine.last_errors[key][1]
        assert _metric(r, "stalled_partitions", reason="unreadable") == 1
