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
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            described = await admin.describe_topics([name])
            parts = described[0].get("partitions", []) if described else []
            if len(parts) == partitions and all(p.get("leader", -1) >= 0 for p in parts):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"topic {name} has no leaders after 60 s")
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


class OneDocumentServer:
    """An HTTP server on loopback (a thread) that answers every GET with one document, and
    counts the requests; ``url`` names ``path`` on it. A context manager."""

    def __init__(self, body: bytes, *, path: str, content_type: str) -> None:
        import http.server
        import threading

        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.requests = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OneDocumentServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
