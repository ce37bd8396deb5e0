"""`sidecar run` beside the real broker: it sees partitions and rolls, serves probes, stops on
SIGTERM, and never writes into the broker's log dir or prints its secrets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import stack
from tests.helpers import create_topic, produce

pytestmark = pytest.mark.e2e


class SidecarProcess:
    """A `sidecar run` subprocess whose JSON log lines are read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.proc = proc
        self.events: list[dict[str, object]] = []
        self.raw: list[str] = []
        self._log = log_path.open("w")

    async def next_event(self, name: str, *, timeout: float = 60, **match: object) -> dict:
        """Read log lines until an event named ``name`` with the given fields arrives."""
        for seen in self.events:
            if seen.get("event") == name and all(seen.get(k) == v for k, v in match.items()):
                self.events.remove(seen)
                return seen
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"no {name} {match} within {timeout} s; log:\n" + "".join(self.raw[-30:])
                )
            line = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            if not line:
                raise AssertionError(f"sidecar exited before {name}; log:\n" + "".join(self.raw))
            text = line.decode()
            self.raw.append(text)
            self._log.write(text)
            try:
                event = json.loads(text)
            except json.JSONDecodeError:
                continue
            if event.get("event") == name and all(event.get(k) == v for k, v in match.items()):
                return event
            self.events.append(event)

    async def drain(self) -> None:
        assert self.proc.stdout is not None
        rest = await self.proc.stdout.read()
        self.raw.append(rest.decode())
        self._log.write(rest.decode())
        self.close()

    def close(self) -> None:
        self._log.close()


def _snapshot(log_dir: Path, topic: str) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file in the topic's partition dirs, to prove the sidecar wrote
    nothing there. Only this topic's: other tests' topics share the broker, and the broker
    removes their ``-delete`` dirs at any time, also while a walk of the whole log dir runs."""
    found: dict[str, tuple[int, int]] = {}
    for partition_dir in log_dir.glob(f"{topic}-*"):
        for path in partition_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a checkpoint's .tmp, renamed
                info = path.stat()
                if stat.S_ISREG(info.st_mode):
                    found[str(path.relative_to(log_dir))] = (info.st_size, info.st_mtime_ns)
    return found


async def test_run_sees_partitions_and_rolls(kafka, s3, topic_name, s3_prefix, tmp_path):
    """The daemon reports the topic's partitions, sees new rolls, serves /metrics and /readyz,
    and exits 0 on SIGTERM without touching the log dir or logging a secret."""
    await create_topic(
        kafka.bootstrap_servers, topic_name, partitions=2, configs={"segment.bytes": "1048576"}
    )
    await produce(kafka.bootstrap_servers, topic_name, count=2500, value_size=1000, partition=0)

    port = stack.free_port()
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n'
        f'[broker]\nlog_dirs = ["{kafka.log_dir}"]\n'
        f'[kafka]\nbootstrap_servers = ["{kafka.bootstrap_servers}"]\n'
        f'[s3]\nendpoint_url = "{s3.endpoint}"\nbucket = "{s3.bucket}"\nprefix = "{s3_prefix}"\n'
        f"[metrics]\nport = {port}\n[tiering]\nrescan_interval_s = 3600\n"
        f"[remote_log_metadata]\nreplication_factor = 1\nnum_partitions = 5\n"
        f'topic = "__rlm_{topic_name}"\n'
    )
    env = {
        **os.environ,
        "SIDECAR_S3__ACCESS_KEY_ID": s3.access_key,
        "SIDECAR_S3__SECRET_ACCESS_KEY": s3.secret_key,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        "run",
        "--config",
        str(config),
        "--log-format",
        "json",
        "--log-level",
        "DEBUG",  # partition_discovered of the first scan is a DEBUG line
        stdout=asyncio.subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    sidecar = SidecarProcess(proc, tmp_path / "sidecar.log")
    try:
        p0 = await sidecar.next_event("partition_discovered", topic=topic_name, partition=0)
        assert p0["segments"] >= 3
        assert p0["rolled"] == p0["segments"] - 1
        assert p0["ready"] >= 1
        assert p0["broker_id"] == 1
        p1 = await sidecar.next_event("partition_discovered", topic=topic_name, partition=1)
        assert p1["segments"] == 1
        assert p1["rolled"] == 0
        await sidecar.next_event("log_dirs_scanned")
        await sidecar.next_event("sidecar_ready")
        # no include_topics and a broker without KIP-405: nothing is selected, and it says so
        unselected = await sidecar.next_event("no_partition_selected")
        assert unselected["level"] == "warning"
        assert "include_topics" in unselected["hint"]
        before = _snapshot(kafka.log_dir, topic_name)

        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 200, await r.text()
                body = await r.json()
                assert body["ready"] is True
                assert body["detail"]["selected_partitions"] == 0
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                families = {f.name: f for f in text_string_to_metric_families(await r.text())}
        watched = families["kafka_tiered_sidecar_partitions_watched"].samples[0].value
        assert watched >= 2
        assert families["kafka_tiered_sidecar_selected_partitions"].samples[0].value == 0

        # a roll on partition 1 is seen through inotify, long before the hour-long rescan
        await produce(kafka.bootstrap_servers, topic_name, count=1500, value_size=1000, partition=1)
        ready = await sidecar.next_event("segment_ready", topic=topic_name, partition=1)
        assert ready["base_offset"] == 0
        assert ready["end_offset"] >= 900

        proc.send_signal(signal.SIGTERM)
        await sidecar.next_event("sidecar_stopped", timeout=60)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        await sidecar.drain()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        sidecar.close()  # its log file, also when the test failed before the drain

    # the sidecar never writes into the log dir: every file it saw is unchanged except the
    # ones the broker itself appended to while we produced
    after = _snapshot(kafka.log_dir, topic_name)
    p0_dir = f"{topic_name}-0/"
    for name, meta in before.items():
        if name.startswith(p0_dir) and name in after:
            assert after[name] == meta, f"{name} changed"
    log_text = "".join(sidecar.raw)
    assert s3.secret_key not in log_text
    assert s3.access_key not in log_text
