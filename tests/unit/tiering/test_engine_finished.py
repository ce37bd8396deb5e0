"""Once FINISHED may have been sent, a copy is never abandoned; holes are seen and filled.

The engine runs with its real uploader and store and an in-memory object store (the rig of
``test_engine``); the faults are the ones that used to delete a finished copy for good: a
read-back that times out or fails after FINISHED was applied, a cancellation during the
read-back, another broker's delete racing a FINISHED, and a delete of a copy that finished
meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from sidecar.errors import MetadataPublishError
from sidecar.metadata.errors import MetadataReadBackTimeoutError
from sidecar.metadata.events import (
    RemoteLogMetadata,
    SegmentMetadata,
    SegmentMetadataUpdate,
)
from sidecar.retention.safety import lost_segments
from sidecar.tiering.workers import remote_coverage
from tests.unit.tiering.test_engine import (
    DELETE_FINISHED,
    DELETE_STARTED,
    FINISHED,
    ME,
    OTHER,
    STARTED,
    Rig,
)


def _counted_looks(r: Rig) -> list[int]:
    """A one-item list that counts the engine's looks at a partition from now on (a look
    plans the partition and uploads what the plan says)."""
    looks = [0]
    work_partition = r.engine._work_partition

    async def counting(key: Any) -> bool:
        result = await work_partition(key)
        looks[0] += 1
        return result

    r.engine._work_partition = counting  # type: ignore[method-assign]
    return looks


def _copies(r: Rig) -> list[SegmentMetadata]:
    return [e for _, e in r.publisher.events if isinstance(e, SegmentMetadata)]


def _fail_after_finished(r: Rig, exc: Exception, *, times: int = 1) -> list[SegmentMetadataUpdate]:
    """The publisher applies FINISHED (it is on the topic), then reports ``exc``."""
    publish = r.publisher.publish_and_wait
    failed: list[SegmentMetadataUpdate] = []

    async def publish_and_wait(event: RemoteLogMetadata) -> tuple[int, int]:
        result = await publish(event)
        if (
            isinstance(event, SegmentMetadataUpdate)
            and event.state is FINISHED
            and len(failed) < times
        ):
            failed.append(event)
            raise exc
        return result

    r.publisher.publish_and_wait = publish_and_wait  # type: ignore[method-assign]
    return failed


class TestFinishedIsNeverAbandoned:
    """A failure after FINISHED was sent is settled by the copy's state on the topic."""

    @pytest.mark.parametrize(
        "exc",
        [
            pytest.param(MetadataReadBackTimeoutError("not read back in time"), id="read-back"),
            pytest.param(MetadataPublishError("the producer died"), id="producer"),
        ],
    )
    async def test_failure_after_finished_applied_keeps_the_copy(self, rig, exc):
        """FINISHED landed but the publish reports a failure: the copy stays FINISHED, its
        objects stay, nothing is deleted and every segment is tiered exactly once."""
        r = rig()
        failed = _fail_after_finished(r, exc)
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert len(failed) == 1
        assert [e.state for _, e in r.publisher.events].count(DELETE_STARTED) == 0
        assert len(_copies(r)) == len(r.rolled)  # no segment uploaded twice
        assert set(r.objects.objects) == r.expected_objects()

    async def test_finished_that_did_not_land_is_sent_again(self, rig):
        """The publish of FINISHED fails before it lands: the topic still shows STARTED, so
        FINISHED is sent again (no re-upload, no delete)."""
        r = rig()
        publish = r.publisher.publish_and_wait
        dropped: list[RemoteLogMetadata] = []

        async def publish_and_wait(event: RemoteLogMetadata) -> tuple[int, int]:
            if isinstance(event, SegmentMetadataUpdate) and event.state is FINISHED and not dropped:
                dropped.append(event)
                raise MetadataPublishError("broker refused the write")
            return await publish(event)

        r.publisher.publish_and_wait = publish_and_wait  # type: ignore[method-assign]
        r.uploader._finish_backoff_s = 0.0
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        first = _copies(r)[0]
        assert r.states_of(first) == [STARTED, FINISHED]
        assert len(_copies(r)) == len(r.rolled)
        assert set(r.objects.objects) == r.expected_objects()

    async def test_cancelled_during_finished_read_back_keeps_the_copy(self, rig):
        """Leadership moves while FINISHED is being read back (the worker is cancelled): the
        copy is settled FINISHED, not deleted; when leadership comes back nothing is redone."""
        r = rig()
        publish = r.publisher.publish_and_wait
        reading_back = asyncio.Event()
        release = asyncio.Event()

        async def publish_and_wait(event: RemoteLogMetadata) -> tuple[int, int]:
            result = await publish(event)
            finishing = isinstance(event, SegmentMetadataUpdate) and event.state is FINISHED
            if finishing and not reading_back.is_set():
                reading_back.set()
                await release.wait()  # the read-back of the first FINISHED hangs
            return result

        r.publisher.publish_and_wait = publish_and_wait  # type: ignore[method-assign]
        r.start()
        await asyncio.wait_for(reading_back.wait(), 5)
        r.cluster.set_leader(OTHER)
        r.engine.poke()
        await r.until(lambda: r.metrics.preempted_copies.labels("not_leader")._value.get() == 1)
        release.set()
        first = _copies(r)[0]
        await r.until(lambda: not r.engine.busy_partitions)
        assert r.states_of(first) == [STARTED, FINISHED]
        assert r.finished()[0] == (first.start_offset, first.end_offset)
        r.cluster.set_leader(ME)
        r.engine.poke()
        await r.until(r.all_tiered)
        await r.stop()
        assert len(_copies(r)) == len(r.rolled)
        assert set(r.objects.objects) == r.expected_objects()


