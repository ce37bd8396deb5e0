"""The orphan scrub against SeaweedFS: planted orphan objects and incomplete multipart uploads go
after their grace period (judged by the server's LastModified / Initiated) and never before;
objects that the metadata store references are never removed."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sidecar.metadata.events import RemoteLogSegmentId, SegmentMetadata, TopicIdPartition
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.retention.scrub import OrphanScrubber
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.ownership import PrefixOwner, claim_prefix, marker_key
from sidecar.storage.s3 import S3ObjectStore

pytestmark = pytest.mark.integration

TP = TopicIdPartition(uuid.uuid4(), "orders", 3)
OWNER = PrefixOwner("cluster-a", "__remote_log_metadata")


def _segment(start: int) -> SegmentMetadata:
    return SegmentMetadata(
        segment_id=RemoteLogSegmentId(TP, uuid.uuid4()),
        start_offset=start,
        end_offset=start + 99,
        broker_id=1,
        max_timestamp_ms=0,
        event_timestamp_ms=0,
        segment_leader_epochs=((0, start),),
        segment_size_in_bytes=1,
    )


def _keys(layout: KeyLayout, metadata: SegmentMetadata) -> list[str]:
    return [
        layout.segment_key(
            topic=TP.topic,
            topic_id=TP.topic_id,
            partition=TP.partition,
            base_offset=metadata.start_offset,
            segment_id=metadata.segment_id.id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    ]


def _store(s3: Any) -> S3ObjectStore:
    return S3ObjectStore(
        bucket=s3.bucket,
        endpoint_url=s3.endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
    )


class TestScrubOnSeaweedFS:
    """Grace periods on the server's clock, and references."""

    async def test_orphans_go_after_the_grace_period_never_before(self, s3, s3_prefix, tmp_path):
        layout = KeyLayout(prefix=s3_prefix)
        store = RemoteSegmentStore(tmp_path / "state")
        try:
            async with _store(s3) as objects:
                await claim_prefix(
                    objects,
                    s3_prefix,
                    cluster_id=OWNER.cluster_id,
                    metadata_topic=OWNER.metadata_topic,
                )
                live = [_segment(0), _segment(100)]
                store.apply(live)
                referenced = [k for m in live for k in _keys(layout, m)]
                orphans = [k for m in (_segment(200), _segment(300)) for k in _keys(layout, m)]
                planted_at = time.monotonic()  # before the first PUT: no object is older
                for key in referenced + orphans:
                    await objects.put(key, b"")
                upload_key = _keys(layout, _segment(400))[0]
                client = s3.client()
                try:
                    upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key=upload_key)[
                        "UploadId"
                    ]
                finally:
                    client.close()

                grace = 3.0
                scrubber = OrphanScrubber(
                    objects=objects,
                    store=store,
                    layout=layout,
                    owner=OWNER,
                    object_grace_s=grace,
                    upload_grace_s=grace,
                )
                deadline = planted_at + 60
                deleted: list[str] = []
                aborted: list[tuple[str, str]] = []
                first_removal_age: float | None = None
                # the objects and the upload were created at slightly different times, so one
                # pass may remove the orphans and a later one abort the upload
                while len(deleted) < len(orphans) or not aborted:
                    report = await scrubber.scrub()
                    age = time.monotonic() - planted_at
                    listed = {o.key async for o in objects.list(s3_prefix)}
                    listed.discard(marker_key(s3_prefix))
                    assert set(referenced) <= listed  # never a referenced object
                    if age < grace - 1.0:  # well inside the grace period: nothing goes
                        assert report.orphans == []
                        assert report.aborted_uploads == []
                        assert listed == set(referenced + orphans)
                    if (report.orphans or report.aborted_uploads) and first_removal_age is None:
                        first_removal_age = age
                    deleted += report.orphans
                    aborted += report.aborted_uploads
                    assert time.monotonic() < deadline, (report, deleted, aborted)
                assert sorted(deleted) == sorted(orphans)
                assert aborted == [(upload_key, upload_id)]
                assert first_removal_age is not None
                assert first_removal_age >= grace - 1.0  # the server's clock: under 1 s off
                assert {o.key async for o in objects.list(s3_prefix)} == {
                    *referenced,
                    marker_key(s3_prefix),
                }
                assert [u async for u in objects.list_multipart_uploads(s3_prefix)] == []

                # a dry run a day later still spares the referenced objects
                later = OrphanScrubber(
                    objects=objects,
                    store=store,
                    layout=layout,
                    owner=OWNER,
                    object_grace_s=0,
                    upload_grace_s=0,
                    now=lambda: datetime.now(UTC) + timedelta(days=1),
                )
                dry = await later.scrub(dry_run=True)
                assert dry.orphans == []
                assert dry.referenced == len(referenced)
        finally:
            store.close()
