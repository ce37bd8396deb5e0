"""The package installs as the README says: `python -m build` makes a wheel and an sdist, and
the wheel, installed into a fresh venv, gives a working `sidecar` command.

Offline and fast: the wheel is built with ``--no-isolation`` (hatchling comes with the dev
extra), and the fresh venv gets its dependencies by a ``.pth`` line naming the project venv's
site-packages, then ``pip install --no-deps --no-index`` of the wheel. The project venv's own
editable install is a ``.pth`` file *inside* that directory, which a path line does not
process, so the ``sidecar`` that runs is the wheel's (the test checks that it is).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, f"{cmd}: {result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    return out


def test_build_makes_a_wheel_and_an_sdist(dist: Path):
    """One wheel and one sdist, named for the package and its version."""
    from sidecar import __version__

    names = sorted(p.name for p in dist.iterdir())
    assert names == [
        f"kafka_tiered_sidecar-{__version__}-py3-none-any.whl",
        f"kafka_tiered_sidecar-{__version__}.tar.gz",
    ]


def test_wheel_installs_into_a_fresh_venv(dist: Path, tmp_path: Path):
    """`sidecar --version` and `sidecar config check` work from the installed wheel, and the
    module that runs is the venv's copy, not the checkout."""
    from sidecar import __version__

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)  # pip comes with the project's packages
    python = target / "bin" / "python"
    site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
        ).strip()
    )
    deps = sysconfig.get_paths()["purelib"]  # this (project) venv's third-party packages
    (site / "_project_deps.pth").write_text(deps + "\n")
    wheel = next(dist.glob("*.whl"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "PYTHON"))}
    _run(
        python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    sidecar = target / "bin" / "sidecar"
    assert __version__ in _run(sidecar, "--version", cwd=tmp_path, env=env)
    where = _run(python, "-c", "import sidecar; print(sidecar.__file__)", cwd=tmp_path, env=env)
    assert Path(where.strip()).is_relative_to(target)
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[broker]\nlog_dirs = ["{tmp_path}"]\n'
        '[tiering]\ninclude_topics = ["orders"]\n'
    )
    assert "[s3]" in _run(sidecar, "config", "check", "-c", config, cwd=tmp_path, env=env)