class TestHolesAreFilled:
    """Planning follows the FINISHED coverage of the lineage, not a monotone highest offset."""

    async def test_finished_copy_deleted_by_another_broker_is_uploaded_again(self, rig):
        """Another broker deletes a FINISHED copy in the middle of the log (a dangling-delete
        race): the range is uploaded again while the local segment exists."""
        r = rig()
        r.start()
        await r.until(r.all_tiered)
        middle = r.store.segments(r.tip, states={FINISHED})[1]
        r.update(middle, DELETE_STARTED, broker=OTHER)
        r.update(middle, DELETE_FINISHED, broker=OTHER)
        assert not r.all_tiered()
        r.scan = dataclasses.replace(r.scan)  # what the detector does on a change
        r.engine.poke()
        await r.until(r.all_tiered)
        await r.stop()
        redone = _copies(r)[-1]
        assert (redone.start_offset, redone.end_offset) == (middle.start_offset, middle.end_offset)

    async def test_first_copy_deleted_is_uploaded_again(self, rig):
        """A partition this sidecar tiered from its first copy has floor 0: a hole at its very
        start is a hole too, not retention."""
        r = rig()
        r.start()
        await r.until(r.all_tiered)
        first = r.store.segments(r.tip, states={FINISHED})[0]
        r.update(first, DELETE_STARTED, broker=OTHER)
        r.update(first, DELETE_FINISHED, broker=OTHER)
        r.scan = dataclasses.replace(r.scan)  # what the detector does on a change
        r.engine.poke()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.store.remote_floor(r.tip) == 0

    async def test_retention_deletes_below_the_floor_are_not_uploaded_again(self, rig):
        """Deletions below the floor that retention recorded are on purpose: nothing is
        uploaded again for them."""
        r = rig()
        r.start()
        await r.until(r.all_tiered)
        first = r.store.segments(r.tip, states={FINISHED})[0]
        r.store.raise_remote_floor(r.tip, first.end_offset + 1)
        r.update(first, DELETE_STARTED, broker=ME)
        r.update(first, DELETE_FINISHED, broker=ME)
        copies = len(_copies(r))
        looks = _counted_looks(r)
        r.scan = dataclasses.replace(r.scan)  # what the detector does on a change
        r.engine.poke()
        await r.until(lambda: looks[0] >= 1)  # the partition was planned again
        await r.stop()
        assert len(_copies(r)) == copies

    async def test_a_log_start_inside_a_tiered_segment_is_no_hole(self, rig):
        """DeleteRecords moved the log start into a tiered segment and the broker cut its
        leader-epoch checkpoint to it: the segment's offsets below it are gone, not a hole,
        and nothing is uploaded again (it was, on every pass, before)."""
        r = rig()
        r.start()
        await r.until(r.all_tiered)
        first, second = r.store.segments(r.tip, states={FINISHED})[:2]
        new_start = second.start_offset + 1
        r.store.raise_remote_floor(r.tip, first.end_offset + 1)  # what retention records
        r.update(first, DELETE_STARTED, broker=ME)
        r.update(first, DELETE_FINISHED, broker=ME)
        copies = len(_copies(r))
        # Kafka's truncateFromStart: the last epoch starting at or below the new start
        # begins there, earlier ones go
        kept = [e for e in r.scan.leader_epochs if e.start_offset > new_start]
        below = [e for e in r.scan.leader_epochs if e.start_offset <= new_start]
        epochs = tuple([below[-1]._replace(start_offset=new_start), *kept])
        r.scan = dataclasses.replace(
            r.scan, leader_epochs=epochs, segments=r.scan.segments[1:]
        )  # the broker deleted the first segment and truncated its checkpoint
        coverage = remote_coverage(r.store, r.scan, r.tip, r.cluster.lso)
        assert coverage.floor == new_start
        assert not coverage.uncovered(second.start_offset, second.end_offset)
        looks = _counted_looks(r)
        r.engine.poke()
        await r.until(lambda: looks[0] >= 1)  # the partition was planned again
        await r.stop()
        assert len(_copies(r)) == copies

    async def test_hole_whose_local_segment_is_gone_is_reported_lost(self, rig):
        """The local segment of a hole is deleted by the broker: it is reported lost, although
        the monotone highest remote offset is past it."""
        r = rig()
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        middle = r.store.segments(r.tip, states={FINISHED})[1]
        r.update(middle, DELETE_STARTED, broker=OTHER)
        r.update(middle, DELETE_FINISHED, broker=OTHER)
        coverage = remote_coverage(r.store, r.scan, r.tip, r.cluster.lso)
        remaining = [s for s in r.scan.segments if s.base_offset != middle.start_offset]
        highest = r.rolled[-1].end_offset
        lost = lost_segments(
            r.scan.segments[:2], remaining, highest_tiered_offset=highest, coverage=coverage
        )
        assert lost == []  # it is not older than every remaining segment: not deleted by age
        gone = [s for s in r.scan.segments if s.base_offset > middle.start_offset]
        lost = lost_segments(
            r.scan.segments, gone, highest_tiered_offset=highest, coverage=coverage
        )
        assert [s.base_offset for s in lost] == [middle.start_offset]
        assert lost_segments(r.scan.segments, gone, highest_tiered_offset=highest) == []


