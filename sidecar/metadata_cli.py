"""``sidecar metadata decode``: remote log metadata values as JSON lines, for operators.

Every field, state names, and topic and segment ids in Kafka's base64 form, from ``--hex`` values
or from the topic itself (read once to its current end, no consumer group).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from sidecar.config import SidecarConfig
from sidecar.errors import CommandError, ConfigError
from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.metadata.errors import MetadataFormatError
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.serde import decode

__all__ = ["decode_command", "event_to_json"]


def _tip(tip: TopicIdPartition) -> dict[str, Any]:
    return {
        "topic": tip.topic,
        "topic_id": encode_kafka_uuid(tip.topic_id),
        "partition": tip.partition,
    }


def _segment_id(segment_id: RemoteLogSegmentId) -> dict[str, Any]:
    return {**_tip(segment_id.topic_id_partition), "segment_id": encode_kafka_uuid(segment_id.id)}


def event_to_json(event: RemoteLogMetadata) -> dict[str, Any]:
    """A JSON-able dict of every field of a decoded record."""
    data: dict[str, Any] = {"type": type(event).__name__, "state": event.state.name}
    if isinstance(event, SegmentMetadata | SegmentMetadataSnapshot):
        if isinstance(event, SegmentMetadata):
            data.update(_segment_id(event.segment_id))
        else:
            data["segment_id"] = encode_kafka_uuid(event.segment_id)
        data.update(
            start_offset=event.start_offset,
            end_offset=event.end_offset,
            broker_id=event.broker_id,
            max_timestamp_ms=event.max_timestamp_ms,
            event_timestamp_ms=event.event_timestamp_ms,
            segment_leader_epochs={str(e): o for e, o in event.segment_leader_epochs},
            segment_size_in_bytes=event.segment_size_in_bytes,
            custom_metadata=None if event.custom_metadata is None else event.custom_metadata.hex(),
            txn_index_empty=event.txn_index_empty,
        )
    elif isinstance(event, SegmentMetadataUpdate):
        data.update(_segment_id(event.segment_id))
        data.update(
            broker_id=event.broker_id,
            event_timestamp_ms=event.event_timestamp_ms,
            custom_metadata=None if event.custom_metadata is None else event.custom_metadata.hex(),
        )
    elif isinstance(event, PartitionDeleteMetadata):
        data.update(_tip(event.topic_id_partition))
        data.update(broker_id=event.broker_id, event_timestamp_ms=event.event_timestamp_ms)
    return data


def _line(value: bytes, where: dict[str, Any]) -> tuple[str, bool]:
    """The JSON line for one value, and whether it decoded."""
    try:
        return json.dumps({**where, **event_to_json(decode(value))}), True
    except MetadataFormatError as exc:
        return json.dumps({**where, "error": str(exc), "value_hex": value.hex()}), False


async def _read_topic(
    config: SidecarConfig, topic: str, max_messages: int | None, out: TextIO
) -> tuple[int, int]:
    """Print the topic's values; how many were printed and how many of them did not decode."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from sidecar.config import kafka_client_options

    bootstrap = ",".join(config.kafka.bootstrap_servers)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        request_timeout_ms=config.kafka.request_timeout_ms,
        **kafka_client_options(config.kafka),
        **config.remote_log_metadata.consumer_kwargs(),
    )
    try:
        await consumer.start()
    except Exception as exc:
        await consumer.stop()  # closes what start() opened; no "Unclosed AIOKafkaConsumer"
        raise CommandError(
            f"cannot read {topic} from Kafka at {bootstrap}: {exc or type(exc).__name__};"
            " check the address and the [kafka] security settings"
        ) from exc
    try:
        ids = consumer.partitions_for_topic(topic)
        if not ids:
            await consumer._client.force_metadata_update()
            ids = consumer.partitions_for_topic(topic)
        if not ids:
            raise CommandError(f"topic {topic} does not exist on {bootstrap}")
        partitions = [TopicPartition(topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        printed = failed = 0
        remaining = [tp for tp in partitions if ends[tp] > 0]
        while remaining and (max_messages is None or printed < max_messages):
            batches = await consumer.getmany(*remaining, timeout_ms=5000)
            for tp, records in batches.items():
                for record in records:
                    if record.value is None or (
                        max_messages is not None and printed >= max_messages
                    ):
                        continue
                    where = {"partition_of_topic": tp.partition, "offset": record.offset}
                    line, ok = _line(record.value, where)
                    print(line, file=out)
                    printed += 1
                    failed += 0 if ok else 1
            remaining = [tp for tp in remaining if await consumer.position(tp) < ends[tp]]
        return printed, failed
    finally:
        await consumer.stop()


def decode_command(
    *,
    hex_values: Sequence[str] | None,
    config: SidecarConfig | None,
    topic: str | None,
    max_messages: int | None,
    out: TextIO,
    err: TextIO | None = None,
) -> int:
    """Decode values given in hex, or read the topic of ``config``'s cluster (its bootstrap
    servers and security settings); print one JSON object per record, an undecodable one as
    an object with ``error``, so that lines and records stay one to one. When any did not
    decode, a ``sidecar: error:`` line on ``err`` says how many, and the status is 1."""
    if hex_values:
        failed = 0
        for text in hex_values:
            try:
                value = bytes.fromhex(text.strip())
            except ValueError:
                print(json.dumps({"error": "not hex", "input": text}), file=out)
                failed += 1
                continue
            line, ok = _line(value, {})
            failed += 0 if ok else 1
            print(line, file=out)
        total = len(hex_values)
    else:
        if config is None:
            raise ConfigError("give --hex VALUE, --bootstrap-server HOST:PORT or -c FILE")
        name = topic or config.remote_log_metadata.topic
        total, failed = asyncio.run(_read_topic(config, name, max_messages, out))
    if failed:
        print(
            f"sidecar: error: {failed} of {total} values did not decode (their lines carry"
            ' "error")',
            file=err or sys.stderr,
        )
        return 1
    return 0
