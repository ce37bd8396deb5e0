"""The CLI's one error path, through the console script as an operator runs it: one line on
stderr, a documented exit code, a traceback only with --debug, quiet on a closed pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar import __version__
from sidecar.cli import build_parser
from tests.helpers import OneDocumentServer


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else _env(),
        check=False,
        timeout=120,
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command, asserting there is no traceback."""
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sidecar: error: "), lines[0]
    return lines[0]


def _config(tmp_path: Path, body: str = "") -> Path:
    log_dir = tmp_path / "logs"
    log_dir.mkdir(exist_ok=True)
    path = tmp_path / "sidecar.toml"
    path.write_text(
        f'state_dir = "{tmp_path / "state"}"\n'
        f'[broker]\nlog_dirs = ["{log_dir}"]\n'
        '[tiering]\ninclude_topics = ["orders.*"]\n' + body
    )
    return path


class TestErrorPath:
    def test_version_flag(self):
        """`sidecar --version` prints the version and exits 0, as `sidecar version` does."""
        result = _cli("--version")
        assert result.returncode == 0
        assert __version__ in result.stdout

    def test_invalid_include_regex_is_one_line_in_check_and_run(self, tmp_path):
        """An invalid include_topics regex fails `config check` and `run` with exit 2 and one
        line naming the key, not a re.error traceback from inside the daemon."""
        path = tmp_path / "bad.toml"
        path.write_text('[tiering]\ninclude_topics = ["orders.(*"]\n')
        for command in (("config", "check", "-c", str(path)), ("run", "-c", str(path))):
            result = _cli(*command)
            assert result.returncode == 2, result.stderr
            line = _one_line_error(result)
            assert "tiering.include_topics" in line
            assert "not a valid regex" in line

    def test_unreachable_kafka_is_one_line(self):
        """`metadata decode` against a port nobody listens on: exit 1, one line naming the
        address and what to check, no traceback, no 'Unclosed AIOKafkaConsumer'."""
        result = _cli("metadata", "decode", "--bootstrap-server", "127.0.0.1:1")
        assert result.returncode == 1
        line = _one_line_error(result)
        assert "127.0.0.1:1" in line
        assert "Unclosed" not in result.stderr

    def test_debug_shows_the_traceback(self):
        """--debug (anywhere on the line) adds the traceback to the same failure."""
        result = _cli("metadata", "decode", "--bootstrap-server", "127.0.0.1:1", "--debug")
        assert result.returncode == 1
        assert "Traceback" in result.stderr
        assert result.stderr.rstrip().splitlines()[-1].startswith("sidecar: error: ")

    def test_closed_pipe_ends_quietly(self):
        """A reader that goes away after the first line (`| head -1`) ends the command with
        exit 0 and nothing on stderr."""
        with subprocess.Popen(
            [sys.executable, "-m", "sidecar", "config", "docs"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
        ) as proc:
            assert proc.stdout is not None
            assert proc.stderr is not None
            proc.stdout.readline()
            proc.stdout.close()  # the pipe's reader is gone; the rest of the table cannot go out
            err = proc.stderr.read().decode()
            assert proc.wait(timeout=60) == 0
        assert "BrokenPipeError" not in err
        assert err == ""

    def test_inspect_into_a_closed_pipe_ends_quietly(self, tmp_path):
        """`sidecar inspect --records … | head -1`: exit 0, no BrokenPipeError on stderr."""
        from sidecar.testing import TestRecord, build_batch, write_log_dir

        batches = [build_batch([TestRecord(b"k", b"v" * 100)] * 50) for _ in range(40)]
        write_log_dir(tmp_path / "logs", {("orders", 0): [batches, []]})
        command = (
            f"{sys.executable} -m sidecar inspect --records {tmp_path / 'logs' / 'orders-0'}"
            " | head -1"
        )
        result = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            env=_env(),
            check=False,
            timeout=120,
        )
        assert len(result.stdout.splitlines()) == 1
        assert "BrokenPipe" not in result.stderr
        assert "Traceback" not in result.stderr

    def test_bootstrap_server_spellings(self):
        """--bootstrap-server (Kafka's tools) and --bootstrap-servers are both accepted."""
        parser = build_parser()
        for flag in ("--bootstrap-server", "--bootstrap-servers"):
            assert parser.parse_args(["run", flag, "b:9092"]).bootstrap_servers == "b:9092"
            args = parser.parse_args(["metadata", "decode", flag, "b:9092"])
            assert args.bootstrap_server == "b:9092"

    def test_run_log_levels_are_checked_as_flags(self, capsys):
        """`run --log-level` takes logging's names in any case (warn too) and refuses others
        as a flag, not as a `--set` the user never wrote."""
        parser = build_parser()
        assert parser.parse_args(["run", "--log-level", "warn"]).log_level == "WARNING"
        assert parser.parse_args(["run", "--log-level", "debug"]).log_level == "DEBUG"
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["run", "--log-level", "loud"])
        assert exited.value.code == 2
        error = capsys.readouterr().err.splitlines()[-1]
        assert "argument --log-level: invalid choice: 'LOUD'" in error
        assert "--set" not in error


