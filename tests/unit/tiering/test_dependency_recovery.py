"""What the tiering engine relies on during a Kafka outage: the metadata tailer retries Kafka
errors with backoff instead of ending the daemon, and the publisher replaces a producer that
died instead of failing every later publish. Kafka's clients are faked."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

import sidecar.metadata.publisher as publisher_module
from sidecar.metadata import tailer as tailer_module
from sidecar.metadata.publisher import MetadataPublisher
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.metadata.tailer import MetadataTailer


class FakeConsumer:
    """An assign()-mode consumer whose offset requests fail ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def position(self, partition: TopicPartition) -> int:
        return 0

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        return None

    def seek(self, partition: TopicPartition, offset: int) -> None:
        return None

    def pause(self, *partitions: TopicPartition) -> None:
        return None

    async def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[Any, int]:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("Connection refused")
        return dict.fromkeys(partitions, 0)

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[Any, int]:
        return dict.fromkeys(partitions, 0)

    async def getmany(self, **kwargs: Any) -> dict[Any, Any]:
        await asyncio.sleep(0.01)
        return {}

    async def stop(self) -> None:
        return None


class TestTailerOutage:
    """Kafka errors in the tailer are retried, reported and recovered from."""

    async def test_kafka_errors_are_retried_not_fatal(self, tmp_path):
        """Two failed offset requests mark the tailer unhealthy (with the error, the callback
        called); the third succeeds, the partition is caught up and the tailer healthy again."""
        errors: list[BaseException] = []
        with RemoteSegmentStore(tmp_path) as store:
            tailer = MetadataTailer(
                bootstrap_servers="127.0.0.1:1",
                store=store,
                broker_id=1,
                topic="__rlm",
                on_error=errors.append,
                retry_backoff_s=(0.01, 0.02),
            )
            consumer = FakeConsumer(failures=2)
            tailer._consumer = consumer  # type: ignore[assignment]
            tailer._state = tailer_module._State.STARTED
            tailer.track({0})
            stopping = asyncio.Event()
            running = asyncio.create_task(tailer.run(stopping))
            async with asyncio.timeout(5):
                while len(errors) < 1:
                    await asyncio.sleep(0.005)
                assert not tailer.healthy
                assert tailer.last_error is not None
                assert "Connection refused" in tailer.last_error
                await tailer.wait_caught_up({0})
                while not tailer.healthy:
                    await asyncio.sleep(0.005)
            stopping.set()
            await running
        assert len(errors) == 2
        assert consumer.calls == 3
        assert tailer.last_error is None

    async def test_sync_waits_for_what_was_published(self, tmp_path):
        """sync() returns at once for an empty partition and fails typed when Kafka errors."""
        with RemoteSegmentStore(tmp_path) as store:
            tailer = MetadataTailer(
                bootstrap_servers="127.0.0.1:1", store=store, broker_id=1, topic="__rlm"
            )
            tailer._consumer = FakeConsumer(failures=1)  # type: ignore[assignment]
            tailer._state = tailer_module._State.STARTED
            tailer.track({0})
            with pytest.raises(tailer_module.MetadataTailError, match="end offset"):
                await tailer.sync(0)
            await tailer.sync(0)  # empty partition: nothing to wait for


class FakeSender:
    def __init__(self) -> None:
        self.sender_task = asyncio.create_task(asyncio.Event().wait())


class FakeProducer:
    """Records sends; the test kills its sender task."""

    instances: ClassVar[list[FakeProducer]] = []

    def __init__(self, **kwargs: Any) -> None:
        self._sender = FakeSender()
        self.sent = 0
        FakeProducer.instances.append(self)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self._sender.sender_task.cancel()

    async def send_and_wait(self, topic: str, **kwargs: Any) -> Any:
        self.sent += 1

        class _Meta:
            offset = self.sent

        return _Meta()


class TestPublisherOutage:
    """A producer that died is replaced at the next publish."""

    async def test_dead_producer_is_restarted(self, monkeypatch):
        """After the sender task dies (a fatal producer error), the next publish starts a new
        producer and succeeds."""
        FakeProducer.instances.clear()
        monkeypatch.setattr(publisher_module, "AIOKafkaProducer", FakeProducer)
        publisher = MetadataPublisher(bootstrap_servers="127.0.0.1:1", broker_id=1)
        await publisher.start()
        event = _copy_started()
        assert await publisher.publish(event) == (publisher.partition_for(event), 1)
        first = FakeProducer.instances[0]
        first._sender.sender_task.cancel()  # what a fatal error in aiokafka's sender does
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert await publisher.publish(event) == (publisher.partition_for(event), 1)
        assert len(FakeProducer.instances) == 2
        assert publisher.restarts == 1
        await publisher.aclose()

    async def test_restart_failure_is_a_retriable_publish_error(self, monkeypatch):
        """When the new producer cannot start (Kafka still down), the publish fails with the
        retriable MetadataPublishError, and a later one tries again."""
        FakeProducer.instances.clear()
        monkeypatch.setattr(publisher_module, "AIOKafkaProducer", FakeProducer)
        publisher = MetadataPublisher(bootstrap_servers="127.0.0.1:1", broker_id=1)
        await publisher.start()
        FakeProducer.instances[0]._sender.sender_task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)

        async def refuse(self: FakeProducer) -> None:
            raise KafkaTimeoutError("no broker")

        monkeypatch.setattr(FakeProducer, "start", refuse)
        with pytest.raises(publisher_module.MetadataPublishError) as caught:
            await publisher.publish(_copy_started())
        assert caught.value.retriable
        monkeypatch.undo()
        monkeypatch.setattr(publisher_module, "AIOKafkaProducer", FakeProducer)
        await publisher.publish(_copy_started())
        await publisher.aclose()


def _copy_started() -> Any:
    import uuid

    from sidecar.metadata.events import RemoteLogSegmentId, SegmentMetadata, TopicIdPartition

    tip = TopicIdPartition(uuid.UUID(int=1), "orders", 0)
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(tip, uuid.UUID(int=2)),
        start_offset=0,
        end_offset=9,
        broker_id=1,
        max_timestamp_ms=1,
        event_timestamp_ms=1,
        segment_leader_epochs=((0, 0),),
        segment_size_in_bytes=100,
    )
