"""What retention asks Kafka beyond the cluster watcher's view: topic ids and log start offsets.

* Topic ids: aiokafka speaks Metadata only up to v5, which has no topic ids. Metadata v10 added
  them (KIP-516); this module sends Metadata v12 (flexible encoding; the version Kafka 3.x and
  4.x brokers all accept) with a null topic list (all topics), and reads names and ids only.
  Schema: ``clients/src/main/resources/common/message/Metadata{Request,Response}.json``.
* Topic id states: an all-topics Metadata answer silently leaves out the topics the principal
  may not Describe, so a missing id proves nothing. :meth:`RetentionKafka.topic_id_states`
  asks for the ids themselves (Metadata v12 with topic ids and null names); the broker answers
  ``UNKNOWN_TOPIC_ID`` only for an id it does not know, and ``TOPIC_AUTHORIZATION_FAILED`` for
  a topic we may not see (``KafkaApis.handleTopicMetadataRequest``: "topic IDs are not
  considered sensitive information").
* Cluster id: from the same Metadata answer (the prefix ownership marker records it).
* Log start offsets: ListOffsets with the EARLIEST timestamp (-2), which is the broker's
  ``logStartOffset`` (moved by DeleteRecords and by the broker's own retention).
* Topic configs: DescribeConfigs of named topics, the keys the cluster watcher reads (the
  ``sidecar scrub`` command checks the metadata topic's retention with it).

A failed call raises :class:`~sidecar.tiering.cluster.ClusterUnavailableError`; the retention
loop skips what needs the answer and tries again next pass.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Collection, Mapping, Sequence
from io import BytesIO
from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    AbstractType,
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

from sidecar.tiering._clients import AdminAndConsumer
from sidecar.tiering.cluster import (
    ClusterUnavailableError,
    TopicConfig,
    describe_topic_configs,
)

__all__ = ["RetentionKafka", "TopicIdState"]


class _Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka is untyped here
    """Kafka's ``uuid`` field: 16 raw bytes."""

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        return bytes(value)

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        value = data.read(16)
        if len(value) != 16:
            raise ValueError("Buffer underrun decoding a uuid")
        return value


