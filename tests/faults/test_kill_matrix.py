"""kill -9 at every step of the copy and delete state machines, then a restart.

The first run is ``python -m tests.faults.killpoint_runner --point P``: the sidecar itself,
with wrappers installed from outside that SIGKILL it the first time it reaches ``P``
(deterministic: the step, not a timer, decides). The second run is a plain ``sidecar run``
on the same state dir. Every rolled segment ends with exactly one FINISHED copy (0 lost,
0 duplicated), no unfinished copy or delete, no object outside a FINISHED copy (0 orphaned)
and no open multipart upload.

The delete points are reached on the failure path of a copy: the fault proxy fails the
manifest PUT of the first copy more often than its retries absorb, the uploader abandons the
copy (DELETE_SEGMENT_STARTED → delete → DELETE_SEGMENT_FINISHED) and is killed inside that.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._support import Sidecar, clean_prefix, delete_topic
from tests.faults._harness import REPO, FaultProxy
from tests.faults._scenario import backlog_topic, converged, sidecar_config
from tests.faults.killpoint_runner import POINTS
from tests.helpers import create_topic, produce
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

DELETE_POINTS = ("after_delete_started", "mid_deletes", "after_deletes")


async def _killed_run(point: str, config: Path, env: dict[str, str], log: Path) -> Sidecar:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.faults.killpoint_runner", "--point", point,
        "--", "run", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    sidecar = Sidecar(proc, log, f"killed at {point}")
    sidecar._reader = asyncio.create_task(sidecar._read())
    return sidecar


@pytest.mark.parametrize("point", list(POINTS))
async def test_kill_at_every_step_converges_after_restart(
    kafka, s3, s3_proxied, fault_proxy: FaultProxy, topic_name, s3_prefix, tmp_path, point
):
    bootstrap = kafka.bootstrap_servers
    if point == "mid_multipart":  # a .log over twice the 5 MiB part size: three parts
        await create_topic(
            bootstrap,
            topic_name,
            configs={"segment.bytes": str(12 * 1024 * 1024), "segment.ms": "3600000"},
        )
        await produce(bootstrap, topic_name, count=13000, partition=0)
        from tests.faults._scenario import rolled

        segments = await rolled(kafka, topic_name)
    else:
        segments = await backlog_topic(kafka, topic_name)
    assert segments
    if point in DELETE_POINTS:
        fault_proxy.set(
            {"fault": "internal_error", "op": "PutObject", "key": r"manifest\.json$", "count": 4}
        )
    run = sidecar_config(tmp_path, kafka, s3_proxied, topic_name, s3_prefix)
    env = sidecar_env(s3)
    first = await _killed_run(point, run.config, env, tmp_path / "killed.log")
    second = None
    try:
        reached = await first.wait_for("killpoint_reached", timeout=120)
        assert reached[0]["point"] == point
        assert await first.wait_exit(30) == -9
        fault_proxy.clear()
        second = await Sidecar.start(run.config, env, tmp_path / "restarted.log")
        await second.wait_for("sidecar_ready", timeout=60)
        outcome = await converged(
            kafka, s3, topic_name, s3_prefix, segments, tmp_path / "m", timeout=120
        )
        assert outcome.segments_lost == 0, outcome
        assert outcome.duplicate_finished == 0, outcome
        assert outcome.orphans == 0, outcome
        assert outcome.uploads_open == 0, outcome
        assert not second.matching("task_failed")
        assert await second.stop() == 0
    finally:
        for sidecar in (first, second):
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
