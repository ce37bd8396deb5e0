"""The local read socket against other users and hostile requests, on the real daemon.

* A process of another uid (nobody, through ``setpriv``) cannot connect to the 0660 socket
  (EACCES), even with every directory above it searchable; root (the owner) can.
* Path traversal in the topic, partition, segment id and index type, hostile topic names and
  query values: every answer is a 4xx with a JSON error, the daemon keeps serving, and no
  file outside the chunk cache is created, changed or read into a response.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from tests.e2e._support import Sidecar, clean_prefix, delete_topic
from tests.faults._scenario import backlog_topic, sidecar_config, wait_all_tiered
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

_CONNECT = """
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
else:
    print("connected")
"""

HOSTILE_PATHS = [
    "/v1/topics/..%2F..%2Fetc%2Fpasswd/partitions/0/records?offset=0",
    "/v1/topics/../../etc/passwd/partitions/0/records?offset=0",
    "/v1/topics/%2e%2e/partitions/0/records?offset=0",
    "/v1/topics/a%00b/partitions/0/records?offset=0",
    "/v1/topics/" + "x" * 300 + "/partitions/0/records?offset=0",
    "/v1/topics/t%C3%A9st/partitions/0/records?offset=0",
    "/v1/topics/{t}/partitions/-1/records?offset=0",
    "/v1/topics/{t}/partitions/99999999999999999999/records?offset=0",
    "/v1/topics/{t}/partitions/0/records?offset=-1",
    "/v1/topics/{t}/partitions/0/records?offset=1e99",
    "/v1/topics/{t}/partitions/0/records?offset=0&max_bytes=0",
    "/v1/topics/{t}/partitions/0/records?offset=0&format=../../x",
    "/v1/topics/{t}/partitions/0/records?offset=0&isolation=%00",
    "/v1/topics/{t}/partitions/0/records?offset=0&offset=1",
    "/v1/topics/{t}/partitions/0/records?offset=0&evil=1",
    "/v1/topics/{t}/partitions/0/segments/..%2F..%2Fmetadata.sqlite3/log",
    "/v1/topics/{t}/partitions/0/segments/../../metadata.sqlite3",
    "/v1/topics/{t}/partitions/0/segments/{sid}/indexes/..%2F..%2Fmetadata.sqlite3",
    "/v1/topics/{t}/partitions/0/segments/{sid}/indexes/%2e%2e",
    "/v1/topics/{t}/partitions/0/segments/{sid}/log?start=-5",
    "/v1/topics/{t}/partitions/0/offsets?timestamp=abc",
]


def _tree(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` but ``skip``: path → (size, mtime)."""
    found = {}
    for directory, _dirs, files in os.walk(root):
        if Path(directory) == skip or skip in Path(directory).parents:
            continue
        for name in files:
            path = Path(directory) / name
            with_stat = path.lstat()
            if stat.S_ISREG(with_stat.st_mode):
                found[str(path)] = (with_stat.st_size, with_stat.st_mtime_ns)
    return found


async def test_other_users_and_hostile_requests_are_refused(
    kafka, s3, topic_name, s3_prefix, tmp_path: Path
):
    bootstrap = kafka.bootstrap_servers
    segments = await backlog_topic(kafka, topic_name)
    sockets = Path(tempfile.mkdtemp(prefix="faults-sock-", dir="/tmp"))
    sockets.chmod(0o755)  # searchable by anyone: only the socket's own mode may refuse
    socket_path = sockets / "read.sock"
    cache = tmp_path / "cache"
    run = sidecar_config(
        tmp_path,
        kafka,
        s3,
        topic_name,
        s3_prefix,
        read_server={"socket_path": str(socket_path), "cache_dir": str(cache)},
    )
    sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
    try:
        await wait_all_tiered([sidecar], segments, timeout=120)
        await sidecar.wait_for("read_server_listening", timeout=60)
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660
        nobody = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                _CONNECT,
                str(socket_path),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert nobody.stdout.strip() == "EACCES", (nobody.stdout, nobody.stderr)
        owner = subprocess.run(
            ["python3", "-c", _CONNECT, str(socket_path)],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        assert owner.stdout.strip() == "connected"

        before = _tree(tmp_path, cache)
        secret = (run.state_dir / "metadata.sqlite3").read_bytes()[:16]
        connector = aiohttp.UnixConnector(path=str(socket_path))
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.get(
                f"http://localhost/v1/topics/{topic_name}/partitions/0/segments"
            ) as r:
                sid = (await r.json())["segments"][0]["segment_id"]
            statuses = {}
            for template in HOSTILE_PATHS:
                path = template.replace("{t}", quote(topic_name)).replace("{sid}", sid)
                async with http.get(f"http://localhost{path}") as response:
                    body = await response.read()
                    statuses[path] = response.status
                    assert 400 <= response.status < 500, (path, response.status, body[:300])
                    assert secret not in body
                    assert b"root:" not in body
            async with http.get(f"http://localhost/v1/topics/{topic_name}/partitions/0") as r:
                assert r.status == 200  # still serving
        after = _tree(tmp_path, cache)
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)} - {
            str(tmp_path / "sidecar.log")
        }
        changed = {p for p in changed if not p.startswith(str(run.state_dir / "metadata"))}
        assert not changed, changed
        assert not sidecar.exited
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
        await delete_topic(bootstrap, topic_name)
        for leftover in sockets.iterdir():
            leftover.unlink()
        sockets.rmdir()
