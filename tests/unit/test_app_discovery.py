"""The read server's discovery of partitions outside this broker's metadata scope: names the
cluster does not know are remembered for a while, within a bound (clients choose them), and
partitions the topic does not have never widen the metadata read."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import pytest

from sidecar.app import _ReadDiscovery
from sidecar.metadata.events import TopicIdPartition

TOPIC_ID = uuid.UUID(int=0x5EED)


class _Tailer:
    """A tailer that records what it is asked to read; every metadata partition is caught
    up once wanted."""

    def __init__(self) -> None:
        self.wanted: list[TopicIdPartition] = []

    def wants(self, tp: TopicIdPartition) -> bool:
        return tp in self.wanted

    def caught_up(self, metadata_partition: int) -> bool:
        return True

    def want(self, partitions: Iterable[TopicIdPartition]) -> None:
        self.wanted.extend(partitions)

    async def wait_caught_up(self, metadata_partitions: Iterable[int]) -> None:
        return None


async def test_unknown_topic_names_are_remembered_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[int] = []

    async def topics() -> dict[str, tuple[uuid.UUID, int]]:
        asked.append(1)
        return {}

    monkeypatch.setattr(_ReadDiscovery, "_MAX_UNKNOWN", 3)
    tailer: Any = object()  # not reached: no name is known
    discovery = _ReadDiscovery(tailer=tailer, topics=topics, num_partitions=50, timeout_s=1)
    assert not await discovery("nope-0", 0)
    assert not await discovery("nope-0", 0)
    assert len(asked) == 1  # remembered: not asked for again
    for n in range(1, 10):
        assert not await discovery(f"nope-{n}", 0)
    assert len(discovery._unknown) <= 3
    assert "nope-9" in discovery._unknown  # the newest is remembered


async def test_made_up_partition_numbers_of_a_known_topic_are_not_read() -> None:
    """Partition numbers the topic does not have (a client's typo or scan) are unknown at
    once: no metadata partition is read for them, so the tailer's scope stays as it was."""

    async def topics() -> dict[str, tuple[uuid.UUID, int]]:
        return {"orders": (TOPIC_ID, 1)}

    tailer: Any = _Tailer()
    discovery = _ReadDiscovery(tailer=tailer, topics=topics, num_partitions=50, timeout_s=1)
    for partition in range(1, 201):
        assert not await discovery("orders", partition)
    assert tailer.wanted == []
    assert await discovery("orders", 0)  # the partition it has is read
    assert tailer.wanted == [TopicIdPartition(TOPIC_ID, "orders", 0)]
