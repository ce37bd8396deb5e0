"""`make plugin` on a machine without Maven: Apache Maven comes from Maven Central into the home
cache (checked against its pinned SHA-512), and the plugin builds with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import stack

REPO = Path(__file__).resolve().parents[2]


def _path_without(tool: str, bin_dir: Path) -> str:
    """A PATH of one directory linking every program on this PATH except ``tool``."""
    bin_dir.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for entry in Path(directory).iterdir():
            link = bin_dir / entry.name
            if entry.name != tool and not link.exists() and os.access(entry, os.X_OK):
                link.symlink_to(entry)
    return str(bin_dir)


def test_make_plugin_fetches_maven_when_it_is_missing(tmp_path):
    path = _path_without("mvn", tmp_path / "bin")
    env = {**os.environ, "PATH": path, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    home = tmp_path / "cache" / "kafka-tiered-sidecar" / f"apache-maven-{stack.MAVEN_VERSION}"
    fetched = home / "bin" / "mvn"
    result = subprocess.run(
        ["make", "-s", "plugin", f"PYTHON={sys.executable}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{fetched} -B" in result.stdout  # the build ran with the fetched Maven
    assert (
        REPO / "deploy" / "kafka-plugin" / "target" / "kafka-tiered-sidecar-plugin.jar"
    ).is_file()
    # later calls find it in the cache
    again = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "local" / "stack.py"), "maven"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert again.stdout.strip() == str(fetched)
    version = subprocess.run(
        [str(fetched), "-v"], env=env, capture_output=True, text=True, check=True
    )
    assert f"Apache Maven {stack.MAVEN_VERSION}" in version.stdout
