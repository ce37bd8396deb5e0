"""Tiering end to end on the real broker and SeaweedFS: every rolled segment below the LSO reaches
COPY_SEGMENT_FINISHED, every object is byte-identical to the broker's files, Kafka's own serde
decodes every metadata record, and a SIGKILL mid-upload converges after a restart."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.kafka.checkpoints import leader_epoch_checkpoint_for_segment
from sidecar.kafka.logdir import scan_partition_dir
from sidecar.metadata.events import (
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
)
from sidecar.metadata.serde import decode
from sidecar.storage.manifest import IndexKind, SegmentManifest
from sidecar.storage.ownership import is_marker_key
from tests.conftest import _clean_prefix, stack
from tests.e2e._support import CODECS, MetadataTopic, produce_per_codec, topic_id_partition
from tests.helpers import create_topic
from tests.kafka_serde import fields
from tests.sidecar_runner import Sidecar, sidecar_config, sidecar_env

pytestmark = pytest.mark.e2e


async def _produce_codecs(bootstrap: str, topic: str, *, mib_per_partition: float) -> None:
    """Each partition gets its own codec; random values do not compress, so segments roll."""
    await produce_per_codec(
        bootstrap,
        topic,
        range(int(mib_per_partition * 1024)),
        headers=lambda _i, codec: [("codec", codec.encode())],
    )


def _rolled(log_dir: Path, topic: str) -> dict[int, list[Any]]:
    found = {}
    for partition in range(len(CODECS)):
        scan = scan_partition_dir(log_dir / f"{topic}-{partition}")
        assert scan is not None
        found[partition] = [s for s in scan.segments if not s.is_active]
    return found


async def _metadata_records(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not partitions:
            await consumer._client.force_metadata_update()
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        values: list[bytes] = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            batch = await consumer.getmany(timeout_ms=2000)
            for records in batch.values():
                values.extend(r.value for r in records)
        return values
    finally:
        await consumer.stop()


def _final_states(values: list[bytes]) -> dict[Any, tuple[SegmentMetadata, RemoteLogSegmentState]]:
    """Segment id → (its COPY_SEGMENT_STARTED record, its last state)."""
    states: dict[Any, tuple[SegmentMetadata, RemoteLogSegmentState]] = {}
    for value in values:
        event = decode(value)
        if isinstance(event, SegmentMetadata):
            states[event.segment_id] = (event, event.state)
        elif isinstance(event, SegmentMetadataUpdate):
            first, _ = states[event.segment_id]
            states[event.segment_id] = (first, event.state)
    return states


def _bucket(s3: Any, prefix: str) -> dict[str, bytes]:
    client = s3.client()
    try:
        keys = [
            o["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=s3.bucket, Prefix=prefix
            )
            for o in page.get("Contents", [])
            if not is_marker_key(o["Key"])  # the prefix's ownership marker
        ]
        return {k: client.get_object(Bucket=s3.bucket, Key=k)["Body"].read() for k in keys}
    finally:
        client.close()


def _delete_prefix(s3: Any, prefix: str) -> None:
    """Everything under ``prefix``, the ownership marker included."""
    _clean_prefix(s3, prefix)


async def _tiered_run(kafka, s3, topic_name, tmp_path, *, kill_after: int | None):
    await create_topic(
        kafka.bootstrap_servers,
        topic_name,
        partitions=len(CODECS),
        configs={"segment.bytes": "1048576"},
    )
    await _produce_codecs(kafka.bootstrap_servers, topic_name, mib_per_partition=5.0)
    rolled = _rolled(kafka.log_dir, topic_name)
    total = sum(len(v) for v in rolled.values())
    prefix = f"tests/{topic_name}/"
    metadata_topic = f"__rlm_{topic_name}"
    metrics_port = stack.free_port()
    config = sidecar_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dirs=[kafka.log_dir],
        bootstrap=kafka.bootstrap_servers,
        s3=s3,
        metrics_port=metrics_port,
        metadata_topic=metadata_topic,
        include_topics=[topic_name],
        prefix=prefix,
    )
    env = sidecar_env(s3)
    sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-1.log")
    try:
        if kill_after is not None:
            # segments left to upload when the kill comes, or nothing is in flight to repair
            assert total > kill_after, rolled
            await sidecar.wait_for("segment_tiered", count=kill_after, topic=topic_name)
            sidecar.proc.send_signal(signal.SIGKILL)
            await sidecar.proc.wait()
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-2.log")
            # the killed run may have finished copies it never logged: wait on the metadata
            await sidecar.wait_for("sidecar_ready")
            tips = [topic_id_partition(kafka.log_dir, topic_name, p) for p in rolled]
            async with MetadataTopic(
                kafka.bootstrap_servers, metadata_topic, tmp_path / "metadata"
            ) as topic:
                await topic.wait_until(
                    lambda: (
                        not topic.store.unfinished_copies()
                        and all(
                            [(m.start_offset, m.end_offset) for m in topic.finished(tip)]
                            == [(s.base_offset, s.end_offset) for s in rolled[tip.partition]]
                            for tip in tips
                        )
                    ),
                    timeout=240,
                    what="every rolled segment FINISHED after the restart",
                )
        else:
            await sidecar.wait_for("segment_tiered", count=total, timeout=240, topic=topic_name)
        await _check_status(metrics_port, topic_name, rolled)
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
    return rolled, total, prefix, metadata_topic


async def _decode_cli(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """`sidecar metadata decode --bootstrap-server` prints one JSON object per record."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "metadata",
        "decode",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


