"""A pass visits the partitions something happened to, not every partition: a changed log dir
(the detector's journal), a leadership or config change (a pass over all), an LSO looked up for
one partition, a worker's end, a due timer (backoff, handover, idle look), a partition waiting
for its metadata; and a pass over every partition still comes at least every
``full_pass_interval_s``. A partition is "visited" when the pass looks up its leader."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sidecar.errors import SidecarError
from sidecar.kafka.logdir import PartitionScan
from sidecar.tiering.detector import ViewMap
from tests.unit.tiering.test_engine import ME, OTHER, TOPIC, Rig

PARTITIONS = 200


class Leaders(dict[tuple[str, int], int]):
    """The view's leaders, recording which partitions a pass asked about."""

    def __init__(self, leaders: dict[tuple[str, int], int]) -> None:
        super().__init__(leaders)
        self.asked: list[tuple[str, int]] = []

    def get(self, key: tuple[str, int], default: Any = None) -> Any:
        self.asked.append(key)
        return super().get(key, default)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Many:
    """The rig's partition 0 (led here, real files) among ``PARTITIONS`` partitions of the
    topic led by another broker, in the detector's own views; passes run one at a time."""

    def __init__(self, rig: Callable[..., Rig], **settings: Any) -> None:
        self.clock = Clock()
        settings = {
            "lag_interval_s": 3600.0,
            "full_pass_interval_s": 3600.0,
            "monotonic": self.clock,
            **settings,
        }
        self.r = rig(**settings)
        self.views: ViewMap[PartitionScan] = ViewMap()
        self.views[self.r.scan.path] = self.r.scan
        for i in range(1, PARTITIONS):
            path = Path(f"/logs/{TOPIC}-{i}")
            self.views[path] = dataclasses.replace(self.r.scan, path=path, partition=i)
        self.r.engine._views = lambda: self.views
        self.leaders = Leaders({(TOPIC, i): OTHER for i in range(1, PARTITIONS)})
        self.leaders[(TOPIC, 0)] = ME
        self.set_view(self.leaders)
        self.looks = 0
        work_partition = self.r.engine._work_partition

        async def counting(key: Any) -> bool:
            self.looks += 1
            return await work_partition(key)

        self.r.engine._work_partition = counting  # type: ignore[method-assign]

    def set_view(self, leaders: Leaders, **changes: Any) -> None:
        view = self.r.cluster.view
        self.r.cluster.view = dataclasses.replace(view, leaders=leaders, **changes)

    def change(self, partition: int) -> None:
        """A rescan found the partition's dir changed (the detector notes it)."""
        path = next(p for p, s in self.views.items() if s.partition == partition)
        self.views[path] = dataclasses.replace(self.views[path])
        self.views.note(path)

    @asynccontextmanager
    async def passes(self) -> AsyncIterator[Callable[[], set[int]]]:
        """Run passes: each call runs one and returns the partitions it visited."""
        async with asyncio.TaskGroup() as tg:

            def one() -> set[int]:
                self.leaders.asked.clear()
                self.r.engine._reconcile(tg)
                return {partition for _, partition in self.leaders.asked}

            yield one
            self.r.engine._stopping.set()

    async def idle(self) -> None:
        """Partition 0's worker has ended (its uploads done)."""
        await self.r.until(lambda: not self.r.engine.busy_partitions)


async def test_a_pass_after_one_partitions_change_visits_only_it(rig):
    m = Many(rig)
    async with m.passes() as run:
        assert run() == set(range(PARTITIONS))  # the first pass: every partition
        await m.idle()
        assert m.r.all_tiered()
        assert run() == {0}  # its worker ended: started again or timed, not the others
        assert run() == set()
        m.change(57)
        assert run() == {57}
        looks = m.looks
        m.change(0)  # a roll in the led partition: planned again, at once
        assert run() == {0}
        await m.idle()
        assert m.looks == looks + 1


async def test_a_leadership_change_is_visited(rig):
    """A new picture of the leaders is a pass over every partition: the partition that this
    broker now leads starts its worker (after the handover delay, 0 here)."""
    m = Many(rig)
    async with m.passes() as run:
        run()
        await m.idle()
        run()
        assert run() == set()
        looks = m.looks
        leaders = Leaders({**m.leaders, (TOPIC, 0): OTHER, (TOPIC, 3): ME})
        m.leaders = leaders
        m.set_view(leaders)
        assert run() == set(range(PARTITIONS))
        await m.idle()
        assert m.looks == looks + 1  # partition 3, led here now
        assert (TOPIC, 3) in m.r.engine._workers
        assert run() == {3}  # its worker ended
        assert run() == set()


async def test_an_lso_looked_up_for_one_partition_visits_it_alone(rig):
    """``fetch_lso`` merges one partition's LSO into the view (same leaders, same refresh):
    only that partition is visited, and planned again."""
    m = Many(rig)
    async with m.passes() as run:
        run()
        await m.idle()
        run()
        looks = m.looks
        lsos = {**m.r.cluster.view.last_stable_offsets, (TOPIC, 0): m.r.cluster.lso + 5}
        m.set_view(m.leaders, last_stable_offsets=lsos)
        assert run() == {0}
        await m.idle()
        assert m.looks == looks + 1


