"""The README's configuration reference is the one the model generates, and its word on which
commands take ``-c`` and ``--set`` is the parser's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sidecar.cli import build_parser
from sidecar.config import reference_markdown

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def test_config_reference_is_current():
    """Regenerate with: python -m tests.unit.test_readme (writes the table into README.md)."""
    text = README.read_text()
    current = text[text.index(START) + len(START) : text.index(END)]
    assert current == reference_markdown()


def _commands() -> dict[str, set[str]]:
    """Each leaf command of ``sidecar`` ("config check", "read", ...) -> its option strings."""
    found: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[name] = {option for a in parser._actions for option in a.option_strings}
        for child, subparser in subs[0].choices.items() if subs else ():
            walk(subparser, f"{name} {child}".strip())

    walk(build_parser(), "")
    return found


def test_commands_taking_config_and_set_are_as_documented():
    """The README names the commands without -c/--config and those without --set exactly."""
    text = " ".join(README.read_text().split())
    claim = re.search(
        r"Every command but (.+?) takes `-c/--config FILE` and `SIDECAR_\*` variables the same"
        r" way, all of those but (.+?) take `--set KEY=VALUE` too",
        text,
    )
    assert claim, "the README's sentence on -c/--config and --set is gone"
    without_config, without_set = (set(re.findall(r"`([^`]+)`", g)) for g in claim.groups())
    commands = _commands()
    assert without_config == {name for name, opts in commands.items() if "--config" not in opts}
    assert without_set == {
        name for name, opts in commands.items() if "--config" in opts and "--set" not in opts
    }


if __name__ == "__main__":
    text = README.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    README.write_text(head + START + reference_markdown() + END + tail)
