"""The public surface of sidecar.kafka and the rules every module of it follows."""

from __future__ import annotations

import importlib

import pytest

import sidecar.kafka

SUBMODULES = ["records", "indexes", "checkpoints", "logdir"]
ALL_MODULES = [*SUBMODULES, "inspect", "_io"]


def _isort_key(name: str) -> tuple[bool, bool, str]:
    # ruff RUF022 ("isort-style"): CONSTANTS, then Classes, then functions
    return (not name.isupper(), not name[:1].isupper(), name)


class TestExports:
    """``sidecar.kafka.__all__`` is the union of its submodules' surfaces, sorted."""

    def test_all_is_union_of_submodules(self) -> None:
        """Every public name of records/indexes/checkpoints/logdir is re-exported, nothing else."""
        expected: set[str] = set()
        for name in SUBMODULES:
            expected |= set(importlib.import_module(f"sidecar.kafka.{name}").__all__)
        assert set(sidecar.kafka.__all__) == expected
        assert len(sidecar.kafka.__all__) == len(expected)

    def test_all_is_sorted(self) -> None:
        """__all__ is sorted the way ruff's RUF022 sorts it."""
        assert sidecar.kafka.__all__ == sorted(sidecar.kafka.__all__, key=_isort_key)

    @pytest.mark.parametrize("module", ALL_MODULES)
    def test_names_resolve_and_module_has_docstring(self, module: str) -> None:
        """Each module states its role in a docstring and every name in __all__ exists."""
        mod = importlib.import_module(f"sidecar.kafka.{module}")
        doc = mod.__doc__ or ""
        assert "must not" in doc or "never" in doc
        for name in mod.__all__:
            assert hasattr(mod, name), name
