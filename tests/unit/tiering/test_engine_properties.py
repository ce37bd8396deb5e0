"""A property test of the tiering state machine: random interleavings of faults, then healing.

Hypothesis draws what happens at each metadata publish (it lands; it fails before landing; it
lands but its read-back fails; leadership moves away right after it; another broker deletes a
FINISHED copy behind our back; another broker's delete races our FINISHED), S3 upload faults,
and restarts (the engine stopped mid-way with a short drain deadline, so uploads are cancelled,
and a new engine started on the same store and bucket). The engine is the real one, with its
real uploader and SQLite store; Kafka and S3 are the in-memory fakes of ``test_engine``.

After every run the faults stop and the engine runs until it settles. Invariants:

* every rolled local segment below the LSO is covered by exactly one FINISHED copy along the
  lineage (no hole is left while the local segment exists, no range is FINISHED twice);
* no object of a copy is ever deleted while the store shows that copy FINISHED;
* no unfinished copy or delete is left, and the bucket holds exactly the FINISHED copies'
  objects.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import MetadataPublishError, StorageError
from sidecar.metadata.errors import MetadataReadBackTimeoutError
from sidecar.metadata.events import (
    RemoteLogMetadata,
    RemoteLogSegmentId,
    SegmentMetadata,
    SegmentMetadataUpdate,
)
from sidecar.observability.metrics import Metrics
from sidecar.tiering.quarantine import Quarantine
from sidecar.tiering.uploader import SegmentUploader
from sidecar.tiering.workers import EngineSettings, TieringEngine
from tests.unit.tiering.test_engine import (
    DELETE_FINISHED,
    DELETE_STARTED,
    FINISHED,
    ME,
    OTHER,
    GatedStore,
    Rig,
)

OPS = ("ok", "drop", "late", "move", "steal", "race")


class CheckedStore(GatedStore):
    """Fails the test if an object of a copy the store shows FINISHED is deleted."""

    def __init__(self) -> None:
        super().__init__()
        self.owner: dict[str, RemoteLogSegmentId] = {}
        self.check: Any = None
        self.violations: list[str] = []

    async def delete(self, keys: Any) -> Any:
        keys = list(keys)
        if self.check is not None:
            for key in keys:
                sid = self.owner.get(key)
                if sid is not None and self.check(sid):
                    self.violations.append(key)
        return await super().delete(keys)


class ScriptedPublisher:
    """The fake publisher of the rig, with a scripted fate for each publish."""

    def __init__(self, rig: PropertyRig, ops: list[str]) -> None:
        self.rig = rig
        self.ops = ops
        self.calls = 0
        self.faults_on = True

    async def publish_and_wait(self, event: RemoteLogMetadata) -> tuple[int, int]:
        r = self.rig
        op = self.ops[self.calls % len(self.ops)] if self.faults_on and self.ops else "ok"
        self.calls += 1
        if isinstance(event, SegmentMetadata):
            for key in r.keys_of(event):
                r.objects.owner[key] = event.segment_id
        finishing = isinstance(event, SegmentMetadataUpdate) and event.state is FINISHED
        if op == "drop":
            raise MetadataPublishError("scripted: the write did not land")
        if op == "race" and finishing:
            await r.other_deletes(event.segment_id)  # their DELETE_STARTED comes first
        r.publisher.events.append((time.monotonic(), event))
        r.store.apply([event])
        await asyncio.sleep(0)
        if op == "late":
            raise MetadataReadBackTimeoutError("scripted: published but not read back")
        if op == "move":
            r.move_leadership()
        if op == "steal":
            finished = r.store.segments(r.tip, states={FINISHED})
            if finished:
                await r.other_deletes(r.random.choice(finished).segment_id)
        return 0, self.calls


class PropertyRig(Rig):
    """The engine rig with scripted faults, restarts and another broker."""

    def __init__(self, tmp_path: Path, ops: list[str], seed: int) -> None:
        super().__init__(tmp_path)
        self.tmp_path = tmp_path
        self.random = random.Random(seed)
        self.objects = CheckedStore()
        self.objects.check = lambda sid: (
            (found := self.store.segment(sid)) is not None and found.state is FINISHED
        )
        self.script = ScriptedPublisher(self, ops)
        self.moves: list[asyncio.Task[None]] = []
        self.build()

    def build(self) -> None:
        """A new uploader and engine on the same store and bucket (a restart)."""
        self.metrics = Metrics()
        self.uploader = SegmentUploader(
            objects=self.objects,
            publisher=self.script,  # type: ignore[arg-type]
            layout=self.layout,
            broker_id=ME,
            part_size=5 * 1024 * 1024,
            concurrency=1,
            store=self.store,
            finish_backoff_s=0.0,
        )
        self.engine = TieringEngine(
            views=lambda: {self.scan.path: self.scan},
            cluster=self.cluster,  # type: ignore[arg-type]
            store=self.store,
            tailer=self.tailer,  # type: ignore[arg-type]
            uploader=self.uploader,
            quarantine=Quarantine(self.tmp_path / "state" / "quarantine.json"),
            metrics=self.metrics,
            settings=EngineSettings(
                backoff_initial_s=0.001,
                backoff_max_s=0.01,
                wake_interval_s=0.005,
                handover_delay_s=0.0,
                foreign_copy_grace_s=0.0,
                drain_timeout_s=0.01,
                cleanup_timeout_s=1.0,
            ),
        )
        self.stopping = asyncio.Event()

    def move_leadership(self) -> None:
        """Another broker leads for a moment, then this one again."""
        self.cluster.set_leader(OTHER)
        self.engine.poke()

        async def back() -> None:
            await asyncio.sleep(0.02)
            self.cluster.set_leader(ME)
            self.engine.poke()

        self.moves.append(asyncio.create_task(back()))

    async def other_deletes(self, segment_id: RemoteLogSegmentId) -> None:
        """Another broker deletes a copy: DELETE_STARTED, its objects, DELETE_FINISHED."""
        for state in (DELETE_STARTED, DELETE_FINISHED):
            update = SegmentMetadataUpdate(
                segment_id=segment_id, broker_id=OTHER, event_timestamp_ms=5, state=state
            )
            self.publisher.events.append((time.monotonic(), update))
            result = self.store.apply([update])
            if result.rejected:
                return
            if state is DELETE_STARTED:
                stored = self.store.segment(segment_id)
                assert stored is not None
                await self.objects.delete(list(self.keys_of(stored)))

    async def run_for(self, publishes: int, *, limit_s: float = 3.0) -> None:
        """Run the engine until ``publishes`` more publishes (or everything is tiered), then
        stop it with the short drain deadline."""
        target = self.script.calls + publishes
        self.start()
        deadline = time.monotonic() + limit_s
        while self.script.calls < target and not self.settled() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await self.stop()
        for move in self.moves:
            await move
        self.moves.clear()
        self.cluster.set_leader(ME)

    def settled(self) -> bool:
        return (
            self.all_tiered()
            and not self.store.unfinished_copies()
            and not self.store.unfinished_deletes()
        )


async def _scenario(tmp_path: Path, ops: list[str], phases: list[int], seed: int, s3: int) -> None:
    r = PropertyRig(tmp_path, ops, seed)
    try:
        if s3:
            r.objects.fail_next("put_file", StorageError("scripted: S3 refused"), times=s3)
        for publishes in phases:  # each phase ends in a stop (a restart)
            await r.run_for(publishes)
            r.build()
        r.script.faults_on = False
        r.objects.clear_faults()
        r.start()
        deadline = time.monotonic() + 20
        while not r.settled():
            assert time.monotonic() < deadline, (
                f"not settled: finished={r.finished()} rolled="
                f"{[(s.base_offset, s.end_offset) for s in r.rolled]}"
                f" unfinished={r.store.unfinished_copies()} {r.store.unfinished_deletes()}"
            )
            await asyncio.sleep(0.01)
        await r.stop()
        # every local segment FINISHED exactly once along the lineage, no hole
        assert r.finished() == [(s.base_offset, s.end_offset) for s in r.rolled]
        assert r.objects.violations == [], "objects of a FINISHED copy were deleted"
        assert set(r.objects.objects) == r.expected_objects()
        assert [u async for u in r.objects.list_multipart_uploads("t/")] == []
        assert _open_files(tmp_path / "logs") == [], "segment files left open"
    finally:
        r.store.close()


def _open_files(under: Path) -> list[str]:
    """The files under ``under`` that this process holds open."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink()
        except OSError:
            continue
        if target.is_relative_to(under):
            found.append(str(target))
    return found


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=12),
    phases=st.lists(st.integers(min_value=1, max_value=6), max_size=3),
    seed=st.integers(min_value=0, max_value=2**16),
    s3=st.integers(min_value=0, max_value=2),
)
def test_tiering_converges_under_any_interleaving(tmp_path_factory, ops, phases, seed, s3):
    """Whatever happens around the publishes, tiering converges to one FINISHED copy per local
    segment, with no hole, no deleted object of a FINISHED copy, and no leftover."""
    tmp_path = tmp_path_factory.mktemp("prop")
    asyncio.run(_scenario(tmp_path, ops, phases, seed, s3))
