"""Local-retention safety (at risk, lost) on real log dirs written by the test builders, and the
orphan scrub over an in-memory bucket and a real metadata store with an injected clock."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sidecar.kafka.logdir import scan_partition_dir
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.retention.safety import LocalRetention, at_risk_segments, lost_segments
from sidecar.retention.scrub import OrphanScrubber
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.memory import MemoryObjectStore
from sidecar.storage.ownership import PrefixOwner, claim_prefix, marker_key
from sidecar.testing import TestRecord, build_batch, write_partition
from sidecar.tiering.cluster import ClusterView, TopicConfig

LAYOUT = KeyLayout(prefix="p/")
TP = TopicIdPartition(uuid.UUID(int=11), "orders", 0)
OWNER = PrefixOwner("cluster-a", "__remote_log_metadata")
MARKER = marker_key(LAYOUT.prefix)


async def claim(objects: MemoryObjectStore, prefix: str = LAYOUT.prefix) -> None:
    """Write the prefix's ownership marker, as the daemon does at startup."""
    await claim_prefix(
        objects, prefix, cluster_id=OWNER.cluster_id, metadata_topic=OWNER.metadata_topic
    )


def _scan(tmp_path: Path, segments: int = 4):
    batches = [
        [build_batch([TestRecord(b"k", b"v" * 100)] * 5, base_timestamp=1000 * (i + 1))]
        for i in range(segments)
    ]
    scan = scan_partition_dir(write_partition(tmp_path / "logs", "orders", 0, batches))
    assert scan is not None
    return scan


def finished_copies(
    store: RemoteSegmentStore, tp: TopicIdPartition, spans: list[tuple[int, int, int]]
) -> list[SegmentMetadata]:
    """Tier ``(start offset, max timestamp, size)`` spans of five offsets each in epoch 0:
    COPY_SEGMENT_STARTED and FINISHED of each applied to ``store``; their metadata."""
    copies = [
        SegmentMetadata(
            segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
            start_offset=start,
            end_offset=start + 4,
            broker_id=1,
            max_timestamp_ms=max_ts,
            event_timestamp_ms=0,
            segment_leader_epochs=((0, start),),
            segment_size_in_bytes=size,
        )
        for start, max_ts, size in spans
    ]
    store.apply(copies)
    store.apply(
        [
            SegmentMetadataUpdate(
                segment_id=c.segment_id,
                broker_id=1,
                event_timestamp_ms=0,
                state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
            )
            for c in copies
        ]
    )
    return copies


def led_view(config: TopicConfig) -> ClusterView:
    """Broker 1 leads orders-0 (LSO 20), whose topic has ``config``."""
    return ClusterView(
        broker_id=1,
        leaders={("orders", 0): 1},
        configs={"orders": config},
        last_stable_offsets={("orders", 0): 20},
        refreshed_at=time.monotonic(),
        stale_after_s=3600,
    )