class TestConfigCheck:
    def test_dash_c_and_positional(self, tmp_path):
        """`config check -c FILE` works like every other subcommand; FILE alone still works."""
        path = _config(tmp_path)
        assert _cli("config", "check", "-c", str(path)).returncode == 0
        assert _cli("config", "check", str(path)).returncode == 0

    @pytest.mark.parametrize(
        ("body", "key", "words"),
        [
            ('[s3]\nendpoint_url = "htp://minio:9000"\n', "s3.endpoint_url", "http://"),
            ('[s3]\nendpoint_url = "minio:9000"\n', "s3.endpoint_url", "http://"),
            ('[s3]\nbucket = "My_Bucket!!"\n', "s3.bucket", "not a valid S3 bucket name"),
            ('[s3]\nbucket = "192.168.1.10"\n', "s3.bucket", "IP address"),
            ("[retention]\norphan_grace_s = 0\n", "retention.orphan_grace_s", "greater than 0"),
            ('[retention]\n[[retention.overrides]]\ntopics = ["a["]\n', "topics", "regex"),
            ('[kafka]\nsecurity_protocol = "SASL_SSL"\n', "kafka", "sasl_mechanism"),
        ],
    )
    def test_invalid_values_are_refused(self, tmp_path, body, key, words):
        """Values that would only fail at run time are refused by `config check` (exit 2)."""
        result = _cli("config", "check", "-c", str(_config(tmp_path, body)))
        assert result.returncode == 2, result.stdout
        assert key in result.stderr
        assert words in result.stderr

    def test_missing_log_dir_is_a_warning(self, tmp_path):
        """A log dir absent on this host warns (the file may be checked elsewhere), exit 0."""
        path = tmp_path / "c.toml"
        path.write_text(
            f'[broker]\nlog_dirs = ["{tmp_path / "absent"}"]\n[tiering]\ninclude_topics = ["a"]\n'
        )
        result = _cli("config", "check", "-c", str(path))
        assert result.returncode == 0, result.stderr
        assert "sidecar: warning: broker.log_dirs" in result.stderr
        assert "does not exist" in result.stderr

    def test_empty_selection_warns_with_the_setting_to_add(self, tmp_path):
        """No include_topics: config check says that only KIP-405 topics will be tiered."""
        path = tmp_path / "c.toml"
        path.write_text(f'[broker]\nlog_dirs = ["{tmp_path}"]\n')
        result = _cli("config", "check", "-c", str(path))
        assert result.returncode == 0
        assert "include_topics" in result.stderr

    def test_effective_config_loads_back(self, tmp_path):
        """`config check --effective > x.toml` then `config check -c x.toml` passes, with
        unset settings (sasl_mechanism) and secrets present."""
        path = _config(tmp_path, '[kafka]\nsasl_username = "u"\n')
        first = _cli("config", "check", "--effective", "-c", str(path))
        assert first.returncode == 0, first.stderr
        assert "# sasl_mechanism = (unset)" in first.stdout
        again = tmp_path / "x.toml"
        again.write_text(first.stdout)
        second = _cli("config", "check", "-c", str(again))
        assert second.returncode == 0, second.stderr
        assert second.stdout == first.stdout

    def test_environment_error_blames_the_variable(self, tmp_path):
        """A mistyped variable (single underscore) is named, and the file is not blamed."""
        path = _config(tmp_path)
        result = _cli("config", "check", "-c", str(path), env=_env(SIDECAR_S3_BUCKET="x"))
        assert result.returncode == 2
        line = _one_line_error(result)
        assert "environment variable SIDECAR_S3_BUCKET" in line
        assert str(path) not in line
        assert "SIDECAR_S3__BUCKET" in line  # what to write instead

    def test_kubernetes_service_links_are_ignored(self, tmp_path):
        """Variables a Service named sidecar… injects are not configuration."""
        env = _env(
            SIDECAR_PORT="tcp://10.0.0.1:9464",
            SIDECAR_PORT_9464_TCP="tcp://10.0.0.1:9464",
            SIDECAR_PORT_9464_TCP_ADDR="10.0.0.1",
            SIDECAR_PORT_9464_TCP_PORT="9464",
            SIDECAR_PORT_9464_TCP_PROTO="tcp",
            SIDECAR_SERVICE_HOST="10.0.0.1",
            SIDECAR_SERVICE_PORT="9464",
            SIDECAR_SERVICE_PORT_METRICS="9464",
            SIDECAR_METRICS_SERVICE_HOST="10.0.0.2",
        )
        result = _cli("config", "check", "-c", str(_config(tmp_path)), env=env)
        assert result.returncode == 0, result.stderr


