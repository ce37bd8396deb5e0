"""The kernel's inotify watch limit below what the broker's log dir needs, for real: `sidecar run`
in a user namespace whose ``max_inotify_watches`` is lowered below the number of partition dirs
(a limit that caps every process of the namespace, like ``fs.inotify.max_user_watches`` on a
host). The daemon says so once, with the sysctl to raise, keeps running, and its full rescans
tier every segment that rolls afterwards; SIGTERM by PID still stops it cleanly."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.kafka.logdir import scan_partition_dir
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    delete_topic,
    metric_samples,
    readyz,
    sample,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic, produce
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

#: the topic's partition dirs: three times the watches allowed
PARTITIONS = 24
#: watches the namespace may hold; the detector needs one per partition dir plus the log dir
WATCH_LIMIT = 8
LIMIT_FILE = "/proc/sys/user/max_inotify_watches"


def _in_limited_namespace(limit: int) -> tuple[str, ...]:
    """The CLI call (``run --config ...`` is appended) in a new user namespace whose inotify
    watch limit is ``limit``; ``exec`` keeps one process, so the PID we hold is the daemon's."""
    script = f'echo {limit} > {LIMIT_FILE} && exec "$0" -m sidecar "$@"'
    return ("unshare", "-r", "sh", "-c", script, sys.executable)


def _check_namespace_limit(limit: int) -> None:
    """Fail (never skip) with what is missing when the limit cannot be lowered here."""
    assert shutil.which("unshare"), (
        "`unshare` (util-linux) is not on PATH: this test lowers the inotify watch limit in a"
        " user namespace with `unshare -r`"
    )
    probe = subprocess.run(
        ["unshare", "-r", "sh", "-c", f"echo {limit} > {LIMIT_FILE} && cat {LIMIT_FILE}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != str(limit):
        pytest.fail(
            f"`unshare -r` could not set {LIMIT_FILE} to {limit} (exit {probe.returncode}):"
            f" {probe.stderr.strip() or probe.stdout.strip()}. The test needs unprivileged user"
            " namespaces: user.max_user_namespaces > 0, and where they exist"
            " kernel.unprivileged_userns_clone=1 and kernel.apparmor_restrict_unprivileged_userns=0"
        )


def _rolled(log_dir: Path, topic: str) -> dict[int, list[Any]]:
    """Partition → its rolled (no longer active) segments, as the broker's files show them."""
    found: dict[int, list[Any]] = {}
    for partition in range(PARTITIONS):
        scan = scan_partition_dir(log_dir / f"{topic}-{partition}")
        assert scan is not None
        found[partition] = [s for s in scan.segments if not s.is_active]
    return found


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


async def test_watch_limit_below_partition_dirs(kafka, s3, topic_name, s3_prefix, tmp_path):
    """One ``inotify_watch_limit_reached`` warning naming the sysctl, no inotify hint ever, the
    daemon ready throughout, every segment rolled after its start tiered by the rescans alone,
    and exit 0 on SIGTERM sent to the PID that ``unshare`` started."""
    _check_namespace_limit(WATCH_LIMIT)
    log_dir = kafka.log_dir
    bootstrap = kafka.bootstrap_servers
    metadata_topic = f"__rlm_{topic_name}"
    await create_topic(
        bootstrap, topic_name, partitions=PARTITIONS, configs={"segment.bytes": "1048576"}
    )
    tips = [topic_id_partition(log_dir, topic_name, p) for p in range(PARTITIONS)]
    # the watches the detector needs: the log dir's and one per partition dir (every topic's)
    needed = 1 + sum(1 for d in log_dir.iterdir() if d.is_dir())
    assert needed > PARTITIONS > WATCH_LIMIT

    port = stack.free_port()
    config = write_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dir=log_dir,
        bootstrap=bootstrap,
        s3=s3,
        metrics_port=port,
        metadata_topic=metadata_topic,
        include_topics=[topic_name],
        prefix=s3_prefix,
        tiering={"rescan_interval_s": 1},
    )
    sidecar = await Sidecar.start(
        config,
        sidecar_env(s3),
        tmp_path / "sidecar.log",
        command=_in_limited_namespace(WATCH_LIMIT),
    )
    try:
        (warning,) = await sidecar.wait_for("inotify_watch_limit_reached", timeout=120)
        assert warning["level"] == "warning"
        assert "fs.inotify.max_user_watches" in warning["fix"]
        assert "rescan_interval_s" in warning["fallback"]
        await sidecar.wait_for("sidecar_ready", timeout=180)
        # the PID is the daemon itself (sh exec'd python): a signal to it reaches the sidecar
        assert _cmdline(sidecar.proc.pid)[1:5] == ["-m", "sidecar", "run", "--config"]
        # a hint may have come in the moment between the watches and the warning (the broker
        # creating the metadata topic's dirs); none after, the watches are gone
        hints = "kafka_tiered_sidecar_log_dir_events_total"
        hints_at_ready = sample(await metric_samples(port), hints)

        # every partition rolls at least once now, when no inotify watch is left to see it
        for partition in range(PARTITIONS):
            await produce(bootstrap, topic_name, count=1300, value_size=1000, partition=partition)
        rolled = _rolled(log_dir, topic_name)
        assert all(rolled.values()), {p: len(s) for p, s in rolled.items()}

        async with MetadataTopic(bootstrap, metadata_topic, tmp_path / "metadata") as topic:

            def all_finished() -> bool:
                return not topic.store.unfinished_copies() and all(
                    [(m.start_offset, m.end_offset) for m in topic.finished(tip)]
                    == [(s.base_offset, s.end_offset) for s in rolled[tip.partition]]
                    for tip in tips
                )

            await topic.wait_until(
                lambda: sidecar.exited or all_finished(),
                timeout=300,
                what="every rolled segment COPY_SEGMENT_FINISHED",
            )
        assert not sidecar.exited, sidecar.tail(60)
        status, body = await readyz(port)
        assert status == 200, body
        samples = await metric_samples(port)
        # the rolls were found by the rescans: not one inotify event came for them
        assert sample(samples, hints) == hints_at_ready
        assert samples[("kafka_tiered_sidecar_log_dir_hints", ())] == 0  # rescans only
        assert sample(samples, "kafka_tiered_sidecar_log_dir_scans_total", outcome="ok") > 1

        os.kill(sidecar.proc.pid, signal.SIGTERM)
        await sidecar.wait_for("sidecar_stopped", timeout=60)
        assert await sidecar.wait_exit(timeout=60) == 0
        assert len(sidecar.matching("inotify_watch_limit_reached")) == 1
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        await delete_topic(bootstrap, topic_name)
