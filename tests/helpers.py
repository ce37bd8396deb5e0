"""Small async helpers for tests that talk to the real broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def create_topic(
    bootstrap: str,
    name: str,
    *,
    partitions: int = 1,
    replication: int = 1,
    configs: dict[str, str] | None = None,
) -> None:
    """Create a topic and wait until the broker reports it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, partitions, replication, topic_configs=configs or {})]
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = await admin.describe_topics([name])
            parts = described[0].get("partitions", []) if described else []
            if len(parts) == partitions and all(p.get("leader", -1) >= 0 for p in parts):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"topic {name} has no leaders after 30 s")
    finally:
        await admin.close()


async def produce(
    bootstrap: str,
    topic: str,
    *,
    count: int,
    value_size: int = 1000,
    partition: int | None = None,
    **producer_kwargs: object,
) -> list[int]:
    """Produce ``count`` keyed records (acks=all) and return their offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **producer_kwargs)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=(f"{i:08d}".encode() * (value_size // 8 + 1))[:value_size],
                key=f"key-{i}".encode(),
                partition=partition,
                headers=[("i", str(i).encode())],
            )
            for i in range(count)
        ]
        return [(await f).offset for f in futures]
    finally:
        await producer.stop()


def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll a filesystem condition (the broker gives no event for it) with a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def segment_files(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))
