"""The tools around the daemon on a SASL cluster: a broker with a SASL_PLAINTEXT listener
(PLAIN), `sidecar metadata decode -c FILE` with the file's [kafka] security settings, and the
Spark source's metadata read with Spark's `kafka.*` option names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from sidecar.spark._metadata_topic import read_metadata_events
from sidecar.spark._options import kafka_security
from tests.conftest import stack
from tests.helpers import create_topic

pytestmark = pytest.mark.integration

VECTORS = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "metadata-vectors.json").read_text()
)["recordVectors"]
JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required"


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A one-node broker with a PLAINTEXT listener (for setup) and a SASL_PLAINTEXT one where
    the user `audit` (password `audit-secret`) is the only one besides `admin`."""
    cluster = stack.KafkaCluster.create(tmp_path_factory.mktemp("sasl") / "kafka")
    node = cluster.nodes[0]
    sasl_port = stack.free_port()
    loop = stack.LOOPBACK
    cluster.overrides.update(
        {
            "listeners": f"PLAINTEXT://{loop}:{node.port},CONTROLLER://{loop}:"
            f"{node.controller_port},SASL_PLAINTEXT://{loop}:{sasl_port}",
            "advertised.listeners": f"PLAINTEXT://{loop}:{node.port},"
            f"SASL_PLAINTEXT://{loop}:{sasl_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": f'{JAAS} username="admin"'
            ' password="admin-secret" user_admin="admin-secret" user_audit="audit-secret";',
        }
    )
    cluster.start()
    try:
        yield {"plain": cluster.bootstrap_servers, "sasl": f"{loop}:{sasl_port}"}
    finally:
        cluster.stop()


async def _metadata_topic(bootstrap: str, name: str) -> int:
    """A metadata topic holding every reference vector; returns how many."""
    await create_topic(bootstrap, name, partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for vector in VECTORS:
            await producer.send_and_wait(name, bytes.fromhex(vector["expectedHex"]), partition=0)
    finally:
        await producer.stop()
    return len(VECTORS)


def _decode(config: Path, topic: str, password: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env["SIDECAR_KAFKA__SASL_PASSWORD"] = password
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "metadata",
            "decode",
            "-c",
            str(config),
            "--topic",
            topic,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


async def test_metadata_decode_over_sasl(sasl_kafka, tmp_path):
    """`metadata decode -c FILE` reads the topic through the SASL listener with the file's
    settings and the password from the environment; a wrong password is one line, exit 1."""
    count = await _metadata_topic(sasl_kafka["plain"], "__rlm_sasl_decode")
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'[kafka]\nbootstrap_servers = ["{sasl_kafka["sasl"]}"]\n'
        'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
        'sasl_username = "audit"\nrequest_timeout_ms = 10000\n'
    )
    result = _decode(config, "__rlm_sasl_decode", "audit-secret")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == count
    assert all("error" not in line for line in lines)

    refused = _decode(config, "__rlm_sasl_decode", "wrong")
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    assert "wrong" not in refused.stderr + refused.stdout  # the password is never printed


async def test_metadata_decode_of_an_undecodable_record_exits_1(sasl_kafka):
    """A record on the topic that is not a metadata value gets its own line with `error` (the
    lines stay one per record), one `sidecar: error:` line on stderr, and exit 1."""
    plain = sasl_kafka["plain"]
    count = await _metadata_topic(plain, "__rlm_undecodable")
    producer = AIOKafkaProducer(bootstrap_servers=plain)
    await producer.start()
    try:
        await producer.send_and_wait("__rlm_undecodable", b"\x01\xff", partition=0)
    finally:
        await producer.stop()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    command = ["metadata", "decode", "--bootstrap-server", plain, "--topic", "__rlm_undecodable"]
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", *command],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == count + 1
    assert all("error" not in line for line in lines[:-1])
    assert lines[-1]["value_hex"] == "01ff"
    assert result.stderr.strip() == (
        f'sidecar: error: 1 of {count + 1} values did not decode (their lines carry "error")'
    )


async def test_spark_metadata_read_over_sasl(sasl_kafka):
    """The Spark source's driver reads the metadata topic with Spark's kafka.* option names."""
    count = await _metadata_topic(sasl_kafka["plain"], "__rlm_sasl_spark")
    security = kafka_security(
        {
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": f'{JAAS} username="audit" password="audit-secret";',
        }
    )
    events, undecodable = await _in_thread(
        sasl_kafka["sasl"], "__rlm_sasl_spark", security.client_options()
    )
    assert len(events) + undecodable == count
    assert undecodable == 0


async def _in_thread(bootstrap: str, topic: str, options: dict[str, object]) -> tuple[list, int]:
    import asyncio

    return await asyncio.to_thread(
        read_metadata_events, bootstrap, topic, timeout_s=60, client_options=options
    )
