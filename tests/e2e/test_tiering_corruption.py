"""Corrupt and unreadable segments on the real broker and SeaweedFS.

* A segment whose bytes are corrupt (a flipped byte, written by the test into the broker's log
  dir) is quarantined by topic id and never uploaded; the segments after it still tier; status
  and metrics show it; ``sidecar quarantine clear`` makes the running sidecar check it again
  (quarantined again while still corrupt, tiered once repaired); a restart keeps the rest.
* A read error (EIO, injected into the daemon's segment reads by ``tests.read_faults``) is
  retried with backoff and the segment ends FINISHED, never quarantined.
* A topic deleted and created again under the same name (a new topic id) does not inherit the
  old topic's quarantine.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid
from sidecar.kafka.logdir import scan_partition_dir
from sidecar.storage.keys import KeyLayout
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    end_offsets,
    metric_samples,
    partition_scan,
    rolled_below,
    sample,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic, produce, wait_for
from tests.read_faults import ENV as READ_FAULT_ENV
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

PARTITIONS = 3
TOPIC_CONFIGS = {"segment.bytes": "1048576", "segment.ms": "3600000"}
QUARANTINED = "kafka_tiered_sidecar_quarantined_segments"


def _flip_byte(path: Path, position: int) -> None:
    """Flip one byte (inside the first batch's records, its CRC fails); flipping it again
    repairs the segment."""
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


async def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """Run ``sidecar <args>``; its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _config(tmp_path: Path, kafka: Any, s3: Any, topic: str, prefix: str, port: int) -> Path:
    return write_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dir=kafka.log_dir,
        bootstrap=kafka.bootstrap_servers,
        s3=s3,
        metrics_port=port,
        metadata_topic=f"__rlm_{topic}",
        include_topics=[topic],
        prefix=prefix,
    )


async def _rolled(kafka: Any, topic: str, partitions: range) -> dict[int, list[Any]]:
    lsos = await end_offsets(kafka.bootstrap_servers, topic, partitions)
    return {p: rolled_below(partition_scan(kafka.log_dir, topic, p), lsos[p]) for p in partitions}