async def test_a_due_retry_is_visited(rig, monkeypatch):
    """A failed worker's backoff is a timer: the partition is not visited before it is due,
    and is then retried."""
    m = Many(rig, backoff_initial_s=5.0, backoff_max_s=5.0)
    failing = True
    work_partition = m.r.engine._work_partition

    async def failing_once(key: Any) -> bool:
        if failing:
            raise SidecarError("S3 said no")
        return await work_partition(key)

    monkeypatch.setattr(m.r.engine, "_work_partition", failing_once)
    async with m.passes() as run:
        run()
        await m.idle()
        retry_at = m.r.engine._workers[(TOPIC, 0)].retry_at
        assert retry_at > m.clock.now
        assert run() == {0}  # it ended: its retry is timed
        assert run() == set()
        m.clock.now = retry_at - 0.001
        assert run() == set()
        failing = False
        m.clock.now = retry_at
        assert run() == {0}
        await m.idle()
        assert m.r.all_tiered()


async def test_the_handover_delay_is_a_timer(rig):
    m = Many(rig, handover_delay_s=10.0)
    async with m.passes() as run:
        assert run() == set(range(PARTITIONS))
        assert m.looks == 0
        m.clock.now += 9.9
        assert run() == set()
        m.clock.now += 0.1
        assert run() == {0}
        await m.idle()
        assert m.looks == 1


async def test_an_idle_look_is_a_timer(rig):
    """A worker that ended is looked at again after ``idle_recheck_s`` (here the safety net of
    ``idle_recheck_max_s`` too, so each look plans); passes in between leave it alone."""
    m = Many(rig, idle_recheck_s=30.0, idle_recheck_max_s=30.0)
    async with m.passes() as run:
        run()
        await m.idle()
        assert m.looks == 1  # the look that uploaded
        for looks in (2, 3):  # then looks that find nothing
            assert run() == {0}  # it ended: its next look is timed
            assert run() == set()
            m.clock.now += 29.0
            assert run() == set()
            m.clock.now += 1.0
            assert run() == {0}
            await m.idle()
            assert m.looks == looks


async def test_a_partition_waiting_for_its_metadata_is_visited_every_pass(rig):
    m = Many(rig)
    caught_up = False
    m.r.tailer.caught_up = lambda mp: caught_up  # type: ignore[method-assign]
    async with m.passes() as run:
        run()
        assert run() == {0}
        assert run() == {0}
        assert m.looks == 0
        caught_up = True
        assert run() == {0}
        await m.idle()
        assert m.r.all_tiered()


async def test_a_pass_over_every_partition_comes_every_full_pass_interval(rig):
    m = Many(rig, full_pass_interval_s=60.0, idle_recheck_s=3600.0)
    async with m.passes() as run:
        run()
        await m.idle()
        run()
        m.clock.now += 59.0
        assert run() == set()
        m.clock.now += 1.0
        assert run() == set(range(PARTITIONS))
        assert run() == set()


async def test_pause_resume_retry_now_and_a_quarantine_change_walk_every_partition(rig):
    m = Many(rig)
    async with m.passes() as run:
        run()
        await m.idle()
        run()
        assert run() == set()
        m.r.pause = "S3 unreachable"
        assert run() == set(range(PARTITIONS))
        assert run() == set()
        m.r.pause = None
        assert run() == set(range(PARTITIONS))
        m.r.engine.retry_now()
        assert run() == set(range(PARTITIONS))
        assert run() == set()
        await m.r.engine._reload_quarantine()  # unchanged file: nothing to look at again
        assert run() == set()


async def test_a_stale_view_walks_every_partition(rig):
    """The view turning stale (no refresh) is a pass over all: the partition led here loses
    its right to upload."""
    m = Many(rig)
    async with m.passes() as run:
        run()
        await m.idle()
        run()
        assert (TOPIC, 0) in m.r.engine._led_since
        m.set_view(m.leaders, refreshed_at=-1e9)  # long ago
        run()  # (a stale view is not asked who leads)
        assert (TOPIC, 0) not in m.r.engine._led_since


async def test_a_gone_partition_dir_drops_its_state(rig):
    m = Many(rig)
    async with m.passes() as run:
        run()
        await m.idle()
        run()
        m.r.engine.last_errors[(TOPIC, 0)] = (0.0, "old")
        path = m.r.scan.path
        del m.views[path]
        m.views.note(path)
        assert run() == set()
        assert (TOPIC, 0) not in m.r.engine.last_errors
        assert (TOPIC, 0) not in m.r.engine._workers


async def test_the_copy_lag_update_visits_no_partition(rig):
    """The copy lag is counted over the partitions whose lag counts as of their last visit
    (led here, handed over, metadata caught up): its update is not a pass over every
    partition."""
    m = Many(rig, lag_interval_s=10.0)
    counted: list[list[int]] = []
    compute = m.r.engine._compute_lag

    def recording(inputs: Any) -> Any:
        counted.append([tip.partition for _scan, tip, _lso in inputs])
        return compute(inputs)

    m.r.engine._compute_lag = recording  # type: ignore[method-assign]
    async with m.passes() as run:
        assert run() == set(range(PARTITIONS))
        await m.idle()
        run()
        assert run() == set()
        m.clock.now += 10.0  # the copy lag is due
        assert run() == set()
        assert m.r.engine._lag_task is not None
        await m.r.engine._lag_task
        assert counted[-1] == [0]  # the one partition led here, of 200
