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
from tests.unit.tiering.test_engine import TOPIC


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


async def test_copy_lag_is_queried_again_only_when_its_inputs_change(rig, monkeypatch):
    """The copy-lag metric is recomputed every ``lag_interval_s``; a partition whose scan, LSO
    and metadata are unchanged since the last time costs no store query, a new scan one."""
    r = rig(lag_interval_s=0.01)
    queried: list[int] = []
    computed = 0
    segments_behind = r.engine._segments_behind
    compute_lag = r.engine._compute_lag

    def counting_queries(scan: Any, tip: Any, lso: int | None) -> Any:
        queried.append(lso)
        return segments_behind(scan, tip, lso)

    def counting_passes(inputs: Any) -> Any:
        nonlocal computed
        result = compute_lag(inputs)
        computed += 1
        return result

    monkeypatch.setattr(r.engine, "_segments_behind", counting_queries)
    monkeypatch.setattr(r.engine, "_compute_lag", counting_passes)
    lag = "kafka_tiered_sidecar_copy_lag_segments"

    async def settled() -> int:
        """The queries made once two whole lag passes in a row made none (a FINISHED applied
        during a pass's query leaves that pass's version behind: the next one asks again)."""
        while True:
            before, seen = len(queried), computed
            await r.until(lambda s=seen: computed >= s + 3)  # two whole passes after ``before``
            if len(queried) == before:
                return before

    r.start()
    await r.until(r.all_tiered)
    await r.until(lambda: r.metrics.registry.get_sample_value(lag, {"topic": TOPIC}) == 0)
    settled_at = await settled()
    seen = computed
    await r.until(lambda: computed >= seen + 3)
    assert len(queried) == settled_at
    r.scan = dataclasses.replace(r.scan)  # a rescan found the partition changed
    r.engine.poke()
    await r.until(lambda: len(queried) == settled_at + 1)
    seen = computed
    await r.until(lambda: computed >= seen + 3)
    assert len(queried) == settled_at + 1


async def test_a_look_that_finds_nothing_pokes_no_pass(rig, monkeypatch):
    """An idle partition is looked at again every ``idle_recheck_s``; a look that finds nothing
    to upload does not wake the engine for another pass (at a thousand led partitions those
    looks alone kept passes running), while one that uploaded does."""
    r = rig(idle_recheck_s=0.02, idle_recheck_max_s=0.02)  # the safety net: a look each time
    pokes = 0
    poke = r.engine.poke

    def counting() -> None:
        nonlocal pokes
        pokes += 1
        poke()

    monkeypatch.setattr(r.engine, "poke", counting)
    looks = 0
    work_partition = r.engine._work_partition

    async def counting_looks(key: Any) -> bool:
        nonlocal looks
        result = await work_partition(key)
        looks += 1
        return result

    monkeypatch.setattr(r.engine, "_work_partition", counting_looks)
    r.start()
    await r.until(r.all_tiered)
    await r.until(lambda: looks >= 2)
    assert pokes >= 1  # the look that uploaded
    settled, seen = pokes, looks
    await r.until(lambda: looks >= seen + 3)
    assert pokes == settled


async def test_an_idle_partition_is_looked_at_again_when_its_metadata_changed(rig, monkeypatch):
    """Past ``idle_recheck_s`` a partition that found nothing to do is planned again only if
    the metadata store changed for it meanwhile (another broker's copy or deletion), or once
    ``idle_recheck_max_s`` has passed; unchanged, passes leave it alone."""
    r = rig(idle_recheck_s=0.02, idle_recheck_max_s=3600)
    version = 0
    monkeypatch.setattr(r.store, "partition_version", lambda tp: version)
    looks = passes = 0
    work_partition = r.engine._work_partition
    reconcile = r.engine._reconcile

    async def counting_looks(key: Any) -> bool:
        nonlocal looks
        result = await work_partition(key)
        looks += 1
        return result

    def counting_passes(tg: asyncio.TaskGroup) -> None:
        nonlocal passes
        passes += 1
        reconcile(tg)

    monkeypatch.setattr(r.engine, "_work_partition", counting_looks)
    monkeypatch.setattr(r.engine, "_reconcile", counting_passes)
    r.start()
    await r.until(r.all_tiered)
    await r.until(lambda: looks >= 2)  # the look that uploaded, then one that found nothing
    settled, seen = looks, passes
    await r.until(lambda: passes >= seen + 30)  # 30 wake-ups of 10 ms: past idle_recheck_s
    assert looks == settled
    version += 1  # an event of the partition applied
    await r.until(lambda: looks == settled + 1)
    seen = passes
    await r.until(lambda: passes >= seen + 30)
    assert looks == settled + 1
