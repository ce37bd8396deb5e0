"""Remote retention and deletion end to end on the real broker and SeaweedFS.

Each test tiers a topic with a running sidecar, then changes what Kafka says (``retention.ms``,
``retention.bytes``, DeleteRecords, topic deletion) and checks that exactly the segments Kafka's
rules select are deleted: the expected set is computed here from the segments' facts (start,
end, max timestamp, size, read from the metadata topic and the log dir) and the topic config,
without the sidecar's policy code. Every test ends by deleting its topic and waiting until the
sidecar itself has emptied the test's prefix (no fixture cleanup needed for these).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    delete_topic,
    end_offsets,
    expected_keys,
    metric_samples,
    multipart_uploads,
    partition_scan,
    rolled_below,
    sample,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
HOUR_MS = 3_600_000
METRIC = "kafka_tiered_sidecar_"


def _config(tmp_path: Path, kafka: Any, s3: Any, topic: str, prefix: str, **retention: Any) -> Path:
    return write_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dir=kafka.log_dir,
        bootstrap=kafka.bootstrap_servers,
        s3=s3,
        metrics_port=stack.free_port(),
        metadata_topic=f"__rlm_{topic}",
        include_topics=[topic],
        prefix=prefix,
        retention={
            "interval_s": 1.0,
            "topic_deletion_grace_s": 1.0,
            # each test deletes its only topic: all of the prefix's segments at once
            "topic_deletion_override_share": True,
            "scrub_enabled": False,
            **retention,
        },
    )


async def _produce(
    bootstrap: str, topic: str, *, count: int, partition: int = 0, timestamp_ms: int | None = None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i in range(count):
            await producer.send(
                topic,
                value=(f"{i:08d}".encode() * 128),
                key=f"k{i}".encode(),
                partition=partition,
                timestamp_ms=timestamp_ms,
            )
        await producer.flush()
    finally:
        await producer.stop()


async def _alter(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
    finally:
        await admin.close()


async def _tier_everything(
    kafka: Any, sidecar: Sidecar, topic: str, partitions: int = 1
) -> dict[int, list[Any]]:
    """Wait until every rolled segment below the LSO is tiered; the rolled segments."""
    lsos = await end_offsets(kafka.bootstrap_servers, topic, range(partitions))
    rolled = {p: rolled_below(partition_scan(kafka.log_dir, topic, p), lsos[p]) for p in lsos}

    def done() -> bool:
        return all(
            {s.base_offset for s in segs}
            <= {e["base_offset"] for e in sidecar.matching("segment_tiered", partition=p)}
            for p, segs in rolled.items()
        )

    await sidecar.wait_until(done, timeout=120, what="every rolled segment tiered")
    return rolled


async def _finished(
    kafka: Any, topic: str, state: Path, partition: int = 0
) -> list[SegmentMetadata]:
    async with MetadataTopic(kafka.bootstrap_servers, f"__rlm_{topic}", state) as log:
        await log.read_to_end()
        return log.finished(topic_id_partition(kafka.log_dir, topic, partition))


async def _wait_deleted(
    kafka: Any,
    sidecar: Sidecar,
    topic: str,
    state: Path,
    expected: list[SegmentMetadata],
    kept: list[SegmentMetadata],
) -> None:
    """Until ``expected`` are DELETE_SEGMENT_FINISHED; then two more passes change nothing,
    and ``kept`` are still FINISHED."""
    async with MetadataTopic(kafka.bootstrap_servers, f"__rlm_{topic}", state) as log:
        wanted = {m.segment_id for m in expected}
        await log.wait_until(
            lambda: all(log.final_states().get(s) is DELETE_FINISHED for s in wanted),
            timeout=60,
            what=f"{len(wanted)} segments deleted",
        )
        passes = len(sidecar.matching("retention_pass"))
        await sidecar.wait_for("retention_pass", count=passes + 2, timeout=60)
        await log.read_to_end()
        states = log.final_states()
        deleted = {s for s, st in states.items() if st is DELETE_FINISHED}
        assert deleted == wanted
        assert all(states[m.segment_id] is FINISHED for m in kept)


async def _delete_topic_and_wait_empty(
    kafka: Any, s3: Any, sidecar: Sidecar, topic: str, prefix: str
) -> None:
    """Delete the user topic; the sidecar must empty the prefix by itself."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers, request_timeout_ms=30000)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()
    deadline = time.monotonic() + 90
    while bucket_keys(s3, prefix) or multipart_uploads(s3, prefix):
        assert time.monotonic() < deadline, f"{prefix} not emptied:\n{sidecar.tail()}"
        await sidecar.wait_for(
            "retention_pass", count=len(sidecar.matching("retention_pass")) + 1, timeout=60
        )


