"""The metadata topic against the real broker: MetadataPublisher creates and writes it as Kafka's
TopicBasedRemoteLogMetadataManager does, MetadataTailer reads it back into a RemoteSegmentStore
(and resumes from the stored offsets after a restart), a bad record is skipped and counted, and
Kafka's own console consumer with RemoteLogMetadataFormatter decodes what we published; a scoped
tailer applies only the user partitions it wants."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from sidecar.errors import MetadataPublishError
from sidecar.metadata import (
    MetadataNotTrackedError,
    MetadataPublisher,
    MetadataReadBackTimeoutError,
    MetadataStoreError,
    MetadataTailer,
    MetadataTopicMismatchError,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemoteSegmentStore,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
    metadata_partition,
)
from tests.helpers import create_topic

pytestmark = pytest.mark.integration

NUM_PARTITIONS = 5
BROKER_ID = 7
STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
FORMATTER = (
    "org.apache.kafka.server.log.remote.metadata.storage.serialization."
    "RemoteLogMetadataSerde$RemoteLogMetadataFormatter"
)


def user_partition(metadata_partition_wanted: int, topic: str = "orders") -> TopicIdPartition:
    """A user partition whose events go to ``metadata_partition_wanted`` of the metadata topic."""
    while True:
        tp = TopicIdPartition(uuid.uuid4(), topic, 0)
        if metadata_partition(tp, NUM_PARTITIONS) == metadata_partition_wanted:
            return tp


def copy_started(tp: TopicIdPartition, start: int, end: int, epoch: int = 0) -> SegmentMetadata:
    """A COPY_SEGMENT_STARTED event for a new segment id."""
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
        start_offset=start,
        end_offset=end,
        broker_id=BROKER_ID,
        max_timestamp_ms=1_700_000_000_000,
        event_timestamp_ms=1_700_000_000_001,
        segment_leader_epochs=((epoch, start),),
        segment_size_in_bytes=4096,
    )


def update(event: SegmentMetadata, state: RemoteLogSegmentState) -> SegmentMetadataUpdate:
    """An update of ``event``'s segment to ``state``."""
    return SegmentMetadataUpdate(
        segment_id=event.segment_id,
        broker_id=BROKER_ID,
        event_timestamp_ms=1_700_000_000_002,
        state=state,
    )


def kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString()``."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


class SignallingReadBack:
    """The tailer's read-back, with an event set once a publish waits for its read-back."""

    def __init__(self, tailer: MetadataTailer) -> None:
        self.tailer = tailer
        self.waiting = asyncio.Event()

    def is_tracked(self, partition: int) -> bool:
        return self.tailer.is_tracked(partition)

    async def wait_for_offset(self, partition: int, offset: int) -> None:
        self.waiting.set()
        await self.tailer.wait_for_offset(partition, offset)


@pytest.fixture
def metadata_topic_name(topic_name: str) -> str:
    """A metadata topic name unique to this test."""
    return f"__remote_log_metadata_{topic_name}"


@pytest.fixture
async def metadata_topic(kafka, metadata_topic_name: str) -> str:
    """The metadata topic, created by ensure_topic (before any consumer asks for it: a Metadata
    request for a missing topic would let the broker auto-create it with its defaults)."""
    await _create_metadata_topic(kafka, metadata_topic_name)
    return metadata_topic_name


async def _create_metadata_topic(kafka, topic: str) -> None:
    """``topic`` created as the sidecar creates it (5 partitions, replication factor 1)."""
    publisher = MetadataPublisher(
        bootstrap_servers=kafka.bootstrap_servers,
        broker_id=BROKER_ID,
        topic=topic,
        num_partitions=NUM_PARTITIONS,
        replication_factor=1,
    )
    await publisher.ensure_topic()