async def _check_status(port: int, topic: str, rolled: dict[int, list[Any]]) -> None:
    """`sidecar status --json` shows every rolled segment tiered and no lag, within 60 s: the
    test may see the last FINISHED on the metadata topic before the sidecar's own tailer has
    applied it (after a restart, the copies of the killed run reach it only that way)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await _status_shows_all_tiered(port, topic, rolled)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
        else:
            return


async def _status_shows_all_tiered(port: int, topic: str, rolled: dict[int, list[Any]]) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "status",
        "--json",
        "--url",
        f"http://127.0.0.1:{port}/v1/status",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    document = json.loads(out)
    rows = {r["partition"]: r for r in document["partitions"] if r["topic"] == topic}
    assert set(rows) == set(rolled)
    for partition, segments in rolled.items():
        row = rows[partition]
        assert row["selected"]
        assert row["leader"]
        assert row["tiered_segments"] == len(segments)
        assert row["remote_start_offset"] == 0
        assert row["remote_end_offset"] == segments[-1].end_offset
        assert row["lag_segments"] == 0
        assert row["last_error"] is None


def _check_bucket_matches_broker(kafka, s3, topic, rolled, prefix, states) -> None:
    objects = _bucket(s3, prefix)
    manifests = [
        SegmentManifest.from_json(body, key=key)
        for key, body in objects.items()
        if key.endswith(".manifest.json")
    ]
    finished = {
        sid.id
        for sid, (_, state) in states.items()
        if state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
    }
    # no object without metadata: every object belongs to a FINISHED segment
    assert {m.segment_id for m in manifests} == finished
    referenced = {k for m in manifests for k in (m.log.key, m.indexes.key)}
    referenced |= {k for k in objects if k.endswith(".manifest.json")}
    assert set(objects) == referenced
    by_partition: dict[int, list[SegmentManifest]] = defaultdict(list)
    for m in manifests:
        by_partition[m.partition].append(m)
    for partition, segments in rolled.items():
        remote = sorted(by_partition[partition], key=lambda m: m.start_offset)
        # exactly one FINISHED copy per local segment: no gaps, no duplicates
        assert [(m.start_offset, m.end_offset) for m in remote] == [
            (s.base_offset, s.end_offset) for s in segments
        ]
        scan = scan_partition_dir(kafka.log_dir / f"{topic}-{partition}")
        assert scan is not None
        for m, seg in zip(remote, segments, strict=True):
            assert objects[m.log.key] == seg.log_path.read_bytes()
            assert m.size_bytes == seg.size
            assert m.max_timestamp_ms == seg.max_timestamp_ms
            assert m.leader_epochs == tuple((e.epoch, e.start_offset) for e in seg.leader_epochs)
            blob = objects[m.indexes.key]
            expected = {
                IndexKind.OFFSET_INDEX: seg.index_path.read_bytes(),
                IndexKind.TIME_INDEX: seg.timeindex_path.read_bytes(),
                IndexKind.PRODUCER_SNAPSHOT: seg.snapshot_path.read_bytes(),
                IndexKind.LEADER_EPOCH_CHECKPOINT: leader_epoch_checkpoint_for_segment(
                    scan.leader_epochs, seg.next_base_offset
                ),
            }
            for kind, data in expected.items():
                r = m.indexes.ranges[kind]
                assert blob[r.start : r.start + r.length] == data, (m.log.key, kind)
            # trimmed indexes: no preallocated zero tail travelled to S3
            assert len(expected[IndexKind.OFFSET_INDEX]) % 8 == 0
            assert len(expected[IndexKind.OFFSET_INDEX]) < 10 * 1024 * 1024
            assert IndexKind.TXN_INDEX not in m.indexes.ranges


async def test_every_rolled_segment_is_tiered_byte_exact(
    kafka, s3, topic_name, tmp_path, kafka_serde
):
    """≥ 20 segments over five codecs reach FINISHED; objects equal the broker's files; Kafka's
    RemoteLogMetadataSerde decodes every record we published with the same fields."""
    rolled, total, prefix, metadata_topic = await _tiered_run(
        kafka, s3, topic_name, tmp_path, kill_after=None
    )
    try:
        assert total >= 20
        values = await _metadata_records(kafka.bootstrap_servers, metadata_topic)
        assert len(values) == 2 * total  # STARTED + FINISHED each, nothing else
        decoded = await _decode_cli(kafka.bootstrap_servers, metadata_topic)
        assert len(decoded) == 2 * total
        assert {d["state"] for d in decoded} == {"COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED"}
        assert all(len(d["segment_id"]) == 22 and len(d["topic_id"]) == 22 for d in decoded)
        for value in values:
            kafka_fields, text = kafka_serde.decode(value)
            assert kafka_fields is not None, text
            assert kafka_fields == fields(decode(value))
        states = _final_states(values)
        _check_bucket_matches_broker(kafka, s3, topic_name, rolled, prefix, states)
    finally:
        _delete_prefix(s3, prefix)


async def test_sigkill_mid_upload_converges(kafka, s3, topic_name, tmp_path):
    """Killed with uploads in flight and restarted, the sidecar repairs and finishes: no segment
    missing, no duplicate FINISHED copy, no object without metadata."""
    rolled, _total, prefix, metadata_topic = await _tiered_run(
        kafka, s3, topic_name, tmp_path, kill_after=3
    )
    try:
        values = await _metadata_records(kafka.bootstrap_servers, metadata_topic)
        states = _final_states(values)
        for _first, state in states.values():
            # every copy either finished or was cleaned up by crash repair
            assert state in {
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
            }
        _check_bucket_matches_broker(kafka, s3, topic_name, rolled, prefix, states)
    finally:
        _delete_prefix(s3, prefix)
    await asyncio.sleep(0)
