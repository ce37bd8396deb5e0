"""Eager upload's contract between the stager and the broker's copy call, over the memory object
store and real segment files: a staged .log with the file's size and CRC is adopted with a copy
inside the store (no second upload), one with other bytes is not, a copy call waits for a
staging upload of its segment in flight, and the staged key format round-trips."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from sidecar.brokerapi import BrokerCopyRequest
from sidecar.errors import StorageError
from sidecar.kafka.logdir import FileKind, PartitionScan, scan_partition_dir, segment_file_name
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.metrics import Metrics
from sidecar.storage import PartChecksums, plan_parts
from sidecar.storage._crc import crc32c
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import SegmentManifest
from sidecar.storage.memory import MemoryObjectStore
from sidecar.testing import write_partition
from sidecar.tiering import brokercopy, eager
from sidecar.tiering.brokercopy import BrokerCopier
from sidecar.tiering.cluster import BrokerTiering, ClusterView, TopicConfig, TopicSelector
from sidecar.tiering.detector import ViewMap
from sidecar.tiering.eager import EagerStager, StagingLedger, file_crc32c
from sidecar.tiering.uploader import segment_keys
from tests.unit.readserver._tiered import data_batches
from tests.unit.tiering.test_uploader_files import held_open

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


async def test_a_copy_call_tells_whose_topic_the_broker_copies(partition: Path) -> None:
    """Every copy call names its topic to ``on_copy`` (the cluster watcher then treats the topic
    as broker-driven), before any byte is read."""
    copied: list[str] = []
    copier = BrokerCopier(
        objects=MemoryObjectStore(),
        layout=LAYOUT,
        log_dirs=[partition.parent],
        part_size=8 * 1024 * 1024,
        concurrency=2,
        on_copy=copied.append,
    )
    request = _request(partition, 30, 60)
    await copier.copy(request)
    assert copied == [request.metadata.segment_id.topic_id_partition.topic]


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


async def test_the_check_gives_the_staging_lookup_and_the_upload_their_crcs(
    partition: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One read of the broker's ``.log`` (the batch check) gives the whole file's CRC-32C for
    the staged-key lookup and each part's for the upload: the file is not read again for
    either."""
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    log = (partition / segment_file_name(0, FileKind.LOG)).read_bytes()
    part_size = 5 * 1024 * 1024
    assert len(log) < part_size  # one part here; PartChecksums cuts several the same way

    def no_second_read(fd: int, size: int) -> int:
        raise AssertionError("the .log was read again for its CRC-32C")

    handed: list[object] = []
    put_file = MemoryObjectStore.put_file

    async def spy(self: MemoryObjectStore, key: str, path: Any, **kwargs: Any) -> Any:
        handed.append((kwargs.get("part_size"), kwargs.get("part_crcs")))
        return await put_file(self, key, path, **kwargs)

    monkeypatch.setattr(brokercopy, "file_crc32c", no_second_read)
    monkeypatch.setattr(MemoryObjectStore, "put_file", spy)
    copier = BrokerCopier(
        objects=objects,
        layout=LAYOUT,
        log_dirs=[partition.parent],
        part_size=part_size,
        concurrency=2,
        staging=ledger,
        metrics=metrics,
    )
    request = _request(partition, 0, 30)
    await copier.copy(request)

    assert handed == [(part_size, (crc32c(log),))]
    assert _outcomes(metrics) == {"adopted": 0, "not_staged": 1}  # looked up under crc32c(log)
    keys = segment_keys(LAYOUT, request.metadata)
    assert await objects.get(keys[ObjectSuffix.LOG]) == log


def test_part_checksums_give_the_whole_files_crc() -> None:
    """The whole file's CRC-32C combined from its parts' equals the CRC of all its bytes."""
    data = bytes(range(256)) * 50_000  # 12.5 MB: three parts of 5 MiB
    checksums = PartChecksums(len(data), 5 * 1024 * 1024)
    for start in range(0, len(data), 1_000_000):
        checksums.feed(start, data[start : start + 1_000_000])
    assert len(checksums.result() or ()) == 3
    assert checksums.whole() == crc32c(data)
    gap = PartChecksums(len(data), 5 * 1024 * 1024)
    gap.feed(1, data[1:])
    assert gap.whole() is None


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


