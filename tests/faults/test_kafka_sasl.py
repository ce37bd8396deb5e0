"""SASL/SCRAM and SSL on the real broker: a single-node cluster of its own with SASL_PLAINTEXT
(SCRAM-SHA-256) and SSL listeners (a self-signed certificate made with keytool) next to its
PLAINTEXT one, through the stack's broker overrides; the SCRAM user is created with Kafka's own
ConfigCommand.

* SCRAM: the sidecar's clients authenticate and it tiers; with a wrong password it says the
  credentials are invalid (SaslAuthenticationFailed) and, at startup, exits 1. Neither
  password is in any log line (nor, with the right one, in a metric).
* SSL: with the broker's certificate as CA the sidecar tiers; with another CA it says the
  certificate does not verify.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import KafkaHandle, stack
from tests.e2e._support import Sidecar, clean_prefix
from tests.faults._scenario import backlog_topic, converged, sidecar_config, wait_all_tiered
from tests.sidecar_runner import sidecar_env

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

USER, PASSWORD = "tiering", "scram-secret-7c1e9a"
MECHANISM = "SCRAM-SHA-256"
STORE_PASSWORD = "keystore-pw-1"


def _keystore(directory: Path, name: str) -> Path:
    """A self-signed certificate for 127.0.0.1 in a PKCS12 keystore, and its PEM next to it."""
    directory.mkdir(parents=True, exist_ok=True)
    store = directory / f"{name}.p12"
    if not store.exists():
        subprocess.run(
            ["keytool", "-genkeypair", "-alias", name, "-keyalg", "RSA", "-keysize", "2048",
             "-validity", "2", "-dname", f"CN={name}", "-ext", "SAN=IP:127.0.0.1",
             "-storetype", "PKCS12", "-keystore", str(store), "-storepass", STORE_PASSWORD,
             "-keypass", STORE_PASSWORD],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        subprocess.run(
            ["keytool", "-exportcert", "-rfc", "-alias", name, "-keystore", str(store),
             "-storepass", STORE_PASSWORD, "-file", str(directory / f"{name}.pem")],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return store


@pytest.fixture(scope="module")
def sasl_kafka(stack_root: Path) -> Iterator[tuple[KafkaHandle, dict[str, str]]]:
    """A one-node cluster with PLAINTEXT, SASL_PLAINTEXT (SCRAM) and SSL listeners; the handle
    (PLAINTEXT bootstrap, for the test's own clients) and the SASL and SSL bootstraps."""
    root = stack_root / "kafka-sasl"
    cluster = stack.KafkaCluster.create(root, nodes=1)
    node = cluster.nodes[0]
    sasl_port, ssl_port = stack.free_port(), stack.free_port()
    host = stack.LOOPBACK
    keystore = _keystore(root / "tls", "broker")
    cluster.overrides.update(
        {
            "listeners": f"PLAINTEXT://{host}:{node.port},CONTROLLER://{host}:"
            f"{node.controller_port},SASL_PLAINTEXT://{host}:{sasl_port},SSL://{host}:{ssl_port}",
            "advertised.listeners": f"PLAINTEXT://{host}:{node.port},"
            f"SASL_PLAINTEXT://{host}:{sasl_port},SSL://{host}:{ssl_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(keystore),
            "ssl.keystore.password": STORE_PASSWORD,
            "ssl.key.password": STORE_PASSWORD,
        }
    )
    try:
        cluster.start()
        libs = Path(stack.kafka_libs(cluster.version))
        created = subprocess.run(
            cluster._java_cmd(
                libs, node,
                ["kafka.admin.ConfigCommand", "--bootstrap-server", cluster.bootstrap_servers,
                 "--alter", "--add-config", f"{MECHANISM}=[iterations=4096,password={PASSWORD}]",
                 "--entity-type", "users", "--entity-name", USER],
            ),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr[-3000:]
        handle = KafkaHandle(cluster.bootstrap_servers, cluster.log_dirs, cluster)
        yield handle, {"sasl": f"{host}:{sasl_port}", "ssl": f"{host}:{ssl_port}"}
    finally:
        cluster.stop()


def _sasl_run(tmp_path: Path, kafka: Any, sasl_bootstrap: str, s3: Any, topic: str, prefix: str):
    handle = KafkaHandle(sasl_bootstrap, kafka.log_dirs, None)
    return sidecar_config(
        tmp_path, handle, s3, topic, prefix,
        kafka_options={"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
                       "sasl_username": USER},
    )  # fmt: skip


def _secret_free(texts: list[str]) -> None:
    leaked = [t[:200] for t in texts if PASSWORD in t]
    assert not leaked, f"the SASL password appears in: {leaked}"


async def test_sidecar_authenticates_with_scram_and_tiers(
    sasl_kafka, s3, topic_name, s3_prefix, tmp_path
):
    kafka, bootstraps = sasl_kafka
    sasl_bootstrap = bootstraps["sasl"]
    segments = await backlog_topic(kafka, topic_name)
    run = _sasl_run(tmp_path, kafka, sasl_bootstrap, s3, topic_name, s3_prefix)
    env = {**sidecar_env(s3), "SIDECAR_KAFKA__SASL_PASSWORD": PASSWORD}
    sidecar = await Sidecar.start(run.config, env, tmp_path / "sidecar.log")
    try:
        await wait_all_tiered([sidecar], segments, timeout=120)
        outcome = await converged(kafka, s3, topic_name, s3_prefix, segments, tmp_path / "m")
        assert (outcome.segments_lost, outcome.duplicate_finished, outcome.orphans) == (0, 0, 0)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{run.metrics_port}/metrics") as r,
        ):
            metrics = await r.text()
        _secret_free([*sidecar.raw, metrics, run.config.read_text()])
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)


