"""The local stack fetches Maven when it is missing, and tells the user what to install when
Java is missing or Maven cannot be fetched."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest

from tests.helpers import OneDocumentServer

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

    def test_missing_maven_that_cannot_be_fetched_says_what_to_install(self, tmp_path, monkeypatch):
        """Without mvn on PATH and with Maven Central out of reach, the error names Maven and
        the package to install, and why the fetch failed."""
        from tests.conftest import stack

        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "java").symlink_to(shutil.which("java"))
        monkeypatch.setenv("PATH", str(bin_dir))
        monkeypatch.setattr(stack, "CACHE", tmp_path / "cache")
        monkeypatch.setattr(stack, "MAVEN_URL", f"http://127.0.0.1:{_closed_port()}/maven.tar.gz")
        with pytest.raises(stack.MissingToolError) as caught:
            stack.require_maven()
        assert "apt-get install -y maven" in str(caught.value)
        assert "Connection refused" in str(caught.value)
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _maven_archive(tmp_path: Path, *members: tuple[str, bytes]) -> bytes:
    """A tar.gz shaped like Maven's binary archive, with ``members`` (name, content) in it."""
    path = tmp_path / "archive.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(content))
    return path.read_bytes()


def _served(body: bytes) -> OneDocumentServer:
    """One archive served over HTTP on loopback, counting the requests for it."""
    return OneDocumentServer(body, path="/maven.tar.gz", content_type="application/gzip")


class TestMavenFetch:
    """Apache Maven fetched into the cache when ``mvn`` is not on PATH (the archive served
    from loopback here; the integration tier fetches the real one from Maven Central)."""

    def test_fetched_once_checked_and_unpacked_into_the_cache(self, tmp_path):
        from tests.conftest import stack

        top = f"apache-maven-{stack.MAVEN_VERSION}"
        body = _maven_archive(tmp_path, (f"{top}/bin/mvn", b"#!/bin/sh\necho maven\n"))
        cache = tmp_path / "cache"
        with _served(body) as served:
            sha = hashlib.sha512(body).hexdigest()
            mvn = stack.fetch_maven(cache, url=served.url, sha512=sha)
            again = stack.fetch_maven(cache, url=served.url, sha512=sha)
        assert mvn == again == cache / top / "bin" / "mvn"
        assert subprocess.run([mvn], capture_output=True, check=True).stdout == b"maven\n"
        assert served.requests == 1
        assert sorted(p.name for p in cache.iterdir()) == [top]  # no temporary left

    def test_an_archive_that_does_not_match_the_pinned_checksum_is_refused(self, tmp_path):
        from tests.conftest import stack

        top = f"apache-maven-{stack.MAVEN_VERSION}"
        body = _maven_archive(tmp_path, (f"{top}/bin/mvn", b"#!/bin/sh\n"))
        cache = tmp_path / "cache"
        with _served(body) as served, pytest.raises(stack.StackError, match="SHA-512"):
            stack.fetch_maven(cache, url=served.url, sha512="0" * 128)
        assert list(cache.iterdir()) == []

    def test_an_archive_member_outside_its_directory_is_refused(self, tmp_path):
        from tests.conftest import stack

        top = f"apache-maven-{stack.MAVEN_VERSION}"
        body = _maven_archive(
            tmp_path, (f"{top}/bin/mvn", b"#!/bin/sh\n"), ("../outside", b"not here")
        )
        cache = tmp_path / "cache"
        with _served(body) as served, pytest.raises(stack.StackError, match="unexpected"):
            stack.fetch_maven(cache, url=served.url, sha512=hashlib.sha512(body).hexdigest())
        assert list(cache.iterdir()) == []  # nothing unpacked, "../outside" included


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


class TestDemo:
    def test_a_step_that_fails_right_after_the_start_stops_the_stack(self, tmp_path, monkeypatch):
        """`make demo` stops the stack it started when any later step fails, the broker
        properties check (the first step after the start) included: no broker or S3 server
        is left running."""
        from tests.conftest import stack

        spec = importlib.util.spec_from_file_location("demo", STACK.parent / "demo.py")
        assert spec is not None
        assert spec.loader is not None
        demo = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(demo)

        class FakeStack:
            started = stopped = False
            kafka = types.SimpleNamespace(
                overrides={},
                bootstrap_servers="127.0.0.1:1",
                nodes=[types.SimpleNamespace(log_dir=tmp_path / "logs")],
            )
            s3 = types.SimpleNamespace(endpoint="http://127.0.0.1:2", bucket="tiered")

            def start(self):
                self.started = True
                return self

            def stop(self):
                self.stopped = True

        local = FakeStack()

        def run(cmd, **kwargs):
            # `broker-config` prints one property; `broker-config --check` finds it missing
            failed = "--check" in cmd
            out = "broker 1: 0 of 1 properties\n" if failed else "a.b=c\n"
            return subprocess.CompletedProcess(cmd, 1 if failed else 0, stdout=out, stderr="")

        monkeypatch.setattr(stack, "Stack", types.SimpleNamespace(create=lambda *a, **k: local))
        monkeypatch.setattr(demo, "plugin_jar", lambda: tmp_path / "plugin.jar")
        monkeypatch.setattr(demo.subprocess, "run", run)
        monkeypatch.setattr(sys, "argv", ["demo.py", "--root", str(tmp_path / "demo")])
        with pytest.raises(SystemExit, match="the broker lacks properties"):
            demo.main()
        assert local.started
        assert local.stopped


class TestSeaweed:
    def test_its_unix_sockets_stay_in_the_stack_directory(self, tmp_path, monkeypatch):
        """`weed mini` is told where to put every Unix socket it opens: inside the stack's
        directory, not /tmp, where SeaweedFS leaves them behind (and where another user's
        leftover of the same port would stop it)."""
        from tests.conftest import stack

        spawned: list[list[str]] = []

        def spawn(cmd, **kwargs):
            spawned.append(cmd)
            raise stack.StackError("not started in a unit test")

        monkeypatch.setattr(stack, "spawn", spawn)
        server = stack.SeaweedS3.create(tmp_path / "s3")
        with pytest.raises(stack.StackError, match="not started"):
            server.start()
        [cmd] = spawned
        sockets = {a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in cmd if "Socket=" in a}
        assert set(sockets) == {"-filer.localSocket", "-s3.localSocket"}
        assert all(path.parent == tmp_path / "s3" for path in sockets.values()), sockets


class TestCommandLine:
    def test_an_override_without_a_value_is_a_usage_error(self, tmp_path, capsys):
        """`stack.py up --override KEY` (no `=VALUE`) is refused with argparse's exit 2 and
        one line naming it, before anything starts, instead of a ValueError traceback."""
        from tests.conftest import stack

        with pytest.raises(SystemExit) as exited:
            stack.main(["--root", str(tmp_path / "stack"), "up", "--override", "log.roll.ms"])
        assert exited.value.code == 2
        assert "'log.roll.ms' is not KEY=VALUE" in capsys.readouterr().err
        assert not (tmp_path / "stack").exists()


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
