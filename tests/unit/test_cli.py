"""The console script's basic contract: help, version, exit codes."""

from __future__ import annotations

import logging
import subprocess
import sys

from sidecar import __version__
from sidecar.cli import main
from sidecar.observability.logging import get_logger


class TestCli:
    def test_version(self, capsys):
        """`sidecar version` prints the package version."""
        assert main(["version"]) == 0
        assert __version__ in capsys.readouterr().out

    def test_help_lists_subcommands(self):
        """`sidecar --help` lists the subcommands and exits 0."""
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "--help"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0
        for command in ("run", "version", "config", "inspect"):
            assert command in result.stdout

    def test_unknown_command_exits_2(self):
        """An unknown subcommand is a usage error (exit 2)."""
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "frobnicate"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 2


class TestSecretsInCommandLogs:
    """A one-shot command sets up its logging before it loads its configuration; the secrets
    of that configuration are redacted from its log lines all the same."""

    def teardown_method(self):
        logging.getLogger().handlers.clear()

    def test_broker_config_logs_redact_the_configs_secrets(self, capsys, monkeypatch):
        import sidecar.broker_config

        def logs_a_secret(config, **kwargs):
            # what a library's error line might carry: the client's password
            password = config.kafka.sasl_password.get_secret_value()
            get_logger("sidecar.broker_config").warning("auth failed", detail=f"pw {password}")
            logging.getLogger("botocore").warning("key %s", config.s3.secret_access_key)
            return 0

        monkeypatch.setattr(sidecar.broker_config, "broker_config_command", logs_a_secret)
        monkeypatch.setenv("SIDECAR_KAFKA__SASL_PASSWORD", "kafka-pass-9f3")
        monkeypatch.setenv("SIDECAR_S3__ACCESS_KEY_ID", "AKIDEXAMPLE")
        monkeypatch.setenv("SIDECAR_S3__SECRET_ACCESS_KEY", "s3-secret-7c1")
        assert main(["broker-config"]) == 0
        err = capsys.readouterr().err
        assert "auth failed" in err
        assert "kafka-pass-9f3" not in err
        assert "s3-secret-7c1" not in err

    def test_the_read_servers_logs_redact_the_sasl_password(self, capsys, monkeypatch):
        from sidecar.readserver import __main__ as readserver_main

        async def serve(config):
            password = config.kafka.sasl_password.get_secret_value()
            get_logger("x").warning("serving", detail=f"pw {password}")

        monkeypatch.setattr(readserver_main, "serve", serve)
        monkeypatch.setenv("SIDECAR_KAFKA__SASL_PASSWORD", "kafka-pass-9f3")
        assert readserver_main.main([]) == 0
        err = capsys.readouterr().err
        assert "serving" in err
        assert "kafka-pass-9f3" not in err

    def test_the_read_server_does_not_echo_a_malformed_set(self, capsys):
        """A mistyped `--set s3.secret_access_key:VALUE` is refused without its text."""
        from sidecar.readserver import __main__ as readserver_main

        assert readserver_main.main(["--set", "s3.secret_access_key:s3-secret-7c1"]) == 2
        err = capsys.readouterr().err
        assert "item 1 has no '='" in err
        assert "s3-secret-7c1" not in err