def test_the_ledger_stays_bounded_while_no_stager_pass_prunes_it() -> None:
    """The broker copies on while the stager makes no full pass (paused: S3 or Kafka down as
    the sidecar sees them, or no topic broker-driven in its view): what the ledger remembers
    of copied segments is still bounded by its memory span, not by how long that lasts."""
    now = [0.0]
    ledger = StagingLedger(clock=lambda: now[0])
    for base in range(5000):  # a copy call a second, none of them followed by a pass
        now[0] = float(base)
        ledger.claim((TOPIC_ID, 0, base))
        ledger.release((TOPIC_ID, 0, base), copied=True)
    assert len(ledger._copied) <= 601
    assert ledger.taken((TOPIC_ID, 0, 4999))
    assert not ledger.taken((TOPIC_ID, 0, 0))


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


class _Cluster:
    """The cluster watcher as the stager sees it: the topic is broker-driven and led here."""

    def __init__(self, lso: int | None) -> None:
        self.view = ClusterView(
            broker_id=1,
            leaders={("orders", 0): 1},
            configs={"orders": TopicConfig(remote_storage_enable=True)},
            last_stable_offsets={} if lso is None else {("orders", 0): lso},
            refreshed_at=time.monotonic(),
            stale_after_s=3600,
        )
        self.fetched = 0
        self._lso = lso
        self.broker_runs_plugin: bool | None = None

    def broker_copies(self, topic: str) -> bool:
        return TopicSelector.broker_copies(self.view.configs.get(topic))

    async def fetch_lso(self, topic: str, partition: int) -> int | None:
        self.fetched += 1
        return 10_000


class _CountingViews(ViewMap):  # type: ignore[type-arg]
    """The detector's views, counting how often they are walked."""

    walks = 0

    def values(self):  # type: ignore[override]
        type(self).walks += 1
        return super().values()

    def items(self):  # type: ignore[override]
        type(self).walks += 1
        return super().items()


class _Tailer:
    def wants(self, tp: object) -> bool:
        return True

    def caught_up(self, metadata_partition: int) -> bool:
        return True


def _stager(tmp_path: Path, partition: Path, objects: MemoryObjectStore, *, lso: int | None):
    scan = scan_partition_dir(partition)
    assert scan is not None
    metrics, ledger, cluster = Metrics(), StagingLedger(), _Cluster(lso)
    store = RemoteSegmentStore(tmp_path / "state")
    stager = EagerStager(
        objects=objects,
        layout=LAYOUT,
        views=lambda: {partition: scan},
        cluster=cluster,  # type: ignore[arg-type]
        store=store,
        tailer=_Tailer(),  # type: ignore[arg-type]
        ledger=ledger,
        metrics=metrics,
        num_metadata_partitions=50,
        part_size=8 * 1024 * 1024,
        concurrency=2,
    )
    return stager, ledger, metrics, cluster, store


async def test_nothing_broker_driven_walks_no_partition(tmp_path: Path, partition: Path):
    """With no broker-driven topic in the cluster, a pass (one a second) does not walk the
    broker's partition dirs (ten thousand, on a large broker)."""
    objects = MemoryObjectStore()
    stager, _ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=100)
    views = _CountingViews()
    stager._views = lambda: views
    try:
        cluster.view = dataclasses.replace(cluster.view, configs={"orders": TopicConfig()})
        await stager._pass(asyncio.Event())
        assert _CountingViews.walks == 0
        driven = TopicConfig(remote_storage_enable=True)
        cluster.view = dataclasses.replace(cluster.view, configs={"orders": driven})
        await stager._pass(asyncio.Event())
        assert _CountingViews.walks == 1
    finally:
        store.close()


async def test_a_topic_with_copy_disabled_is_not_staged_until_copy_is_enabled(
    tmp_path: Path, partition: Path
):
    """remote.log.copy.disable=true (KIP-950): the broker copies nothing of the topic, so a
    staged .log would only wait for the orphan scrub. Enabled again, its segments are staged."""
    objects = MemoryObjectStore()
    stager, ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=100)
    try:
        disabled = TopicConfig(remote_storage_enable=True, remote_log_copy_disable=True)
        cluster.view = dataclasses.replace(cluster.view, configs={"orders": disabled})
        await stager._pass(asyncio.Event())
        assert objects.calls["put_file"] == 0
        assert ledger.staged_key((TOPIC_ID, 0, 0)) is None
        enabled = dataclasses.replace(disabled, remote_log_copy_disable=False)
        cluster.view = dataclasses.replace(cluster.view, configs={"orders": enabled})
        await stager._pass(asyncio.Event())
        assert objects.calls["put_file"] == 2
        assert ledger.staged_key((TOPIC_ID, 0, 0)) == _staged_key(partition, 0)
    finally:
        store.close()