class TestLocalRetention:
    """Kafka's localRetentionMs/Size and the at-risk and lost rules."""

    def test_local_values_apply_only_with_remote_storage_enabled(self):
        kw = {"retention_ms": 100, "retention_bytes": 200}
        assert LocalRetention.of(
            remote_storage_enable=False, local_retention_ms=5, local_retention_bytes=6, **kw
        ) == LocalRetention(100, 200)
        assert LocalRetention.of(
            remote_storage_enable=True, local_retention_ms=5, local_retention_bytes=-2, **kw
        ) == LocalRetention(5, 200)

    def test_copy_disabled_falls_back_to_retention(self):
        # KIP-950: with remote.log.copy.disable=true nothing more is copied, and the broker
        # deletes local segments by retention.* (remoteLogEnabledAndRemoteCopyEnabled)
        assert LocalRetention.of(
            remote_storage_enable=True,
            remote_log_copy_disable=True,
            retention_ms=100,
            retention_bytes=200,
            local_retention_ms=5,
            local_retention_bytes=6,
        ) == LocalRetention(100, 200)

    def test_at_risk_by_time(self, tmp_path):
        scan = _scan(tmp_path)
        rolled = [s for s in scan.segments if s.end_offset is not None]
        risky = at_risk_segments(
            scan.segments,
            highest_tiered_offset=rolled[0].end_offset,
            retention=LocalRetention(10_000, -1),
            now_ms=10_000,
            fraction=0.8,
        )
        # max timestamps are 1000, 2000, 3000 (ages 9000, 8000, 7000): >= 8000 is at risk,
        # and the first is tiered already
        assert [s.base_offset for s in risky] == [rolled[1].base_offset]

    def test_at_risk_by_size(self, tmp_path):
        scan = _scan(tmp_path)
        sizes = [s.size for s in scan.segments]
        total = sum(sizes)
        # retention = total - sizes[0]: the broker deletes the first segment now; with 0.5 of
        # slack the second one (deleted after sizes[1] more bytes) is at risk when the slack
        # covers it
        retention = LocalRetention(-1, total - sizes[0])
        risky = at_risk_segments(
            scan.segments, highest_tiered_offset=-1, retention=retention, now_ms=0, fraction=1.0
        )
        assert [s.base_offset for s in risky] == [scan.segments[0].base_offset]

    def test_lost_when_gone_before_tiered(self, tmp_path):
        scan = _scan(tmp_path)
        old = scan.segments
        new = old[2:]
        assert [s.base_offset for s in lost_segments(old, new, highest_tiered_offset=-1)] == [
            old[0].base_offset,
            old[1].base_offset,
        ]
        tiered = old[0].end_offset
        assert [s.base_offset for s in lost_segments(old, new, highest_tiered_offset=tiered)] == [
            old[1].base_offset
        ]


def _metadata(start: int, end: int | None = None) -> SegmentMetadata:
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(TP, uuid.uuid4()),
        start_offset=start,
        end_offset=start + 9 if end is None else end,
        broker_id=1,
        max_timestamp_ms=0,
        event_timestamp_ms=0,
        segment_leader_epochs=((0, start),),
        segment_size_in_bytes=10,
    )


