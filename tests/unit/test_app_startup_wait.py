"""The daemon beside a broker that is not there yet (a pod whose sidecar starts first): it
serves /healthz and waits, for the broker's meta.properties and then for Kafka, within
``broker.startup_wait_s``; SIGTERM ends the wait cleanly, and after the wait the error that
ended it is the one it always was."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)


class _Daemon:
    """``sidecar run`` as a subprocess, its JSON log lines read as events."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, tmp_path: Path, log_dir: Path, *extra: str) -> _Daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sidecar",
            "run",
            "--log-dir",
            str(log_dir),
            "--bootstrap-server",
            "127.0.0.1:1",  # refused at once: no Kafka there
            "--set",
            f"state_dir={tmp_path / 'state'}",
            "--set",
            "metrics.port=0",
            "--set",
            "s3.endpoint_url=http://127.0.0.1:1",
            "--log-format",
            "json",
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        return cls(proc)

    async def event(self, name: str, **match: object) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
            if not line:
                raise AssertionError(f"exited before {name}; log:\n" + "".join(self.lines))
            self.lines.append(line.decode())
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == name and all(event.get(k) == v for k, v in match.items()):
                return dict(event)

    async def exit_code(self) -> int:
        assert self.proc.stdout is not None
        rest = await asyncio.wait_for(self.proc.stdout.read(), 60)
        self.lines.append(rest.decode())
        return await asyncio.wait_for(self.proc.wait(), 60)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


async def test_it_waits_for_the_broker_then_for_kafka_and_stops_on_sigterm(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    daemon = await _Daemon.start(tmp_path, log_dir)
    try:
        listening = await daemon.event("health_server_listening")
        await daemon.event("waiting_for_broker", waiting_for="the broker's meta.properties")
        status, _ = await asyncio.to_thread(_get, listening["port"], "/healthz")
        assert status == 200
        status, ready = await asyncio.to_thread(_get, listening["port"], "/readyz")
        assert status == 503
        assert "meta.properties" in ready["failing"]["startup"]
        # the broker formats its storage: the daemon goes on, and waits for Kafka next
        (log_dir / "meta.properties").write_text("version=1\nnode.id=7\ncluster.id=abc\n")
        starting = await daemon.event("sidecar_starting")
        assert starting["broker_id"] == 7
        await daemon.event("waiting_for_broker", waiting_for="Kafka")
        daemon.proc.send_signal(signal.SIGTERM)
        assert await daemon.exit_code() == 0
    finally:
        daemon.kill()


async def test_after_the_wait_the_error_ends_the_daemon_as_before(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    started = time.monotonic()
    daemon = await _Daemon.start(tmp_path, log_dir, "--set", "broker.startup_wait_s=1")
    try:
        await daemon.event("waiting_for_broker")
        failed = await daemon.event("sidecar_failed")
        assert failed["error_type"] == "ConfigError"
        assert "meta.properties" in failed["error"]
        assert await daemon.exit_code() == 2
    finally:
        daemon.kill()
    assert time.monotonic() - started >= 1.0