async def test_nothing_is_staged_while_the_broker_loads_another_rsm(
    tmp_path: Path, partition: Path
):
    """A broker whose RemoteStorageManager is another class copies its broker-driven topics
    through that class: a staged .log would only wait for the orphan scrub. The stager says so
    once (per broker configs seen), and stages again once the broker loads the plugin."""
    objects = MemoryObjectStore()
    stager, ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=100)
    other = BrokerTiering(system_enable=True, rsm_class="org.example.OtherRsm")
    try:
        cluster.view = dataclasses.replace(cluster.view, broker_tiering=other)
        cluster.broker_runs_plugin = False
        with capture_logs() as logs:
            await stager._pass(asyncio.Event())
            await stager._pass(asyncio.Event())
        assert objects.calls["put_file"] == 0
        warned = [e for e in logs if e["event"] == "broker_not_using_plugin"]
        assert len(warned) == 1
        assert warned[0]["log_level"] == "warning"
        assert warned[0]["rsm_class"] == "org.example.OtherRsm"
        assert warned[0]["broker_driven_topics"] == 1
        assert "sidecar broker-config" in warned[0]["detail"]
        cluster.broker_runs_plugin = True
        await stager._pass(asyncio.Event())
        assert objects.calls["put_file"] == 2
        assert ledger.staged_key((TOPIC_ID, 0, 0)) == _staged_key(partition, 0)
    finally:
        store.close()


def test_copy_disable_is_read_from_the_topic_configs() -> None:
    """Kafka answers DescribeConfigs with strings; a broker before 3.9 leaves the key out."""
    base = {"remote.storage.enable": "true"}
    assert not TopicConfig.from_entries(base).remote_log_copy_disable
    on = TopicConfig.from_entries({**base, "remote.log.copy.disable": "TRUE"})
    assert on.remote_log_copy_disable
    assert TopicSelector.broker_driven(on)  # the broker still owns its remote data
    assert not TopicSelector.broker_copies(on)
    assert TopicSelector.broker_copies(TopicConfig.from_entries(base))
    off = TopicConfig.from_entries({"remote.log.copy.disable": "true"})
    assert not TopicSelector.broker_copies(off)
    assert not TopicSelector.broker_copies(None)


async def test_the_stager_uploads_rolled_segments_below_the_lso(tmp_path: Path, partition: Path):
    objects = MemoryObjectStore()
    stager, ledger, metrics, cluster, store = _stager(tmp_path, partition, objects, lso=None)
    try:
        await stager._pass(asyncio.Event())
        assert cluster.fetched == 1  # the periodic refresh has no LSO of broker-driven topics
        for base in (0, 30):  # both rolled segments, not the active one
            key = _staged_key(partition, base)
            log = (partition / segment_file_name(base, FileKind.LOG)).read_bytes()
            assert objects.objects[key] == log
            assert ledger.staged_key((TOPIC_ID, 0, base)) == key
        assert len([k for k in objects.objects if LAYOUT.parse_staged(k)]) == 2
        assert (
            metrics.registry.get_sample_value(
                "kafka_tiered_sidecar_eager_uploads_total", {"outcome": "staged"}
            )
            == 2
        )
        await stager._pass(asyncio.Event())  # nothing new: no second upload
        assert objects.calls["put_file"] == 2
    finally:
        store.close()


async def test_a_staging_upload_gets_its_part_crcs_from_the_fingerprint_read(
    tmp_path: Path, partition: Path, monkeypatch: pytest.MonkeyPatch
):
    """The read that fingerprints a rolled ``.log`` (its CRC-32C names the staged key) also
    gives each part's CRC-32C to the upload, which then does not read the file to compute
    them."""
    handed: list[object] = []
    put_file = MemoryObjectStore.put_file

    async def spy(self: MemoryObjectStore, key: str, path: Any, **kwargs: Any) -> Any:
        handed.append(kwargs.get("part_crcs"))
        return await put_file(self, key, path, **kwargs)

    monkeypatch.setattr(MemoryObjectStore, "put_file", spy)
    objects = MemoryObjectStore()
    stager, _ledger, _metrics, _cluster, store = _stager(tmp_path, partition, objects, lso=None)
    try:
        await stager._pass(asyncio.Event())
    finally:
        store.close()
    logs = [(partition / segment_file_name(b, FileKind.LOG)).read_bytes() for b in (0, 30)]
    assert sorted(handed, key=str) == sorted([(crc32c(log),) for log in logs], key=str)


