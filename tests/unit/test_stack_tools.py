"""The local stack tells the user what to install when Java or Maven is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

STACK = Path(__file__).resolve().parents[2] / "deploy" / "local" / "stack.py"


def _run_fetch(tmp_path: Path, tools: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `stack.py fetch` with a PATH holding only the named tools and an empty cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"{tool} must exist on this machine for the test to mean anything"
        (bin_dir / tool).symlink_to(found)
    env = {
        **os.environ,
        "PATH": str(bin_dir),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "KAFKA_VERSION": "4.3.1",
    }
    return subprocess.run(
        [sys.executable, str(STACK), "--root", str(tmp_path / "stack"), "fetch"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


class TestMissingTools:
    def test_missing_java_says_what_to_install(self, tmp_path):
        """Without java on PATH, the stack exits 3 naming the package to install."""
        result = _run_fetch(tmp_path, [])
        assert result.returncode == 3
        assert "Java 17" in result.stderr
        assert "openjdk-17-jre-headless" in result.stderr

    def test_missing_maven_says_what_to_install(self, tmp_path):
        """With java but without mvn on PATH, the stack exits 3 naming Maven."""
        result = _run_fetch(tmp_path, ["java"])
        assert result.returncode == 3
        assert "Maven" in result.stderr
        assert "apt-get install -y maven" in result.stderr


class TestPluginBuild:
    def test_missing_maven_stops_the_build_saying_what_to_install(self, tmp_path):
        """`make plugin` (a step of both README commands) without Maven names the package to
        install instead of make's "No such file or directory"."""
        result = subprocess.run(
            ["make", "-s", "plugin", f"MVN={tmp_path / 'no-mvn'}"],
            cwd=STACK.parents[2],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode != 0
        assert "install Maven: sudo apt-get install -y maven" in result.stderr


class TestClusterId:
    def test_cluster_ids_never_start_with_a_dash(self):
        """Generated cluster ids are base64url UUIDs that StorageTool cannot mistake for flags."""
        from tests.conftest import stack

        ids = [stack._kafka_uuid() for _ in range(5000)]
        assert all(len(i) == 22 and not i.startswith("-") for i in ids)


class TestLogging:
    def test_both_log4j_generations_are_configured(self, tmp_path):
        """Kafka 3.x binds SLF4J to reload4j (log4j 1) and 4.x to log4j 2: the stack writes a
        config for each and passes both to the JVM, so the broker's "started" line reaches
        server.log whichever binding wins."""
        from tests.conftest import stack

        cluster = stack.KafkaCluster.create(tmp_path / "kafka", nodes=1, version="3.9.1")
        node = cluster.nodes[0]
        node.home.mkdir(parents=True)
        cluster._write_logging(node)
        log4j1 = (node.home / "log4j.properties").read_text()
        assert f"log4j.appender.file.File={node.log_file}" in log4j1
        assert str(node.log_file) in (node.home / "log4j2.properties").read_text()
        cmd = cluster._java_cmd(Path("/libs"), node, ["kafka.Kafka"])
        assert f"-Dlog4j.configuration={(node.home / 'log4j.properties').as_uri()}" in cmd
        assert f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}" in cmd


class TestJvmFlags:
    def test_benchmark_brokers_run_with_kafkas_own_jvm_flags(self, tmp_path):
        """Brokers of the tests start quickly (serial GC, first JIT tier); those of a benchmark
        (``production_jvm``) get the flags of Kafka's start scripts and a fixed heap."""
        from tests.conftest import stack

        cluster = stack.KafkaCluster.create(tmp_path / "kafka", nodes=1)
        node = cluster.nodes[0]
        quick = cluster._java_cmd(Path("/libs"), node, ["kafka.Kafka"])
        assert "-XX:TieredStopAtLevel=1" in quick
        assert "-XX:+UseSerialGC" in quick
        cluster.production_jvm = True
        cluster.heap = "1g"
        production = cluster._java_cmd(Path("/libs"), node, ["kafka.Kafka"])
        assert "-XX:TieredStopAtLevel=1" not in production
        assert "-XX:+UseSerialGC" not in production
        assert {"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Xmx1g", "-Xms1g"} <= set(production)
        assert production[-1] == "kafka.Kafka"


class TestFreePorts:
    def test_ports_come_from_below_the_ephemeral_range_and_never_twice(self):
        """A restarting test broker must find its port again: ports are picked below the
        range the kernel takes outgoing connections' source ports from, and handed out once."""
        from tests.conftest import stack

        floor = stack._ephemeral_floor()
        ports = [stack.free_port() for _ in range(50)]
        paired = [stack.free_port(also_free_offset=10000) for _ in range(10)]
        assert len(set(ports + paired + [p + 10000 for p in paired])) == 70
        if floor - 10000 - stack._PORT_FLOOR >= 1000:  # room below the range (Linux: 32768)
            assert all(stack._PORT_FLOOR <= p < floor for p in ports)
            assert all(p + 10000 < floor for p in paired)
        assert all(stack.port_is_free(p) for p in ports)

    def test_a_pid_file_names_only_the_process_it_recorded(self, tmp_path):
        """A PID file holds the PID with its start time: a PID the kernel has since given to
        another process (after a reboot) is not reported, so `down` cannot signal it."""
        from tests.conftest import stack

        path = tmp_path / "server.pid"
        stack.write_pid(path, os.getpid())
        assert stack.read_pid(path) == os.getpid()
        pid, ticks = path.read_text().split()
        path.write_text(f"{pid} {int(ticks) + 1}\n")  # the same PID, started at another time
        assert stack.read_pid(path) is None
        path.write_text(f"{pid}\n")  # written before start times were recorded: trusted
        assert stack.read_pid(path) == os.getpid()
        with subprocess.Popen(["sleep", "0"]) as gone:
            gone.wait()
        path.write_text(f"{gone.pid} {ticks}\n")  # no such process any more
        assert stack.read_pid(path) is None

    def test_without_room_below_the_range_ports_are_still_handed_out_once(self, monkeypatch):
        from tests.conftest import stack

        monkeypatch.setattr(stack, "_ephemeral_floor", lambda: 1024)
        ports = [stack.free_port() for _ in range(30)]
        paired = [stack.free_port(also_free_offset=7) for _ in range(5)]
        assert len(set(ports + paired + [p + 7 for p in paired])) == 40
        assert set(ports) <= stack._handed_out
