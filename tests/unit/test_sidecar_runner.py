"""The test runner's safety net: a `sidecar run` that a test left running is killed after it."""

from __future__ import annotations

import os
import signal

import pytest

from tests.sidecar_runner import Sidecar, kill_leftovers

pytestmark = pytest.mark.timeout(120)


async def test_a_sidecar_left_running_is_killed(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[broker]\nlog_dirs = ["{log_dir}"]\n'
        '[kafka]\nbootstrap_servers = ["127.0.0.1:1"]\n[metrics]\nport = 0\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env["SIDECAR_LOGGING__FORMAT"] = "json"
    sidecar = await Sidecar.start(config, env, tmp_path / "sidecar.log", name="left")
    try:
        # no meta.properties in the log dir: it waits for the broker, for minutes
        await sidecar.wait_for("waiting_for_broker", timeout=90)
        assert kill_leftovers() == ["left"]
        assert await sidecar.wait_exit(timeout=30) == -signal.SIGKILL
        assert kill_leftovers() == []  # nothing twice
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
