"""The broker restarts under load: a producer keeps writing, four socket readers keep reading
tiered records, and the (single) broker is stopped and started again under the running
sidecar. Readers never get a batch that fails its CRC or starts past the offset asked for;
the sidecar stays up, reports Kafka unreachable, recovers, and every segment rolled before,
during and after the restart ends with exactly one FINISHED copy, no orphan, no open upload."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from sidecar.kafka.records import decode_batches
from tests.e2e._support import Sidecar, clean_prefix, delete_topic
from tests.faults._scenario import converged, rolled, sidecar_config, wait_all_tiered
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]


async def _produce(bootstrap: str, topic: str, stop: asyncio.Event, counts: Counter[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        while not stop.is_set():
            try:
                for _ in range(100):
                    await producer.send(topic, value=os.urandom(1000), partition=0)
                await producer.flush()
                counts["produced"] += 100
            except KafkaError:
                counts["produce_errors"] += 1
            await asyncio.sleep(0.05)  # pacing, about 2 MB/s
    finally:
        with contextlib.suppress(KafkaError):
            await producer.stop()


async def _read(socket_path: Path, topic: str, stop: asyncio.Event, counts: Counter[str]) -> None:
    rng = random.Random()
    base = f"http://localhost/v1/topics/{topic}/partitions/0"
    connector = aiohttp.UnixConnector(path=str(socket_path))
    async with aiohttp.ClientSession(connector=connector) as http:
        while not stop.is_set():
            async with http.get(base) as response:
                tiered = (await response.json()).get("tiered") if response.status == 200 else None
            if not tiered:
                counts["nothing_tiered"] += 1
                await asyncio.sleep(0.2)
                continue
            offset = rng.randint(tiered["start_offset"], tiered["end_offset"])
            params = {"offset": str(offset), "max_bytes": str(128 * 1024)}
            async with http.get(base + "/records", params=params) as response:
                body = await response.read()
                counts[f"status_{response.status}"] += 1
            if response.status == 200:
                batches = list(decode_batches(body))  # raises on a CRC mismatch
                assert batches[0][0].last_offset >= offset
                assert batches[0][0].base_offset <= max(offset, tiered["start_offset"])


async def test_broker_restart_under_load(kafka, s3, topic_name, s3_prefix, tmp_path):
    assert kafka.cluster is not None, "the restart needs the native broker"
    bootstrap = kafka.bootstrap_servers
    await create_topic(
        bootstrap, topic_name, configs={"segment.bytes": "1048576", "segment.ms": "3600000"}
    )
    run = sidecar_config(tmp_path, kafka, s3, topic_name, s3_prefix)
    sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
    stop = asyncio.Event()
    counts: Counter[str] = Counter()
    tasks: list[asyncio.Task[None]] = []
    stopped = False
    try:
        await sidecar.wait_for("sidecar_ready", timeout=60)
        tasks.append(asyncio.create_task(_produce(bootstrap, topic_name, stop, counts)))
        await sidecar.wait_for("segment_tiered", count=2, timeout=120)
        tasks += [
            asyncio.create_task(_read(run.state_dir / "read.sock", topic_name, stop, counts))
            for _ in range(4)
        ]
        stopped = True
        await asyncio.to_thread(kafka.cluster.stop_node, 1)
        await sidecar.wait_for("cluster_refresh_failed", timeout=60)
        await asyncio.to_thread(kafka.cluster.start_node, 1)
        stopped = False
        await sidecar.wait_for("cluster_refresh_recovered", timeout=90)
        tiered_before = len(sidecar.matching("segment_tiered"))
        await sidecar.wait_for("segment_tiered", count=tiered_before + 2, timeout=120)
        stop.set()
        await asyncio.gather(*tasks)
        segments = await rolled(kafka, topic_name)
        await wait_all_tiered([sidecar], segments, timeout=120)
        outcome = await converged(kafka, s3, topic_name, s3_prefix, segments, tmp_path / "m")
        assert (outcome.segments_lost, outcome.duplicate_finished) == (0, 0), outcome
        assert (outcome.orphans, outcome.uploads_open) == (0, 0), outcome
        assert counts["status_200"] > 0, counts
        assert not sidecar.exited
        assert await sidecar.stop() == 0
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if stopped:
            await asyncio.to_thread(kafka.cluster.start_node, 1)
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