async def _start(config: Path, s3: Any, tmp_path: Path, name: str = "sidecar") -> Sidecar:
    sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / f"{name}.log", name=name)
    await sidecar.wait_for("sidecar_ready", timeout=60)
    return sidecar


async def _delete_partition(config: Path, s3: Any, *args: str) -> str:
    """`sidecar delete-partition --yes` with ``args``; its output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "delete-partition", "--config", str(config), *args,
        "--yes", env=sidecar_env(s3), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def _scrub(config: Path, s3: Any, *args: str, rc: int = 0) -> dict[str, Any]:
    """`sidecar scrub --json` with ``args``: its report (a refused scrub prints one too, with exit
    1), or its stderr when it printed none."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "scrub", "--config", str(config), "--json", *args,
        env=sidecar_env(s3), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == rc, err.decode()
    return json.loads(out) if out else {"stderr": err.decode()}


def _expected_by_time(segments: list[SegmentMetadata], retention_ms: int, now_ms: int) -> list:
    """Oldest first, while max timestamp <= now - retention.ms."""
    out = []
    for m in sorted(segments, key=lambda m: m.start_offset):
        if m.max_timestamp_ms > now_ms - retention_ms:
            break
        out.append(m)
    return out


class TestRemoteRetention:
    """retention.ms, retention.bytes and DeleteRecords applied to the tiered segments."""

    async def test_retention_ms_deletes_the_old_segments(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """Old records (2 h) then new ones; retention.ms = 1 h deletes exactly the segments
        whose max timestamp is older than an hour, oldest first."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, configs={"retention.ms": "-1"})
        old = int(time.time() * 1000) - 2 * HOUR_MS
        await _produce(bootstrap, topic_name, count=3000, timestamp_ms=old)
        await _produce(bootstrap, topic_name, count=2500)
        sidecar = await _start(_config(tmp_path, kafka, s3, topic_name, s3_prefix), s3, tmp_path)
        try:
            await _tier_everything(kafka, sidecar, topic_name)
            finished = await _finished(kafka, topic_name, tmp_path / "m1")
            expected = _expected_by_time(finished, HOUR_MS, int(time.time() * 1000))
            assert 0 < len(expected) < len(finished)
            kept = [m for m in finished if m not in expected]
            await _alter(bootstrap, topic_name, {"retention.ms": str(HOUR_MS)})
            await _wait_deleted(kafka, sidecar, topic_name, tmp_path / "m2", expected, kept)
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, kept)
            samples = await metric_samples(_port(tmp_path))
            deleted = sum(
                sample(
                    samples, f"{METRIC}retention_deleted_segments_total", topic=topic_name, reason=r
                )
                for r in ("retention_ms", "log_start_offset")
            )
            assert deleted == len(expected)
            await _delete_topic_and_wait_empty(kafka, s3, sidecar, topic_name, s3_prefix)
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)

    async def test_retention_bytes_deletes_down_to_the_limit(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """A remote retention.bytes over local-only plus tiered bytes: the oldest segments go
        while the breach still covers them.

        The limit is the sidecar's (a ``[[retention.overrides]]`` retention_bytes) and the
        topic keeps ``retention.bytes=-1``: the broker runs without KIP-405, so a topic
        retention.bytes would also make the broker delete local segments and move its log start
        offset on its own timer, and which of the two retentions ran first would decide the
        outcome (the log-start rule deletes more)."""
        bootstrap = kafka.bootstrap_servers
        configs = {"retention.ms": "-1", "retention.bytes": "-1"}
        await create_topic(bootstrap, topic_name, configs=configs)
        await _produce(bootstrap, topic_name, count=7000)
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix)
        base = config.read_text()
        sidecar = await _start(config, s3, tmp_path)
        second = None
        try:
            await _tier_everything(kafka, sidecar, topic_name)
            finished = sorted(
                await _finished(kafka, topic_name, tmp_path / "m1"), key=lambda m: m.start_offset
            )
            scan = partition_scan(kafka.log_dir, topic_name, 0)
            highest = max(m.end_offset for m in finished)
            local_only = sum(s.size for s in scan.segments if s.base_offset >= highest)
            limit = local_only + sum(m.segment_size_in_bytes for m in finished) * 4 // 10
            breach = local_only + sum(m.segment_size_in_bytes for m in finished) - limit
            expected = []
            for m in finished:
                if breach - m.segment_size_in_bytes < 0:
                    break
                breach -= m.segment_size_in_bytes
                expected.append(m)
            assert 0 < len(expected) < len(finished)
            kept = [m for m in finished if m not in expected]
            assert sidecar.matching("remote_segment_deleted") == []
            assert await sidecar.stop() == 0
            config.write_text(
                base + "\n[[retention.overrides]]\n"
                f'topics = ["{topic_name}"]\nretention_bytes = {limit}\n'
            )
            second = await _start(config, s3, tmp_path, name="limited")
            await _wait_deleted(kafka, second, topic_name, tmp_path / "m2", expected, kept)
            reasons = {e["reason"] for e in second.matching("remote_segment_deleted")}
            assert reasons == {"retention_bytes"}
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, kept)
            await _delete_topic_and_wait_empty(kafka, s3, second, topic_name, s3_prefix)
            assert await second.stop() == 0
        finally:
            for process in (sidecar, second):
                if process is not None and process.proc.returncode is None:
                    await process.kill()
            await delete_topic(bootstrap, topic_name)

    async def test_delete_records_moves_the_remote_start(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """DeleteRecords to an offset inside a tiered segment: the segments that end below it
        are deleted, the one holding it and the later ones stay."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, configs={"retention.ms": "-1"})
        await _produce(bootstrap, topic_name, count=6000)
        sidecar = await _start(_config(tmp_path, kafka, s3, topic_name, s3_prefix), s3, tmp_path)
        try:
            await _tier_everything(kafka, sidecar, topic_name)
            finished = sorted(
                await _finished(kafka, topic_name, tmp_path / "m1"), key=lambda m: m.start_offset
            )
            assert len(finished) >= 3
            target = finished[2].start_offset + 10
            expected = [m for m in finished if m.end_offset < target]
            kept = [m for m in finished if m.end_offset >= target]
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
            await admin.start()
            try:
                await admin.delete_records({TopicPartition(topic_name, 0): RecordsToDelete(target)})
            finally:
                await admin.close()
            await _wait_deleted(kafka, sidecar, topic_name, tmp_path / "m2", expected, kept)
            assert kept[0].start_offset <= target <= kept[0].end_offset  # the new remote start
            reasons = {e["reason"] for e in sidecar.matching("remote_segment_deleted")}
            assert reasons == {"log_start_offset"}
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, kept)
            await _delete_topic_and_wait_empty(kafka, s3, sidecar, topic_name, s3_prefix)
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)


