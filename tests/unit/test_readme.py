"""The README's configuration reference is the one the model generates."""

from __future__ import annotations

from pathlib import Path

from sidecar.config import reference_markdown

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def test_config_reference_is_current():
    """Regenerate with: python -m tests.unit.test_readme (writes the table into README.md)."""
    text = README.read_text()
    current = text[text.index(START) + len(START) : text.index(END)]
    assert current == reference_markdown()


if __name__ == "__main__":
    text = README.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    README.write_text(head + START + reference_markdown() + END + tail)
