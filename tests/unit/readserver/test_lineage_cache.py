"""The read path's lineage cache: a partition's spans are computed again only when the store
applies an event of that partition (or, for a store another process writes, when that process
commits), not on every request of a busy cluster."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.metadata.events import TopicIdPartition
from sidecar.metadata.store import RemoteSegmentStore, SegmentSpan
from sidecar.readserver.cache import ChunkCache
from sidecar.readserver.service import ReadService
from tests.unit.readserver._tiered import LAYOUT, TOPIC_ID, TP, Remote, data_batches

TP1 = TopicIdPartition(TOPIC_ID, "orders", 1)


def _count_lineages(
    store: RemoteSegmentStore, monkeypatch: pytest.MonkeyPatch
) -> Counter[TopicIdPartition]:
    """Calls of ``store.finished_lineage``, by partition."""
    calls: Counter[TopicIdPartition] = Counter()
    real: Callable[..., list[SegmentSpan]] = store.finished_lineage

    def counted(tp: TopicIdPartition, *args: object) -> list[SegmentSpan]:
        calls[tp] += 1
        return real(tp, *args)

    monkeypatch.setattr(store, "finished_lineage", counted)
    return calls


def _service(store: RemoteSegmentStore, remote: Remote, chunks: ChunkCache) -> ReadService:
    # a TTL of zero: every request re-checks what the store cannot version (the broker's
    # checkpoint, other processes' commits), so only a real change may recompute
    return ReadService(
        store=store, objects=remote.objects, layout=LAYOUT, chunks=chunks, lineage_ttl_s=0.0
    )


async def test_only_the_changed_partition_is_recomputed(
    remote: Remote, chunks: ChunkCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests for an unchanged partition reuse its spans, even while events of another
    partition are applied; the partition whose segment events were applied is recomputed
    once, and its new segment is served."""
    await remote.upload(0, data_batches(0, 4))
    await remote.upload(0, data_batches(0, 4), tp=TP1)
    calls = _count_lineages(remote.store, monkeypatch)
    service = _service(remote.store, remote, chunks)
    for _ in range(3):
        assert await service.tiered_range(TP) == (0, 19)
        assert await service.tiered_range(TP1) == (0, 19)
    assert calls == {TP: 1, TP1: 1}

    await remote.upload(20, data_batches(20, 4), tp=TP1)
    for _ in range(3):
        assert await service.tiered_range(TP) == (0, 19)
        assert await service.tiered_range(TP1) == (0, 39)
    assert calls == {TP: 1, TP1: 2}
    await service.aclose()


async def test_another_process_writing_the_store_is_seen(
    remote: Remote, chunks: ChunkCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read server alone opens the store a daemon writes: it applies nothing itself, so a
    commit of the other writer recomputes, and no commit recomputes nothing."""
    reader = RemoteSegmentStore(tmp_path / "state")  # the same file as remote.store
    try:
        await remote.upload(0, data_batches(0, 4))
        calls = _count_lineages(reader, monkeypatch)
        service = _service(reader, remote, chunks)
        assert await service.tiered_range(TP) == (0, 19)
        assert await service.tiered_range(TP) == (0, 19)
        assert calls == {TP: 1}
        await remote.upload(20, data_batches(20, 4))  # committed by the other connection
        assert await service.tiered_range(TP) == (0, 39)
        assert await service.tiered_range(TP) == (0, 39)
        assert calls == {TP: 2}
        await service.aclose()
    finally:
        reader.close()


async def test_partition_versions_move_with_their_events(remote: Remote) -> None:
    """``partition_version`` changes for the partitions of a batch's applied events only."""
    store = remote.store
    assert store.partition_version(TP) == store.partition_version(TP1) == 0
    store.set_consumed({0: 5})  # a commit with no events
    assert store.partition_version(TP) == store.partition_version(TP1) == 0
    await remote.upload(0, data_batches(0, 2), tp=TP1)
    assert store.partition_version(TP) == 0
    first = store.partition_version(TP1)
    assert first != 0
    await remote.upload(10, data_batches(10, 2), tp=TP1)
    assert store.partition_version(TP1) not in (0, first)
    assert store.partition_version(TP) == 0


async def test_the_spans_of_a_partition_dropped_from_the_store_are_not_kept(
    remote: Remote, chunks: ChunkCache
) -> None:
    """A deleted topic's partitions, once forgotten by the store, leave the cache too: it
    does not grow with every topic ever read."""
    gone = await remote.upload(0, data_batches(0, 4), tp=TP1)
    await remote.upload(0, data_batches(0, 4))
    service = _service(remote.store, remote, chunks)
    assert await service.tiered_range(TP1) == (0, 19)
    assert TP1 in service._lineages
    remote.delete(gone)
    assert remote.store.forget_partition(TP1)
    assert [s.topic for s in await service.topics()] == ["orders"]  # the store's partitions read
    assert TP1 not in service._lineages
    assert await service.tiered_range(TP) == (0, 19)
    await service.aclose()
