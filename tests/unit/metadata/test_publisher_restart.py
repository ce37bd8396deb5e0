"""MetadataPublisher after a producer restart was interrupted; Kafka's producer is faked."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, ClassVar

import pytest

import sidecar.metadata.publisher as publisher_module
from sidecar.metadata.events import RemoteLogSegmentId, SegmentMetadata, TopicIdPartition
from sidecar.metadata.publisher import MetadataPublisher


class _Sender:
    def __init__(self) -> None:
        self.sender_task = asyncio.create_task(asyncio.Event().wait())


class BlockingStartProducer:
    """A producer whose ``start`` waits for ``release`` when ``block`` is set."""

    instances: ClassVar[list[BlockingStartProducer]] = []
    block: ClassVar[bool] = False
    starting: ClassVar[asyncio.Event]
    release: ClassVar[asyncio.Event]

    def __init__(self, **kwargs: Any) -> None:
        self._sender = _Sender()
        self.stopped = False
        self.sent = 0
        BlockingStartProducer.instances.append(self)

    async def start(self) -> None:
        if BlockingStartProducer.block:
            BlockingStartProducer.starting.set()
            await BlockingStartProducer.release.wait()

    async def stop(self) -> None:
        self.stopped = True
        self._sender.sender_task.cancel()

    async def send_and_wait(self, topic: str, **kwargs: Any) -> Any:
        self.sent += 1

        class _Meta:
            offset = self.sent

        return _Meta()


def _event() -> SegmentMetadata:
    tp = TopicIdPartition(uuid.UUID(int=1), "orders", 0)
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(tp, uuid.UUID(int=2)),
        start_offset=0,
        end_offset=9,
        broker_id=1,
        max_timestamp_ms=1,
        event_timestamp_ms=1,
        segment_leader_epochs=((0, 0),),
        segment_size_in_bytes=100,
    )


class TestInterruptedRestart:
    """A publish cancelled while it restarts the producer does not leave the publisher dead."""

    @pytest.fixture(autouse=True)
    def _fake_producer(self, monkeypatch: pytest.MonkeyPatch) -> None:
        BlockingStartProducer.instances.clear()
        BlockingStartProducer.block = False
        BlockingStartProducer.starting = asyncio.Event()
        BlockingStartProducer.release = asyncio.Event()
        monkeypatch.setattr(publisher_module, "AIOKafkaProducer", BlockingStartProducer)

    async def test_next_publish_restarts_after_a_cancelled_restart(self) -> None:
        """The producer being started is stopped and the next publish starts a new one."""
        publisher = MetadataPublisher(bootstrap_servers="127.0.0.1:1", broker_id=1)
        await publisher.start()
        first = BlockingStartProducer.instances[0]
        first._sender.sender_task.cancel()  # the sender died: the next publish restarts
        await asyncio.gather(first._sender.sender_task, return_exceptions=True)

        BlockingStartProducer.block = True
        interrupted = asyncio.create_task(publisher.publish(_event()))
        await BlockingStartProducer.starting.wait()
        interrupted.cancel()  # e.g. the caller's deadline while Kafka is slow
        with pytest.raises(asyncio.CancelledError):
            await interrupted
        half_started = BlockingStartProducer.instances[1]
        assert half_started.stopped

        BlockingStartProducer.block = False
        event = _event()
        assert await publisher.publish(event) == (publisher.partition_for(event), 1)
        assert len(BlockingStartProducer.instances) == 3
        await publisher.aclose()
