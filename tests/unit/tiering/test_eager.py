"""Eager upload's contract between the stager and the broker's copy call, over the memory object
store and real segment files: a staged .log with the file's size and CRC is adopted with a copy
inside the store (no second upload), one with other bytes is not, a copy call waits for a
staging upload of its segment in flight, and the staged key format round-trips."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from sidecar.brokerapi import BrokerCopyRequest
from sidecar.kafka.logdir import FileKind, segment_file_name
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    TopicIdPartition,
)
from sidecar.observability.metrics import Metrics
from sidecar.storage._crc import crc32c
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import SegmentManifest
from sidecar.storage.memory import MemoryObjectStore
from sidecar.testing import write_partition
from sidecar.tiering.brokercopy import BrokerCopier
from sidecar.tiering.eager import StagingLedger, file_crc32c
from sidecar.tiering.uploader import segment_keys
from tests.unit.readserver._tiered import data_batches

LAYOUT = KeyLayout(prefix="test/")
TOPIC_ID = uuid.UUID(int=0xE6E7 << 64 | 3)
TIP = TopicIdPartition(TOPIC_ID, "orders", 0)


@pytest.fixture
def partition(tmp_path: Path) -> Path:
    return write_partition(
        tmp_path / "data",
        "orders",
        0,
        [data_batches(0, 6), data_batches(30, 6), data_batches(60, 1)],
        topic_id=TOPIC_ID,
    )


def _request(partition: Path, base: int, next_base: int) -> BrokerCopyRequest:
    log = partition / segment_file_name(base, FileKind.LOG)
    metadata = SegmentMetadata(
        segment_id=RemoteLogSegmentId(TIP, uuid.uuid4()),
        start_offset=base,
        end_offset=next_base - 1,
        broker_id=1,
        max_timestamp_ms=1_700_000_000_000,
        event_timestamp_ms=1_700_000_000_001,
        segment_leader_epochs=((0, base),),
        segment_size_in_bytes=log.stat().st_size,
        state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
    )
    return BrokerCopyRequest(
        metadata,
        {
            "log": log,
            "offset_index": partition / segment_file_name(base, FileKind.INDEX),
            "time_index": partition / segment_file_name(base, FileKind.TIMEINDEX),
            "txn_index": None,
            "producer_snapshot": partition / segment_file_name(next_base, FileKind.SNAPSHOT),
        },
        b"0\n1\n0 0\n",
    )


def _copier(objects: MemoryObjectStore, partition: Path, ledger: StagingLedger, metrics: Metrics):
    return BrokerCopier(
        objects=objects,
        layout=LAYOUT,
        log_dirs=[partition.parent],
        part_size=8 * 1024 * 1024,
        concurrency=2,
        staging=ledger,
        metrics=metrics,
    )


def _staged_key(partition: Path, base: int, body: bytes | None = None) -> str:
    data = (
        (partition / segment_file_name(base, FileKind.LOG)).read_bytes() if body is None else body
    )
    return LAYOUT.staged_key(
        topic=TIP.topic,
        topic_id=TIP.topic_id,
        partition=TIP.partition,
        base_offset=base,
        size=len(data),
        crc32c=crc32c(data),
    )


def _outcomes(metrics: Metrics) -> dict[str, float]:
    return {
        outcome: metrics.registry.get_sample_value(
            "kafka_tiered_sidecar_eager_uploads_total", {"outcome": outcome}
        )
        or 0.0
        for outcome in ("adopted", "not_staged")
    }


async def test_a_staged_log_is_adopted_with_a_copy_not_uploaded_again(partition: Path) -> None:
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    log = (partition / segment_file_name(30, FileKind.LOG)).read_bytes()
    staged = _staged_key(partition, 30)
    await objects.put(staged, log)
    ledger.note_staged((TOPIC_ID, 0, 30), staged)
    request = _request(partition, 30, 60)
    objects.calls.clear()

    assert await _copier(objects, partition, ledger, metrics).copy(request) == len(log)

    keys = segment_keys(LAYOUT, request.metadata)
    assert await objects.get(keys[ObjectSuffix.LOG]) == log
    manifest = SegmentManifest.from_json(await objects.get(keys[ObjectSuffix.MANIFEST]))
    assert manifest.log.crc32c == crc32c(log)
    assert objects.calls["put_file"] == 0  # the bytes went once, when staged
    assert objects.calls["copy"] == 1
    assert staged not in objects.objects  # adopted, then removed
    assert _outcomes(metrics) == {"adopted": 1, "not_staged": 0}
    assert ledger.taken((TOPIC_ID, 0, 30))  # not staged again before FINISHED is read


async def test_nothing_staged_or_other_bytes_staged_means_an_upload(partition: Path) -> None:
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    log = (partition / segment_file_name(0, FileKind.LOG)).read_bytes()
    other = bytes(len(log))  # same size, other content: another name
    await objects.put(_staged_key(partition, 0, other), other)
    ledger.note_staged((TOPIC_ID, 0, 0), _staged_key(partition, 0, other))
    request = _request(partition, 0, 30)

    await _copier(objects, partition, ledger, metrics).copy(request)

    keys = segment_keys(LAYOUT, request.metadata)
    assert await objects.get(keys[ObjectSuffix.LOG]) == log
    assert objects.calls["put_file"] == 1
    assert _outcomes(metrics) == {"adopted": 0, "not_staged": 1}
    assert _staged_key(partition, 0, other) in objects.objects  # not ours to adopt
    assert objects.calls["copy"] == 0  # known not to match: no request


async def test_a_log_staged_before_a_restart_is_adopted(partition: Path) -> None:
    """The ledger is new (the sidecar restarted) but the staged object is there."""
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    log = (partition / segment_file_name(30, FileKind.LOG)).read_bytes()
    await objects.put(_staged_key(partition, 30), log)
    await _copier(objects, partition, ledger, metrics).copy(_request(partition, 30, 60))
    assert objects.calls["put_file"] == 0
    assert _outcomes(metrics) == {"adopted": 1, "not_staged": 0}
    assert _staged_key(partition, 30) not in objects.objects


async def test_a_staged_object_gone_meanwhile_means_an_upload(partition: Path) -> None:
    """The scrub removed a staged object the broker adopts only now: the copy uploads."""
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    ledger.note_staged((TOPIC_ID, 0, 30), _staged_key(partition, 30))
    request = _request(partition, 30, 60)
    await _copier(objects, partition, ledger, metrics).copy(request)
    log = (partition / segment_file_name(30, FileKind.LOG)).read_bytes()
    assert await objects.get(segment_keys(LAYOUT, request.metadata)[ObjectSuffix.LOG]) == log
    assert (objects.calls["copy"], objects.calls["put_file"]) == (1, 1)
    assert _outcomes(metrics) == {"adopted": 0, "not_staged": 1}


async def test_a_copy_waits_for_the_staging_upload_of_its_segment(partition: Path) -> None:
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    ident = (TOPIC_ID, 0, 30)
    ledger.begin(ident)
    copy = asyncio.create_task(
        _copier(objects, partition, ledger, metrics).copy(_request(partition, 30, 60))
    )
    # one loop turn: the task claims its segment and blocks on the staging upload, both
    # before its first real await
    await asyncio.sleep(0)
    assert ledger.taken(ident)
    assert not copy.done()
    log = (partition / segment_file_name(30, FileKind.LOG)).read_bytes()
    await objects.put(_staged_key(partition, 30), log)
    ledger.note_staged(ident, _staged_key(partition, 30))
    ledger.end(ident)
    await copy
    assert objects.calls["put_file"] == 0  # the bytes went once, when staged
    assert _outcomes(metrics)["adopted"] == 1


async def test_a_failed_copy_releases_its_claim(partition: Path) -> None:
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    objects.fail_next("put", RuntimeError("boom"))
    with pytest.raises(RuntimeError):
        await _copier(objects, partition, ledger, metrics).copy(_request(partition, 30, 60))
    assert not ledger.taken((TOPIC_ID, 0, 30))


def test_a_copied_claim_is_forgotten_after_a_while() -> None:
    now = [0.0]
    ledger = StagingLedger(clock=lambda: now[0])
    ledger.claim((TOPIC_ID, 0, 1))
    ledger.release((TOPIC_ID, 0, 1), copied=True)
    assert ledger.taken((TOPIC_ID, 0, 1))
    now[0] = 601.0
    assert not ledger.taken((TOPIC_ID, 0, 1))


def test_file_crc32c_reads_the_whole_file(tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert file_crc32c(fd, len(data)) == crc32c(data)
        with pytest.raises(OSError, match="ended"):
            file_crc32c(fd, len(data) + 1)
    finally:
        os.close(fd)


def test_staged_keys_round_trip_and_never_parse_as_segment_keys() -> None:
    for layout in (LAYOUT, KeyLayout(prefix="p/", hash_prefix=True), KeyLayout()):
        key = layout.staged_key(
            topic="a.b-c", topic_id=TOPIC_ID, partition=7, base_offset=42, size=99, crc32c=0xABC
        )
        parsed = layout.parse_staged(key)
        assert parsed is not None
        assert (parsed.topic, parsed.topic_id, parsed.partition) == ("a.b-c", TOPIC_ID, 7)
        assert (parsed.base_offset, parsed.size, parsed.crc32c) == (42, 99, 0xABC)
        assert layout.parse(key) is None
        segment = layout.segment_key(
            topic="staging",
            topic_id=TOPIC_ID,
            partition=0,
            base_offset=0,
            segment_id=uuid.uuid4(),
            suffix=ObjectSuffix.LOG,
        )
        assert layout.parse_staged(segment) is None
    with pytest.raises(ValueError, match="bad staged segment"):
        LAYOUT.staged_key(
            topic="t", topic_id=TOPIC_ID, partition=0, base_offset=0, size=1, crc32c=2**32
        )