def _status_server(document: dict[str, object]) -> OneDocumentServer:
    """A one-document HTTP server on loopback standing in for a sidecar's /v1/status."""
    return OneDocumentServer(
        json.dumps(document).encode(), path="/v1/status", content_type="application/json"
    )


def _row(partition: int, selected: bool) -> dict[str, object]:
    return {
        "topic": "orders",
        "partition": partition,
        "selected": selected,
        "leader": True,
        "local_segments": 2,
        "tiered_segments": 1,
        "tiered_bytes": 10,
        "remote_start_offset": 0,
        "remote_end_offset": 9,
        "lag_segments": 0,
        "lag_bytes": 0,
        "lag_seconds": 0.0,
        "last_error": None,
        "quarantined": 0,
    }


class TestSmallFixes:
    def test_status_header_and_exit_code(self):
        """`sidecar status` prints a readable header naming the failing check and its reason,
        and exits 1 while the sidecar is not ready; --json keeps only selected partitions
        unless --all."""
        document = {
            "broker_id": 1,
            "ready": False,
            "checks": {"kafka": True, "s3": False},
            "failing": {"s3": "connection refused"},
            "partitions": [_row(0, True), _row(1, False)],
        }
        with _status_server(document) as server:
            text = _cli("status", "--url", server.url)
            as_json = _cli("status", "--json", "--url", server.url)
            everything = _cli("status", "--json", "--all", "--url", server.url)
        assert text.returncode == 1
        header = text.stdout.splitlines()[0]
        assert header == "broker 1  NOT READY  kafka ok, s3 FAILING (connection refused)"
        assert "{" not in header
        import json

        assert as_json.returncode == 1
        assert [r["partition"] for r in json.loads(as_json.stdout)["partitions"]] == [0]
        assert [r["partition"] for r in json.loads(everything.stdout)["partitions"]] == [0, 1]

    def test_status_hint_leaves_secrets_out(self):
        """The quarantine hint repeats the command's --set items, but not a secret's value."""
        segment = {
            "base_offset": 0,
            "end_offset": 9,
            "bytes": 100,
            "local": True,
            "since_ms": 0,
            "reason": "bad CRC",
        }
        row = {**_row(0, True), "quarantined": [0], "quarantined_segments": [segment]}
        document = {"broker_id": 1, "ready": True, "checks": {}, "failing": {}, "partitions": [row]}
        with _status_server(document) as server:
            result = _cli(
                "status",
                "--url",
                server.url,
                "--set",
                "s3.secret_access_key=TOPSECRETVALUE",
                "--set",
                "kafka.sasl_password=hunter2pass",
                "--set",
                "s3.bucket=tiered",
            )
        assert result.returncode == 0, result.stderr
        assert "sidecar quarantine clear" in result.stdout
        assert "TOPSECRETVALUE" not in result.stdout + result.stderr
        assert "hunter2pass" not in result.stdout + result.stderr
        assert "--set s3.secret_access_key=... --set kafka.sasl_password=..." in result.stdout
        assert "--set s3.bucket=tiered" in result.stdout

    def test_status_of_another_document_is_one_line(self):
        """`status --url` at /readyz (or any other JSON): one error line, nothing on stdout."""
        with _status_server({"ready": True, "checks": {}}) as server:
            result = _cli("status", "--url", server.url)
        assert result.returncode == 1
        assert result.stdout == ""
        assert "did not answer with a status document" in _one_line_error(result)

    def test_status_of_a_page_that_is_not_json_is_one_line(self):
        """`status --url` at /metrics (text, not JSON): the same one line as for another JSON
        document, not an "unexpected JSONDecodeError"."""
        page = OneDocumentServer(b"# HELP up 1\nup 1\n", path="/metrics", content_type="text/plain")
        with page as server:
            result = _cli("status", "--url", server.url)
        assert result.returncode == 1
        assert result.stdout == ""
        line = _one_line_error(result)
        assert "did not answer with a status document" in line
        assert "unexpected" not in line

    def test_status_of_a_port_that_does_not_speak_http_is_one_line(self):
        """`status --url` at a port that answers bytes that are not HTTP (a Kafka listener,
        say): "cannot reach", not an "unexpected BadStatusLine"."""
        import socketserver
        import threading

        class Garbage(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.recv(65536)
                self.request.sendall(b"\x00\x00\x00\x08not http\r\n")

        with socketserver.TCPServer(("127.0.0.1", 0), Garbage) as server:
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            try:
                port = server.server_address[1]
                result = _cli("status", "--url", f"http://127.0.0.1:{port}/v1/status")
            finally:
                server.shutdown()
                thread.join()
        assert result.returncode == 1
        line = _one_line_error(result)
        assert "cannot reach the running sidecar" in line
        assert "unexpected" not in line

    def test_a_malformed_set_is_not_echoed(self, tmp_path):
        """A --set without '=' may be a secret typed with ':'; the error names its position."""
        result = _cli(
            "config", "check", "--set", "s3.bucket=b", "--set", "s3.secret_access_key:wJalrXUt"
        )
        assert result.returncode == 2
        line = _one_line_error(result)
        assert "wJalrXUt" not in result.stdout + result.stderr
        assert "item 2" in line

    def test_read_offsets_take_kafka_specials(self):
        """`read --offset -2`/`beginning` and `-1`/`end` are accepted as kcat's -o; other
        negative offsets are a usage error."""
        parser = build_parser()
        base = ["read", "--topic", "t", "--partition", "0", "--offset"]
        assert parser.parse_args([*base, "-2"]).offset == -2
        assert parser.parse_args([*base, "beginning"]).offset == -2
        assert parser.parse_args([*base, "end"]).offset == -1
        result = _cli(*base, "-5")
        assert result.returncode == 2
        assert "-2 (beginning) or -1 (end)" in result.stderr

    @pytest.mark.parametrize(
        ("args", "words"),
        [
            (["read", "--url", "localhost:9401"], "is not an http(s) URL"),
            (["read", "--url", "http://"], "is not an http(s) URL"),
            (["status", "--url", "127.0.0.1:9400/v1/status"], "is not an http(s) URL"),
            (["read", "--url", "http://127.0.0.1:1", "--count", "0"], "0 is not 1 or more"),
            (["read", "--url", "http://127.0.0.1:1", "--count", "-1"], "-1 is not 1 or more"),
            (["metadata", "decode", "--hex", "00", "--max-messages", "0"], "not 1 or more"),
        ],
    )
    def test_bad_read_and_status_flags_are_usage_errors(self, capsys, args, words):
        """A --url without http(s) is a usage error (exit 2), not an "unexpected" connection
        failure; a --count or --max-messages below 1 is refused rather than printing nothing
        and exiting 0."""
        from sidecar.cli import main

        read_args = ["--topic", "t", "--partition", "0", "--offset", "0"]
        argv = [*args, *read_args] if args[0] == "read" else args
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        assert words in capsys.readouterr().err

    def test_read_without_a_socket_says_where_it_looked(self, tmp_path):
        """`sidecar read` with no running daemon names the socket path and what to pass."""
        path = _config(tmp_path)
        result = _cli("read", "-c", str(path), "--topic", "t", "--partition", "0", "--offset", "0")
        assert result.returncode == 1
        line = _one_line_error(result)
        assert str(tmp_path / "state" / "read.sock") in line
        assert "sidecar run" in line

    def test_missing_log_dir_is_named(self, tmp_path):
        """`run` with a log dir that does not exist says so, instead of blaming the broker id."""
        result = _cli(
            "run",
            "--log-dir",
            str(tmp_path / "absent"),
            "--bootstrap-server",
            "127.0.0.1:1",
            "--set",
            f"state_dir={tmp_path / 'state'}",
            "--set",
            "broker.startup_wait_s=0",  # no wait for a broker that formats its storage
            "--log-format",
            "json",
        )
        assert result.returncode == 2
        assert f"{tmp_path / 'absent'} does not exist" in result.stdout + result.stderr
        assert "broker_id is not set" not in result.stdout + result.stderr


class TestTermination:
    def test_sigterm_cleans_up_as_ctrl_c_does(self, tmp_path):
        """SIGTERM (`timeout`, a CronJob's deadline) during `sidecar scrub` removes the
        scrub's temporary metadata store, as Ctrl-C does, and exits 143, instead of dying
        on the spot and leaving the store in the temporary directory."""
        import signal
        import socket

        tmp = tmp_path / "tmp"
        tmp.mkdir()
        # a "broker" that accepts the scrub's connection and never answers
        with socket.create_server(("127.0.0.1", 0)) as silent:
            port = silent.getsockname()[1]
            command = ["scrub", "-c", str(_config(tmp_path))]
            command += ["--set", f"kafka.bootstrap_servers=127.0.0.1:{port}"]
            scrub = subprocess.Popen(
                [sys.executable, "-m", "sidecar", *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(TMPDIR=str(tmp)),
            )
            try:
                silent.settimeout(60)
                connection, _ = silent.accept()  # the store exists: it is made before this
                with connection:
                    assert [p.name[:14] for p in tmp.iterdir()] == ["sidecar-scrub-"]
                    scrub.send_signal(signal.SIGTERM)
                    _, stderr = scrub.communicate(timeout=60)
            finally:
                if scrub.poll() is None:
                    scrub.kill()
                    scrub.wait()
        assert scrub.returncode == 143, stderr
        assert "Traceback" not in stderr
        assert list(tmp.iterdir()) == []


class TestDescribeFailure:
    """The one line for failures that carry no text of their own."""

    def test_a_timeout_without_text_says_what_timed_out(self):
        """asyncio.timeout's TimeoutError (an OSError) has no message: the line says what
        waited, not an empty `sidecar: error: `."""
        from sidecar.cli import describe_failure

        line, code = describe_failure(TimeoutError())
        assert line.startswith("timed out waiting for Kafka or S3"), line
        assert code == 1

    def test_an_os_error_without_text_is_named(self):
        from sidecar.cli import describe_failure

        assert describe_failure(ConnectionResetError()) == ("ConnectionResetError", 1)
        assert describe_failure(TimeoutError("read of x timed out")) == (
            "read of x timed out",
            1,
        )