class TestDeletesRecheck:
    """Every delete of a copy re-checks the copy's current state on the topic first."""

    async def test_dangling_copy_finished_meanwhile_is_not_deleted(self, rig):
        """Another broker's STARTED copy finishes between the grace period's end and our
        dangling-copy delete: the re-check sees FINISHED and deletes nothing."""
        r = rig(foreign_copy_grace_s=0.0)
        theirs = r.copy_started(0, broker=OTHER)
        syncs: list[Any] = []

        async def sync(tip: Any) -> None:
            syncs.append(tip)
            if len(syncs) == 1:  # their FINISHED lands just before our re-check reads
                r.update(theirs, FINISHED, broker=OTHER)

        r.uploader._sync = sync
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.states_of(theirs) == []  # no DELETE_SEGMENT_STARTED from us
        assert [c.start_offset for c in _copies(r)] == [s.base_offset for s in r.rolled[1:]]
        assert r.metrics.repairs.labels("dangling_copy")._value.get() == 0

    async def test_own_unfinished_copy_already_being_deleted_is_finished(self, rig):
        """Crash repair of our STARTED copy that another broker is already deleting: the
        delete is finished (FINISHED of the delete), not started twice."""
        r = rig()
        leftover = r.copy_started(0, broker=ME)

        async def sync(tip: Any) -> None:
            if r.store.segment(leftover.segment_id).state is STARTED:
                r.update(leftover, DELETE_STARTED, broker=OTHER)

        r.uploader._sync = sync
        r.start()
        await r.until(r.all_tiered)
        await r.stop()
        assert r.states_of(leftover) == [DELETE_FINISHED]