def _port(tmp_path: Path) -> int:
    for line in (tmp_path / "sidecar.toml").read_text().splitlines():
        if line.startswith("port = "):
            return int(line.split("=")[1])
    raise AssertionError("no metrics port in the config")


class TestDeletion:
    """Topic deletion, partition deletion and a SIGKILL in the middle of deleting."""

    async def test_topic_deletion_survives_sigkill(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """The topic is deleted; the sidecar is SIGKILLed as soon as it starts deleting; after a
        restart every copy is DELETE_SEGMENT_FINISHED and the prefix is empty."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, partitions=3, configs={"retention.ms": "-1"})
        for p in range(3):
            await _produce(bootstrap, topic_name, count=3000, partition=p)
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix)
        sidecar = await _start(config, s3, tmp_path)
        second = None
        try:
            await _tier_everything(kafka, sidecar, topic_name, partitions=3)
            tips = [topic_id_partition(kafka.log_dir, topic_name, p) for p in range(3)]
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
            await admin.start()
            try:
                await admin.delete_topics([topic_name])
            finally:
                await admin.close()
            await sidecar.wait_for("remote_segments_deleting", timeout=60)
            await sidecar.kill()
            assert bucket_keys(s3, s3_prefix)  # the kill came before the end
            second = await _start(config, s3, tmp_path, name="restarted")
            deadline = time.monotonic() + 90
            while bucket_keys(s3, s3_prefix):
                assert time.monotonic() < deadline, second.tail()
                await second.wait_for(
                    "retention_pass", count=len(second.matching("retention_pass")) + 1
                )
            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m") as log:
                await log.read_to_end()
                copies = [m for tip in tips for m in log.copies(tip)]
                assert copies
                assert {m.state for m in copies} == {DELETE_FINISHED}
            assert multipart_uploads(s3, s3_prefix) == []
            # nothing of the deleted topic is left: its partitions leave the metadata store
            await second.wait_for("deleted_topic_partition_forgotten", count=3, timeout=60)
            assert await second.stop() == 0
        finally:
            for process in (sidecar, second):
                if process is not None and process.proc.returncode is None:
                    await process.kill()
            await delete_topic(bootstrap, topic_name)

    async def test_delete_partition_command(self, kafka, s3, topic_name, s3_prefix, tmp_path):
        """`sidecar delete-partition` marks one partition; the sidecar publishes STARTED,
        deletes every segment of it, publishes FINISHED; the other partition is untouched."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, partitions=2, configs={"retention.ms": "-1"})
        for p in range(2):
            await _produce(bootstrap, topic_name, count=3000, partition=p)
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix)
        sidecar = await _start(config, s3, tmp_path)
        try:
            await _tier_everything(kafka, sidecar, topic_name, partitions=2)
            tips = [topic_id_partition(kafka.log_dir, topic_name, p) for p in range(2)]
            before = {
                p: await _finished(kafka, topic_name, tmp_path / f"b{p}", p) for p in range(2)
            }
            marked = await _delete_partition(
                config, s3, "--topic", topic_name, "--partition", "1", "--force"
            )
            assert "DELETE_PARTITION_MARKED" in marked
            await sidecar.wait_for("partition_delete_finished", timeout=60, partition=1)
            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m") as log:
                await log.read_to_end()
                states = [
                    e.state.name
                    for e in log.events
                    if type(e).__name__ == "PartitionDeleteMetadata"
                    and e.topic_id_partition == tips[1]
                ]
                assert states == [
                    "DELETE_PARTITION_MARKED",
                    "DELETE_PARTITION_STARTED",
                    "DELETE_PARTITION_FINISHED",
                ]
                final = log.final_states()
                assert {final[m.segment_id] for m in before[1]} == {DELETE_FINISHED}
                assert {final[m.segment_id] for m in before[0]} == {FINISHED}
            remaining = set(bucket_keys(s3, s3_prefix))
            assert not remaining & expected_keys(s3_prefix, before[1])
            assert expected_keys(s3_prefix, before[0]) <= remaining
            await _delete_topic_and_wait_empty(kafka, s3, sidecar, topic_name, s3_prefix)
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)


