"""The upload bandwidth cap on the real SeaweedFS: a backlog tiered by the daemon's uploader
through one capped store stays within the cap, and a stop during a throttled wait ends the
upload at once and leaves no multipart upload behind.

The rate is only asserted from above: the throttle can only slow uploads down, so a loaded
machine cannot push the measured rate over the cap, whereas it could keep it below any lower
bound. The bound is the token bucket's own guarantee, ``bytes <= burst + cap * seconds``, with
10 % to spare.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sidecar.observability.metrics import Metrics
from sidecar.storage.s3 import S3ObjectStore
from sidecar.storage.throttle import TokenBucket
from tests.backlog import tier_backlog, write_backlog

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
PART = 5 * MiB


def _store(s3: Any, bucket: TokenBucket, metrics: Metrics | None = None) -> S3ObjectStore:
    return S3ObjectStore(
        bucket=s3.bucket,
        endpoint_url=s3.endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
        upload_throttle=bucket,
        metrics=metrics,
    )


async def test_a_backlog_stays_within_the_cap(s3: Any, s3_prefix: str, tmp_path: Path) -> None:
    """Four partitions tiered at once (24 MiB of 6 MiB segments, two parts each) through one
    store capped at 8 MiB/s: the bytes in the bucket, less one burst, took at least their time
    at the cap, and the uploads waited for the throttle."""
    cap = 8 * MiB
    backlog = write_backlog(tmp_path / "logs", partitions=4, segments=1, segment_mib=6)
    metrics = Metrics()
    # as the daemon builds it: the burst is one second or one part, whichever is smaller
    bucket = TokenBucket(cap, burst=min(cap, PART), on_wait=metrics.upload_throttle_wait.inc)
    async with _store(s3, bucket, metrics) as store:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await tier_backlog(store, backlog, prefix=s3_prefix, part_size=PART)
        seconds = loop.time() - started
        stored = sum([o.size async for o in store.list(s3_prefix)])
    assert stored > backlog.log_bytes  # the .log objects, indexes and manifests
    rate = (stored - bucket.burst) / seconds
    assert rate <= 1.1 * cap, f"{rate / MiB:.2f} MiB/s beyond one burst, cap {cap / MiB} MiB/s"
    waited = metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_upload_throttle_wait_seconds_total"
    )
    assert waited is not None
    assert waited > 0


async def test_a_stop_while_throttled_aborts_the_upload(
    s3: Any, s3_prefix: str, tmp_path: Path
) -> None:
    """Cancelled while its parts wait for a slow cap (minutes of waiting left), a multipart
    upload ends within seconds: the upload is aborted and nothing is left under the prefix."""
    path = tmp_path / "segment.log"
    path.write_bytes(b"x" * (3 * PART))
    bucket = TokenBucket(64 * 1024)
    waiting = asyncio.Event()
    acquire = bucket.acquire
    charged: list[int] = []

    async def acquire_and_tell(amount: int) -> float:
        charged.append(amount)
        if len(charged) == 2:  # the first part took the bucket; the second waits ~80 s
            waiting.set()
        return await acquire(amount)

    bucket.acquire = acquire_and_tell  # type: ignore[method-assign]
    async with _store(s3, bucket) as store:
        upload = asyncio.create_task(
            store.put_file(f"{s3_prefix}seg.log", path, part_size=PART, concurrency=2)
        )
        await waiting.wait()
        upload.cancel()
        async with asyncio.timeout(60):  # a liveness guard, below the wait that was left
            with pytest.raises(asyncio.CancelledError):
                await upload
        assert [u async for u in store.list_multipart_uploads(s3_prefix)] == []
        assert [o async for o in store.list(s3_prefix)] == []
    assert set(charged) == {PART}  # each part charged whole, none of them twice
    assert len(charged) <= 3
