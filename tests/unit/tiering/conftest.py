"""The engine rig (``test_engine.Rig``) as a fixture for every engine test module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.tiering.test_engine import Rig


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Callable[..., Rig]]:
    """Builds rigs in ``tmp_path``; each is stopped and its store closed afterwards."""
    rigs: list[Rig] = []

    def make(**settings: Any) -> Rig:
        rigs.append(Rig(tmp_path, **settings))
        return rigs[-1]

    yield make
    for r in rigs:
        if r.task is not None and not r.task.done():
            await r.stop()
        r.store.close()