class TestCorruptSegment:
    """A segment whose batches fail their CRC is quarantined, never uploaded."""

    async def test_corrupt_segment_is_quarantined_later_segments_tier_and_clear_rechecks(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """Partition 0's first and partition 1's last rolled segment are corrupt: both are
        quarantined (log, gauges, status text and JSON, the file keyed by topic id), and every
        other rolled segment is tiered, those after partition 0's gap too. A clear of partition
        1 with the bytes still bad quarantines it again; repaired and cleared, it is tiered. A
        restart keeps partition 0's quarantine: new segments tier, the corrupt one is not read
        again."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, partitions=PARTITIONS, configs=TOPIC_CONFIGS)
        sidecar = None
        try:
            for partition in range(PARTITIONS):
                await produce(bootstrap, topic_name, count=3200, partition=partition)
            rolled = await _rolled(kafka, topic_name, range(PARTITIONS))
            assert all(len(segments) >= 2 for segments in rolled.values()), rolled
            bad0, bad1 = rolled[0][0], rolled[1][-1]
            _flip_byte(bad0.log_path, 200)
            _flip_byte(bad1.log_path, 200)

            port = stack.free_port()
            config = _config(tmp_path, kafka, s3, topic_name, s3_prefix, port)
            env = sidecar_env(s3)
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-1.log")
            for partition, bad in ((0, bad0), (1, bad1)):
                [event] = await sidecar.wait_for(
                    "segment_quarantined", topic=topic_name, partition=partition
                )
                assert event["base_offset"] == bad.base_offset
                assert "corrupt" in event["error"]
            for partition in range(PARTITIONS):
                expected = len(rolled[partition]) - (partition in (0, 1))
                await sidecar.wait_for(
                    "segment_tiered", count=expected, topic=topic_name, partition=partition
                )
            samples = await metric_samples(port)
            assert sample(samples, QUARANTINED) == 2
            assert sample(samples, "kafka_tiered_sidecar_quarantined_bytes") == (
                bad0.size + bad1.size
            )
            assert sample(samples, "kafka_tiered_sidecar_segment_read_retries_total") == 0

            # sidecar status, JSON and text (it exits 1 while the sidecar is not ready, which
            # may come after the first segments are tiered)
            await sidecar.wait_for("sidecar_ready")
            url = f"http://127.0.0.1:{port}/v1/status"
            code, out, _ = await _cli(env, "status", "--url", url, "--json")
            assert code == 0
            # the shared broker hosts other tests' topics too
            partitions = json.loads(out)["partitions"]
            rows = {r["partition"]: r for r in partitions if r["topic"] == topic_name}
            assert rows[0]["quarantined"] == [bad0.base_offset]
            assert rows[0]["quarantined_segments"][0]["local"] is True
            assert rows[0]["quarantined_segments"][0]["bytes"] == bad0.size
            assert rows[2]["quarantined"] == []
            code, out, _ = await _cli(env, "status", "--url", url)
            assert code == 0
            assert "QUARANTINED" in out
            assert (
                f"sidecar quarantine clear --topic {topic_name} --partition 0"
                f" --offset {bad0.base_offset}"
            ) in out

            # the file and `sidecar quarantine list`, keyed by topic id
            tips = {p: topic_id_partition(kafka.log_dir, topic_name, p) for p in (0, 1)}
            code, out, _ = await _cli(env, "quarantine", "list", "--config", str(config), "--json")
            assert code == 0
            listed = json.loads(out)["segments"]
            assert [(s["topic_id"], s["partition"], s["base_offset"]) for s in listed] == [
                (encode_kafka_uuid(tips[0].topic_id), 0, bad0.base_offset),
                (encode_kafka_uuid(tips[1].topic_id), 1, bad1.base_offset),
            ]

            # clear with the bytes still corrupt: checked again, quarantined again
            clear = ["quarantine", "clear", "--config", str(config), "--topic", topic_name]
            code, out, _ = await _cli(env, *clear, "--partition", "1")
            assert code == 0, out
            await sidecar.wait_for("quarantine_reloaded")
            await sidecar.wait_for(
                "segment_quarantined", count=2, topic=topic_name, partition=1, timeout=60
            )
            # repaired and cleared: tiered
            _flip_byte(bad1.log_path, 200)
            offset = ["--offset", str(bad1.base_offset)]
            code, out, _ = await _cli(env, *clear, "--partition", "1", *offset)
            assert code == 0, out
            await sidecar.wait_for(
                "segment_tiered",
                topic=topic_name,
                partition=1,
                base_offset=bad1.base_offset,
                timeout=60,
            )
            samples = await metric_samples(port)
            assert sample(samples, QUARANTINED) == 1
            assert sample(samples, "kafka_tiered_sidecar_quarantined_bytes") == bad0.size
            assert await sidecar.stop() == 0

            # a restart keeps the quarantine: a new segment of partition 0 tiers, the corrupt
            # one is not read again
            await produce(bootstrap, topic_name, count=1200, partition=0)
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-2.log")
            await sidecar.wait_for("segment_tiered", topic=topic_name, partition=0)
            samples = await metric_samples(port)
            assert sample(samples, QUARANTINED) == 1
            assert await sidecar.stop() == 0
            assert not sidecar.matching("segment_quarantined")
            assert not sidecar.matching("segment_upload_started", base_offset=bad0.base_offset)

            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m") as topic:
                await topic.read_to_end()
                for partition in range(PARTITIONS):
                    tip = topic_id_partition(kafka.log_dir, topic_name, partition)
                    finished = [m.start_offset for m in topic.finished(tip)]
                    expected = [s.base_offset for s in rolled[partition]]
                    if partition == 0:  # all but the corrupt first one, and the new one
                        assert finished[:-1] == expected[1:]
                        assert finished[-1] > expected[-1]
                    else:
                        assert finished == expected
            layout = KeyLayout(prefix=s3_prefix)
            parsed = [layout.parse(key) for key in bucket_keys(s3, s3_prefix)]
            assert None not in parsed
            assert bad0.base_offset not in {
                p.base_offset for p in parsed if p is not None and p.partition == 0
            }
        finally:
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)


class TestUnreadableSegment:
    """A read error is the disk's problem, not the bytes': retried, never quarantined."""

    async def test_transient_eio_is_retried_and_the_segment_finished(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """The first two reads of a segment fail with EIO: the sidecar logs and counts two
        retries (reason eio), then tiers every rolled segment, that one too; nothing is
        quarantined."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, partitions=1, configs=TOPIC_CONFIGS)
        sidecar = None
        try:
            await produce(bootstrap, topic_name, count=3200, partition=0)
            rolled = (await _rolled(kafka, topic_name, range(1)))[0]
            assert len(rolled) >= 2, rolled
            flaky = rolled[0]
            port = stack.free_port()
            config = _config(tmp_path, kafka, s3, topic_name, s3_prefix, port)
            env = {**sidecar_env(s3), READ_FAULT_ENV: f"{flaky.log_path}:2"}
            sidecar = await Sidecar.start(
                config, env, tmp_path / "sidecar.log", module="tests.read_faults"
            )
            retries = await sidecar.wait_for(
                "segment_read_retry", count=2, topic=topic_name, partition=0
            )
            assert {r["reason"] for r in retries} == {"eio"}
            assert all(r["path"] == str(flaky.log_path) for r in retries)
            await sidecar.wait_for(
                "segment_tiered", count=len(rolled), topic=topic_name, partition=0
            )
            samples = await metric_samples(port)
            assert (
                sample(samples, "kafka_tiered_sidecar_segment_read_retries_total", reason="eio")
                == 2
            )
            assert sample(samples, QUARANTINED) == 0
            assert await sidecar.stop() == 0
            assert not sidecar.matching("segment_quarantined")
            state = tmp_path / "state" / "quarantine.json"
            assert not state.exists() or json.loads(state.read_text())["segments"] == []

            async with MetadataTopic(bootstrap, f"__rlm_{topic_name}", tmp_path / "m") as topic:
                await topic.read_to_end()
                tip = topic_id_partition(kafka.log_dir, topic_name, 0)
                assert [(m.start_offset, m.end_offset) for m in topic.finished(tip)] == [
                    (s.base_offset, s.end_offset) for s in rolled
                ]
        finally:
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)


