"""The orphan scrub touches only its own cluster's objects: it refuses a prefix without our
ownership marker, skips a nested prefix with a marker of its own, and never deletes (or aborts
uploads of) a partition this cluster's metadata never mentioned. In-memory bucket, real store."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.retention.scrub import OrphanScrubber, UnsafeScrubError
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.memory import MemoryObjectStore
from sidecar.storage.ownership import claim_prefix, marker_key
from tests.unit.retention.test_safety_and_scrub import OWNER, TP, _metadata, claim

ROOT = KeyLayout(prefix="")


def _scrubber(store: RemoteSegmentStore, objects: MemoryObjectStore, layout: KeyLayout):
    return OrphanScrubber(
        objects=objects,
        store=store,
        layout=layout,
        owner=OWNER,
        object_grace_s=0,
        upload_grace_s=0,
        now=lambda: datetime.now(UTC) + timedelta(days=1),
    )


MARKED = RemotePartitionDeleteState.DELETE_PARTITION_MARKED


def _partition_delete(
    tp: TopicIdPartition,
    state: RemotePartitionDeleteState = RemotePartitionDeleteState.DELETE_PARTITION_FINISHED,
) -> PartitionDeleteMetadata:
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return PartitionDeleteMetadata(
        topic_id_partition=tp, broker_id=1, event_timestamp_ms=now_ms, state=state
    )


def _update(segment: RemoteLogSegmentId, state: RemoteLogSegmentState) -> SegmentMetadataUpdate:
    return SegmentMetadataUpdate(segment_id=segment, event_timestamp_ms=1, state=state, broker_id=1)


def _segment_keys(layout: KeyLayout, tp: TopicIdPartition) -> list[str]:
    segment_id = uuid.uuid4()
    return [
        layout.segment_key(
            topic=tp.topic,
            topic_id=tp.topic_id,
            partition=tp.partition,
            base_offset=0,
            segment_id=segment_id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    ]


class TestMarker:
    @pytest.mark.parametrize("dry_run", [False, True])
    async def test_no_marker_no_scrub(self, tmp_path, dry_run):
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            store.apply([_metadata(100)])
            orphans = _segment_keys(ROOT, TP)
            for key in orphans:
                await objects.put(key, b"x")
            with pytest.raises(UnsafeScrubError, match="no ownership marker"):
                await _scrubber(store, objects, ROOT).scrub(dry_run=dry_run)
            assert sorted(objects.objects) == sorted(orphans)
        finally:
            store.close()

    async def test_another_clusters_marker_no_scrub(self, tmp_path):
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            store.apply([_metadata(100)])
            await claim_prefix(objects, "", cluster_id="cluster-b", metadata_topic="__rlm")
            orphans = _segment_keys(ROOT, TP)
            for key in orphans:
                await objects.put(key, b"x")
            with pytest.raises(UnsafeScrubError, match="'cluster-b'"):
                await _scrubber(store, objects, ROOT).scrub()
            assert set(orphans) <= set(objects.objects)
        finally:
            store.close()


class TestOtherClusters:
    async def test_a_partition_our_metadata_never_mentioned_is_not_ours(self, tmp_path):
        """Root prefix, and another cluster's objects (and a stale upload) beside ours: only our
        own orphan goes."""
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects, "")
            store.apply([_metadata(100)])
            ours = _segment_keys(ROOT, TP)
            payments = TopicIdPartition(uuid.uuid4(), "payments", 0)
            theirs = _segment_keys(ROOT, payments)
            for key in ours + theirs:
                await objects.put(key, b"x")
            upload_id = await objects.create_multipart_upload(theirs[0] + ".upload")
            their_upload = await objects.create_multipart_upload(_segment_keys(ROOT, payments)[0])
            report = await _scrubber(store, objects, ROOT).scrub()
            assert sorted(report.orphans) == sorted(ours)
            assert report.not_ours == len(theirs) + 2  # the objects and both uploads
            assert report.aborted_uploads == []
            assert set(theirs) <= set(objects.objects)
            assert set(ours).isdisjoint(objects.objects)
            left = {u.upload_id async for u in objects.list_multipart_uploads("")}
            assert left == {upload_id, their_upload}
        finally:
            store.close()

    @pytest.mark.parametrize("how", ["partition delete finished", "topic forgotten"])
    async def test_objects_written_after_a_partitions_deletion_are_ours(self, tmp_path, how):
        """A copy that raced its partition's deletion left objects after the deletion listed
        its segments; the store dropped the partition since. Its objects are still this
        cluster's orphans; a partition that only left the store's scope stays not ours."""
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects, "")
            deleted = TopicIdPartition(uuid.uuid4(), "gone", 0)
            scoped_out = TopicIdPartition(uuid.uuid4(), "elsewhere", 0)
            store.apply([_partition_delete(scoped_out, MARKED)])
            if how == "topic forgotten":  # deleted segment by segment, then forgotten
                segment = RemoteLogSegmentId(deleted, uuid.uuid4())
                store.apply(
                    [
                        dataclasses.replace(_metadata(0), segment_id=segment),
                        _update(segment, RemoteLogSegmentState.DELETE_SEGMENT_STARTED),
                        _update(segment, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED),
                    ]
                )
                assert store.forget_partition(deleted)
            else:
                store.apply([_partition_delete(deleted, MARKED), _partition_delete(deleted)])
            store.set_scope(0, frozenset(), drop=[scoped_out])
            assert store.partitions() == []
            leftovers = _segment_keys(ROOT, deleted)
            theirs = _segment_keys(ROOT, scoped_out)
            for key in leftovers + theirs:
                await objects.put(key, b"x")
            report = await _scrubber(store, objects, ROOT).scrub()
            assert sorted(report.orphans) == sorted(leftovers)
            assert report.not_ours == len(theirs)
            assert set(objects.objects) == {*theirs, marker_key("")}
        finally:
            store.close()

    async def test_a_nested_prefix_with_its_own_marker_is_skipped(self, tmp_path):
        """Ours is the bucket root with hash prefixes; another cluster owns ``abcd/``, whose keys
        even parse as ours and name a partition we know: the scrub leaves them alone."""
        hashed = KeyLayout(prefix="", hash_prefix=True)
        store = RemoteSegmentStore(tmp_path / "state")
        objects = MemoryObjectStore()
        try:
            await claim(objects, "")
            await claim_prefix(objects, "abcd/", cluster_id="cluster-b", metadata_topic="__rlm")
            store.apply([_metadata(100)])
            theirs = _segment_keys(KeyLayout(prefix="abcd/"), TP)
            assert all(hashed.parse(k) is not None for k in theirs)
            ours = _segment_keys(hashed, TP)
            for key in ours + theirs:
                await objects.put(key, b"x")
            report = await _scrubber(store, objects, hashed).scrub()
            assert sorted(report.orphans) == sorted(ours)
            assert report.not_ours == len(theirs)
            assert set(objects.objects) == {*theirs, marker_key(""), marker_key("abcd/")}
        finally:
            store.close()
