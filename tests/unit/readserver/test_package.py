"""The readserver package's surface: sorted exports, and the layering (no app, no tiering)."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import sidecar.readserver


class TestPackage:
    """What ``import sidecar.readserver`` offers and pulls in."""

    def test_all_is_sorted_and_public(self) -> None:
        """__all__ is sorted and names exactly the public names the package defines."""
        exported = sidecar.readserver.__all__
        assert exported == sorted(exported)
        public = {
            name
            for name, value in vars(sidecar.readserver).items()
            if not name.startswith("_")
            and not isinstance(value, ModuleType)
            and name != "annotations"
        }
        assert set(exported) == public

    def test_layering(self) -> None:
        """The read path imports neither the composition root, tiering, nor aiokafka."""
        code = (
            "import sys, sidecar.readserver, sidecar.readserver.__main__; "
            "bad = sorted(m for m in sys.modules if m.startswith(('sidecar.app', "
            "'sidecar.tiering', 'aiokafka.producer', 'aiokafka.consumer'))); print(bad)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == "[]"


class TestStandaloneServer:
    """``python -m sidecar.readserver`` as an operator runs it."""

    def test_a_socket_it_cannot_create_is_one_error_line_and_exit_2(self, tmp_path) -> None:
        """A failure inside the server's task group (here its socket's directory) ends with
        the configuration error's line and exit code, not a traceback."""
        (tmp_path / "file").write_text("a file, not a directory")
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sidecar.readserver",
                "--set",
                f"state_dir={tmp_path / 'state'}",
                "--set",
                f"read_server.socket_path={tmp_path / 'file' / 'r.sock'}",
                "--set",
                "s3.endpoint_url=http://127.0.0.1:9",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            cwd=tmp_path,
        )
        assert result.returncode == 2, result.stderr
        # guard() logs the traceback inside one JSON line; nothing prints one raw
        assert not any(line.startswith("Traceback") for line in result.stderr.splitlines())
        assert (
            result.stderr.strip()
            .splitlines()[-1]
            .startswith("sidecar.readserver: error: read_server.socket_path ")
        )