def test_the_fingerprint_cuts_part_crcs_as_the_upload_does(tmp_path: Path) -> None:
    data = os.urandom(12 * 1024 * 1024 + 3)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    part = 5 * 1024 * 1024
    fingerprint = eager._fingerprint(path, part)
    assert fingerprint is not None
    size, crc, _mtime, part_crcs = fingerprint
    assert (size, crc) == (len(data), crc32c(data))
    assert part_crcs == tuple(
        crc32c(data[p.offset : p.offset + p.length]) for p in plan_parts(len(data), part)
    )
    assert len(part_crcs or ()) == 3


async def test_a_failed_staging_upload_is_counted_logged_and_retried_later(
    tmp_path: Path, partition: Path
):
    objects = MemoryObjectStore()
    objects.fail_next("put_file", StorageError("SlowDown"), times=2)
    stager, ledger, metrics, _cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    try:
        with capture_logs() as logs:
            await stager._pass(asyncio.Event())
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "segment_staging_failed",
            "segment_staging_failed",
        ]
        assert (
            metrics.registry.get_sample_value(
                "kafka_tiered_sidecar_eager_uploads_total", {"outcome": "failed"}
            )
            == 2
        )
        assert ledger.staged_key((TOPIC_ID, 0, 0)) is None
        await stager._pass(asyncio.Event())  # within the retry wait: not tried again
        assert objects.calls["put_file"] == 2
        stager._retry_at.clear()  # the wait is over
        await stager._pass(asyncio.Event())
        assert ledger.staged_key((TOPIC_ID, 0, 0)) == _staged_key(partition, 0)
    finally:
        store.close()


async def test_stop_cancels_a_staging_upload_in_flight(tmp_path: Path, partition: Path):
    """SIGTERM does not wait for a slow staging upload: the copy call uploads instead."""
    objects = MemoryObjectStore()
    entered = asyncio.Event()

    async def hang(*args: object, **kwargs: object) -> None:
        entered.set()
        await asyncio.Event().wait()

    objects.put_file = hang  # type: ignore[method-assign]
    stager, ledger, _metrics, _cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    stopping = asyncio.Event()
    try:
        running = asyncio.create_task(stager.run(stopping))
        await entered.wait()
        stopping.set()
        await asyncio.wait_for(running, timeout=30)
        assert ledger.staged_key((TOPIC_ID, 0, 0)) is None
        await ledger.settled((TOPIC_ID, 0, 0))  # nothing left in flight for a copy to wait on
    finally:
        store.close()


def test_a_claim_holds_while_any_copy_call_of_the_segment_runs() -> None:
    """The broker retries a copy (a new segment id) while the call it gave up on is still
    being cancelled here: the first call's end must not let the stager upload the segment
    under the retry."""
    ledger = StagingLedger()
    ident = (TOPIC_ID, 0, 30)
    ledger.claim(ident)  # the call the broker gave up on
    ledger.claim(ident)  # its retry
    ledger.release(ident, copied=False)
    assert ledger.taken(ident)
    ledger.release(ident, copied=False)
    assert not ledger.taken(ident)


async def test_a_pass_on_a_stale_view_keeps_what_was_staged(
    tmp_path: Path, partition: Path, monkeypatch: pytest.MonkeyPatch
):
    """A pass that skips the partition (the cluster view went stale for a moment) does not
    forget its staged segments: the next pass neither reads their files again nor asks the
    store about them."""
    reads: list[str] = []
    fingerprint = eager._fingerprint

    def counting(path: Path, part_size: int) -> Any:
        reads.append(path.name)
        return fingerprint(path, part_size)

    monkeypatch.setattr(eager, "_fingerprint", counting)
    objects = MemoryObjectStore()
    stager, ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    try:
        await stager._pass(asyncio.Event())
        assert len(reads) == 2
        fresh = cluster.view
        cluster.view = dataclasses.replace(fresh, refreshed_at=0.0, stale_after_s=1)
        await stager._pass(asyncio.Event())
        assert ledger.staged_key((TOPIC_ID, 0, 0)) == _staged_key(partition, 0)
        cluster.view = fresh
        heads = objects.calls["head"]
        await stager._pass(asyncio.Event())
        assert len(reads) == 2
        assert objects.calls["head"] == heads
        assert objects.calls["put_file"] == 2
    finally:
        store.close()


