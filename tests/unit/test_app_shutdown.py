"""Phased shutdown: every task of the daemon's task groups ends once the daemon stops, so
the process exits on the first SIGTERM, whenever it comes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.app import Daemon
from sidecar.config import SidecarConfig

pytestmark = pytest.mark.timeout(60)


def _daemon(tmp_path: Path) -> Daemon:
    (tmp_path / "logs").mkdir()
    config = SidecarConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "broker": {"log_dirs": [str(tmp_path / "logs")], "broker_id": 1},
        }
    )
    return Daemon(config)


async def test_stopped_before_the_first_scan_the_waiter_for_it_ends(tmp_path: Path) -> None:
    """A SIGTERM during startup sets the stop before the detector's first scan: the detector
    then ends without scanning, and the task waiting for that scan must end too (the task
    group would otherwise wait for it for ever, past any drain deadline)."""
    daemon = _daemon(tmp_path)
    infra = daemon._infra_stop
    infra.set()
    async with asyncio.timeout(10):
        async with asyncio.TaskGroup() as tg:
            tg.create_task(daemon.detector.run(infra))
            tg.create_task(daemon._mark_ready_after_first_scan())
    assert not daemon.detector.scanned.is_set()
    assert daemon.readiness.snapshot()["log_dirs_scanned"] is False
