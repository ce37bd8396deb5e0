"""Helpers for the tiering e2e tests that run several sidecars, stop servers and inspect the
metadata topic: a sidecar config writer with every section the tests tune, a sidecar process
whose log is read continuously (so a quiet test never blocks its stdout pipe), a live reader of
the metadata topic that applies every record to a RemoteSegmentStore the way Kafka's
RemoteLogMetadataCache does, and bucket and probe helpers.

Waiting is always on something observable: a log event, a metadata record, an HTTP answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from sidecar.kafka.checkpoints import decode_kafka_uuid
from sidecar.kafka.logdir import PartitionScan, scan_partition_dir
from sidecar.metadata.events import (
    RemoteLogMetadata,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.serde import decode
from sidecar.metadata.store import RemoteSegmentStore, SegmentSpan
from sidecar.storage.ownership import marker_key
from tests.helpers import wait_for
from tests.kafka_serde import check_metadata_topic
from tests.sidecar_runner import Sidecar as Sidecar  # the e2e tests import it from here

# --- configuration


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def write_config(
    path: Path,
    *,
    state_dir: Path,
    log_dir: Path,
    bootstrap: str,
    s3: Any,
    metrics_port: int,
    metadata_topic: str,
    include_topics: Iterable[str],
    prefix: str,
    metadata_replication: int = 1,
    **sections: Mapping[str, Any],
) -> Path:
    """A sidecar TOML for the test stack; ``sections`` override or extend any section, e.g.
    ``tiering={"drain_timeout_s": 1}``. Credentials go through the environment."""
    config: dict[str, dict[str, Any]] = {
        "broker": {"log_dirs": [log_dir]},
        "kafka": {
            "bootstrap_servers": bootstrap.split(","),
            "metadata_refresh_interval_s": 1.0,
        },
        "s3": {
            "endpoint_url": s3.endpoint,
            "bucket": s3.bucket,
            "prefix": prefix,
            "part_size_bytes": 5 * 1024 * 1024,
        },
        "metrics": {"port": metrics_port},
        "tiering": {"rescan_interval_s": 5, "include_topics": list(include_topics)},
        "remote_log_metadata": {
            "replication_factor": metadata_replication,
            "num_partitions": 5,
            "topic": metadata_topic,
        },
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    lines = [f"state_dir = {_toml_value(state_dir)}"]
    for name, values in config.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the metadata topic


class MetadataTopic:
    """Reads a metadata topic from the beginning, decodes every record with the sidecar's serde
    and applies it to a fresh RemoteSegmentStore (Kafka's cache semantics), as records come."""

    def __init__(self, bootstrap: str, topic: str, state_dir: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.store = RemoteSegmentStore(state_dir)
        self.events: list[RemoteLogMetadata] = []
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> MetadataTopic:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=30000,
        )
        await consumer.start()
        self._consumer = consumer
        # open it once a sidecar has created the topic (after its metadata_partition_assigned)
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(self.topic) or set()
        if not partitions:
            await consumer.stop()
            raise AssertionError(f"metadata topic {self.topic} does not exist")
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        self.store.close()

    async def poll(self, timeout_ms: int = 500) -> int:
        """Apply what one fetch returns; the number of new records."""
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=timeout_ms)
        new = 0
        for tp, records in batch.items():
            events = [decode(r.value) for r in records]
            self.events += events
            self.store.apply(events, consumed={tp.partition: records[-1].offset})
            new += len(records)
        return new

    async def wait_until(self, predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Consume until ``predicate()`` holds (checked after every fetch)."""
        deadline = time.monotonic() + timeout
        await self.poll(timeout_ms=0)
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s")
            await self.poll()

    async def read_to_end(self) -> None:
        """Consume every record published so far."""
        assert self._consumer is not None
        tps = list(self._consumer.assignment())
        ends = await self._consumer.end_offsets(tps)
        while [tp for tp in tps if await self._consumer.position(tp) < ends[tp]]:
            await self.poll()

    def copies(self, tip: TopicIdPartition) -> list[SegmentMetadata]:
        """Every copy of the partition ever started, with its latest state (deleted ones too)."""
        latest: dict[Any, SegmentMetadata] = {}
        for event in self.events:
            if isinstance(event, SegmentMetadata) and event.topic_id_partition == tip:
                latest[event.segment_id] = event
        states = self.final_states()
        return [
            _with_state(m, states[sid])
            for sid, m in sorted(latest.items(), key=lambda kv: kv[1].start_offset)
        ]

    def final_states(self) -> dict[Any, RemoteLogSegmentState]:
        states: dict[Any, RemoteLogSegmentState] = {}
        for event in self.events:
            segment_id = getattr(event, "segment_id", None)
            if segment_id is not None:
                states[segment_id] = event.state
        return states

    def finished(self, tip: TopicIdPartition) -> list[SegmentMetadata]:
        """The partition's live COPY_SEGMENT_FINISHED segments, by start offset."""
        return self.store.segments(tip, states={RemoteLogSegmentState.COPY_SEGMENT_FINISHED})

    def finished_in_order(self, tip: TopicIdPartition) -> list[SegmentMetadata]:
        """The live FINISHED copies of the partition in the order they were finished."""
        live = {m.segment_id: m for m in self.finished(tip)}
        order = [
            e.segment_id
            for e in self.events
            if isinstance(e, SegmentMetadataUpdate)
            and e.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
            and e.segment_id in live
        ]
        return [live[segment_id] for segment_id in dict.fromkeys(order)]

    def covered_to(self, tip: TopicIdPartition, leader_epochs: list[tuple[int, int]]) -> int:
        """The end of the contiguous range from offset 0 that the FINISHED copies serve along
        ``leader_epochs`` (Kafka's lineage resolution), or -1."""
        return contiguous_end(self.store.finished_lineage(tip, leader_epochs))


def _with_state(metadata: SegmentMetadata, state: RemoteLogSegmentState) -> SegmentMetadata:
    return dataclasses.replace(metadata, state=state)


def contiguous_end(spans: list[SegmentSpan]) -> int:
    end = -1
    for span in spans:
        if span.start_offset != end + 1:
            break
        end = span.end_offset
    return end


# --- broker files


def partition_scan(log_dir: Path, topic: str, partition: int) -> PartitionScan:
    scan = scan_partition_dir(log_dir / f"{topic}-{partition}")
    assert scan is not None, f"{topic}-{partition} not in {log_dir}"
    return scan


def topic_id_partition(
    log_dir: Path, topic: str, partition: int, *, timeout: float = 60.0
) -> TopicIdPartition:
    """The partition's id from its ``partition.metadata``. The broker writes that file when it
    applies the topic's metadata, which may be after the topic shows in Metadata responses:
    the file is waited for (no event announces it)."""
    wait_for(
        lambda: (log_dir / f"{topic}-{partition}" / "partition.metadata").exists(),
        timeout=timeout,
        what=f"partition.metadata of {topic}-{partition} in {log_dir}",
    )
    scan = partition_scan(log_dir, topic, partition)
    assert scan.topic_id is not None
    return TopicIdPartition(decode_kafka_uuid(scan.topic_id), topic, partition)


def rolled_below(scan: PartitionScan, lso: int) -> list[Any]:
    """The partition's rolled segments that end below ``lso`` (what must be tiered)."""
    return [s for s in scan.segments if s.end_offset is not None and s.end_offset < lso]


async def end_offsets(bootstrap: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", request_timeout_ms=30000
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: int(offset) for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def leaders(
    bootstrap: str, topic: str, *, avoid: Iterable[int] = (), timeout: float = 60.0
) -> dict[int, int]:
    """Partition → leader node id, once every partition of ``topic`` has a leader that is not
    in ``avoid``.

    Each broker applies the controller's metadata on its own schedule, so the broker the admin
    client asks may not know a just-created topic, or may still name a stopped leader; the
    answer is re-asked until it is settled (there is no event for it)."""
    avoided = set(avoid) | {-1}
    deadline = time.monotonic() + timeout
    last: object = None
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        while True:
            described = await admin.describe_topics([topic])
            last = described
            if described and not described[0].get("error_code"):
                found = {p["partition"]: p["leader"] for p in described[0].get("partitions", [])}
                if found and not avoided.intersection(found.values()):
                    return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no settled leaders of {topic} within {timeout} s: {last}")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete a test's topic and its metadata topic (``__rlm_<topic>``), if they exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [t for t in (topic, f"__rlm_{topic}") if t in existing]
        if f"__rlm_{topic}" in existing:  # every record we produced must decode with Kafka's serde
            await check_metadata_topic(bootstrap, f"__rlm_{topic}")
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


# --- the bucket


def bucket_keys(s3: Any, prefix: str) -> list[str]:
    """The keys under ``prefix``, less the prefix's ownership marker (the sidecar writes it at
    startup and never deletes it; the ``s3_prefix`` fixture removes it)."""
    client = s3.client()
    try:
        return [
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=s3.bucket, Prefix=prefix
            )
            for o in page.get("Contents", [])
            if o["Key"] != marker_key(prefix)
        ]
    finally:
        client.close()


def multipart_uploads(s3: Any, prefix: str) -> list[dict[str, Any]]:
    client = s3.client()
    try:
        return list(
            client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix).get("Uploads", [])
        )
    finally:
        client.close()