async def test_a_partition_gone_from_the_log_dirs_is_forgotten(tmp_path: Path, partition: Path):
    objects = MemoryObjectStore()
    stager, ledger, _metrics, _cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    try:
        await stager._pass(asyncio.Event())
        assert ledger.staged_key((TOPIC_ID, 0, 0)) is not None
        stager._views = dict  # the partition moved to another broker's disks
        now = [time.monotonic()]
        stager._monotonic = lambda: now[0]
        await stager._pass(asyncio.Event())
        assert ledger.staged_key((TOPIC_ID, 0, 0)) is not None  # until the next full pass
        now[0] += 30
        await stager._pass(asyncio.Event())
        assert ledger.staged_key((TOPIC_ID, 0, 0)) is None
        assert stager._plans == {}
    finally:
        store.close()


async def test_a_partition_is_planned_again_only_when_something_changed(
    tmp_path: Path, partition: Path, monkeypatch: pytest.MonkeyPatch
):
    """A pass a second over every led partition: the plan (a thread hop and store queries)
    is made again only after a new scan, a new LSO or a metadata change of the partition
    (this one seen by the next pass over every partition)."""
    objects = MemoryObjectStore()
    stager, _ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    now = [time.monotonic()]
    stager._monotonic = lambda: now[0]
    plans: list[int | None] = []
    plan = stager._plan

    def counting(scan: Any, tip: TopicIdPartition, lso: int | None) -> Any:
        plans.append(lso)
        return plan(scan, tip, lso)

    monkeypatch.setattr(stager, "_plan", counting)
    try:
        await stager._pass(asyncio.Event())
        await stager._pass(asyncio.Event())
        assert plans == [10_000]
        cluster.view = dataclasses.replace(
            cluster.view, last_stable_offsets={("orders", 0): 10_001}
        )
        await stager._pass(asyncio.Event())
        assert plans == [10_000, 10_001]
        started = _request(partition, 0, 30).metadata
        store.apply([started])  # the broker's COPY_SEGMENT_STARTED of segment 0
        await stager._pass(asyncio.Event())
        assert plans == [10_000, 10_001]
        now[0] += 30
        await stager._pass(asyncio.Event())
        assert plans == [10_000, 10_001, 10_001]
        rescanned = scan_partition_dir(partition)
        stager._views = lambda: {partition: rescanned}
        await stager._pass(asyncio.Event())
        await stager._pass(asyncio.Event())
        assert plans == [10_000, 10_001, 10_001, 10_001]
        assert objects.calls["put_file"] == 2  # each segment staged once all along
    finally:
        store.close()


def _led_partitions(
    stager: EagerStager, cluster: _Cluster, partition: Path, tmp_path: Path, count: int
) -> tuple[ViewMap[PartitionScan], PartitionScan]:
    """``count`` partitions of the topic, all led here, as copies of ``partition``'s scan in
    a ViewMap the stager reads; and that scan."""
    scan = scan_partition_dir(partition)
    assert scan is not None
    views: ViewMap[PartitionScan] = ViewMap()
    for i in range(count):
        views[tmp_path / f"orders-{i}"] = dataclasses.replace(scan, partition=i)
    stager._views = lambda: views
    cluster.view = dataclasses.replace(
        cluster.view,
        leaders={("orders", i): 1 for i in range(count)},
        last_stable_offsets={("orders", i): 10_000 for i in range(count)},
    )
    return views, scan


