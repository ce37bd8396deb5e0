"""A sidecar remote-retention override on the real broker (which runs without KIP-405).

The topic keeps one hour on the broker's disks (``retention.ms``) while the sidecar's
``[[retention.overrides]]`` keeps the tiered copies forever: once the broker deleted its old
local segments (moving its log start offset), the tiered copies stay in the bucket, readable.
Then the override shrinks to one hour and exactly the segments older than that are deleted, with
their events. The expected sets come from the segments' facts (max timestamps, offsets) read
from the metadata topic, not from the sidecar's policy code. The test ends by deleting its
topic and waiting until the sidecar emptied its prefix.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.kafka.records import iter_batches
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from tests.e2e._support import (
    MetadataTopic,
    bucket_keys,
    delete_topic,
    expected_keys,
    partition_scan,
    topic_id_partition,
)
from tests.e2e.test_retention import (
    DELETE_FINISHED,
    FINISHED,
    HOUR_MS,
    _alter,
    _config,
    _delete_topic_and_wait_empty,
    _expected_by_time,
    _finished,
    _port,
    _produce,
    _start,
    _tier_everything,
    _wait_deleted,
)
from tests.helpers import create_topic

pytestmark = pytest.mark.e2e


def _with_override(config: Path, base: str, retention_ms: int) -> Path:
    config.write_text(
        base + f'\n[[retention.overrides]]\ntopics = [".*"]\nretention_ms = {retention_ms}\n'
    )
    return config


async def _log_start(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return int((await consumer.beginning_offsets([tp]))[tp])
    finally:
        await consumer.stop()


async def _status_row(port: int, topic: str) -> dict[str, Any]:
    def get() -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10) as r:
            document: dict[str, Any] = json.loads(r.read())
        return next(p for p in document["partitions"] if p["topic"] == topic)

    return await asyncio.to_thread(get)


def _read_log_object(s3: Any, key: str) -> bytes:
    client = s3.client()
    try:
        body: bytes = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        return body
    finally:
        client.close()


class TestRemoteRetentionOverride:
    async def test_bucket_keeps_more_than_the_broker_then_the_override_shrinks(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, configs={"retention.ms": "-1"})
        old = int(time.time() * 1000) - 2 * HOUR_MS
        await _produce(bootstrap, topic_name, count=3000, timestamp_ms=old)
        await _produce(bootstrap, topic_name, count=2500)
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix)
        base = config.read_text()
        sidecar = await _start(_with_override(config, base, -1), s3, tmp_path)
        second = None
        try:
            await _tier_everything(kafka, sidecar, topic_name)
            finished = sorted(
                await _finished(kafka, topic_name, tmp_path / "m1"), key=lambda m: m.start_offset
            )
            expected = _expected_by_time(finished, HOUR_MS, int(time.time() * 1000))
            kept = [m for m in finished if m not in expected]
            assert expected
            assert kept

            # the broker keeps an hour: it deletes the old local segments, its log start moves
            await _alter(bootstrap, topic_name, {"retention.ms": str(HOUR_MS)})
            new_start = expected[-1].end_offset + 1
            deadline = time.monotonic() + 60
            while await _log_start(bootstrap, topic_name) < new_start:
                assert time.monotonic() < deadline, "the broker did not apply retention.ms"
                await asyncio.sleep(0.5)  # polling the broker's log start (external state)
            assert await _log_start(bootstrap, topic_name) == new_start
            local = {s.base_offset for s in partition_scan(kafka.log_dir, topic_name, 0).segments}
            assert min(local) == new_start

            # two retention passes that saw the moved log start delete nothing remote
            passes = len(sidecar.matching("retention_pass"))
            await sidecar.wait_for("retention_pass", count=passes + 2, timeout=60)
            assert sidecar.matching("remote_segment_deleted") == []
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, finished)
            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m2") as log:
                await log.read_to_end()
                states = log.final_states()
                assert {states[m.segment_id] for m in finished} == {FINISHED}

            # the copies of the segments the broker no longer has are whole and readable
            tip = topic_id_partition(kafka.log_dir, topic_name, 0)
            layout = KeyLayout(prefix=s3_prefix)
            for m in expected:
                key = layout.segment_key(
                    topic=tip.topic,
                    topic_id=tip.topic_id,
                    partition=tip.partition,
                    base_offset=m.start_offset,
                    segment_id=m.segment_id.id,
                    suffix=ObjectSuffix.LOG,
                )
                data = await asyncio.to_thread(_read_log_object, s3, key)
                assert len(data) == m.segment_size_in_bytes
                batches = list(iter_batches(data))
                assert batches[0].base_offset == m.start_offset
                assert batches[-1].base_offset + batches[-1].last_offset_delta == m.end_offset
            row = await _status_row(_port(tmp_path), topic_name)
            assert row["remote_start_offset"] == 0
            assert row["tiered_bytes"] == sum(m.segment_size_in_bytes for m in finished)

            # the override shrinks to the broker's hour: exactly the old copies go
            assert await sidecar.stop() == 0
            second = await _start(
                _with_override(config, base, HOUR_MS), s3, tmp_path, name="shrunk"
            )
            await _wait_deleted(kafka, second, topic_name, tmp_path / "m3", expected, kept)
            deleted = second.matching("remote_segment_deleted")
            assert sorted(e["start_offset"] for e in deleted) == [m.start_offset for m in expected]
            assert {e["reason"] for e in deleted} == {"retention_ms"}
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, kept)
            row = await _status_row(_port(tmp_path), topic_name)
            assert row["remote_start_offset"] == kept[0].start_offset
            assert row["tiered_bytes"] == sum(m.segment_size_in_bytes for m in kept)
            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m4") as log:
                await log.read_to_end()
                states = log.final_states()
                assert {states[m.segment_id] for m in expected} == {DELETE_FINISHED}

            await _delete_topic_and_wait_empty(kafka, s3, second, topic_name, s3_prefix)
            assert await second.stop() == 0
        finally:
            for process in (sidecar, second):
                if process is not None and process.proc.returncode is None:
                    await process.kill()
            await delete_topic(bootstrap, topic_name)
