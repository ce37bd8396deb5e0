"""Destructive commands against the real broker: `sidecar delete-partition` refuses a partition
the topic does not have and one that still exists, asks before it publishes, and has a dry run;
nothing reaches the metadata topic unless the operator confirmed."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.e2e._support import delete_topic
from tests.helpers import create_topic

pytestmark = pytest.mark.e2e


def _config(tmp_path: Path, bootstrap: str, metadata_topic: str) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(
        f'[kafka]\nbootstrap_servers = ["{bootstrap}"]\n'
        f"[remote_log_metadata]\nreplication_factor = 1\nnum_partitions = 3\n"
        f'topic = "{metadata_topic}"\n'
    )
    return path


async def _cli(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin or b""), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _end_offsets(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(3)]
        return sum((await consumer.end_offsets(partitions)).values())
    finally:
        await consumer.stop()


async def test_delete_partition_guard_rails(kafka, topic_name, tmp_path):
    """On a 3-partition topic: partition 99 and a live partition are refused (exit 1, one
    line, nothing published); --dry-run shows the plan; without a terminal --yes is needed;
    --force --yes publishes."""
    bootstrap = kafka.bootstrap_servers
    metadata_topic = f"__rlm_{topic_name}"
    await create_topic(bootstrap, topic_name, partitions=3)
    config = str(_config(tmp_path, bootstrap, metadata_topic))
    base = ("delete-partition", "-c", config, "--topic", topic_name)
    try:
        rc, out, err = await _cli(*base, "--partition", "99", "--yes")
        assert rc == 1, err
        assert "has 3 partitions (0-2); partition 99 does not exist" in err
        assert len(err.strip().splitlines()) == 1
        assert out == ""

        rc, _, err = await _cli(*base, "--partition", "1", "--yes")
        assert rc == 1
        assert f"{topic_name}-1 still exists in the cluster" in err
        assert "--force" in err

        rc, _, err = await _cli(*base, "--partition", "1", "--force", "--yes")
        assert rc == 1
        assert f"the metadata topic {metadata_topic} does not exist" in err
        assert metadata_topic not in await _topics(bootstrap)
        await create_topic(bootstrap, metadata_topic, partitions=3)

        rc, out, err = await _cli(*base, "--partition", "1", "--force", "--dry-run")
        assert rc == 0, err
        assert out.startswith("dry run: will publish DELETE_PARTITION_MARKED")
        assert f"{metadata_topic}-" in out

        rc, _, err = await _cli(*base, "--partition", "1", "--force")  # stdin is no terminal
        assert rc == 1
        assert "pass --yes" in err
        assert await _end_offsets(bootstrap, metadata_topic) == 0  # nothing published so far

        rc, out, err = await _cli(*base, "--partition", "1", "--force", "--yes")
        assert rc == 0, err
        assert "DELETE_PARTITION_MARKED published" in out
        assert "will publish" in err  # the plan is shown even when not asked
        assert await _end_offsets(bootstrap, metadata_topic) == 1
    finally:
        await delete_topic(bootstrap, topic_name)