def _record_looks(stager: EagerStager, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The partitions the stager plans (or reuses the plan of), in order, as it looks."""
    looked: list[int] = []
    candidates = stager._candidates

    async def counting(scan: PartitionScan, tip: TopicIdPartition) -> Any:
        looked.append(scan.partition)
        return await candidates(scan, tip)

    monkeypatch.setattr(stager, "_candidates", counting)
    return looked


async def test_between_full_passes_only_partitions_something_happened_to_are_looked_at(
    tmp_path: Path, partition: Path, monkeypatch: pytest.MonkeyPatch
):
    """Passes run every second and on every roll: at ten thousand led partitions each must
    cost nothing for the partitions where nothing happened. Between passes over every
    partition (every 30 s, and on a new picture of the cluster) a pass looks at the dirs the
    detector's journal names and at those with work left."""
    objects = MemoryObjectStore()
    stager, ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    views, scan = _led_partitions(stager, cluster, partition, tmp_path, 20)
    now = [time.monotonic()]
    stager._monotonic = lambda: now[0]
    looked = _record_looks(stager, monkeypatch)
    objects.fail_next("put_file", StorageError("SlowDown"))  # one staging upload to retry
    try:
        await stager._pass(asyncio.Event())
        assert sorted(looked) == list(range(20))
        failed = [i for i in range(20) if ledger.staged_key((TOPIC_ID, i, 0)) is None]
        assert len(failed) == 1
        looked.clear()
        await stager._pass(asyncio.Event())
        assert looked == failed  # work left over: looked at again, nothing else
        looked.clear()
        rolled = tmp_path / "orders-7"
        views[rolled] = dataclasses.replace(scan, partition=7)  # a new scan: a roll
        views.note(rolled)
        await stager._pass(asyncio.Event())
        assert sorted(looked) == sorted({7, *failed})
        looked.clear()
        now[0] += 30
        await stager._pass(asyncio.Event())
        assert sorted(looked) == list(range(20))
    finally:
        store.close()


async def test_topics_driven_again_get_a_pass_over_every_partition(
    tmp_path: Path, partition: Path, monkeypatch: pytest.MonkeyPatch
):
    """While the broker loads another RemoteStorageManager nothing is looked at; once it loads
    the plugin again, the next pass looks at every partition, not only at what changed."""
    objects = MemoryObjectStore()
    stager, _ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    stager._monotonic = lambda: 1000.0  # the clock stands still: no pass is due by time
    looked = _record_looks(stager, monkeypatch)
    try:
        await stager._pass(asyncio.Event())
        assert looked == [0]
        cluster.broker_runs_plugin = False
        await stager._pass(asyncio.Event())
        assert looked == [0]
        cluster.broker_runs_plugin = True
        await stager._pass(asyncio.Event())
        assert looked == [0, 0]
    finally:
        store.close()


async def test_a_pass_that_fails_midway_leaves_the_rest_to_the_next(
    tmp_path: Path, partition: Path, monkeypatch: pytest.MonkeyPatch
):
    """A store query that fails (the pass is logged and ends) does not make the stager forget
    the partitions it had not looked at yet: the next pass, one second later, looks at them."""
    objects = MemoryObjectStore()
    stager, ledger, _metrics, cluster, store = _stager(tmp_path, partition, objects, lso=10_000)
    _led_partitions(stager, cluster, partition, tmp_path, 6)
    stager._monotonic = lambda: 1000.0  # no pass is due by time after the first
    candidates = stager._candidates
    calls = 0

    async def failing_once(scan: PartitionScan, tip: TopicIdPartition) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise StorageError("the store query failed")
        return await candidates(scan, tip)

    monkeypatch.setattr(stager, "_candidates", failing_once)
    try:
        with capture_logs() as logs:
            await stager._pass_logged(asyncio.Event())
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["eager_pass_failed"]
        staged = [i for i in range(6) if ledger.staged_key((TOPIC_ID, i, 0)) is not None]
        assert len(staged) == 2
        await stager._pass_logged(asyncio.Event())
        assert all(ledger.staged_key((TOPIC_ID, i, 0)) is not None for i in range(6))
    finally:
        store.close()


async def test_a_copy_cancelled_while_its_files_open_closes_them(
    partition: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy cancelled (the broker gave up) while a worker thread opens its files: once the
    thread is done, the ``.log`` it opened is closed, not left to the garbage collector."""
    objects, ledger, metrics = MemoryObjectStore(), StagingLedger(), Metrics()
    copier = _copier(objects, partition, ledger, metrics)
    log = partition / segment_file_name(0, FileKind.LOG)
    opening, release, closed = threading.Event(), threading.Event(), threading.Event()
    real_open = BrokerCopier._open

    class _Watched:
        """The opened ``.log``, telling when it is closed."""

        def __init__(self, file: Any) -> None:
            self.file = file

        def close(self) -> None:
            self.file.close()
            closed.set()

    def slow_open(self: BrokerCopier, request: BrokerCopyRequest, with_crc: bool) -> Any:
        opened, crc = real_open(self, request, with_crc)
        opening.set()
        release.wait(30)
        return dataclasses.replace(opened, log=_Watched(opened.log)), crc

    monkeypatch.setattr(BrokerCopier, "_open", slow_open)
    copy = asyncio.create_task(copier.copy(_request(partition, 0, 30)))
    assert await asyncio.to_thread(opening.wait, 30)
    assert held_open(log)
    copy.cancel()
    with pytest.raises(asyncio.CancelledError):
        await copy
    release.set()
    assert await asyncio.to_thread(closed.wait, 30)
    assert not held_open(log)
    assert objects.objects == {}
