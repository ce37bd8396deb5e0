"""Full disks under the running daemon, each on its own small tmpfs (mounted for the test and
unmounted after it; the tests run as root, as CI does).

* The chunk cache's disk is full: reads are still served, from S3, with the right bytes.
* The state dir's disk is full while segments roll: the metadata store cannot commit, the
  daemon stays up, readiness turns false naming the metadata check, and a log line says why;
  once space returns it recovers, tiers what rolled meanwhile, and the SQLite store passes
  its integrity check.
"""

from __future__ import annotations

import base64
import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e._support import Sidecar, clean_prefix, delete_topic, readyz
from tests.faults._scenario import (
    backlog_topic,
    converged,
    rolled,
    sidecar_config,
    wait_all_tiered,
)
from tests.helpers import produce
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up to the last byte; the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def _value(i: int) -> bytes:
    return (f"{i:08d}".encode() * 126)[:1000]


async def test_a_full_cache_disk_still_serves_reads_from_s3(
    kafka, s3, topic_name, s3_prefix, tmp_path: Path
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name)
    with tmpfs(tmp_path / "cache", "1m") as cache:
        fill(cache)
        run = sidecar_config(
            tmp_path,
            kafka,
            s3,
            topic_name,
            s3_prefix,
            read_server={"cache_dir": str(cache), "chunk_size_bytes": 64 * 1024},
        )
        sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
        try:
            await wait_all_tiered([sidecar], segments, timeout=120)
            connector = aiohttp.UnixConnector(path=str(run.state_dir / "read.sock"))
            url = f"http://localhost/v1/topics/{topic_name}/partitions/0/records"
            async with aiohttp.ClientSession(connector=connector) as http:
                for offset in range(0, segments[-1].end_offset, 97):
                    params = {"offset": str(offset), "max_records": "1", "format": "json"}
                    async with http.get(url, params=params) as response:
                        document = await response.json()
                        assert response.status == 200, document
                    record = document["records"][0]
                    assert record["offset"] == offset
                    assert base64.b64decode(record["value"]) == _value(offset)
            assert not sidecar.exited
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)


async def test_a_full_state_disk_turns_readiness_false_and_recovers(
    kafka, s3, topic_name, s3_prefix, tmp_path: Path
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name)
    with tmpfs(tmp_path / "state", "8m") as state:
        run = sidecar_config(
            tmp_path,
            kafka,
            s3,
            topic_name,
            s3_prefix,
            read_server={"cache_dir": str(tmp_path / "cache")},
        )
        assert run.state_dir == state
        sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
        try:
            await wait_all_tiered([sidecar], segments, timeout=120)
            await sidecar.wait_for("sidecar_ready")
            filler = fill(state)
            await produce(bootstrap, topic_name, count=2300, partition=0)
            more = await rolled(kafka, topic_name)
            assert len(more) > len(segments)
            not_ready = await sidecar.wait_for("sidecar_not_ready", timeout=90)
            assert "metadata" in not_ready[0]["failing"], not_ready
            assert "full" in not_ready[0]["failing"]["metadata"], not_ready
            status, body = await readyz(run.metrics_port)
            assert status == 503
            assert body["checks"]["metadata"] is False
            assert not sidecar.exited
            filler.unlink()
            await sidecar.wait_for("sidecar_ready", count=2, timeout=90)
            outcome = await converged(
                kafka, s3, topic_name, s3_prefix, more, tmp_path / "m", timeout=120
            )
            assert (outcome.segments_lost, outcome.duplicate_finished) == (0, 0), outcome
            assert (outcome.orphans, outcome.uploads_open) == (0, 0), outcome
            assert await sidecar.stop() == 0
            db = sqlite3.connect(state / "metadata.sqlite3")
            try:
                assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            finally:
                db.close()
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)