class _MetadataResponseV12(Response):  # type: ignore[misc]  # aiokafka is untyped here
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _MetadataRequestV12(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped here
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 12
    RESPONSE_TYPE = _MetadataResponseV12
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _AllTopicIds(Request[_MetadataRequestV12]):  # type: ignore[misc]  # aiokafka is untyped here
    """Metadata v12 for every topic (a null topic array)."""

    API_KEY = 3

    def build(self, request_struct_class: type[_MetadataRequestV12]) -> _MetadataRequestV12:
        return request_struct_class(None, False, False, {})


class _TopicIds(Request[_MetadataRequestV12]):  # type: ignore[misc]  # aiokafka is untyped here
    """Metadata v12 for the given topic ids (null names)."""

    API_KEY = 3

    def __init__(self, topic_ids: Collection[uuid.UUID]) -> None:
        self._ids = list(topic_ids)

    def build(self, request_struct_class: type[_MetadataRequestV12]) -> _MetadataRequestV12:
        topics: list[tuple[bytes, None, dict[int, bytes]]] = [
            (i.bytes, None, {}) for i in self._ids
        ]
        return request_struct_class(topics, False, False, {})


#: Kafka error codes of a per-topic-id Metadata answer
UNKNOWN_TOPIC_ID = 100
TOPIC_AUTHORIZATION_FAILED = 29


class TopicIdState(enum.Enum):
    """What the broker says about one topic id asked for by id."""

    #: the topic exists (error code 0)
    PRESENT = "present"
    #: UNKNOWN_TOPIC_ID: the only answer that proves the topic is gone
    ABSENT = "absent"
    #: TOPIC_AUTHORIZATION_FAILED: we may not see it; it may well exist
    UNAUTHORIZED = "unauthorized"
    #: any other error, or the id missing from the answer
    UNKNOWN = "unknown"


def parse_topic_id_states(
    response: Any, asked: Collection[uuid.UUID]
) -> dict[uuid.UUID, TopicIdState]:
    """Topic id → state from a Metadata v12 answer to a by-id request; every id of ``asked``
    is in the result (UNKNOWN when the answer does not mention it)."""
    states = dict.fromkeys(asked, TopicIdState.UNKNOWN)
    for topic in response.to_object()["topics"]:
        raw = topic["topic_id"]
        if raw is None:
            continue
        topic_id = uuid.UUID(bytes=bytes(raw))
        if topic_id not in states:
            continue
        code = topic["error_code"]
        if code == 0:
            states[topic_id] = TopicIdState.PRESENT
        elif code == UNKNOWN_TOPIC_ID:
            states[topic_id] = TopicIdState.ABSENT
        elif code == TOPIC_AUTHORIZATION_FAILED:
            states[topic_id] = TopicIdState.UNAUTHORIZED
    return states


def parse_topic_ids(response: Any) -> dict[str, uuid.UUID]:
    """Topic name → id from a Metadata v12 response (topics with an error are left out)."""
    ids: dict[str, uuid.UUID] = {}
    for topic in response.to_object()["topics"]:
        if topic["error_code"] != 0 or topic["name"] is None:
            continue
        ids[topic["name"]] = uuid.UUID(bytes=bytes(topic["topic_id"]))
    return ids


def parse_topic_partitions(response: Any) -> dict[str, tuple[uuid.UUID, int]]:
    """Topic name → (id, partition count) from a Metadata v12 response."""
    topics: dict[str, tuple[uuid.UUID, int]] = {}
    for topic in response.to_object()["topics"]:
        if topic["error_code"] != 0 or topic["name"] is None:
            continue
        topics[topic["name"]] = (
            uuid.UUID(bytes=bytes(topic["topic_id"])),
            len(topic["partitions"]),
        )
    return topics


class RetentionKafka:
    """An admin client and a consumer of its own (the cluster watcher's are private)."""

    def __init__(
        self,
        *,
        bootstrap_servers: Sequence[str],
        request_timeout_ms: int = 30_000,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._pair = AdminAndConsumer(
            bootstrap_servers=bootstrap_servers,
            client_id="kafka-tiered-sidecar-retention",
            request_timeout_ms=request_timeout_ms,
            client_options=client_options,
        )

    async def _clients(self) -> tuple[Any, Any]:
        return await self._pair.get()

    async def aclose(self) -> None:
        """Close the clients; idempotent."""
        await self._pair.aclose()

    async def topic_ids(self) -> dict[str, uuid.UUID]:
        """Every topic of the cluster, name → id (Metadata v12)."""
        from aiokafka.errors import KafkaError

        try:
            admin, _ = await self._clients()
            node = admin._client.get_random_node()
            response = await admin._client.send(node, _AllTopicIds())
            return parse_topic_ids(response)
        except (KafkaError, OSError, TimeoutError, ValueError) as exc:
            await self.aclose()
            raise ClusterUnavailableError(f"Metadata v12 (topic ids) failed: {exc!r}") from exc

    async def topic_id_states(
        self, topic_ids: Collection[uuid.UUID]
    ) -> dict[uuid.UUID, TopicIdState]:
        """Ask the cluster about each topic id by id (Metadata v12); see :class:`TopicIdState`."""
        from aiokafka.errors import KafkaError

        if not topic_ids:
            return {}
        try:
            admin, _ = await self._clients()
            node = admin._client.get_random_node()
            response = await admin._client.send(node, _TopicIds(topic_ids))
            return parse_topic_id_states(response, topic_ids)
        except (KafkaError, OSError, TimeoutError, ValueError) as exc:
            await self.aclose()
            raise ClusterUnavailableError(f"Metadata v12 (by topic id) failed: {exc!r}") from exc

    async def cluster_id(self) -> str:
        """The cluster id the brokers report (Metadata v12)."""
        from aiokafka.errors import KafkaError

        try:
            admin, _ = await self._clients()
            node = admin._client.get_random_node()
            response = await admin._client.send(node, _TopicIds([]))
            cluster_id = response.to_object()["cluster_id"]
        except (KafkaError, OSError, TimeoutError, ValueError) as exc:
            await self.aclose()
            raise ClusterUnavailableError(f"Metadata v12 (cluster id) failed: {exc!r}") from exc
        if not cluster_id:
            raise ClusterUnavailableError("the brokers reported no cluster id")
        return str(cluster_id)

    async def topic_configs(self, topics: Collection[str]) -> dict[str, TopicConfig]:
        """DescribeConfigs of ``topics``; a topic that does not exist is left out."""
        from aiokafka.errors import KafkaError

        if not topics:
            return {}
        try:
            admin, _ = await self._clients()
            return await describe_topic_configs(admin, topics)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self.aclose()
            raise ClusterUnavailableError(f"DescribeConfigs failed: {exc!r}") from exc

    async def log_start_offsets(
        self, partitions: Collection[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """The broker's log start offset of each partition (ListOffsets EARLIEST)."""
        from aiokafka import TopicPartition
        from aiokafka.errors import KafkaError

        if not partitions:
            return {}
        try:
            _, consumer = await self._clients()
            tps = [TopicPartition(t, p) for t, p in partitions]
            starts = await consumer.beginning_offsets(tps)
        except (KafkaError, OSError, TimeoutError) as exc:
            await self.aclose()
            raise ClusterUnavailableError(f"ListOffsets (earliest) failed: {exc!r}") from exc
        return {(tp.topic, tp.partition): int(offset) for tp, offset in starts.items()}

    async def topic_partitions(self) -> dict[str, tuple[uuid.UUID, int]]:
        """Every topic of the cluster, name → (id, partition count) (Metadata v12)."""
        from aiokafka.errors import KafkaError

        try:
            admin, _ = await self._clients()
            node = admin._client.get_random_node()
            response = await admin._client.send(node, _AllTopicIds())
            return parse_topic_partitions(response)
        except (KafkaError, OSError, TimeoutError, ValueError) as exc:
            await self.aclose()
            raise ClusterUnavailableError(f"Metadata v12 (topics) failed: {exc!r}") from exc
