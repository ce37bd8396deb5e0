"""Session fixtures that start the real components on loopback: Kafka (KRaft, Maven Central jars)
and SeaweedFS (S3), through the same script the README uses (``deploy/local/stack.py``).

A test that needs a component fails when the component cannot start: nothing skips. The
components start lazily, only when a selected test asks for them, and stop by PID at the end of
the session. With a reachable Docker engine (``STACK_BACKEND=auto|containers``) the single-node
broker and S3 run in containers through testcontainers instead.
"""

from __future__ import annotations

import importlib.util
import re
import secrets
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings

from tests.kafka_serde import (
    SERDE_REPORT,
    check_metadata_topics,
    close_shared_kafka_serde,
    kafka_serde,  # noqa: F401 - registers the fixture
)

REPO = Path(__file__).resolve().parent.parent

# No per-example deadline for property tests: on a loaded machine one slow example says
# nothing about correctness, and Hypothesis would fail the test as flaky for it
settings.register_profile("sidecar", deadline=None)
settings.load_profile("sidecar")


def _load_stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stack", REPO / "deploy" / "local" / "stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stack"] = module
    spec.loader.exec_module(module)
    return module


stack = _load_stack()


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI runner's cancel, `timeout`) ends the session as Ctrl-C does, so the
    # fixtures tear down: the brokers and S3 run in sessions of their own and would outlive
    # an interpreter that died of the signal
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@pytest.fixture(autouse=True)
def _no_sidecar_left() -> Iterator[None]:
    """A `sidecar run` a test started and did not stop (it failed before its cleanup took the
    process) is killed after it, so that it cannot go on tiering into the session's Kafka and
    S3 under the next tests."""
    yield
    from tests.sidecar_runner import kill_leftovers

    kill_leftovers()


@dataclass
class KafkaHandle:
    """What tests need from a running broker, whichever backend started it."""

    bootstrap_servers: str
    log_dirs: list[Path]
    cluster: Any | None  # stack.KafkaCluster for the native backend (node stop/start, tools)

    @property
    def log_dir(self) -> Path:
        return self.log_dirs[0]


@pytest.fixture(scope="session")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's stack keeps data dirs and logs (kept after the run for debugging)."""
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def kafka_libs() -> Path:
    """The directory of Kafka's jars (fetched with Maven into the home cache on first use)."""
    return Path(stack.kafka_libs())


@pytest.fixture(scope="session")
def _containers(stack_root: Path) -> Iterator[dict[str, Any] | None]:
    if stack.backend() != "containers":
        yield None
        return
    with stack.container_stack(stack_root / "containers") as handles:
        yield handles


@pytest.fixture(scope="session")
def kafka(stack_root: Path, _containers: dict[str, Any] | None) -> Iterator[KafkaHandle]:
    """A single-node KRaft broker on loopback with small segments (1 MiB, 10 s roll)."""
    if _containers is not None:
        yield KafkaHandle(_containers["bootstrap_servers"], _containers["log_dirs"], None)
        _serde_check("kafka", _containers["bootstrap_servers"])
        return
    cluster = stack.KafkaCluster.create(stack_root / "kafka", nodes=1)
    try:
        cluster.start()
        yield KafkaHandle(cluster.bootstrap_servers, cluster.log_dirs, cluster)
        _serde_check("kafka", cluster.bootstrap_servers)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3(stack_root: Path) -> Iterator[KafkaHandle]:
    """A three-node KRaft cluster on loopback (failover tests); always native processes.

    Leadership moves only when a test moves it: the controller's periodic preferred-leader
    election (every 300 s by default) would otherwise hand a partition back to a broker that a
    test restarted, at whatever moment the timer fires."""
    cluster = stack.KafkaCluster.create(
        stack_root / "kafka3", nodes=3, overrides={"auto.leader.rebalance.enable": "false"}
    )
    try:
        cluster.start(timeout=180.0)
        yield KafkaHandle(cluster.bootstrap_servers, cluster.log_dirs, cluster)
        _serde_check("kafka_cluster3", cluster.bootstrap_servers)
    finally:
        cluster.stop()


# --- the suite-wide metadata check: Kafka's serde reads every record we produced ---
# Tests delete their metadata topics through tests.e2e._support.delete_topic, which checks each
# one first; what is left on a cluster at the end of the session is checked here.


def _serde_check(name: str, bootstrap: str) -> None:
    """Decode every record of every metadata topic left on the cluster with Kafka's own
    RemoteLogMetadataSerde; fail the run (a teardown error), naming each record it refuses or
    reads differently from our decoder."""
    try:
        problems = check_metadata_topics(bootstrap)
    finally:
        close_shared_kafka_serde()
    if problems:
        shown = "\n  ".join(problems[:50])
        pytest.fail(f"{name}: Kafka's serde disagrees on {len(problems)} records:\n  {shown}")


