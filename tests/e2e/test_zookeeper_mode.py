"""Standalone tiering on a Kafka 3.9 cluster in ZooKeeper mode (ZooKeeper from the same Maven
Central jars, brokers with zookeeper.connect and a version-0 meta.properties).

The sidecar, selecting the topic by `tiering.include_topics`, tiers its rolled segments: COPY
FINISHED events in its metadata topic, objects in S3. After the broker deleted its local copy of
the tiered range, the read socket and `sidecar read` serve the records from offset 0 from S3,
equal to what a consumer read before."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from sidecar.metadata.events import RemoteLogSegmentState
from sidecar.readserver import ReadClient
from tests.conftest import stack
from tests.e2e._support import MetadataTopic, bucket_keys, topic_id_partition
from tests.e2e.test_read_e2e import (
    _consume,
    _delete_records,
    _local_start,
    _read_all,
    _rolled,
)
from tests.helpers import create_topic, wait_for
from tests.sidecar_runner import Sidecar, sidecar_config, sidecar_env

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def kafka39_zk(stack_root: Path) -> Iterator[Any]:
    """A single Kafka 3.9.1 broker in ZooKeeper mode, with its ZooKeeper, on loopback."""
    cluster = stack.ZooKeeperKafkaCluster.create(stack_root / "kafka39-zk", nodes=1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


async def _produce(bootstrap: str, topic: str, count: int) -> None:
    """``count`` records of about 1 KiB to partition 0 in gzip, lz4 and zstd batches (random
    hex values hardly compress, so 1 MiB segments roll), headers on every other record."""
    for n, codec in enumerate(("gzip", "lz4", "zstd")):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type=codec)
        await producer.start()
        try:
            for i in range(n * count // 3, (n + 1) * count // 3):
                headers = [("codec", codec.encode())] if i % 2 else []
                value = os.urandom(512).hex().encode()
                await producer.send(topic, key=f"k{i}".encode(), value=value, headers=headers)
            await producer.flush()
        finally:
            await producer.stop()


async def test_standalone_tiering_and_reads_on_a_zookeeper_mode_cluster(
    kafka39_zk, s3, s3_prefix, topic_name, tmp_path
):
    """The sidecar tiers a ZooKeeper-mode 3.9 broker's rolled segments (FINISHED events,
    objects in S3) and serves them from offset 0 after the broker deleted them locally."""
    cluster = kafka39_zk
    bootstrap = cluster.bootstrap_servers
    log_dir = cluster.nodes[0].log_dir
    meta = (log_dir / "meta.properties").read_text()
    assert "version=0" in meta  # a ZooKeeper-mode log dir
    assert "broker.id=1" in meta
    await create_topic(bootstrap, topic_name, configs={"segment.bytes": str(1024 * 1024)})
    await _produce(bootstrap, topic_name, 6000)
    consumed = (await _consume(bootstrap, topic_name, range(1)))[0]
    assert len(consumed) == 6000
    rolled = _rolled(log_dir, topic_name, range(1))
    assert rolled >= 2

    metadata_topic = f"__rlm_{topic_name}"
    config = sidecar_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dirs=[log_dir],
        bootstrap=bootstrap,
        s3=s3,
        metrics_port=stack.free_port(),
        metadata_topic=metadata_topic,
        include_topics=[topic_name],
        prefix=s3_prefix,
        # DeleteRecords below stands for the broker's local retention; remote retention would
        # apply the log-start rule to the tiered range as well
        extra="[retention]\nenabled = false\n",
    )
    sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / "sidecar.log")
    socket = tmp_path / "state" / "read.sock"
    try:
        await sidecar.wait_for("segment_tiered", count=rolled, timeout=180, topic=topic_name)

        # FINISHED events in the metadata topic, one object set per segment in S3
        tip = topic_id_partition(log_dir, topic_name, 0)
        async with MetadataTopic(bootstrap, metadata_topic, tmp_path / "metadata") as events:
            await events.wait_until(
                lambda: len(events.finished(tip)) >= rolled, timeout=60, what="FINISHED events"
            )
            finished = events.finished(tip)
        assert finished[0].start_offset == 0
        assert all(s.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED for s in finished)
        logs = [k for k in bucket_keys(s3, s3_prefix) if k.endswith(".log")]
        assert len(logs) == len(finished)

        async with ReadClient(socket_path=socket) as client:
            rows, end = await _read_all(client, topic_name, 0)
            assert end == finished[-1].end_offset
            assert rows == consumed[: end + 1]
            # the broker deletes its local copy of the tiered range: the socket serves it from S3
            await _delete_records(bootstrap, topic_name, {0: end})
            wait_for(
                lambda: _local_start(log_dir, topic_name, 0) > end,
                timeout=60,
                what="the broker deleting the tiered segments",
            )
            rows, _ = await _read_all(client, topic_name, 0)
            assert rows == consumed[: end + 1]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar", "read", "--socket", str(socket),
            "--topic", topic_name, "--partition", "0", "--offset", "0", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        printed = [json.loads(line) for line in out.decode().splitlines()]
        assert [p["offset"] for p in printed] == [r[0] for r in consumed[: end + 1]]
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
