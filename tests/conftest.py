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
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.kafka_serde import kafka_serde  # noqa: F401 - registers the fixture

REPO = Path(__file__).resolve().parent.parent


def _load_stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stack", REPO / "deploy" / "local" / "stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stack"] = module
    spec.loader.exec_module(module)
    return module


stack = _load_stack()


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
        return
    cluster = stack.KafkaCluster.create(stack_root / "kafka", nodes=1)
    try:
        cluster.start()
        yield KafkaHandle(cluster.bootstrap_servers, cluster.log_dirs, cluster)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3(stack_root: Path) -> Iterator[KafkaHandle]:
    """A three-node KRaft cluster on loopback (failover tests); always native processes."""
    cluster = stack.KafkaCluster.create(stack_root / "kafka3", nodes=3)
    try:
        cluster.start(timeout=180.0)
        yield KafkaHandle(cluster.bootstrap_servers, cluster.log_dirs, cluster)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def s3(stack_root: Path, _containers: dict[str, Any] | None) -> Iterator[Any]:
    """SeaweedFS's S3 gateway on loopback with credentials enforced and the bucket created."""
    if _containers is not None:
        yield _containers["s3"]
        return
    server = stack.SeaweedS3.create(stack_root / "s3")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", text).strip("-")[:60]


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (test name + random suffix)."""
    return f"t-{_slug(request.node.name)}-{secrets.token_hex(3)}"


@pytest.fixture
def s3_prefix(request: pytest.FixtureRequest) -> str:
    """A bucket key prefix unique to this test."""
    return f"tests/{_slug(request.node.name)}-{secrets.token_hex(3)}/"


__all__ = ["KafkaHandle", "stack"]
