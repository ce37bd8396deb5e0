"""The health server's /metrics is rendered, and its /v1/status document encoded, off the
event loop: with many topic series or partitions either takes tens of milliseconds to seconds,
which on the loop would stall uploads, reads and /healthz alike. Gauges computed from state the
loop owns are read on the loop."""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import aiohttp
import pytest

from sidecar.app import _sample_tailer
from sidecar.observability import health
from sidecar.observability.health import HealthServer, Readiness
from sidecar.observability.metrics import Metrics

pytestmark = pytest.mark.timeout(60)


async def _scrape(metrics: Metrics) -> str:
    """One GET of /metrics from a health server serving ``metrics`` (200 expected)."""
    server = HealthServer(host="127.0.0.1", port=0, metrics=metrics, readiness=Readiness())
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    try:
        await server.started.wait()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.bound_port}/metrics") as response,
        ):
            assert response.status == 200
            return await response.text()
    finally:
        stopping.set()
        await task


async def test_the_loop_runs_while_metrics_render(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    loop_ran = threading.Event()
    seen: list[bool] = []
    render = health.generate_latest

    def slow_render(registry: Any) -> bytes:
        # the render waits for the loop to run a callback: only possible off the loop
        loop.call_soon_threadsafe(loop_ran.set)
        seen.append(loop_ran.wait(timeout=10))
        return render(registry)

    monkeypatch.setattr(health, "generate_latest", slow_render)
    metrics = Metrics()
    metrics.segments_copied.labels("orders").inc(3)
    body = await _scrape(metrics)
    assert seen == [True]
    assert 'kafka_tiered_sidecar_segments_copied_total{topic="orders"} 3.0' in body


class _Tailer:
    """The tailer's state the gauges read, noting the thread that reads it."""

    def __init__(self) -> None:
        self.readers: set[int] = set()

    def lag(self) -> int:
        self.readers.add(threading.get_ident())
        return 7

    @property
    def tracked(self) -> frozenset[int]:
        self.readers.add(threading.get_ident())
        return frozenset({1, 2})

    @property
    def stalled(self) -> frozenset[int]:
        self.readers.add(threading.get_ident())
        return frozenset({2})


async def test_the_tailer_gauges_are_read_on_the_loop() -> None:
    """The render thread must not iterate the tailer's sets while the loop changes them (a
    set that grows meanwhile raises, and the scrape fails): they are read before it."""
    metrics = Metrics()
    tailer = _Tailer()
    _sample_tailer(metrics, tailer)  # type: ignore[arg-type]
    body = await _scrape(metrics)
    assert "kafka_tiered_sidecar_metadata_store_lag_records 7.0" in body
    assert "kafka_tiered_sidecar_metadata_partitions_tracked 2.0" in body
    assert "kafka_tiered_sidecar_metadata_partitions_stalled 1.0" in body
    assert {threading.get_ident()} == tailer.readers


async def test_the_loop_runs_while_the_status_document_is_encoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A status document of thousands of partitions is megabytes of JSON: encoding it must
    leave the loop free."""
    loop = asyncio.get_running_loop()
    loop_ran = threading.Event()
    seen: list[bool] = []
    dumps = health.json.dumps

    def slow_dumps(document: Any) -> str:
        # the encoding waits for the loop to run a callback: only possible off the loop
        loop.call_soon_threadsafe(loop_ran.set)
        seen.append(loop_ran.wait(timeout=10))
        return dumps(document)

    monkeypatch.setattr(health, "json", types.SimpleNamespace(dumps=slow_dumps))
    server = HealthServer(host="127.0.0.1", port=0, metrics=Metrics(), readiness=Readiness())
    document = {"broker_id": 1, "partitions": [{"topic": "orders", "partition": 0}]}

    async def status() -> dict[str, Any]:
        return document

    server.status_provider = status
    stopping = asyncio.Event()
    task = asyncio.create_task(server.run(stopping))
    try:
        await server.started.wait()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.bound_port}/v1/status") as response,
        ):
            assert response.status == 200
            assert response.content_type == "application/json"
            assert document == await response.json()
    finally:
        stopping.set()
        await task
    assert seen == [True]
