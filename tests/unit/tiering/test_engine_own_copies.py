"""Crash repair tells this sidecar's STARTED copies from others under the same broker id: the
broker's own RLM writes COPY_SEGMENT_STARTED with this broker's id for a topic just turned
broker-driven, before its copy call or the next config refresh tells the sidecar. Only a copy
this process started, or one stamped before it started, is deleted at once; any other waits
out the grace period. Both clocks are the test's: nothing depends on timing."""

from __future__ import annotations

from sidecar.errors import MetadataPublishError, StorageError
from sidecar.metadata.events import RemoteLogMetadata, SegmentMetadata, SegmentMetadataUpdate
from tests.unit.tiering.test_engine import DELETE_FINISHED, DELETE_STARTED, ME, STARTED, TOPIC

#: the wall clock (ms) while the engine is built and runs
NOW_MS = 1_800_000_000_000
GRACE_S = 60.0
KEY = (TOPIC, 0)


class FakeTime:
    """The engine's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _rig(rig, clock: FakeTime):
    return rig(
        foreign_copy_grace_s=GRACE_S,
        monotonic=clock,
        clock_ms=lambda: NOW_MS,
    )


async def _next_run_ended(r, after=None):
    """Wait until a worker of the partition other than ``after`` has run and ended."""
    await r.until(
        lambda: (
            KEY in r.engine._workers
            and r.engine._workers[KEY] is not after
            and r.engine._workers[KEY].task.done()
        )
    )
    return r.engine._workers[KEY]


class TestOwnIdCopies:
    """A STARTED copy under this broker's id is repaired at once only if it is this sidecar's."""

    async def test_a_copy_under_this_id_not_started_here_waits_out_the_grace(self, rig):
        """A STARTED copy under this broker's id, stamped after this process started and not
        published by it (the broker's RLM's copy in flight), is left alone and holds the
        partition back for the grace period; still STARTED after it, it is deleted as dangling
        and the segment redone."""
        clock = FakeTime()
        r = _rig(rig, clock)
        brokers = r.copy_started(0, broker=ME, stamped_ms=NOW_MS + 5_000)
        r.start()
        first = await _next_run_ended(r)
        assert r.publisher.events == []  # neither deleted nor uploaded over
        clock.now += GRACE_S - 0.5  # just before the grace period ends: looked at again
        r.engine.poke()
        await _next_run_ended(r, after=first)
        assert r.publisher.events == []
        assert [m.segment_id for m in r.store.unfinished_copies(r.tip)] == [brokers.segment_id]
        clock.now += 1.0  # past it, and the copy is still STARTED
        r.engine.poke()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.states_of(brokers) == [DELETE_STARTED, DELETE_FINISHED]
        assert r.metrics.repairs.labels("dangling_copy")._value.get() == 1
        assert r.metrics.repairs.labels("unfinished_copy")._value.get() == 0

    async def test_a_copy_started_here_that_failed_is_repaired_at_once(self, rig):
        """This process published STARTED, then the upload failed and so did its cleanup
        (Kafka down for DELETE_SEGMENT_STARTED): the copy stays STARTED, stamped after the
        start, and the worker's next run deletes and redoes it at once, within the grace."""
        clock = FakeTime()
        r = _rig(rig, clock)
        r.objects.fail_next("put_file", StorageError("S3 down"))
        failed: list[RemoteLogMetadata] = []

        def kafka_down_for_the_cleanup(event: RemoteLogMetadata) -> None:
            deleting = isinstance(event, SegmentMetadataUpdate) and event.state is DELETE_STARTED
            if deleting and not failed:
                failed.append(event)
                raise MetadataPublishError("Kafka down")

        r.publisher.before = kafka_down_for_the_cleanup
        r.start()
        first = await _next_run_ended(r)
        assert failed
        mine = next(e for _, e in r.publisher.events if isinstance(e, SegmentMetadata))
        assert mine.event_timestamp_ms >= NOW_MS  # stamped after this process started
        assert r.states_of(mine) == [STARTED]
        assert r.engine.last_errors[KEY][1].startswith("StorageError")
        clock.now += 1.0  # past the failure's backoff, well within the grace period
        r.engine.poke()
        await _next_run_ended(r, after=first)
        assert r.states_of(mine) == [STARTED, DELETE_STARTED, DELETE_FINISHED]
        assert r.metrics.repairs.labels("unfinished_copy")._value.get() == 1
        await r.until(r.all_tiered)
        await r.stop()
        assert r.metrics.repairs.labels("dangling_copy")._value.get() == 0
        assert not r.uploader.started_here(mine.segment_id)  # forgotten once repaired
        assert set(r.objects.objects) == r.expected_objects()

    async def test_a_copy_of_an_earlier_run_is_repaired_at_once(self, rig):
        """A STARTED copy under this broker's id stamped before this process started (a crash
        of an earlier run) is deleted and redone at once, as before."""
        clock = FakeTime()
        r = _rig(rig, clock)
        earlier = r.copy_started(0, broker=ME, stamped_ms=NOW_MS - 10_000)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.states_of(earlier) == [DELETE_STARTED, DELETE_FINISHED]
        assert r.metrics.repairs.labels("unfinished_copy")._value.get() == 1