def clean_prefix(s3: Any, prefix: str) -> None:
    """Delete every object (the ownership marker included) and abort every multipart upload
    under ``prefix``."""
    client = s3.client()
    try:
        for upload in client.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix).get(
            "Uploads", []
        ):
            client.abort_multipart_upload(
                Bucket=s3.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        for key in [*bucket_keys(s3, prefix), marker_key(prefix)]:  # the marker too
            client.delete_object(Bucket=s3.bucket, Key=key)
    finally:
        client.close()


def expected_keys(
    s3_prefix: str, copies: Iterable[SegmentMetadata], *, layout: Any | None = None
) -> set[str]:
    """Every object key of ``copies`` (log, indexes, manifest)."""
    from sidecar.storage.keys import KeyLayout, ObjectSuffix

    layout = layout or KeyLayout(prefix=s3_prefix)
    keys = set()
    for m in copies:
        tip = m.segment_id.topic_id_partition
        for suffix in ObjectSuffix:
            keys.add(
                layout.segment_key(
                    topic=tip.topic,
                    topic_id=tip.topic_id,
                    partition=tip.partition,
                    base_offset=m.start_offset,
                    segment_id=m.segment_id.id,
                    suffix=suffix,
                )
            )
    return keys


# --- probes


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/readyz") as r:
        return r.status, await r.json(content_type=None)


async def metric_samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) → value."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


#: one partition per codec in the e2e topics, in this order
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def _random_value(_i: int) -> bytes | None:
    return os.urandom(1024)  # random values do not compress, so segments roll


def _key(i: int) -> bytes | None:
    return f"k{i}".encode()


async def produce_per_codec(
    bootstrap: str,
    topic: str,
    indices: range,
    *,
    codecs: Iterable[str] = CODECS,
    value: Callable[[int], bytes | None] = _random_value,
    key: Callable[[int], bytes | None] = _key,
    headers: Callable[[int, str], list[tuple[str, bytes]]] | None = None,
) -> None:
    """Partition ``n`` gets the ``n``-th codec and a record for each of ``indices`` (acks=all,
    64 KiB batches), with the given value, key and headers per record index."""
    for partition, codec in enumerate(codecs):
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
            max_batch_size=64 * 1024,
        )
        await producer.start()
        try:
            for i in indices:
                await producer.send(
                    topic,
                    value=value(i),
                    key=key(i),
                    partition=partition,
                    headers=headers(i, codec) if headers is not None else [],
                )
            await producer.flush()
        finally:
            await producer.stop()
