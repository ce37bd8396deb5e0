"""Every metric is documented in the README (the table is generated from the registry) and
follows Prometheus' naming conventions; label names never carry unbounded values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.observability.metrics import NAMESPACE, Metrics, metric_reference, reference_markdown

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- metrics-reference:start -->\n", "<!-- metrics-reference:end -->"

#: label names whose values would grow without bound (one series per segment, offset, ...)
UNBOUNDED_LABELS = {
    "segment",
    "segment_id",
    "offset",
    "base_offset",
    "start_offset",
    "end_offset",
    "key",
    "object_key",
    "path",
    "file",
    "error",
    "message",
    "upload_id",
    "url",
    "broker",
}
#: words of a name that are not base units (milliseconds, kibibytes, ...)
NON_BASE_UNITS = re.compile(
    r"_(ms|millis|milliseconds|us|microseconds|minutes|hours|kb|mb|kib|mib)(_|$)"
)

REFERENCE = metric_reference()


def test_metrics_reference_is_current():
    """Regenerate with: python -m tests.unit.test_metrics_reference (writes the README table)."""
    text = README.read_text()
    current = text[text.index(START) + len(START) : text.index(END)]
    assert current == reference_markdown()


def test_reference_lists_every_registered_family():
    """The table covers every family of the registry (nothing registered outside attributes)."""
    families = {f.name for f in Metrics().registry.collect()}
    documented = {name.removesuffix("_total").removesuffix("_info") for name, *_ in REFERENCE}
    assert families == documented


@pytest.mark.parametrize(("name", "kind", "labels", "documentation"), REFERENCE, ids=lambda v: v)
def test_naming_conventions(name: str, kind: str, labels: tuple[str, ...], documentation: str):
    """Prefix, base units, ``_total`` only on counters, a unit suffix on histograms, help text,
    and no label that could carry unbounded values."""
    assert name.startswith(NAMESPACE + "_")
    assert not NON_BASE_UNITS.search(name), name
    assert name.endswith("_total") == (kind == "counter"), name
    if kind == "histogram":
        assert name.endswith(("_seconds", "_bytes")), name
    if "bytes" in name and kind == "gauge":
        assert name.endswith("_bytes"), name
    if kind == "counter" and "bytes" in name:
        assert name.endswith("_bytes_total"), name
    assert documentation.strip().endswith(")") or documentation.strip().endswith("."), name
    assert not set(labels) & UNBOUNDED_LABELS, (name, labels)


if __name__ == "__main__":
    text = README.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    README.write_text(head + START + reference_markdown() + END + tail)
