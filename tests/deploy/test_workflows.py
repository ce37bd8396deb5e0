"""The GitHub workflows pass actionlint (syntax, expressions, action inputs, permissions)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.deploy._tools import REPO, describe, run

WORKFLOWS = REPO / ".github" / "workflows"


def _actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which(
        str(Path(os.environ.get("GOBIN") or Path.home() / "go" / "bin") / "actionlint")
    )
    if found is None:
        pytest.fail(
            "actionlint is not installed; `make deploy-tools` installs it (go install"
            " github.com/rhysd/actionlint/cmd/actionlint into ~/go/bin)"
        )
    return found


def test_release_workflow_exists():
    """A tag builds the wheel, the sdist and the image."""
    text = (WORKFLOWS / "release.yml").read_text()
    assert 'tags: ["v*"]' in text
    assert "python -m build" in text
    assert "docker/build-push-action" in text


def test_workflows_pass_actionlint():
    """Every workflow file is clean under actionlint."""
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert files
    result = run([_actionlint(), "-no-color", *files], cwd=REPO)
    assert result.returncode == 0, describe(result)
