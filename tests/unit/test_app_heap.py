"""The daemon freezes its startup heap once, when it first turns ready."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import sidecar._aio as app


@pytest.fixture
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(app, "_heap_frozen", False)
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


def test_freezes_the_heap_once(unfrozen: None) -> None:
    assert gc.get_freeze_count() == 0
    app.freeze_startup_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    kept = [[] for _ in range(10_000)]  # tracked objects made after the freeze
    app.freeze_startup_heap()
    # a second call freezes nothing new (frozen objects freed meanwhile may lower the count)
    assert gc.get_freeze_count() < frozen + len(kept)
