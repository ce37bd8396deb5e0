"""Read the whole remote log metadata topic once, in the Spark driver's planner process.

An aiokafka consumer (no group, no commits) reads every partition of the topic from the beginning
to the end offsets seen at start, under ``read_committed`` as Kafka's ConsumerTask does, and the
values are decoded with the sidecar's serde (byte-compatible with Kafka's). The event loop lives
only inside :func:`read_metadata_events`; executors never import this module. A broker that
cannot be reached or a read that does not finish in time is a ``MetadataTailError`` naming the
topic and the bootstrap servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from sidecar.metadata.errors import MetadataFormatError, MetadataTailError
from sidecar.metadata.events import RemoteLogMetadata
from sidecar.metadata.serde import decode
from sidecar.spark._options import SparkOptionError

__all__ = ["read_metadata_events"]


def read_metadata_events(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = 120.0,
    client_options: Mapping[str, object] | None = None,
) -> tuple[list[RemoteLogMetadata], int]:
    """Every decodable event of ``topic`` in order per metadata partition, and the number of
    records that did not decode (skipped, as the sidecar's tailer skips them).
    ``client_options`` carries the security settings (SASL, TLS) as aiokafka arguments."""
    from aiokafka.errors import KafkaError

    where = f"the remote log metadata topic {topic!r} at kafka.bootstrap.servers={bootstrap}"
    try:
        return asyncio.run(
            asyncio.wait_for(_read(bootstrap, topic, client_options or {}), timeout_s)
        )
    except TimeoutError as exc:
        raise MetadataTailError(f"reading {where} did not finish in {timeout_s:g} s") from exc
    except KafkaError as exc:
        raise MetadataTailError(f"cannot read {where}: {type(exc).__name__}: {exc}") from exc


async def _read(
    bootstrap: str, topic: str, client_options: Mapping[str, object]
) -> tuple[list[RemoteLogMetadata], int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        **client_options,
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    try:
        await consumer.start()  # inside: a failed start still closes the client
        ids = consumer.partitions_for_topic(topic)
        if not ids:
            await consumer._client.force_metadata_update()
            ids = consumer.partitions_for_topic(topic)
        if not ids:
            raise SparkOptionError(
                f"the remote log metadata topic {topic!r} does not exist at the given"
                " kafka.bootstrap.servers (set metadata.topic, or metadata=manifests)"
            )
        partitions = [TopicPartition(topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        events: list[RemoteLogMetadata] = []
        undecodable = 0
        remaining = [tp for tp in partitions if ends[tp] > 0]
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=2000, max_records=100_000)
            for tp, records in batches.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        continue
                    if record.value is None:
                        undecodable += 1
                        continue
                    try:
                        events.append(decode(record.value))
                    except MetadataFormatError:
                        undecodable += 1
            remaining = [tp for tp in remaining if await consumer.position(tp) < ends[tp]]
        return events, undecodable
    finally:
        await consumer.stop()
