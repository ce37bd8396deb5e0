"""Run `sidecar run` as a subprocess against the test stack and read its JSON log as it comes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def sidecar_config(
    path: Path,
    *,
    state_dir: Path,
    log_dirs: list[Path],
    bootstrap: str,
    s3: Any,
    metrics_port: int,
    metadata_topic: str,
    include_topics: list[str] = (),  # type: ignore[assignment]
    prefix: str = "",
    extra: str = "",
) -> Path:
    """Write a sidecar TOML file for the test stack (credentials go through the environment)."""
    dirs = ", ".join(f'"{d}"' for d in log_dirs)
    includes = ", ".join(json.dumps(t) for t in include_topics)
    path.write_text(
        f'state_dir = "{state_dir}"\n'
        f"[broker]\nlog_dirs = [{dirs}]\n"
        f'[kafka]\nbootstrap_servers = ["{bootstrap.replace(",", chr(34) + ", " + chr(34))}"]\n'
        f"metadata_refresh_interval_s = 1.0\n"
        f'[s3]\nendpoint_url = "{s3.endpoint}"\nbucket = "{s3.bucket}"\nprefix = "{prefix}"\n'
        f"part_size_bytes = 5242880\n"
        f"[metrics]\nport = {metrics_port}\n"
        f"[tiering]\nrescan_interval_s = 5\ninclude_topics = [{includes}]\n"
        f"[remote_log_metadata]\nreplication_factor = 1\nnum_partitions = 5\n"
        f'topic = "{metadata_topic}"\n' + extra
    )
    return path


def sidecar_env(s3: Any) -> dict[str, str]:
    return {
        **os.environ,
        "SIDECAR_S3__ACCESS_KEY_ID": s3.access_key,
        "SIDECAR_S3__SECRET_ACCESS_KEY": s3.secret_key,
        "SIDECAR_LOGGING__FORMAT": "json",
    }


#: `sidecar run` processes started here and not yet seen to exit: PID -> name
_STARTED: dict[int, str] = {}


def kill_leftovers() -> list[str]:
    """SIGKILL every `sidecar run` started by :meth:`Sidecar.start` that is still running
    (a test that failed before its cleanup held the process); the names of those killed."""
    killed = []
    for pid, name in list(_STARTED.items()):
        del _STARTED[pid]
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if b"run" not in cmdline.split(b"\0"):
            continue  # the PID is another process's by now
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(name)
    return killed


@dataclass
class Sidecar:
    """A `sidecar run` subprocess; a reader task keeps consuming its JSON log."""

    proc: asyncio.subprocess.Process
    log_path: Path
    name: str = "sidecar"
    events: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls,
        config: Path,
        env: dict[str, str],
        log_path: Path,
        *,
        name: str = "sidecar",
        module: str = "sidecar",
        command: tuple[str, ...] | None = None,
    ) -> Sidecar:
        """Start ``python -m <module> run --config <config>`` (``module`` may be a test
        wrapper of the sidecar's CLI, e.g. ``tests.read_faults``); ``command``, when given,
        replaces ``python -m <module>`` (``run --config <config>`` is appended to it)."""
        proc = await asyncio.create_subprocess_exec(
            *(command or (sys.executable, "-m", module)),
            "run",
            "--config",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        _STARTED[proc.pid] = name
        sidecar = cls(proc, log_path, name)
        sidecar._reader = asyncio.create_task(sidecar._read(), name=f"{name} log reader")
        return sidecar

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log_path.open("a") as out:
            while line := await self.proc.stdout.readline():
                text = line.decode(errors="replace")
                self.raw.append(text)
                out.write(text)
                out.flush()
                with contextlib.suppress(json.JSONDecodeError):
                    self.events.append(json.loads(text))
                self._changed.set()
        self._changed.set()

    @property
    def exited(self) -> bool:
        return self._reader is not None and self._reader.done()

    def matching(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("event") == name and all(e.get(k) == v for k, v in match.items())
        ]

    def tail(self, lines: int = 40) -> str:
        return f"--- last lines of {self.name}:\n" + "".join(self.raw[-lines:])

    async def wait_until(self, predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
        """Wait until ``predicate()`` holds, re-checked after every log line."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.exited:
                raise AssertionError(f"{self.name} exited before {what}\n{self.tail(60)}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout} s\n{self.tail()}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def wait_for(
        self, name: str, *, count: int = 1, timeout: float = 60, **match: Any
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` events ``name`` with the given fields were logged."""
        await self.wait_until(
            lambda: len(self.matching(name, **match)) >= count,
            timeout=timeout,
            what=f"{count} x {name} {match} (seen {len(self.matching(name, **match))})",
        )
        return self.matching(name, **match)[:count]

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signal the process and return its exit code (killed after ``timeout``)."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await self.wait_exit(timeout)

    async def wait_exit(self, timeout: float = 60) -> int:
        """Wait for the process to exit (killed after ``timeout``); its exit code."""
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            code = await self.proc.wait()
        _STARTED.pop(self.proc.pid, None)
        if self._reader is not None:
            await self._reader
        return code

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.stop(signal.SIGKILL)


@contextlib.asynccontextmanager
async def read_server(
    root: Path,
    config: Path,
    env: dict[str, str],
    name: str,
    *settings: str,
    logs: list[dict[str, Any]] | None = None,
) -> AsyncIterator[tuple[Path, int]]:
    """``python -m sidecar.readserver`` on its own socket and empty cache, until the block
    ends; yields (socket, pid). With ``logs``, the JSON log lines it wrote after it listened
    (up to its exit) are added to it."""
    socket = root / f"{name}.sock"
    cache = root / f"cache-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.readserver",
        "--config",
        str(config),
        "--set",
        f"read_server.socket_path={socket}",
        "--set",
        f"read_server.cache_dir={cache}",
        *[arg for setting in settings for arg in ("--set", setting)],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    drain: asyncio.Task[bytes] | None = None
    try:
        lines: list[bytes] = []
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            lines.append(line)
            if not line:
                raise RuntimeError("read server exited:\n" + b"".join(lines).decode())
            if b"read_server_listening" in line:
                break
        drain = asyncio.create_task(proc.stdout.read())
        yield socket, proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:  # stuck on SIGTERM: never leave it running
            proc.kill()
            await proc.wait()
        if drain is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(drain), 10)
            if drain.done() and logs is not None:
                for line in drain.result().splitlines():
                    with contextlib.suppress(ValueError):
                        logs.append(json.loads(line))
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
        shutil.rmtree(cache, ignore_errors=True)
