"""What keeps the engine's passes over every partition cheap at thousands of partitions: a
partition's identity (topic id, metadata partition) is worked out once, not on every pass, and
a slow pass spaces out the next one however often the engine is poked."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any

from sidecar.kafka.checkpoints import encode_kafka_uuid
from sidecar.metadata.events import TopicIdPartition
from sidecar.tiering import workers


async def test_a_partitions_identity_is_worked_out_once(rig, monkeypatch):
    """Many passes over one partition hash its metadata partition once; a new topic id (the
    topic deleted and created again) is a new identity, worked out once more."""
    r = rig()
    hashed: list[TopicIdPartition] = []  # by the passes (an upload syncs its metadata too)
    real = workers.metadata_partition
    passes = 0
    in_pass = False

    def counting(tip: TopicIdPartition, partitions: int) -> int:
        if in_pass:
            hashed.append(tip)
        return real(tip, partitions)

    monkeypatch.setattr(workers, "metadata_partition", counting)
    reconcile = r.engine._reconcile

    def counted(tg: asyncio.TaskGroup) -> None:
        nonlocal passes, in_pass
        passes += 1
        in_pass = True
        try:
            reconcile(tg)
        finally:
            in_pass = False

    monkeypatch.setattr(r.engine, "_reconcile", counted)
    r.start()
    await r.until(r.all_tiered)
    await r.until(lambda: passes >= 5)
    assert hashed == [r.tip]
    again = uuid.uuid4()
    r.scan = dataclasses.replace(r.scan, topic_id=encode_kafka_uuid(again))
    await r.until(lambda: len(hashed) == 2)
    assert hashed[1].topic_id == again
    seen = passes
    await r.until(lambda: passes >= seen + 3)
    assert len(hashed) == 2


async def test_a_slow_pass_spaces_out_the_next_one(rig, monkeypatch):
    """After a pass that took t seconds the engine waits at least 4 t (for nothing but a stop)
    before it looks at pokes again: passes take at most a fifth of the event loop."""
    r = rig()
    waits: list[tuple[int, float]] = []
    real_wait = workers.wait_any

    async def recording(*events: asyncio.Event, within: float) -> Any:
        waits.append((len(events), within))
        return await real_wait(*events, within=within)

    monkeypatch.setattr(workers, "wait_any", recording)
    reconcile = r.engine._reconcile

    def slow(tg: asyncio.TaskGroup) -> None:
        time.sleep(0.005)  # the cost of a pass over many partitions
        reconcile(tg)

    monkeypatch.setattr(r.engine, "_reconcile", slow)
    r.start()
    await r.until(lambda: len(waits) >= 6)
    spacings = [within for count, within in waits if count == 1]  # the stop event alone
    assert len(spacings) >= 2
    assert all(within >= 4 * 0.005 for within in spacings)
    # each spacing comes before the wait for a poke or the wake interval
    assert [count for count, _ in waits[:2]] == [1, 2]
