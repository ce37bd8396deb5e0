"""Benchmark of a daemon restart with a million segment events in its metadata store.

``bench_metadata_store.py`` measures the store alone; this measures the whole daemon against a
real broker, whose metadata topic holds the events:

1. A single-node Kafka 4.x and SeaweedFS of the local stack (``deploy/local/stack.py``). The
   remote log metadata topic (``--metadata-partitions``, 50 as Kafka's default) is filled with
   ``--events`` events in Kafka's serde bytes, each on its metadata partition: the synthetic
   history of ``--partitions`` user partitions of ``bench_metadata_store.py`` (copies, leader
   changes with superseded re-uploads, deletions once a partition holds 300 live segments).
   A topic of the broker (one partition, 1 MiB segments, standalone mode through
   ``tiering.include_topics``) gets ``--segments`` rolled segments.
2. First start, on an empty state dir, with ``remote_log_metadata.tailing = "all"``: the
   daemon reads and keeps every event (as the elected coordinator does with selective
   tailing). Measured: process start to ``/readyz`` 200, which waits for the metadata to be
   caught up, so the events per second of the catch-up (startup included); then the topic's
   backlog tiered.
3. The daemon is stopped (SIGTERM); while it is down the topic rolls one more segment.
4. Restart on the same state dir: process start to ``sidecar_starting`` (imports and
   configuration), to ``/readyz`` 200 (target <= 5 s), and to the new segment's upload
   (``segment_tiered``, the upload's start and its end), with the RSS once it is uploaded.

Run from the repository root (java and the Kafka jars as ``deploy/local/stack.py`` needs them),
under the benchmark lock:

    flock /tmp/sidecar-bench.lock .venv/bin/python tests/bench/bench_restart.py    # 10^6 events
    .venv/bin/python tests/bench/bench_restart.py --events 100000                  # scaled down

Everything lives in a ``/tmp/bench-restart-*`` directory, removed at the end unless ``--keep``;
Kafka, SeaweedFS and the sidecar bind to 127.0.0.1 and are stopped by PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaProducer

from sidecar.metadata import encode
from tests.bench.bench_metadata_store import synthetic_topic
from tests.bench.bench_scale import (
    event_time,
    rolled_count,
    say,
    status_kib,
    stop_stack,
    wait_ready,
)
from tests.conftest import stack
from tests.e2e._support import Sidecar, write_config
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

MiB = 1024 * 1024
VALUE_BYTES = 16 * 1024
TARGET_READY_S = 5.0


def tree_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / MiB


async def fill_metadata(
    bootstrap: str, topic: str, events: int, partitions: int, metadata_partitions: int
) -> int:
    """Produce the synthetic history to ``topic``, each event on its metadata partition, in
    batches of up to 512 KiB; returns the bytes of the values."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, max_batch_size=512 * 1024, linger_ms=0
    )
    await producer.start()
    sent: list[asyncio.Future[Any]] = []
    size = 0
    try:
        for mp, _offset, chunk in synthetic_topic(events, partitions, metadata_partitions):
            batch = producer.create_batch()
            for event in chunk:
                value = encode(event)
                size += len(value)
                if batch.append(key=None, value=value, timestamp=None) is None:
                    sent.append(await producer.send_batch(batch, topic, partition=mp))
                    batch = producer.create_batch()
                    batch.append(key=None, value=value, timestamp=None)
            sent.append(await producer.send_batch(batch, topic, partition=mp))
            if len(sent) >= 64:  # bounded: wait for the oldest before going on
                await asyncio.gather(*sent)
                sent.clear()
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return size


async def roll(bootstrap: str, topic: str, partition_dir: Path, segments: int) -> None:
    """Produce until ``segments`` more segments of ``topic``-0 have rolled (1 MiB segments)."""
    target = rolled_count(partition_dir) + segments
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5)
    await producer.start()
    try:
        deadline = time.monotonic() + 120
        while rolled_count(partition_dir) < target:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}-0 did not roll {segments} segments in 120 s")
            for _ in range(16):
                await producer.send(topic, value=os.urandom(VALUE_BYTES), partition=0)
            await producer.flush()
    finally:
        await producer.stop()


