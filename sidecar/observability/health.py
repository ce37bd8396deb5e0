"""The metrics and health HTTP server: ``/metrics``, ``/healthz`` (alive), ``/readyz`` and
``/v1/status`` (the status document, when the daemon has installed a provider).

Readiness is the conjunction of named checks that other components register and update
(``readiness.set("s3", False, reason="...")``). ``/readyz`` answers 200 or 503 with every check,
the failing ones and why; each check is also the ``readiness_check{check}`` gauge. The server
binds the configured host (127.0.0.1 by default). It does no domain work: it only reports what
others recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics

__all__ = ["HealthServer", "Readiness"]

log = get_logger(__name__)


def _encode_json(document: Any) -> bytes:
    return json.dumps(document).encode()


class Readiness:
    """Named readiness checks; the sidecar is ready when every registered check is true."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._checks: dict[str, bool] = {}
        self._reasons: dict[str, str] = {}
        self._details: dict[str, object] = {}
        self._metrics = metrics

    def set_detail(self, name: str, value: object) -> None:
        """A fact shown under ``detail`` on /readyz that does not decide readiness."""
        self._details[name] = value

    def details(self) -> dict[str, object]:
        return dict(self._details)

    def register(self, name: str) -> None:
        if name not in self._checks:
            self._checks[name] = False
            self._reasons[name] = "not checked yet"
            self._export(name)

    def set(self, name: str, ok: bool, *, reason: str | None = None) -> bool:
        """Record a check; returns whether it changed. ``reason`` says why it fails."""
        changed = self._checks.get(name) is not ok
        self._checks[name] = ok
        if ok:
            self._reasons.pop(name, None)
        else:
            self._reasons[name] = reason or "failing"
        self._export(name)
        return changed

    def _export(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.readiness_checks.labels(name).set(1 if self._checks[name] else 0)

    @property
    def ready(self) -> bool:
        return bool(self._checks) and all(self._checks.values())

    def snapshot(self) -> dict[str, bool]:
        return dict(self._checks)

    def failing(self) -> dict[str, str]:
        """The failing checks and why."""
        return {
            name: self._reasons.get(name, "failing") for name, ok in self._checks.items() if not ok
        }


class HealthServer:
    """aiohttp server for metrics and probes, run as a root task until ``stopping`` is set."""

    def __init__(self, *, host: str, port: int, metrics: Metrics, readiness: Readiness) -> None:
        self._host = host
        self._port = port
        self._metrics = metrics
        self._readiness = readiness
        self.bound_port: int | None = None
        self.started = asyncio.Event()
        #: builds the ``/v1/status`` document; installed by the daemon once its parts exist
        self.status_provider: Callable[[], Awaitable[Any]] | None = None

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._handle_metrics)
        app.router.add_get("/healthz", self._handle_healthz)
        app.router.add_get("/readyz", self._handle_readyz)
        app.router.add_get("/v1/status", self._handle_status)
        return app

    async def _handle_status(self, request: web.Request) -> web.Response:
        if self.status_provider is None:
            return web.json_response(
                {"code": "starting", "message": "the sidecar is still starting"}, status=503
            )
        document = await self.status_provider()
        # one row per partition: with thousands of partitions the JSON is megabytes, whose
        # encoding would hold the loop for tens of milliseconds
        body = await asyncio.to_thread(_encode_json, document)
        return web.Response(body=body, content_type="application/json")

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        # gauges read from the loop's state are set here, on the loop; the render is off
        # the loop: with many topics it takes tens of milliseconds (the metrics are locked
        # per family, so the loop's updates meanwhile are safe)
        self._metrics.sample()
        body = await asyncio.to_thread(generate_latest, self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _handle_readyz(self, request: web.Request) -> web.Response:
        checks = self._readiness.snapshot()
        status = 200 if self._readiness.ready else 503
        body = {
            "ready": status == 200,
            "checks": checks,
            "failing": self._readiness.failing(),
            "detail": self._readiness.details(),
        }
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    async def run(self, stopping: asyncio.Event) -> None:
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port, reuse_address=True)
            await site.start()
            server = site._server
            sockets = getattr(server, "sockets", None) or []
            self.bound_port = int(sockets[0].getsockname()[1]) if sockets else self._port
            log.info("health_server_listening", host=self._host, port=self.bound_port)
            self.started.set()
            await stopping.wait()
        finally:
            await runner.cleanup()
