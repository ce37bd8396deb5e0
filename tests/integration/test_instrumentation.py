"""The metrics of the S3 store, the metadata publisher and the metadata tailer against the real
SeaweedFS and Kafka: every S3 operation the sidecar uses is counted and timed under its own
label, publishes are timed until acked and until read back, and the metadata store lag follows
the topic's end offsets (up when records arrive unread, 0 once applied)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sidecar.errors import KeyNotFoundError
from sidecar.metadata import (
    MetadataPublisher,
    MetadataReadBackTimeoutError,
    MetadataTailer,
    RemoteSegmentStore,
)
from sidecar.observability.metrics import S3_OPERATIONS, Metrics
from sidecar.storage.s3 import S3ObjectStore
from tests.integration.test_metadata_topic import (
    BROKER_ID,
    FINISHED,
    NUM_PARTITIONS,
    copy_started,
    tailing,
    update,
    user_partition,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(f"kafka_tiered_sidecar_{name}", labels)
    return 0.0 if value is None else value


class TestS3Operations:
    async def test_every_operation_is_counted_and_timed(self, s3: Any, s3_prefix: str, tmp_path):
        """Each ObjectStore call against SeaweedFS moves its operation's series, and only its."""
        metrics = Metrics()
        store = S3ObjectStore(
            bucket=s3.bucket,
            endpoint_url=s3.endpoint,
            access_key_id=s3.access_key,
            secret_access_key=s3.secret_key,
            metrics=metrics,
        )
        path = tmp_path / "segment.log"
        path.write_bytes(os.urandom(11 * MiB))  # three 5 MiB parts: multipart
        async with store:
            steps: list[tuple[str, Any]] = [
                ("put_object", store.put(f"{s3_prefix}small", b"x" * 100)),
                ("get_object", store.get(f"{s3_prefix}small")),
                ("get_object", store.get_range(f"{s3_prefix}small", 10, 19)),
                ("head_object", store.head(f"{s3_prefix}small")),
                ("copy_object", store.copy(f"{s3_prefix}small", f"{s3_prefix}copied")),
                ("list_objects", _drain(store.list(s3_prefix))),
                ("list_multipart_uploads", _drain(store.list_multipart_uploads(s3_prefix))),
                ("delete_objects", store.delete([f"{s3_prefix}small", f"{s3_prefix}copied"])),
            ]
            for operation, call in steps:
                before = _value(metrics, "s3_requests_total", operation=operation)
                await call
                assert _value(metrics, "s3_requests_total", operation=operation) == before + 1
            await store.put_file(f"{s3_prefix}big", path, part_size=5 * MiB, concurrency=2)
            assert _value(metrics, "s3_requests_total", operation="create_multipart_upload") == 1
            assert _value(metrics, "s3_requests_total", operation="upload_part") == 3
            assert _value(metrics, "s3_requests_total", operation="complete_multipart_upload") == 1
            upload = await store._create_multipart_upload(f"{s3_prefix}left")
            await store.abort_multipart_upload(f"{s3_prefix}left", upload)
            assert _value(metrics, "s3_requests_total", operation="abort_multipart_upload") == 1
            with pytest.raises(KeyNotFoundError):
                await store.head(f"{s3_prefix}absent")
            await store.delete([f"{s3_prefix}big"])
        for operation in S3_OPERATIONS:
            count = _value(metrics, "s3_request_seconds_count", operation=operation)
            assert count == _value(metrics, "s3_requests_total", operation=operation) >= 1
        assert (
            _value(metrics, "s3_request_errors_total", operation="head_object", reason="not_found")
            == 1
        )
        errors = [
            s
            for family in metrics.registry.collect()
            if family.name == "kafka_tiered_sidecar_s3_request_errors"
            for s in family.samples
            if s.name.endswith("_total") and s.value
        ]
        assert len(errors) == 1  # the 404 above, nothing else failed


async def _drain(iterator: Any) -> list[Any]:
    return [item async for item in iterator]


@pytest.fixture
async def meta_topic(kafka, topic_name: str) -> str:
    """A metadata topic of this test, created by ensure_topic."""
    name = f"__remote_log_metadata_{topic_name}"
    await MetadataPublisher(
        bootstrap_servers=kafka.bootstrap_servers,
        broker_id=BROKER_ID,
        topic=name,
        num_partitions=NUM_PARTITIONS,
        replication_factor=1,
    ).ensure_topic()
    return name


