"""A finished copy is never abandoned, against the real broker's metadata topic and SeaweedFS.

The uploader runs with the real publisher, tailer and store and the S3 backend; the fault is a
read-back of COPY_SEGMENT_FINISHED that never comes (the event is on the topic, the wait for it
hangs), alone or with the upload cancelled meanwhile (a leadership move, the drain deadline).
The copy must end FINISHED with its objects in the bucket, and no delete event on the topic.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.kafka.logdir import PartitionScan, scan_partition_dir
from sidecar.metadata import (
    MetadataPublisher,
    MetadataTailer,
    RemoteLogSegmentState,
    RemoteSegmentStore,
)
from sidecar.storage.keys import KeyLayout
from sidecar.storage.s3 import S3ObjectStore
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering.uploader import SegmentUploader
from sidecar.tiering.workers import MetadataSync
from tests.e2e._support import delete_topic

pytestmark = pytest.mark.integration

NUM_PARTITIONS = 3
BROKER_ID = 11
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETES = {
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
}


class HangingReadBack:
    """The tailer's read-back, except that the ``hang``-th wait never returns."""

    def __init__(self, tailer: MetadataTailer, hang: int) -> None:
        self.tailer = tailer
        self.hang = hang
        self.calls = 0
        self.hanging = asyncio.Event()

    def is_tracked(self, partition: int) -> bool:
        return self.tailer.is_tracked(partition)

    async def wait_for_offset(self, partition: int, offset: int) -> None:
        self.calls += 1
        if self.calls == self.hang:
            self.hanging.set()
            await asyncio.Event().wait()
        await self.tailer.wait_for_offset(partition, offset)


class Rig:
    """One local partition, the real uploader and what it talks to."""

    def __init__(
        self,
        scan: PartitionScan,
        store: RemoteSegmentStore,
        uploader: SegmentUploader,
        objects: S3ObjectStore,
        prefix: str,
        read_back: HangingReadBack,
    ) -> None:
        self.scan = scan
        self.store = store
        self.uploader = uploader
        self.objects = objects
        self.prefix = prefix
        self.read_back = read_back

    async def keys(self) -> list[str]:
        return [o.key async for o in self.objects.list(self.prefix)]


def _kwargs(kafka: Any, metadata_topic: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": kafka.bootstrap_servers,
        "broker_id": BROKER_ID,
        "topic": metadata_topic,
    }


@pytest.fixture
async def rig(
    kafka: Any, s3: Any, s3_prefix: str, topic_name: str, tmp_path: Path
) -> AsyncIterator[Rig]:
    batches = [[build_batch([TestRecord(b"k", b"v" * 200)] * 10) for _ in range(3)]] * 2
    path = write_partition(tmp_path / "logs", topic_name, 0, batches, topic_id=uuid.uuid4())
    scan = scan_partition_dir(path)
    assert scan is not None
    metadata_topic = f"__rlm_{topic_name}"  # delete_topic checks it with Kafka's serde
    creator = MetadataPublisher(
        **_kwargs(kafka, metadata_topic), num_partitions=NUM_PARTITIONS, replication_factor=1
    )
    await creator.ensure_topic()
    store = RemoteSegmentStore(tmp_path / "state")
    stopping = asyncio.Event()
    objects = S3ObjectStore(
        bucket=s3.bucket,
        endpoint_url=s3.endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
        request_timeout_s=30.0,
    )
    try:
        async with MetadataTailer(store=store, **_kwargs(kafka, metadata_topic)) as tailer:
            tailer.track(range(NUM_PARTITIONS))
            task = asyncio.create_task(tailer.run(stopping), name="metadata tailer")
            # the tailer at the topic's end first: STARTED's read-back must not spend the
            # 5 s below on the tailer's start (seeks, first fetch) on a loaded machine
            async with asyncio.timeout(60):
                await tailer.wait_caught_up()
            read_back = HangingReadBack(tailer, hang=2)  # STARTED's is 1, FINISHED's is 2
            publisher = MetadataPublisher(
                **_kwargs(kafka, metadata_topic),
                num_partitions=NUM_PARTITIONS,
                replication_factor=1,
                read_back=read_back,
                read_back_timeout_s=5.0,
            )
            await publisher.start()
            uploader = SegmentUploader(
                objects=objects,
                publisher=publisher,
                layout=KeyLayout(prefix=s3_prefix),
                broker_id=BROKER_ID,
                part_size=5 * 1024 * 1024,
                concurrency=2,
                store=store,
                sync=MetadataSync(tailer, num_partitions=NUM_PARTITIONS, timeout_s=30.0),
            )
            try:
                yield Rig(scan, store, uploader, objects, s3_prefix, read_back)
            finally:
                await publisher.aclose()
                stopping.set()
                await task
                await objects.delete([o.key async for o in objects.list(s3_prefix)])
                await objects.aclose()
        await delete_topic(kafka.bootstrap_servers, topic_name)
    finally:
        store.close()


def _states(r: Rig, segment_id: Any) -> set[RemoteLogSegmentState]:
    stored = r.store.segment(segment_id)
    return set() if stored is None else {stored.state}


class TestFinishedOnTheRealTopic:
    async def test_read_back_timeout_after_finished_keeps_the_copy(self, rig: Rig) -> None:
        """FINISHED is on the topic but its read-back times out: the uploader reads the topic,
        sees FINISHED, and succeeds; the objects stay and no delete is published."""
        segment = rig.scan.segments[0]
        outcome = await rig.uploader.upload(rig.scan, segment)
        assert rig.read_back.hanging.is_set()
        assert _states(rig, outcome.metadata.segment_id) == {FINISHED}
        assert len(await rig.keys()) == 3  # .log, indexes, manifest
        assert rig.store.is_tiered(
            outcome.metadata.segment_id.topic_id_partition, segment.base_offset
        )

    async def test_cancelled_during_finished_read_back_keeps_the_copy(self, rig: Rig) -> None:
        """The upload is cancelled while FINISHED is read back (a leadership move): the
        cancellation waits for the copy's state to settle, FINISHED, and deletes nothing; the
        caller still hears of the copy, so that it is counted and logged as tiered."""
        segment = rig.scan.segments[0]
        late: list[Any] = []
        upload = asyncio.create_task(
            rig.uploader.upload(rig.scan, segment, on_late_finish=late.append)
        )
        await asyncio.wait_for(rig.read_back.hanging.wait(), 30)
        upload.cancel()
        with pytest.raises(asyncio.CancelledError):
            await upload
        assert [(o.metadata.start_offset, o.metadata.end_offset) for o in late] == [
            (segment.base_offset, segment.end_offset)
        ]
        assert late[0].log_bytes == segment.size
        finished = rig.store.segments(_tip(rig), states={FINISHED})
        assert [(s.start_offset, s.end_offset) for s in finished] == [
            (segment.base_offset, segment.end_offset)
        ]
        assert not [s for s in rig.store.segments(_tip(rig)) if s.state in DELETES]
        assert len(await rig.keys()) == 3


def _tip(r: Rig) -> Any:
    tips = r.store.partitions()
    assert len(tips) == 1
    return tips[0]
