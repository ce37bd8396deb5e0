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
from typing import Any

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


@pytest.fixture(scope="module")
def wheel_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed (offline; see the module docstring)."""
    target = tmp_path_factory.mktemp("wheel") / "venv"
    venv.EnvBuilder(with_pip=False).create(target)  # pip comes with the project's packages
    python = target / "bin" / "python"
    site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=target
        ).strip()
    )
    deps = sysconfig.get_paths()["purelib"]  # this (project) venv's third-party packages
    (site / "_project_deps.pth").write_text(deps + "\n")
    wheel = next(dist.glob("*.whl"))
    _run(
        python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel,
        cwd=target, env=_clean_env(),
    )  # fmt: skip
    return target


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "PYTHON"))}


def test_wheel_installs_into_a_fresh_venv(wheel_venv: Path, tmp_path: Path):
    """`sidecar --version` and `sidecar config check` work from the installed wheel, and the
    module that runs is the venv's copy, not the checkout."""
    from sidecar import __version__

    python = wheel_venv / "bin" / "python"
    env = _clean_env()
    sidecar = wheel_venv / "bin" / "sidecar"
    assert __version__ in _run(sidecar, "--version", cwd=tmp_path, env=env)
    where = _run(python, "-c", "import sidecar; print(sidecar.__file__)", cwd=tmp_path, env=env)
    assert Path(where.strip()).is_relative_to(wheel_venv)
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[broker]\nlog_dirs = ["{tmp_path / "logs"}"]\n'
        '[tiering]\ninclude_topics = ["orders"]\n'
    )
    assert "[s3]" in _run(sidecar, "config", "check", "-c", config, cwd=tmp_path, env=env)


async def test_wheel_runs_the_sidecar_on_the_local_stack(
    wheel_venv: Path, kafka: Any, s3: Any, s3_prefix: str, topic_name: str, tmp_path: Path
):
    """The installed wheel's `sidecar run` does the demo's main job on the real broker and
    SeaweedFS: it tiers a topic's rolled segments and stops cleanly on SIGTERM."""
    from tests.conftest import stack
    from tests.e2e._support import delete_topic
    from tests.helpers import create_topic, produce
    from tests.sidecar_runner import Sidecar, sidecar_config, sidecar_env

    bootstrap = kafka.bootstrap_servers
    await create_topic(bootstrap, topic_name, configs={"segment.bytes": "1048576"})
    await produce(bootstrap, topic_name, count=2500)
    config = sidecar_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dirs=[kafka.log_dir],
        bootstrap=bootstrap,
        s3=s3,
        metrics_port=stack.free_port(),
        metadata_topic=f"__rlm_{topic_name}",
        include_topics=[topic_name],
        prefix=s3_prefix,
    )
    env = {k: v for k, v in sidecar_env(s3).items() if not k.startswith("PYTHON")}
    sidecar = await Sidecar.start(
        config, env, tmp_path / "sidecar.log", command=(str(wheel_venv / "bin" / "sidecar"),)
    )
    try:
        await sidecar.wait_for("segment_tiered", count=2, timeout=120, topic=topic_name)
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        await delete_topic(bootstrap, topic_name)