@pytest.fixture
async def publishers(kafka, meta_topic: str) -> AsyncIterator[Any]:
    """Builds started publishers on ``meta_topic``; closes them at the end."""
    started: list[MetadataPublisher] = []

    async def build(**kwargs: Any) -> MetadataPublisher:
        publisher = MetadataPublisher(
            bootstrap_servers=kafka.bootstrap_servers,
            broker_id=BROKER_ID,
            topic=meta_topic,
            num_partitions=NUM_PARTITIONS,
            replication_factor=1,
            **kwargs,
        )
        started.append(publisher)
        await publisher.start()
        return publisher

    yield build
    for publisher in started:
        await publisher.aclose()


class TestMetadataMetrics:
    async def test_publish_latency_by_stage(self, kafka, meta_topic, publishers, tmp_path):
        """publish_and_wait observes both stages once per event, publish only the ack."""
        metrics = Metrics()
        tp = user_partition(1)
        async with tailing(kafka, meta_topic, tmp_path, {1}) as (tailer, _store):
            publisher = await publishers(read_back=tailer, metrics=metrics)
            segment = copy_started(tp, 0, 9)
            await publisher.publish_and_wait(segment)
            await publisher.publish_and_wait(update(segment, FINISHED))
            await publisher.publish(copy_started(tp, 10, 19))  # no read-back: acked only
        assert _value(metrics, "metadata_publish_seconds_count", stage="acked") == 3
        assert _value(metrics, "metadata_publish_seconds_count", stage="read_back") == 2
        acked = _value(metrics, "metadata_publish_seconds_sum", stage="acked")
        read_back = _value(metrics, "metadata_publish_seconds_sum", stage="read_back")
        assert acked > 0
        assert read_back > 0
        assert _value(metrics, "metadata_publish_errors_total", stage="acked") == 0
        assert _value(metrics, "metadata_publish_errors_total", stage="read_back") == 0

    async def test_read_back_timeout_is_a_read_back_error(
        self, kafka, meta_topic, publishers, tmp_path
    ):
        """An event acked but never read back counts as a read_back error, not as acked."""
        metrics = Metrics()
        store = RemoteSegmentStore(tmp_path)
        try:
            tailer = MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=meta_topic,
            )
            tailer.track({0})  # tracked, never run
            publisher = await publishers(read_back=tailer, read_back_timeout_s=0.5, metrics=metrics)
            with pytest.raises(MetadataReadBackTimeoutError):
                await publisher.publish_and_wait(copy_started(user_partition(0), 0, 1))
        finally:
            store.close()
        assert _value(metrics, "metadata_publish_errors_total", stage="read_back") == 1
        assert _value(metrics, "metadata_publish_errors_total", stage="acked") == 0
        assert _value(metrics, "metadata_publish_seconds_count", stage="acked") == 1
        assert _value(metrics, "metadata_publish_seconds_count", stage="read_back") == 0

    async def test_store_lag_follows_the_end_offsets(self, kafka, meta_topic, publishers, tmp_path):
        """Records published before the tailer runs are applied and the lag is 0; records
        published after its run ended show up as lag from the consumer's fetches alone."""
        publisher = await publishers()
        tp = user_partition(2)
        for start in range(0, 40, 10):
            await publisher.publish(copy_started(tp, start, start + 9))
        store = RemoteSegmentStore(tmp_path)
        stopping = asyncio.Event()
        try:
            async with MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=meta_topic,
            ) as tailer:
                tailer.track({2, 3})
                assert tailer.lag() == 0  # nothing assigned yet: unknown counts 0
                task = asyncio.create_task(tailer.run(stopping))
                async with asyncio.timeout(60):
                    await tailer.wait_caught_up()
                assert tailer.consumed_offset(2) == 3
                assert tailer.lag() == 0
                stopping.set()
                await task  # the consumer stays assigned and keeps fetching in the background
                for start in range(40, 70, 10):
                    await publisher.publish(copy_started(tp, start, start + 9))
                deadline = time.monotonic() + 60
                while tailer.lag() == 0:  # polled: the fetch that reports the end has no event
                    assert time.monotonic() < deadline, "no lag after 60 s"
                    await asyncio.sleep(0.1)
                # aiokafka stops prefetching while fetched records wait unconsumed, so the end
                # it saw may be short of the last one: between 1 and 3 records behind
                assert 1 <= tailer.lag() <= 3
                assert tailer.consumed_offset(2) == 3  # not applied: that is the lag
        finally:
            store.close()
