"""MetadataPublisher: writes KIP-405 events to ``__remote_log_metadata`` exactly as Kafka's
``TopicBasedRemoteLogMetadataManager`` (``ProducerManager``) does, so brokers and Kafka's tools read
them: an idempotent producer with ``acks=all``, a null key, the value from ``serde.encode`` and the
partition from ``metadata_partition`` (kafka-kip405-internals.md §1.1, §2.2, §2.5).

``ensure_topic`` creates the topic with Kafka 4.3's configs (retention, delete policy, no tiering,
``min.insync.replicas``) when it is missing and refuses a topic whose
partition count differs from the configured one. ``publish_and_wait`` waits, like TBRLMM's
``waitTillConsumptionCatchesUp``, until the tailer has applied the event to the local store, so a
caller that goes on to read the store sees its own write.

Failures are MetadataPublishError (retriable): the broker refused or timed out, the producer died,
or the publisher was closed while a publish waited. A dying producer fails every waiting publish;
the next publish starts a new producer (``metadata_producer_restarted``), so a Kafka outage ends
in retries, never in a publisher that stays dead.
With ``metrics``, ``metadata_publish_seconds{stage}`` times each publish until acked and (for
``publish_and_wait``) until read back, and ``metadata_publish_errors_total{stage}`` counts failures.
This module does the I/O of publishing only; it never reads the topic (tailer.py does).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import time
from collections.abc import Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Protocol, Self, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from sidecar.errors import MetadataPublishError
from sidecar.metadata.errors import (
    MetadataNotTrackedError,
    MetadataReadBackTimeoutError,
    MetadataTopicMismatchError,
)
from sidecar.metadata.events import PublishableMetadata
from sidecar.metadata.partitioner import metadata_partition
from sidecar.metadata.serde import encode
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics

__all__ = ["MetadataPublisher", "ReadBack", "client_id"]

log = get_logger(__name__)

#: ``TopicBasedRemoteLogMetadataManagerConfig.REMOTE_LOG_METADATA_TOPIC_NAME``
DEFAULT_METADATA_TOPIC: Final = "__remote_log_metadata"
#: Kafka's ``remote.log.metadata.consume.wait.ms`` default
_DEFAULT_READ_BACK_TIMEOUT_S: Final = 120.0
_TOPIC_ALREADY_EXISTS: Final = 36  # TOPIC_ALREADY_EXISTS error code

_T = TypeVar("_T")


def client_id(broker_id: int, role: str) -> str:
    """Kafka's client id for the metadata manager's clients:
    ``__remote_log_metadata_client_<broker id>_<producer|consumer|admin>``."""
    return f"__remote_log_metadata_client_{broker_id}_{role}"


class ReadBack(Protocol):
    """What ``publish_and_wait`` needs from the tailer (MetadataTailer implements it)."""

    def is_tracked(self, metadata_partition: int) -> bool:
        """Whether the tailer reads ``metadata_partition``."""
        ...

    async def wait_for_offset(self, metadata_partition: int, offset: int) -> None:
        """Return once ``offset`` of ``metadata_partition`` is applied to the store; raise
        MetadataPublishError if that can no longer happen (the tailer stopped)."""
        ...


class _State(enum.Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


class MetadataPublisher:
    """Publishes remote log metadata events; an async context manager (``start``/``aclose``).

    ``client_kwargs`` go to every aiokafka client (admin, producer): security settings such as
    ``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``, ``ssl_context``. The
    producer settings Kafka forces (``acks``, idempotence, client id) cannot be overridden.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | Sequence[str],
        broker_id: int,
        topic: str = DEFAULT_METADATA_TOPIC,
        num_partitions: int = 50,
        replication_factor: int = 3,
        retention_ms: int = -1,
        min_isr: int = 2,
        client_kwargs: Mapping[str, Any] | None = None,
        producer_kwargs: Mapping[str, Any] | None = None,
        read_back: ReadBack | None = None,
        read_back_timeout_s: float = _DEFAULT_READ_BACK_TIMEOUT_S,
        metrics: Metrics | None = None,
    ) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, not {num_partitions}")
        if replication_factor < 1:
            raise ValueError(f"replication_factor must be >= 1, not {replication_factor}")
        if retention_ms != -1 and retention_ms <= 0:
            raise ValueError(f"retention_ms must be -1 or > 0, not {retention_ms}")
        if min_isr < 1:
            raise ValueError(f"min_isr must be >= 1, not {min_isr}")
        self.topic = topic
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.retention_ms = retention_ms
        #: the topic's min.insync.replicas at creation: Kafka 4.3's manager sets it (default 2),
        #: so an acks=all event is acknowledged only once two replicas hold it; at most the
        #: replication factor (one broker: 1), as the broker itself would count it
        self.min_isr = min(min_isr, replication_factor)
        self.broker_id = broker_id
        self._bootstrap = (
            bootstrap_servers if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
        )
        self._client_kwargs = dict(client_kwargs or {})
        #: producer-only settings (linger.ms, batch.size, ...), never the forced ones
        self._producer_kwargs = dict(producer_kwargs or {})
        self._read_back = read_back
        self._read_back_timeout_s = read_back_timeout_s
        self._metrics = metrics
        self._state = _State.NEW
        self._producer: AIOKafkaProducer | None = None
        #: resolved (with the cause) when the producer dies or the publisher closes
        self._dead: asyncio.Future[BaseException] | None = None
        self._restarting = asyncio.Lock()
        #: producers started after the first one died
        self.restarts = 0

    # --- lifecycle

    async def start(self) -> None:
        """Start the idempotent producer (it fetches a producer id from the cluster)."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"MetadataPublisher cannot start: it is {self._state.value}")
        self._state = _State.STARTED
        await self._start_producer()

    async def _start_producer(self) -> None:
        self._dead = asyncio.get_running_loop().create_future()
        producer = AIOKafkaProducer(
            **self._client_kwargs,
            bootstrap_servers=self._bootstrap,
            client_id=client_id(self.broker_id, "producer"),
            acks="all",
            enable_idempotence=True,
        )
        try:
            await producer.start()
        except BaseException as exc:
            # A failed or cancelled start leaves no live producer: mark it dead so that the next
            # publish starts another instead of finding neither a producer nor a reason to restart.
            self._mark_dead(exc)
            await producer.stop()
            if isinstance(exc, KafkaError):
                raise MetadataPublishError(f"cannot start the metadata producer: {exc!r}") from exc
            raise
        self._producer = producer
        self._watch_sender(producer)

    async def _restart_producer(self) -> None:
        """Replace a producer whose sender died (waiting publishes have already failed)."""
        async with self._restarting:
            dead = self._dead
            if self._state is not _State.STARTED or dead is None or not dead.done():
                return  # closed meanwhile, or another publish restarted it
            old, self._producer = self._producer, None
            if old is not None:
                try:
                    await old.stop()
                except KafkaError as exc:  # a dead producer may not stop cleanly
                    log.debug("metadata_producer_stop_failed", error=repr(exc))
            await self._start_producer()
            self.restarts += 1
            log.info("metadata_producer_restarted", topic=self.topic, cause=repr(dead.result()))

    def _watch_sender(self, producer: AIOKafkaProducer) -> None:
        """Fail every waiting publish when the producer's sender task dies (aiokafka fails the
        pending sends itself; this also fails publishes waiting for their read-back)."""
        sender = getattr(getattr(producer, "_sender", None), "sender_task", None)
        dead = self._dead
        if isinstance(sender, asyncio.Task) and dead is not None:
            sender.add_done_callback(functools.partial(self._on_sender_done, dead))

    def _on_sender_done(self, dead: asyncio.Future[BaseException], task: asyncio.Task[Any]) -> None:
        if dead.done():
            return  # this producer was already replaced or closed
        if task.cancelled():
            cause: BaseException = MetadataPublishError("the metadata producer was stopped")
        else:
            cause = task.exception() or MetadataPublishError("the metadata producer stopped")
        if self._state is _State.STARTED:
            log.error("metadata_producer_died", topic=self.topic, error=repr(cause))
        dead.set_result(cause)

    def _mark_dead(self, cause: BaseException) -> None:
        if self._dead is not None and not self._dead.done():
            self._dead.set_result(cause)

    async def aclose(self) -> None:
        """Flush and stop the producer; idempotent. Waiting publishes fail."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._mark_dead(MetadataPublishError("the metadata publisher was closed"))
        if self._producer is not None:
            await self._producer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- the topic

    def _admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(
            **self._client_kwargs,
            bootstrap_servers=self._bootstrap,
            client_id=client_id(self.broker_id, "admin"),
        )

    async def ensure_topic(self, *, timeout_s: float = 60.0) -> None:
        """Create the metadata topic if it is missing, with Kafka's configs, and wait until every
        partition has a leader. TOPIC_ALREADY_EXISTS counts as success; an existing topic with
        another partition count raises MetadataTopicMismatchError (TBRLMM refuses it too)."""
        admin = self._admin()
        try:
            async with asyncio.timeout(timeout_s):
                await admin.start()
                await self._create_topic(admin)
                await self._wait_for_leaders(admin)
        except TimeoutError as exc:
            raise MetadataPublishError(
                f"metadata topic {self.topic!r} is not ready after {timeout_s} s"
            ) from exc
        except KafkaError as exc:
            raise MetadataPublishError(
                f"cannot create or describe the metadata topic {self.topic!r}: {exc!r}"
            ) from exc
        finally:
            await admin.close()

    async def _create_topic(self, admin: AIOKafkaAdminClient) -> None:
        # Create first: describing a missing topic through aiokafka's admin client sends a
        # Metadata request that lets the broker auto-create it with the broker's defaults.
        topic = NewTopic(
            self.topic,
            self.num_partitions,
            self.replication_factor,
            topic_configs={
                "retention.ms": str(self.retention_ms),
                "cleanup.policy": "delete",
                "remote.storage.enable": "false",
                "min.insync.replicas": str(self.min_isr),
            },
        )
        response = await admin.create_topics([topic])
        for name, code, *rest in response.topic_errors:
            if name != self.topic or code in (0, _TOPIC_ALREADY_EXISTS):
                continue
            message = rest[0] if rest else None
            raise MetadataPublishError(
                f"cannot create the metadata topic {self.topic!r}: error code {code}"
                + (f" ({message})" if message else "")
            )
        if any(code == 0 for name, code, *_ in response.topic_errors if name == self.topic):
            log.info(
                "metadata_topic_created",
                topic=self.topic,
                partitions=self.num_partitions,
                replication_factor=self.replication_factor,
            )

    async def _wait_for_leaders(self, admin: AIOKafkaAdminClient) -> None:
        # The admin protocol gives no event for "leaders elected": poll with a short backoff
        # (the caller's deadline bounds it).
        backoff = 0.05
        while True:
            described = await admin.describe_topics([self.topic])
            info = next((t for t in described if t.get("topic") == self.topic), None)
            partitions = [] if info is None else info.get("partitions", [])
            if info is not None and info.get("error_code", 0) == 0 and partitions:
                if len(partitions) != self.num_partitions:
                    raise MetadataTopicMismatchError(
                        f"the metadata topic {self.topic!r} has {len(partitions)} partitions but"
                        f" {self.num_partitions} are configured (remote.log.metadata.topic."
                        "num.partitions must match the topic: it picks each event's partition)"
                    )
                if all(p.get("leader", -1) >= 0 for p in partitions):
                    return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    # --- publishing

    def partition_for(self, event: PublishableMetadata) -> int:
        """The metadata-topic partition ``event`` goes to."""
        return metadata_partition(event.topic_id_partition, self.num_partitions)

    async def publish(self, event: PublishableMetadata) -> tuple[int, int]:
        """Publish ``event``; return its (metadata partition, offset) once all in-sync replicas
        have it. Raises InvalidMetadataEventError for an event that must never be published."""
        started = time.perf_counter()
        try:
            partition, offset = await self._send(event)
        except Exception:
            self._count_error("acked")
            raise
        self._observe("acked", started)
        return partition, offset

    async def _send(self, event: PublishableMetadata) -> tuple[int, int]:
        producer = await self._live_producer()
        value = encode(event)
        partition = self.partition_for(event)
        try:
            metadata = await self._unless_dead(
                producer.send_and_wait(self.topic, value=value, key=None, partition=partition)
            )
        except KafkaError as exc:
            raise MetadataPublishError(
                f"publishing to {self.topic}-{partition} failed: {exc!r}"
            ) from exc
        offset = int(metadata.offset)
        log.debug(
            "metadata_published",
            record_type=type(event).__name__,
            state=event.state.name,
            metadata_partition=partition,
            offset=offset,
        )
        return partition, offset

    async def publish_and_wait(
        self, event: PublishableMetadata, *, timeout_s: float | None = None
    ) -> tuple[int, int]:
        """Publish ``event`` and wait until the tailer has applied it to the store (at most
        ``timeout_s``, default the read-back timeout given at construction).

        Raises MetadataNotTrackedError, before publishing, when the tailer does not read the
        event's metadata partition, and MetadataReadBackTimeoutError when the event was published
        but not read back in time.
        """
        read_back = self._read_back
        if read_back is None:
            raise RuntimeError("publish_and_wait needs a read_back (the metadata tailer)")
        partition = self.partition_for(event)
        if not read_back.is_tracked(partition):
            raise MetadataNotTrackedError(
                f"the metadata tailer does not read {self.topic}-{partition}, so this event's"
                " read-back could never be confirmed; track the partition first"
            )
        timeout = self._read_back_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        measured = time.perf_counter()
        partition, offset = await self.publish(event)
        remaining = max(0.0, timeout - (time.monotonic() - started))
        try:
            async with asyncio.timeout(remaining):
                await self._unless_dead(read_back.wait_for_offset(partition, offset))
        except TimeoutError as exc:
            self._count_error("read_back")
            raise MetadataReadBackTimeoutError(
                f"{self.topic}-{partition} offset {offset} was published but not read back"
                f" within {timeout} s"
            ) from exc
        except Exception:
            self._count_error("read_back")
            raise
        self._observe("read_back", measured)
        return partition, offset

    def _observe(self, stage: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.metadata_publish_seconds.labels(stage).observe(
                time.perf_counter() - started
            )

    def _count_error(self, stage: str) -> None:
        if self._metrics is not None:
            self._metrics.metadata_publish_errors.labels(stage).inc()

    async def _live_producer(self) -> AIOKafkaProducer:
        if self._state is not _State.STARTED:
            raise MetadataPublishError(f"the metadata publisher is {self._state.value}")
        if self._dead is None or self._dead.done() or self._producer is None:
            await self._restart_producer()
        if self._state is not _State.STARTED or self._producer is None:
            raise MetadataPublishError(f"the metadata publisher is {self._state.value}")
        return self._producer

    async def _unless_dead(self, awaitable: Awaitable[_T]) -> _T:
        """Await ``awaitable`` unless the producer dies or the publisher closes first."""
        dead = self._dead
        if dead is None:
            raise MetadataPublishError("the metadata publisher is not started")
        if dead.done():
            raise MetadataPublishError("the metadata publisher is not running") from dead.result()
        task = asyncio.ensure_future(awaitable)
        try:
            either: set[asyncio.Future[Any]] = {task, dead}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        await asyncio.gather(task, return_exceptions=True)
        raise MetadataPublishError(
            "the metadata producer stopped while publishing"
        ) from dead.result()
