"""The read server's discovery of partitions outside this broker's metadata scope: names the
cluster does not know are remembered for a while, within a bound (clients choose them)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sidecar.app import _ReadDiscovery


async def test_unknown_topic_names_are_remembered_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []

    async def topic_ids() -> dict[str, uuid.UUID]:
        asked.append(1)
        return {}

    monkeypatch.setattr(_ReadDiscovery, "_MAX_UNKNOWN", 3)
    tailer: Any = object()  # not reached: no name is known
    discovery = _ReadDiscovery(tailer=tailer, topic_ids=topic_ids, num_partitions=50, timeout_s=1)
    assert not await discovery("nope-0", 0)
    assert not await discovery("nope-0", 0)
    assert len(asked) == 1  # remembered: not asked for again
    for n in range(1, 10):
        assert not await discovery(f"nope-{n}", 0)
    assert len(discovery._unknown) <= 3
    assert "nope-9" in discovery._unknown  # the newest is remembered
