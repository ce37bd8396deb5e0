"""Every command in the README's `sh` blocks runs against the local stack, unless the README
marks it `# not run: <why>` (on the command, or as the first line of its block).

The README's placeholders stand for the stack: `sidecar.toml` for a config of the test stack,
`b1:9092` for its broker, `/var/lib/kafka/data` for the broker's log dir,
`/var/lib/kafka-tiered-sidecar` for the sidecar's state dir, `orders` for a topic with tiered
segments, `ID` for a topic id. `sidecar run` starts the daemon in the background; the commands
after it run while it serves. Each command must exit 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.kafka.checkpoints import encode_kafka_uuid
from tests.conftest import stack
from tests.e2e._support import delete_topic
from tests.helpers import create_topic, produce

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "not run:"
_COMMENT = re.compile(r"\s+#\s")


def readme_commands() -> tuple[list[str], list[str]]:
    """The commands to run, and the skipped ones (each with its marker), in README order."""
    run: list[str] = []
    skipped: list[str] = []
    blocks = re.findall(r"^```sh\n(.*?)^```", README.read_text(), flags=re.M | re.S)
    for block in blocks:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if lines and lines[0].startswith("#") and MARKER in lines[0]:
            skipped += [f"{line}  ({lines[0]})" for line in lines[1:] if not line.startswith("#")]
            continue
        for line in lines:
            if line.startswith("#"):
                continue
            parts = _COMMENT.split(line, maxsplit=1)
            command = parts[0].strip()
            comment = parts[1] if len(parts) > 1 else ""
            if MARKER in comment:
                skipped.append(f"{command}  (# {comment})")
            else:
                run.append(command)
    return run, skipped


def test_readme_has_runnable_and_marked_commands():
    """The parser finds the README's commands, and every skipped one carries the marker."""
    run, skipped = readme_commands()
    assert any(c.startswith("sidecar run --config") for c in run)
    assert any(c.startswith("sidecar config check") for c in run)
    assert any(c.startswith("make test") for c in skipped)
    assert all(MARKER in c for c in skipped)


async def _wait_http(url: str, accept: object, *, timeout: float, proc: subprocess.Popen) -> dict:
    """Poll an HTTP JSON endpoint of the daemon until ``accept(document)``; the daemon has no
    event to await from outside, and the poll ends early if it exits."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            assert proc.poll() is None, "sidecar run exited"
            try:
                async with http.get(url) as response:
                    document = await response.json(content_type=None)
                    if callable(accept) and accept(response.status, document):
                        return document
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{url} did not reach the expected state in {timeout} s")
            await asyncio.sleep(0.2)


async def test_readme_commands_run_on_the_local_stack(kafka, s3, topic_name, s3_prefix, tmp_path):
    """Each unmarked README command exits 0 with the stack's values substituted."""
    bootstrap = kafka.bootstrap_servers
    await create_topic(bootstrap, topic_name, configs={"segment.bytes": "1048576"})
    await produce(bootstrap, topic_name, count=2500, value_size=1000, partition=0)
    state = tmp_path / "state"
    port = stack.free_port()
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'state_dir = "{state}"\n'
        f'[broker]\nlog_dirs = ["{kafka.log_dir}"]\n'
        f'[kafka]\nbootstrap_servers = ["{bootstrap}"]\nmetadata_refresh_interval_s = 1.0\n'
        f'[s3]\nendpoint_url = "{s3.endpoint}"\nbucket = "{s3.bucket}"\nprefix = "{s3_prefix}"\n'
        f"[metrics]\nport = {port}\n"
        f"[tiering]\nrescan_interval_s = 5\ninclude_topics = ['{re.escape(topic_name)}']\n"
        f"[remote_log_metadata]\nreplication_factor = 1\n"
    )
    substitutions = [
        ("sidecar.toml", str(config)),
        ("b1:9092", bootstrap),
        ("/var/lib/kafka-tiered-sidecar", str(state)),
        ("/var/lib/kafka/data", str(kafka.log_dir)),
        ("--topic orders", f"--topic {topic_name}"),
        ("/orders-0/", f"/{topic_name}-0/"),
        ("--topic-id ID", f"--topic-id {encode_kafka_uuid(uuid.uuid4())}"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        SIDECAR_S3__ACCESS_KEY_ID=s3.access_key,
        SIDECAR_S3__SECRET_ACCESS_KEY=s3.secret_key,
        SIDECAR_LOGGING__FORMAT="json",
    )
    commands, _ = readme_commands()
    daemon: subprocess.Popen | None = None
    ran: list[str] = []
    daemon_log = (tmp_path / "sidecar.log").open("wb")
    try:
        for command in commands:
            for placeholder, value in substitutions:
                command = command.replace(placeholder, value)
            if command.startswith("sidecar run "):
                assert daemon is None, "the README's runnable commands start one daemon"
                daemon = subprocess.Popen(
                    ["bash", "-c", f"exec {command}"],
                    cwd=tmp_path,
                    env=env,
                    stdout=daemon_log,
                    stderr=subprocess.STDOUT,
                )
                await _wait_http(
                    f"http://127.0.0.1:{port}/readyz",
                    lambda status, _doc: status == 200,
                    timeout=120,
                    proc=daemon,
                )

                def tiered(status: int, doc: dict) -> bool:
                    rows = [r for r in doc.get("partitions", []) if r["topic"] == topic_name]
                    return status == 200 and any(r["tiered_segments"] >= 1 for r in rows)

                await _wait_http(
                    f"http://127.0.0.1:{port}/v1/status", tiered, timeout=120, proc=daemon
                )
                ran.append(command)
                continue
            result = await asyncio.to_thread(
                subprocess.run,
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, (
                f"$ {command}\nrc={result.returncode}\n{result.stdout[-2000:]}\n"
                f"{result.stderr[-2000:]}"
            )
            # one-shot commands log at WARNING: no INFO chatter around their output
            assert '"level": "info"' not in result.stderr, f"$ {command}\n{result.stderr}"
            ran.append(command)
        assert daemon is not None
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.wait, 60) == 0
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        daemon_log.close()
        await delete_topic(bootstrap, topic_name)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            if "__remote_log_metadata" in await admin.list_topics():
                await admin.delete_topics(["__remote_log_metadata"])
        finally:
            await admin.close()
    assert len(ran) == len(commands)  # each ran, in order