async def amain(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-restart-", dir="/tmp"))
    say(f"working directory {root}")
    kafka = s3 = sidecar = None
    try:
        kafka = stack.KafkaCluster.create(root / "kafka", nodes=1)
        s3 = stack.SeaweedS3.create(root / "s3")
        await asyncio.to_thread(s3.start)
        await asyncio.to_thread(kafka.start)
        bootstrap = kafka.bootstrap_servers
        topic = f"restart-{secrets.token_hex(3)}"
        metadata_topic = f"__rlm_restart_{secrets.token_hex(3)}"
        partition_dir = Path(kafka.log_dirs[0]) / f"{topic}-0"
        metrics_port = stack.free_port()
        config = root / "sidecar.toml"
        write_config(
            config,
            state_dir=root / "state",
            log_dir=Path(kafka.log_dirs[0]),
            bootstrap=bootstrap,
            s3=s3,
            metrics_port=metrics_port,
            metadata_topic=metadata_topic,
            include_topics=[topic],
            prefix="restart/",
            kafka={"metadata_refresh_interval_s": 10.0},
            tiering={"rescan_interval_s": 30.0},
            remote_log_metadata={"num_partitions": args.metadata_partitions, "tailing": "all"},
        )
        await create_topic(
            bootstrap,
            metadata_topic,
            partitions=args.metadata_partitions,
            configs={"retention.ms": "-1"},
        )
        t = time.monotonic()
        size = await fill_metadata(
            bootstrap, metadata_topic, args.events, args.partitions, args.metadata_partitions
        )
        filled_s = time.monotonic() - t
        say(f"{args.events} events ({size / MiB:.1f} MiB) produced in {filled_s:.1f} s")
        await create_topic(bootstrap, topic, configs={"segment.bytes": str(MiB)})
        await roll(bootstrap, topic, partition_dir, args.segments)
        backlog = rolled_count(partition_dir)
        env = sidecar_env(s3)

        # 2. first start: the whole metadata topic read
        started = time.time()
        sidecar = await Sidecar.start(config, env, root / "first.log", name="first")
        ready_first = await wait_ready(metrics_port, sidecar, args.timeout, every=0.05) - started
        say(f"first start: ready after {ready_first:.1f} s")
        await sidecar.wait_for("segment_tiered", count=backlog, timeout=args.timeout, topic=topic)
        rss_first = status_kib(sidecar.proc.pid, "VmRSS") / 1024
        await sidecar.stop()
        sidecar = None
        store_mib = tree_mib(root / "state")

        # 3. a segment rolls while the daemon is down
        await roll(bootstrap, topic, partition_dir, 1)

        # 4. the restart
        started = time.time()
        sidecar = await Sidecar.start(config, env, root / "restart.log", name="restart")
        ready_at = await wait_ready(metrics_port, sidecar, args.timeout, every=0.05)
        tiered = await sidecar.wait_for(
            "segment_tiered", count=1, timeout=args.timeout, topic=topic
        )
        rss_restart = status_kib(sidecar.proc.pid, "VmRSS") / 1024
        starting = sidecar.matching("sidecar_starting")
        await sidecar.stop()
        sidecar = None
        upload_end = event_time(tiered[0])
        upload_start = upload_end - float(tiered[0]["seconds"])

        ready_s = ready_at - started
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python"
            f" {platform.python_version()}, Kafka {kafka.version}; load average"
            f" {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(
            f"metadata topic: {args.events} events of {args.partitions} user partitions,"
            f" {args.metadata_partitions} partitions, {size / MiB:.1f} MiB of values"
            f" (produced in {filled_s:.1f} s); state dir after the first run {store_mib:.1f} MiB"
        )
        print("(1) first start, empty state dir (tailing = all: every event read and kept)")
        print(f"    process start -> /readyz 200 (caught up)    {ready_first:7.2f} s")
        print(f"    events per second, startup included        {args.events / ready_first:9,.0f}")
        print(f"    RSS once its {backlog} segments are tiered     {rss_first:7.0f} MiB")
        print("(2) restart on that state dir, one segment rolled while it was down")
        if starting:
            print(
                f"    process start -> sidecar_starting          "
                f"{event_time(starting[0]) - started:7.2f} s (imports, configuration)"
            )
        met = "met" if ready_s <= TARGET_READY_S else "NOT met"
        print(
            f"    process start -> /readyz 200                {ready_s:7.2f} s"
            f"   (target <= {TARGET_READY_S:.0f} s: {met})"
        )
        print(f"    process start -> first upload starts        {upload_start - started:7.2f} s")
        print(f"    process start -> first segment tiered       {upload_end - started:7.2f} s")
        print(f"    RSS after that upload                       {rss_restart:7.0f} MiB")
        return 0 if ready_s <= TARGET_READY_S else 1
    finally:
        if sidecar is not None and not sidecar.exited:
            await sidecar.stop()
        await stop_stack(kafka, s3, root, keep=args.keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="in the metadata topic")
    parser.add_argument("--partitions", type=int, default=1_000, help="user partitions")
    parser.add_argument("--metadata-partitions", type=int, default=50)
    parser.add_argument("--segments", type=int, default=2, help="rolled before the first start")
    parser.add_argument("--timeout", type=float, default=900.0, help="for each wait (s)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    return asyncio.run(amain(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