@pytest.fixture
async def publisher_factory(kafka, metadata_topic_name):
    """Builds started publishers on ``metadata_topic`` (5 partitions, replication factor 1)."""
    publishers: list[MetadataPublisher] = []

    async def build(**kwargs) -> MetadataPublisher:
        kwargs = {
            "bootstrap_servers": kafka.bootstrap_servers,
            "broker_id": BROKER_ID,
            "topic": metadata_topic_name,
            "num_partitions": NUM_PARTITIONS,
            "replication_factor": 1,
            **kwargs,
        }
        publisher = MetadataPublisher(**kwargs)
        publishers.append(publisher)
        await publisher.start()
        return publisher

    yield build
    for publisher in publishers:
        await publisher.aclose()


async def _until(condition, what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` (state the tailer's own loop changes) until it holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not {what} within {timeout} s"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def tailing(
    kafka, metadata_topic: str, state_dir: Path, partitions: set[int], **kwargs
) -> AsyncIterator[tuple[MetadataTailer, RemoteSegmentStore]]:
    """A store in ``state_dir`` and a tailer of ``partitions`` running into it."""
    store = RemoteSegmentStore(state_dir)
    stopping = asyncio.Event()
    try:
        async with MetadataTailer(
            bootstrap_servers=kafka.bootstrap_servers,
            store=store,
            broker_id=BROKER_ID,
            topic=metadata_topic,
            **kwargs,
        ) as tailer:
            tailer.track(partitions)
            task = asyncio.create_task(tailer.run(stopping), name="metadata tailer")
            try:
                yield tailer, store
            finally:
                stopping.set()
                await task
    finally:
        store.close()


class TestEnsureTopic:
    """ensure_topic creates the metadata topic like TBRLMM and checks its partition count."""

    async def test_creates_the_topic_with_kafkas_configs(
        self, kafka, metadata_topic_name, publisher_factory
    ):
        """A missing topic is created with the configured partitions and Kafka's topic configs."""
        publisher = await publisher_factory(retention_ms=86_400_000)
        await publisher.ensure_topic()
        await publisher.ensure_topic()  # already there: still fine
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([metadata_topic_name])
            (response,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, metadata_topic_name)]
            )
        finally:
            await admin.close()
        assert len(described["partitions"]) == NUM_PARTITIONS
        configs = {entry[0]: entry[1] for entry in response.resources[0][4]}
        assert configs["retention.ms"] == "86400000"
        assert configs["cleanup.policy"] == "delete"
        assert configs["remote.storage.enable"] == "false"
        assert configs["min.insync.replicas"] == "1"  # Kafka's 2, at most the one replica

    async def test_partition_count_mismatch_is_refused(
        self, kafka, metadata_topic_name, publisher_factory
    ):
        """An existing topic with another partition count raises MetadataTopicMismatchError."""
        await create_topic(kafka.bootstrap_servers, metadata_topic_name, partitions=3)
        publisher = await publisher_factory()
        with pytest.raises(MetadataTopicMismatchError, match="has 3 partitions but 5"):
            await publisher.ensure_topic()


class TestReadBack:
    """Published events come back through the tailer into the store, in order and durably."""

    async def test_segment_lifecycle(self, kafka, metadata_topic, publisher_factory, tmp_path):
        """STARTED, FINISHED, DELETE_STARTED, DELETE_FINISHED read back with the right states."""
        tps = [user_partition(0), user_partition(3), user_partition(3, topic="payments")]
        async with tailing(kafka, metadata_topic, tmp_path, {0, 3}) as (tailer, store):
            publisher = await publisher_factory(read_back=tailer)
            segments = [copy_started(tp, 0, 99) for tp in tps]
            for segment in segments:
                partition, _ = await publisher.publish_and_wait(segment)
                assert metadata_partition(segment.topic_id_partition, 5) == partition
                assert store.segment(segment.segment_id).state == STARTED  # read after write
                await publisher.publish_and_wait(update(segment, FINISHED))
                assert store.segment(segment.segment_id).state == FINISHED
                assert store.is_tiered(segment.topic_id_partition, 0, 99)
            doomed = segments[1]
            await publisher.publish_and_wait(update(doomed, DELETE_STARTED))
            assert [(doomed.segment_id, DELETE_STARTED)] == [
                (s.segment_id, s.state) for s in store.unfinished_deletes(doomed.topic_id_partition)
            ]
            await publisher.publish_and_wait(update(doomed, DELETE_FINISHED))
            assert store.segment(doomed.segment_id) is None
            for segment in (segments[0], segments[2]):
                (stored,) = store.segments(segment.topic_id_partition)
                assert (segment.segment_id, FINISHED) == (stored.segment_id, stored.state)
                assert store.remote_log_size(segment.topic_id_partition) == 4096
            assert tailer.undecodable_records == 0
            assert store.counters().applied == 8
            assert store.consumed_offsets() == {0: 1, 3: 5}

    async def test_a_metadata_partition_that_stops_moving_is_reported_stalled(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """The consumer gets nothing of a metadata partition that has more records (its leader
        unreachable from here; here its fetching is paused) and nothing raises: the progress
        check sees its end move past a position that does not, reports it stalled and counts
        it in the lag; once it is read again, resumed."""
        from sidecar.metadata.serde import encode

        tp = user_partition(1)
        later = [copy_started(tp, start, start + 9) for start in (10, 20, 30)]
        with structlog.testing.capture_logs() as logs:
            async with tailing(kafka, metadata_topic, tmp_path, {1}, progress_check_s=0.05) as (
                tailer,
                store,
            ):
                publisher = await publisher_factory(read_back=tailer)
                await publisher.publish_and_wait(copy_started(tp, 0, 9))
                consumer = tailer._consumer
                assert consumer is not None
                read = TopicPartition(metadata_topic, 1)
                consumer.pause(read)
                raw = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
                await raw.start()
                try:
                    for event in later:
                        await raw.send_and_wait(metadata_topic, value=encode(event), partition=1)
                finally:
                    await raw.stop()
                await _until(lambda: tailer.stalled == frozenset({1}), "stalled")
                assert tailer.lag() >= len(later)
                assert all(store.segment(e.segment_id) is None for e in later)
                consumer.resume(read)
                await _until(
                    lambda: (
                        not tailer.stalled
                        and all(store.segment(e.segment_id) is not None for e in later)
                    ),
                    "read again",
                )
                assert tailer.lag() == 0
        stalled = [e for e in logs if e["event"] == "metadata_partition_stalled"]
        assert [e["metadata_partition"] for e in stalled] == [1]
        assert stalled[0]["end_offset"] > stalled[0]["position"]
        assert [
            e["metadata_partition"] for e in logs if e["event"] == "metadata_partition_resumed"
        ] == [1]

    async def test_restart_resumes_without_rereading(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """A restarted tailer and store resume at the stored offsets: nothing is fetched again."""
        tp = user_partition(2)
        segment = copy_started(tp, 0, 49)
        async with tailing(kafka, metadata_topic, tmp_path, {2}) as (tailer, store):
            publisher = await publisher_factory(read_back=tailer)
            await publisher.publish_and_wait(segment)
            await publisher.publish_and_wait(update(segment, FINISHED))
            assert tailer.records_fetched == 2
        async with tailing(kafka, metadata_topic, tmp_path, {2}) as (tailer, store):
            async with asyncio.timeout(60):
                await tailer.wait_caught_up()
            assert tailer.caught_up(2)
            assert tailer.records_fetched == 0
            assert store.counters().applied == 2
            assert store.consumed_offsets() == {2: 1}
            assert store.segment(segment.segment_id).state == FINISHED
            publisher = await publisher_factory(read_back=tailer)
            await publisher.publish_and_wait(update(segment, DELETE_STARTED))
            assert tailer.records_fetched == 1
            assert store.counters().applied == 3

    async def test_new_store_catches_up_from_the_beginning(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """A store that never read a partition reads it from offset 0 and is then caught up."""
        tp = user_partition(4)
        segment = copy_started(tp, 100, 199)
        publisher = await publisher_factory()
        await publisher.publish(segment)
        await publisher.publish(update(segment, FINISHED))
        async with tailing(kafka, metadata_topic, tmp_path, {1, 4}) as (tailer, store):
            async with asyncio.timeout(60):
                await tailer.wait_caught_up()
            assert tailer.caught_up(1)  # empty partition: caught up at assignment
            assert store.segment(segment.segment_id).state == FINISHED
            assert store.consumed_offsets() == {4: 1}

    async def test_undecodable_record_is_skipped_and_counted(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """Garbage and a null value are skipped, counted and logged; later events still apply."""
        tp = user_partition(1)
        publisher = await publisher_factory()
        raw = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
        await raw.start()
        try:
            garbage = await raw.send_and_wait(metadata_topic, value=b"\x07not-kip-405", partition=1)
            null = await raw.send_and_wait(metadata_topic, key=b"k", value=None, partition=1)
        finally:
            await raw.stop()
        segment = copy_started(tp, 0, 9)
        seen: list[tuple[int, int]] = []
        try:
            with structlog.testing.capture_logs() as logs:
                async with tailing(
                    kafka,
                    metadata_topic,
                    tmp_path,
                    {1},
                    on_undecodable=lambda p, offset, error: seen.append((p, offset)),
                ) as (tailer, store):
                    publisher = await publisher_factory(read_back=tailer)
                    partition, offset = await publisher.publish_and_wait(segment)
                    assert store.segment(segment.segment_id).state == STARTED
                    assert store.consumed_offsets() == {1: 2}
                    assert store.counters().applied == 1
        finally:
            # the garbage is planted, not ours: out of reach of the suite's serde check
            admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
            await admin.start()
            try:
                await admin.delete_topics([metadata_topic])
            finally:
                await admin.close()
        assert [(1, garbage.offset), (1, null.offset)] == seen
        assert tailer.undecodable_records == 2
        assert (partition, offset) == (1, 2)
        bad = [e for e in logs if e["event"] == "metadata_record_undecodable"]
        assert [(1, garbage.offset), (1, null.offset)] == [
            (e["metadata_partition"], e["offset"]) for e in bad
        ]
        assert "frame version 7" in bad[0]["error"]

    async def test_an_event_kafka_would_drop_is_counted_by_reason(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """An update of a segment never started (Kafka's cache drops it as unknown) is
        skipped, logged and reported by reason; later events still apply."""
        from sidecar.metadata.serde import encode

        tp = user_partition(1)
        orphan = SegmentMetadataUpdate(
            segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
            broker_id=BROKER_ID,
            event_timestamp_ms=1,
            state=FINISHED,
        )
        raw = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
        await raw.start()
        try:
            await raw.send_and_wait(metadata_topic, value=encode(orphan), partition=1)
        finally:
            await raw.stop()
        segment = copy_started(tp, 0, 9)
        reasons: list[str] = []
        with structlog.testing.capture_logs() as logs:
            async with tailing(
                kafka, metadata_topic, tmp_path, {1}, on_rejected=reasons.append
            ) as (tailer, store):
                publisher = await publisher_factory(read_back=tailer)
                await publisher.publish_and_wait(segment)
                assert store.segment(segment.segment_id).state == STARTED
        assert reasons == ["unknown_segment"]
        assert tailer.rejected_events == 1
        dropped = [e for e in logs if e["event"] == "metadata_event_dropped"]
        assert [e["reason"] for e in dropped] == ["unknown_segment"]


class TestFailures:
    """Publishes that cannot be confirmed fail with typed, retriable errors."""

    async def test_untracked_partition_is_refused_before_publishing(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """publish_and_wait to a partition the tailer does not read raises and publishes nothing."""
        async with tailing(kafka, metadata_topic, tmp_path, {0}) as (tailer, _store):
            publisher = await publisher_factory(read_back=tailer)
            with pytest.raises(MetadataNotTrackedError):
                await publisher.publish_and_wait(copy_started(user_partition(2), 0, 1))
        assert not MetadataNotTrackedError.retriable

    async def test_read_back_timeout(self, kafka, metadata_topic, publisher_factory, tmp_path):
        """An event that the tailer does not read back in time raises a retriable timeout."""
        store = RemoteSegmentStore(tmp_path)
        try:
            tailer = MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=metadata_topic,
            )
            tailer.track({0})  # tracked, but never run
            publisher = await publisher_factory(read_back=tailer, read_back_timeout_s=0.5)
            with pytest.raises(MetadataReadBackTimeoutError) as caught:
                await publisher.publish_and_wait(copy_started(user_partition(0), 0, 1))
            assert caught.value.retriable
        finally:
            store.close()

    async def test_stopping_tailer_fails_waiters(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """Closing the tailer fails a publish waiting for its read-back."""
        store = RemoteSegmentStore(tmp_path)
        try:
            tailer = MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=metadata_topic,
            )
            await tailer.start()
            tailer.track({0})  # tracked, not run: the read-back waits
            read_back = SignallingReadBack(tailer)
            publisher = await publisher_factory(read_back=read_back)
            waiting = asyncio.create_task(
                publisher.publish_and_wait(copy_started(user_partition(0), 0, 1))
            )
            await read_back.waiting.wait()
            await tailer.aclose()
            with pytest.raises(MetadataPublishError, match="tailer"):
                await waiting
        finally:
            store.close()

    async def test_closing_the_publisher_fails_waiters(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """Closing the publisher fails its waiting publishes with MetadataPublishError."""
        store = RemoteSegmentStore(tmp_path)
        try:
            tailer = MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=metadata_topic,
            )
            tailer.track({0})  # never run: the read-back never comes
            read_back = SignallingReadBack(tailer)
            publisher = await publisher_factory(read_back=read_back)
            waiting = asyncio.create_task(
                publisher.publish_and_wait(copy_started(user_partition(0), 0, 1))
            )
            await read_back.waiting.wait()
            await publisher.aclose()
            with pytest.raises(MetadataPublishError, match="stopped while publishing"):
                await waiting
            with pytest.raises(MetadataPublishError):
                await publisher.publish(copy_started(user_partition(0), 0, 1))
        finally:
            store.close()

    async def test_store_ahead_of_the_topic_is_refused(self, kafka, metadata_topic, tmp_path):
        """A store that applied offsets the partition no longer has (a recreated topic) stops
        the tailer with MetadataStoreError instead of silently skipping new events."""
        with RemoteSegmentStore(tmp_path) as store:
            store.set_consumed({0: 41})
            async with MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=metadata_topic,
            ) as tailer:
                tailer.track({0})
                with pytest.raises(MetadataStoreError, match="recreated or truncated"):
                    await tailer.run(asyncio.Event())
                with pytest.raises(MetadataPublishError, match="tailer"):
                    await tailer.wait_for_offset(0, 42)

    async def test_topic_recreated_under_the_reading_stops_the_tailer(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """The metadata topic deleted and created again while the tailer reads it: the fetch
        position is past the new partition's end. The tailer stops with MetadataStoreError,
        as at assignment, instead of reading the new topic from its beginning and skipping
        its events at offsets the store counts as applied."""
        tp = user_partition(0)
        with RemoteSegmentStore(tmp_path) as store:
            async with MetadataTailer(
                bootstrap_servers=kafka.bootstrap_servers,
                store=store,
                broker_id=BROKER_ID,
                topic=metadata_topic,
            ) as tailer:
                tailer.track({0})
                run = asyncio.create_task(tailer.run(asyncio.Event()), name="metadata tailer")
                publisher = await publisher_factory(read_back=tailer)
                for i in range(3):
                    await publisher.publish_and_wait(copy_started(tp, 10 * i, 10 * i + 9))
                assert store.consumed_offsets() == {0: 2}
                await _recreate(kafka, metadata_topic)
                async with asyncio.timeout(120):
                    with pytest.raises(MetadataStoreError, match="recreated or truncated"):
                        await run

    async def test_records_deleted_before_they_were_read_are_skipped_and_counted(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        """Records the topic deleted (DeleteRecords, its retention) while the sidecar was
        away: the reading goes on after them, with an error logged and the records counted,
        not a reading stuck on an offset the partition no longer has."""
        tp = user_partition(0)
        publisher = await publisher_factory()
        segments = [copy_started(tp, 10 * i, 10 * i + 9) for i in range(3)]
        offsets = [(await publisher.publish(segment))[1] for segment in segments]
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.delete_records(
                {TopicPartition(metadata_topic, 0): RecordsToDelete(before_offset=offsets[2])}
            )
        finally:
            await admin.close()
        expired: list[int] = []
        with RemoteSegmentStore(tmp_path) as store:
            store.apply([segments[0]])
            store.set_consumed({0: offsets[0]})
        reading = tailing(kafka, metadata_topic, tmp_path, {0}, on_expired=expired.append)
        with structlog.testing.capture_logs() as logs:
            async with reading as (tailer, store):
                await _caught_up(tailer, 0)
                assert store.segment(segments[2].segment_id) is not None
                assert store.segment(segments[1].segment_id) is None
                assert store.consumed_offsets() == {0: offsets[2]}
                # the store lacks those events for good: the scrub will not trust it
                assert store.history_gaps() == {0: offsets[2]}
        assert expired == [offsets[2] - offsets[0] - 1]
        assert tailer.expired_records == expired[0]
        lines = [e for e in logs if e["event"] == "metadata_records_expired_unread"]
        assert [(e["from_offset"], e["to_offset"], e["log_level"]) for e in lines] == [
            (offsets[0] + 1, offsets[2] - 1, "error")
        ]
        # a new store reads from the partition's beginning: it never held the deleted events
        async with tailing(kafka, metadata_topic, tmp_path / "fresh", {0}) as (tailer, store):
            await _caught_up(tailer, 0)
            assert store.segment(segments[0].segment_id) is None
            assert store.history_gaps() == {0: offsets[2]}


async def _recreate(kafka, topic: str) -> None:
    """Delete ``topic`` and create it again as the sidecar does, once the broker has it gone."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        async with asyncio.timeout(60):
            while topic in await admin.list_topics():
                await asyncio.sleep(0.1)  # polled: the broker sends no event when it is gone
    finally:
        await admin.close()
    await _create_metadata_topic(kafka, topic)


class TestKafkaTools:
    """Kafka's own console consumer decodes what the publisher wrote."""

    async def test_console_consumer_with_kafkas_formatter(
        self, kafka, kafka_libs, metadata_topic, publisher_factory
    ):
        """RemoteLogMetadataFormatter prints our segment ids and states."""
        publisher = await publisher_factory()
        tp = user_partition(0)
        segment = copy_started(tp, 0, 99)
        events = [segment, update(segment, FINISHED), update(segment, DELETE_STARTED)]
        for event in events:
            await publisher.publish(event)
        result = await asyncio.to_thread(
            subprocess.run,
            [
                "java",
                "-Xmx256m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                f"{kafka_libs}/*",
                "org.apache.kafka.tools.consumer.ConsoleConsumer",
                "--bootstrap-server",
                kafka.bootstrap_servers,
                "--topic",
                metadata_topic,
                "--from-beginning",
                "--formatter",
                FORMATTER,
                "--max-messages",
                str(len(events)),
                "--timeout-ms",
                "30000",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        assert len(lines) == 3, result.stdout
        segment_id = kafka_uuid(segment.segment_id.id)
        states = ("COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED", "DELETE_SEGMENT_STARTED")
        for line, state in zip(lines, states, strict=True):
            assert segment_id in line, line
            assert state in line, line
        assert "RemoteLogSegmentMetadata{" in lines[0]
        assert "startOffset=0, endOffset=99" in lines[0]
        assert "RemoteLogSegmentMetadataUpdate{" in lines[1]


# --- scoped reading: a tailer applies only the events of the user partitions it wants, reads
# a metadata partition again from its beginning for a partition wanted later (its whole
# history, no event applied twice), reads everything for the coordinator, drops what it no
# longer wants, and keeps its scopes across a restart


def _scoped(kafka, metadata_topic: str, state_dir: Path):
    """``tailing`` with a scoped tailer that tracks nothing until asked (``want``)."""
    return tailing(
        kafka, metadata_topic, state_dir, set(), num_partitions=NUM_PARTITIONS, scoped=True
    )


async def _history(publisher, tp: TopicIdPartition, segments: int) -> list:
    """``segments`` copies of ``tp`` finished, the first one deleted again."""
    made = []
    for i in range(segments):
        segment = copy_started(tp, 100 * i, 100 * i + 99)
        await publisher.publish(segment)
        await publisher.publish(update(segment, FINISHED))
        made.append(segment)
    await publisher.publish(update(made[0], DELETE_STARTED))
    await publisher.publish(update(made[0], DELETE_FINISHED))
    return made


async def _caught_up(tailer: MetadataTailer, mp: int) -> None:
    async with asyncio.timeout(60):
        await tailer.wait_caught_up([mp])


class TestScopes:
    async def test_wanted_later_is_read_again_whole_then_narrowed_away(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        mine, later, other = (user_partition(1, topic=t) for t in ("a", "b", "c"))
        publisher = await publisher_factory()
        history = {tp: await _history(publisher, tp, 3) for tp in (mine, later, other)}
        async with _scoped(kafka, metadata_topic, tmp_path) as (tailer, store):
            tailer.want([mine])
            await _caught_up(tailer, 1)
            assert store.partitions() == [mine]
            assert [s.segment_id for s in store.segments(mine)] == [
                s.segment_id for s in history[mine][1:]
            ]
            assert tailer.filtered_records == 16  # the other two partitions' 8 events each

            # a partition wanted on a metadata partition already read: its whole history
            tailer.want([later])
            assert not tailer.caught_up(1)  # not until its history is read
            await _caught_up(tailer, 1)
            assert sorted(store.partitions(), key=lambda tp: tp.topic) == [mine, later]
            assert len(store.segments(later)) == 2
            assert tailer.rejected_events == 0  # nothing of ``mine`` applied twice
            assert store.counters().rejected == 0

            # new events of both apply once the re-read is done; ``other`` stays out (its event
            # goes first to the same metadata partition: read once ``extra`` is applied)
            extra = copy_started(later, 1000, 1099)
            await publisher.publish(copy_started(other, 1000, 1099))
            await publisher.publish(extra)
            async with asyncio.timeout(60):
                while store.segment(extra.segment_id) is None:
                    await asyncio.sleep(0.05)
            assert other not in store.partitions()

            tailer.narrow([later])
            async with asyncio.timeout(60):
                while mine in store.partitions():
                    await asyncio.sleep(0.05)
            assert store.scopes()[1] == frozenset({(later.topic_id, later.partition)})

        # the scope survives a restart: ``mine`` is not read back in
        async with _scoped(kafka, metadata_topic, tmp_path) as (tailer, store):
            tailer.want([later])
            await _caught_up(tailer, 1)
            await publisher.publish(copy_started(mine, 5000, 5099))
            marker = copy_started(later, 5000, 5099)
            await publisher.publish(marker)
            async with asyncio.timeout(60):
                while store.segment(marker.segment_id) is None:
                    await asyncio.sleep(0.05)
            assert mine not in store.partitions()
            assert tailer.rejected_events == 0

    async def test_everything_for_the_coordinator(
        self, kafka, metadata_topic, publisher_factory, tmp_path
    ):
        mine, other = user_partition(2, topic="a"), user_partition(2, topic="b")
        publisher = await publisher_factory()
        for tp in (mine, other):
            await _history(publisher, tp, 2)
        async with _scoped(kafka, metadata_topic, tmp_path) as (tailer, store):
            quiet = user_partition(3, topic="quiet")  # a metadata partition with no record
            tailer.want([mine, quiet])
            await _caught_up(tailer, 2)
            await _caught_up(tailer, 3)
            assert store.partitions() == [mine]
            tailer.want_everything()
            async with asyncio.timeout(60):
                await tailer.wait_caught_up()
            assert set(store.partitions()) == {mine, other}
            assert tailer.rejected_events == 0
            assert set(tailer.tracked) == set(range(NUM_PARTITIONS))
            assert all(scope is None for scope in store.scopes().values())