async def test_a_wrong_password_is_a_clear_error_without_the_secret(
    sasl_kafka, s3, topic_name, s3_prefix, tmp_path
):
    kafka, bootstraps = sasl_kafka
    sasl_bootstrap = bootstraps["sasl"]
    wrong = "wrong-" + PASSWORD
    run = _sasl_run(tmp_path, kafka, sasl_bootstrap, s3, topic_name, s3_prefix)
    env = {**sidecar_env(s3), "SIDECAR_KAFKA__SASL_PASSWORD": wrong}
    sidecar = await Sidecar.start(run.config, env, tmp_path / "sidecar.log")
    try:
        await sidecar.wait_until(
            lambda: any("uthentication" in line for line in sidecar.raw) or sidecar.exited,
            timeout=90,
            what="an authentication error",
        )
        lines = [line for line in sidecar.raw if "uthentication" in line]
        assert any("invalid credentials" in line for line in lines), sidecar.tail(40)
        # at startup a refused login ends the daemon (exit 1, sidecar_failed): a supervisor
        # restarts it, and the credentials can be fixed in between
        assert await sidecar.wait_exit(60) == 1
        assert sidecar.matching("sidecar_failed"), sidecar.tail(20)
        _secret_free(sidecar.raw)
        assert not any(wrong in line for line in sidecar.raw)
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)


@pytest.mark.parametrize("trusted", [True, False], ids=["broker-ca", "other-ca"])
async def test_sidecar_over_ssl(sasl_kafka, s3, topic_name, s3_prefix, tmp_path, trusted):
    """With the broker's certificate as its CA the sidecar tiers over the SSL listener; with
    another CA it says the certificate does not verify."""
    kafka, bootstraps = sasl_kafka
    tls = kafka.cluster.root / "tls"
    cafile = tls / "broker.pem"
    if not trusted:
        _keystore(tls, "stranger")
        cafile = tls / "stranger.pem"
    segments = await backlog_topic(kafka, topic_name)
    handle = KafkaHandle(bootstraps["ssl"], kafka.log_dirs, None)
    run = sidecar_config(
        tmp_path, handle, s3, topic_name, s3_prefix,
        kafka_options={"security_protocol": "SSL", "ssl_cafile": str(cafile)},
    )  # fmt: skip
    sidecar = await Sidecar.start(run.config, sidecar_env(s3), tmp_path / "sidecar.log")
    try:
        if trusted:
            await wait_all_tiered([sidecar], segments, timeout=120)
            outcome = await converged(kafka, s3, topic_name, s3_prefix, segments, tmp_path / "m")
            assert (outcome.segments_lost, outcome.duplicate_finished) == (0, 0)
            assert outcome.orphans == 0
            assert await sidecar.stop() == 0
        else:
            await sidecar.wait_until(
                lambda: any("CERTIFICATE_VERIFY_FAILED" in line for line in sidecar.raw),
                timeout=90,
                what="a certificate verification error",
            )
        _secret_free(sidecar.raw)
        assert not any(STORE_PASSWORD in line for line in sidecar.raw)
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        clean_prefix(s3, s3_prefix)