def _topic_id(partition_dir: Path) -> uuid.UUID | None:
    scan = scan_partition_dir(partition_dir) if partition_dir.is_dir() else None
    return None if scan is None or scan.topic_id is None else decode_kafka_uuid(scan.topic_id)


async def _delete_only(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` (not its metadata topic) and wait until the cluster no longer lists it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        deadline = time.monotonic() + 60
        while topic in set(await admin.list_topics()):  # Kafka has no event for it: poll
            assert time.monotonic() < deadline, f"{topic} still listed 60 s after its deletion"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


class TestRecreatedTopic:
    """The quarantine is keyed by topic id, not name."""

    async def test_recreated_topic_of_the_same_name_is_not_quarantined(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """Segment 0 of a topic is quarantined; the topic is deleted and created again under
        the same name: after a restart, the new topic's segment 0 is tiered."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(bootstrap, topic_name, partitions=1, configs=TOPIC_CONFIGS)
        sidecar = None
        try:
            await produce(bootstrap, topic_name, count=2200, partition=0)
            old = (await _rolled(kafka, topic_name, range(1)))[0]
            assert old[0].base_offset == 0
            old_tip = topic_id_partition(kafka.log_dir, topic_name, 0)
            _flip_byte(old[0].log_path, 200)
            port = stack.free_port()
            config = _config(tmp_path, kafka, s3, topic_name, s3_prefix, port)
            env = sidecar_env(s3)
            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-1.log")
            [event] = await sidecar.wait_for("segment_quarantined", topic=topic_name, partition=0)
            assert event["base_offset"] == 0
            assert await sidecar.stop() == 0

            await _delete_only(bootstrap, topic_name)
            await create_topic(bootstrap, topic_name, partitions=1, configs=TOPIC_CONFIGS)
            wait_for(
                lambda: (
                    _topic_id(kafka.log_dir / f"{topic_name}-0") not in (None, old_tip.topic_id)
                ),
                timeout=60,
                what="the re-created partition's directory with its new topic id",
            )
            await produce(bootstrap, topic_name, count=2200, partition=0)
            new = (await _rolled(kafka, topic_name, range(1)))[0]
            assert new[0].base_offset == 0

            sidecar = await Sidecar.start(config, env, tmp_path / "sidecar-2.log")
            await sidecar.wait_for("segment_tiered", topic=topic_name, partition=0, base_offset=0)
            await sidecar.wait_for("sidecar_ready")  # else `status` exits 1
            code, out, _ = await _cli(
                env, "status", "--url", f"http://127.0.0.1:{port}/v1/status", "--json"
            )
            assert code == 0
            [row] = [r for r in json.loads(out)["partitions"] if r["topic"] == topic_name]
            assert row["quarantined"] == []
            assert await sidecar.stop() == 0
            assert not sidecar.matching("segment_quarantined")

            # the old topic's entry stays until cleared, under its own id
            code, out, _ = await _cli(env, "quarantine", "list", "--config", str(config), "--json")
            assert code == 0
            assert [s["topic_id"] for s in json.loads(out)["segments"]] == [
                encode_kafka_uuid(old_tip.topic_id)
            ]
        finally:
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)