class TestScrubCommand:
    """`sidecar scrub` beside a running sidecar: planted orphans only, never referenced data."""

    async def test_scrub_dry_run_then_scrub(self, kafka, s3, topic_name, s3_prefix, tmp_path):
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, configs={"retention.ms": "-1"})
        await _produce(bootstrap, topic_name, count=3000)
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix)
        sidecar = await _start(config, s3, tmp_path)
        try:
            await _tier_everything(kafka, sidecar, topic_name)
            referenced = set(bucket_keys(s3, s3_prefix))
            tip = topic_id_partition(kafka.log_dir, topic_name, 0)
            planted = _plant(s3, s3_prefix, tip)

            young = await _scrub(config, s3)  # default grace: a day
            assert young["orphans"] == 0
            assert young["young_orphans"] == len(planted["objects"])
            assert set(bucket_keys(s3, s3_prefix)) == referenced | set(planted["objects"])
            graceless = (
                "--set",
                "retention.orphan_grace_s=0.001",
                "--set",
                "retention.multipart_grace_s=0.001",
            )
            dry = await _scrub(config, s3, "--dry-run", *graceless)
            assert sorted(dry["orphan_keys"]) == sorted(planted["objects"])
            assert [u["key"] for u in dry["aborted_uploads"]] == [planted["upload"]]
            assert set(bucket_keys(s3, s3_prefix)) == referenced | set(planted["objects"])
            assert dry["refused"] is None
            # the metadata topic may drop records: deleting what it decides on is refused, the
            # orphans are kept and reported
            metadata_topic = f"__rlm_{topic_name}"
            await _alter(bootstrap, metadata_topic, {"retention.ms": str(7 * 24 * HOUR_MS)})
            refused = await _scrub(config, s3, "--execute", *graceless, rc=1)
            assert "retention.ms=604800000" in refused["refused"]
            assert sorted(refused["withheld_keys"]) == sorted(planted["objects"])
            assert [u["key"] for u in refused["withheld_uploads"]] == [planted["upload"]]
            assert refused["orphan_keys"] == []
            assert set(bucket_keys(s3, s3_prefix)) == referenced | set(planted["objects"])
            warned = await _scrub(config, s3, "--dry-run", *graceless)
            assert "retention.ms=604800000" in warned["refused"]
            assert sorted(warned["withheld_keys"]) == sorted(planted["objects"])
            await _alter(bootstrap, metadata_topic, {"retention.ms": "-1"})
            done = await _scrub(config, s3, "--execute", *graceless)
            assert sorted(done["orphan_keys"]) == sorted(planted["objects"])
            assert set(bucket_keys(s3, s3_prefix)) == referenced
            assert multipart_uploads(s3, s3_prefix) == []
            await _delete_topic_and_wait_empty(kafka, s3, sidecar, topic_name, s3_prefix)
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)

    async def test_scrub_deletes_the_leftovers_of_a_deleted_partition(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """Partition 1 of a deleted topic is deleted with `sidecar delete-partition`
        (DELETE_PARTITION_FINISHED in the metadata topic), then objects and an upload appear
        under its prefix, as a copy that raced the deletion leaves them: the scrub deletes them
        and aborts the upload; partition 0, still tiered, keeps every object."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, partitions=2, configs={"retention.ms": "-1"})
        for p in range(2):
            await _produce(bootstrap, topic_name, count=3000, partition=p)
        # the deleted topic's data waits for its grace period: partition 1 goes by the command
        config = _config(
            tmp_path, kafka, s3, topic_name, s3_prefix, topic_deletion_grace_s=24 * 3600.0
        )
        sidecar = await _start(config, s3, tmp_path)
        try:
            await _tier_everything(kafka, sidecar, topic_name, partitions=2)
            tips = [topic_id_partition(kafka.log_dir, topic_name, p) for p in range(2)]
            live = await _finished(kafka, topic_name, tmp_path / "m0", 0)
            assert live
            # a deleted topic: nothing of partition 1 is tiered again after its deletion
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
            await admin.start()
            try:
                await admin.delete_topics([topic_name])
            finally:
                await admin.close()
            topic_id = encode_kafka_uuid(tips[1].topic_id)
            await _delete_partition(
                config, s3, "--topic", topic_name, "--topic-id", topic_id, "--partition", "1",
                "--force",
            )  # fmt: skip
            await sidecar.wait_for("partition_delete_finished", timeout=60, partition=1)
            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m1") as log:
                await log.read_to_end()
                assert [
                    e.state.name
                    for e in log.events
                    if type(e).__name__ == "PartitionDeleteMetadata"
                    and e.topic_id_partition == tips[1]
                ][-1] == "DELETE_PARTITION_FINISHED"
            referenced = set(bucket_keys(s3, s3_prefix))
            assert referenced == expected_keys(s3_prefix, live)
            planted = _plant(s3, s3_prefix, tips[1])

            graceless = ("--set", "retention.orphan_grace_s=0.001")
            graceless += ("--set", "retention.multipart_grace_s=0.001")
            done = await _scrub(config, s3, "--execute", *graceless)
            assert sorted(done["orphan_keys"]) == sorted(planted["objects"])
            assert [u["key"] for u in done["aborted_uploads"]] == [planted["upload"]]
            assert done["not_ours"] == 0
            assert set(bucket_keys(s3, s3_prefix)) == referenced
            assert multipart_uploads(s3, s3_prefix) == []

            # the rest goes by the sidecar's own deletion: the prefix ends empty
            await _delete_partition(
                config, s3, "--topic", topic_name, "--topic-id", topic_id, "--partition", "0",
                "--force",
            )  # fmt: skip
            await sidecar.wait_for("partition_delete_finished", timeout=60, partition=0)
            assert bucket_keys(s3, s3_prefix) == []
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)


def _plant(s3: Any, prefix: str, tip: Any) -> dict[str, Any]:
    """Segment-shaped objects no metadata references, and an incomplete multipart upload."""
    import uuid

    from sidecar.storage.keys import KeyLayout, ObjectSuffix

    layout = KeyLayout(prefix=prefix)
    segment_id = uuid.uuid4()
    keys = [
        layout.segment_key(
            topic=tip.topic,
            topic_id=tip.topic_id,
            partition=tip.partition,
            base_offset=123,
            segment_id=segment_id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    ]
    client = s3.client()
    try:
        for key in keys:
            client.put_object(Bucket=s3.bucket, Key=key, Body=b"orphan")
        upload_key = layout.segment_key(
            topic=tip.topic,
            topic_id=tip.topic_id,
            partition=tip.partition,
            base_offset=456,
            segment_id=uuid.uuid4(),
            suffix=ObjectSuffix.LOG,
        )
        client.create_multipart_upload(Bucket=s3.bucket, Key=upload_key)
    finally:
        client.close()
    return {"objects": keys, "upload": upload_key}
