"""The console script's basic contract: help, version, exit codes."""

from __future__ import annotations

import subprocess
import sys

from sidecar import __version__
from sidecar.cli import main


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