def _keys(metadata: SegmentMetadata) -> list[str]:
    return [
        LAYOUT.segment_key(
            topic=TP.topic,
            topic_id=TP.topic_id,
            partition=TP.partition,
            base_offset=metadata.start_offset,
            segment_id=metadata.segment_id.id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    ]


class TestScrub:
    """Orphans go after the grace period and never before; referenced objects never go."""

    async def test_grace_periods_and_references(self, tmp_path):
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects)
            live = _metadata(0)
            store.apply([live])
            orphan = _metadata(10)  # never published
            for key in _keys(live) + _keys(orphan):
                await objects.put(key, b"x")
            await objects.put("p/not-a-segment-key", b"x")
            await objects.put("elsewhere/x", b"x")
            upload_id = await objects.create_multipart_upload(_keys(orphan)[0])
            clock = [datetime.now(UTC)]
            scrubber = OrphanScrubber(
                objects=objects,
                store=store,
                layout=LAYOUT,
                owner=OWNER,
                object_grace_s=60,
                upload_grace_s=120,
                now=lambda: clock[0],
            )
            early = await scrubber.scrub()
            assert early.orphans == []
            assert early.young_orphans == 3
            assert early.referenced == 3
            assert early.foreign == 2  # the marker and p/not-a-segment-key
            assert early.young_uploads == 1

            clock[0] += timedelta(seconds=90)
            dry = await scrubber.scrub(dry_run=True)
            assert sorted(dry.orphans) == sorted(_keys(orphan))
            assert all(k in objects.objects for k in _keys(orphan))

            done = await scrubber.scrub()
            assert sorted(done.orphans) == sorted(_keys(orphan))
            assert done.aborted_uploads == []  # the upload's grace is longer
            assert set(objects.objects) == {
                *_keys(live),
                "p/not-a-segment-key",
                "elsewhere/x",
                MARKER,
            }

            clock[0] += timedelta(seconds=60)
            later = await scrubber.scrub()
            assert later.aborted_uploads == [(_keys(orphan)[0], upload_id)]
            assert [u async for u in objects.list_multipart_uploads("p/")] == []
        finally:
            store.close()

    async def test_a_copy_superseded_by_a_finished_copy_of_its_offsets_is_an_orphan(self, tmp_path):
        """The broker gave up on a copy (its copy timeout) just as the sidecar finished it, and
        copied the same offsets again under a new segment id: the first stays at
        COPY_SEGMENT_STARTED forever and its objects go after the grace period. A copy whose
        offsets are held only in part, or not at all (a gap filled later, a copy in flight),
        keeps its objects."""
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects)
            abandoned, retried = _metadata(0), _metadata(0)
            after = _metadata(10, 29)  # FINISHED: with the retry, offsets 0-29 are held
            partly = _metadata(25, 39)  # 30-39 held by no FINISHED copy
            in_flight = _metadata(40)
            store.apply([abandoned, retried, after, partly, in_flight])
            store.apply(
                [
                    SegmentMetadataUpdate(
                        segment_id=m.segment_id,
                        broker_id=1,
                        event_timestamp_ms=1,
                        state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                    )
                    for m in (retried, after)
                ]
            )
            segments = (abandoned, retried, after, partly, in_flight)
            for key in [k for m in segments for k in _keys(m)]:
                await objects.put(key, b"x")
            upload_id = await objects.create_multipart_upload(_keys(abandoned)[0])
            clock = [datetime.now(UTC)]
            scrubber = OrphanScrubber(
                objects=objects,
                store=store,
                layout=LAYOUT,
                owner=OWNER,
                object_grace_s=60,
                upload_grace_s=60,
                now=lambda: clock[0],
            )
            early = await scrubber.scrub()
            assert (early.orphans, early.young_orphans, early.young_uploads) == ([], 3, 1)

            clock[0] += timedelta(seconds=90)
            report = await scrubber.scrub()
            assert sorted(report.orphans) == sorted(_keys(abandoned))
            assert report.aborted_uploads == [(_keys(abandoned)[0], upload_id)]
            assert report.referenced == 12
            assert set(objects.objects) == {
                MARKER,
                *(k for m in (retried, after, partly, in_flight) for k in _keys(m)),
            }
        finally:
            store.close()

    async def test_out_of_scope_partitions_are_left_alone(self, tmp_path):
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects)
            store.apply([_metadata(100)])  # the partition is this cluster's
            orphan = _metadata(0)
            for key in _keys(orphan):
                await objects.put(key, b"x")
            scrubber = OrphanScrubber(
                objects=objects,
                store=store,
                layout=LAYOUT,
                owner=OWNER,
                object_grace_s=0,
                upload_grace_s=0,
                in_scope=lambda tp: False,
                now=lambda: datetime.now(UTC) + timedelta(days=1),
            )
            report = await scrubber.scrub()
            assert report.out_of_scope == 3
            assert report.orphans == []
            assert set(objects.objects) == {*_keys(orphan), MARKER}
        finally:
            store.close()

    async def test_staged_segments_go_after_the_grace_period(self, tmp_path):
        """A staged segment is never referenced by metadata: young ones stay (the broker's copy
        may still adopt them), old ones and their old incomplete uploads are removed."""
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects)
            staged = [
                LAYOUT.staged_key(
                    topic=TP.topic,
                    topic_id=TP.topic_id,
                    partition=TP.partition,
                    base_offset=base,
                    size=1,
                    crc32c=base,
                )
                for base in (0, 10)
            ]
            await objects.put(staged[0], b"x")
            upload_id = await objects.create_multipart_upload(staged[1])
            clock = [datetime.now(UTC)]
            scrubber = OrphanScrubber(
                objects=objects,
                store=store,
                layout=LAYOUT,
                owner=OWNER,
                object_grace_s=60,
                upload_grace_s=60,
                now=lambda: clock[0],
            )
            early = await scrubber.scrub()
            assert (early.staged, early.orphans, early.young_uploads) == (1, [], 1)
            assert staged[0] in objects.objects

            clock[0] += timedelta(seconds=90)
            done = await scrubber.scrub()
            assert done.orphans == [staged[0]]
            assert done.aborted_uploads == [(staged[1], upload_id)]
            assert set(objects.objects) == {MARKER}
        finally:
            store.close()