@pytest.fixture(scope="session")
def s3(stack_root: Path, _containers: dict[str, Any] | None) -> Iterator[Any]:
    """SeaweedFS's S3 gateway on loopback with credentials enforced and the bucket created."""
    if _containers is not None:
        yield _containers["s3"]
        _leak_check(_containers["s3"])
        return
    server = stack.SeaweedS3.create(stack_root / "s3")
    try:
        server.start()
        yield server
        _leak_check(server)
    finally:
        server.stop()


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", text).strip("-")[:60]


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (test name + random suffix)."""
    return f"t-{_slug(request.node.name)}-{secrets.token_hex(3)}"


@pytest.fixture
def s3_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A bucket key prefix unique to this test; what the test leaves under it is removed after.

    The choice: tests whose subject is deletion (retention, topic and partition
    deletion, scrub) assert themselves that the sidecar's own deletion paths emptied their
    prefix before this teardown runs; for every other test this teardown is the cleanup, so
    that the session's leak check (:func:`_leak_check`) finds an empty bucket.
    """
    prefix = f"tests/{_slug(request.node.name)}-{secrets.token_hex(3)}/"
    yield prefix
    if "s3" in request.fixturenames:
        _clean_prefix(request.getfixturevalue("s3"), prefix)


# --- the suite-wide leak check ---------------------------------------------------

#: what the leak check saw at the end of the session: bucket → leaked keys / uploads
LEAK_REPORT: dict[str, dict[str, list[str]]] = {}


def _clean_prefix(s3: Any, prefix: str) -> None:
    """Abort every incomplete multipart upload and delete every object under ``prefix``."""
    client = s3.client()
    try:
        for upload in _uploads(client, s3.bucket, prefix):
            client.abort_multipart_upload(
                Bucket=s3.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        keys = _keys(client, s3.bucket, prefix)
        for i in range(0, len(keys), 1000):
            client.delete_objects(
                Bucket=s3.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )
    finally:
        client.close()


def _keys(client: Any, bucket: str, prefix: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _uploads(client: Any, bucket: str, prefix: str = "") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        page = client.list_multipart_uploads(**params)
        found += page.get("Uploads", [])
        markers = {
            name: page[f"Next{name}"]
            for name in ("KeyMarker", "UploadIdMarker")
            if page.get(f"Next{name}")
        }
        if not page.get("IsTruncated") or not markers:
            return found
        params.update(markers)


def _leak_check(s3: Any) -> None:
    """At the end of the session: every bucket of the session's S3 server must be empty, with
    no incomplete multipart upload. Fails the run (a teardown error), naming what leaked."""
    client = s3.client()
    try:
        buckets = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
        leaks: list[str] = []
        for bucket in buckets:
            keys = _keys(client, bucket)
            uploads = [f"{u['Key']} (upload {u['UploadId']})" for u in _uploads(client, bucket)]
            LEAK_REPORT[bucket] = {"objects": keys, "uploads": uploads}
            leaks += [f"s3://{bucket}/{k}" for k in keys]
            leaks += [f"s3://{bucket}/{u}" for u in uploads]
    finally:
        client.close()
    if leaks:
        shown = "\n  ".join(leaks[:200])
        more = f"\n  ... and {len(leaks) - 200} more" if len(leaks) > 200 else ""
        pytest.fail(
            f"leak check: {len(leaks)} objects/uploads left in the session's buckets"
            f" {buckets}:\n  {shown}{more}",
            pytrace=False,
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the leak check and the metadata check saw (when a test used S3 or Kafka)."""
    for bucket, found in LEAK_REPORT.items():
        terminalreporter.write_line(
            f"S3 leak check: bucket {bucket}: {len(found['objects'])} objects,"
            f" {len(found['uploads'])} incomplete multipart uploads left"
        )
    if SERDE_REPORT["topics"]:
        terminalreporter.write_line(
            f"metadata check: {SERDE_REPORT['records']} records of {SERDE_REPORT['topics']}"
            " metadata topics decoded by Kafka's RemoteLogMetadataSerde,"
            f" {len(SERDE_REPORT['problems'])} read differently or refused"
        )


# --- Spark: one local[2] session per test session, with Spark's Kafka source on it


@pytest.fixture(scope="session")
def spark_kafka_jars() -> list[Path]:
    """spark-sql-kafka-0-10 (matching the installed pyspark, or the newest published below it)
    and the deps pyspark does not ship, fetched with Maven into the home cache on first use."""
    return stack.spark_kafka_jars()


@pytest.fixture(scope="session")
def spark(spark_kafka_jars: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SparkSession local[2] bound to 127.0.0.1 (UI off), with the `kafka-tiered` source
    registered (Spark's Python filter pushdown conf on, for the reads that ask for pushdown)
    and Spark's `kafka` source on the classpath."""
    import os

    from pyspark.sql import SparkSession

    import sidecar.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv (pyarrow, sidecar)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafka-tiered-sidecar-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .config("spark.jars", ",".join(str(p) for p in spark_kafka_jars))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    sidecar.spark.register(session, filter_pushdown=True)
    try:
        yield session
    finally:
        session.stop()


__all__ = ["KafkaHandle", "stack"]
