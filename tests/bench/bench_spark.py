"""Benchmark of the `kafka-tiered` PySpark source, in one run, side by side: rows/s of
our source reading the tiered segments from SeaweedFS vs Spark's own Kafka source
(spark-sql-kafka-0-10) reading the same offsets from the broker, on the same local[2] session.

A fresh single-node Kafka and SeaweedFS are started under a temporary directory (stopped by PID
at the end); the broker writes ``--records`` records (``--value-bytes`` values, half random and
half repeated so lz4 has something to do, a key per record, headers on every 10th) into
``--partitions`` partitions with 8 MiB segments; the sidecar tiers every rolled segment. Both
sources then read exactly the tiered offsets with ``includeHeaders=true``, and the query touches
every column Spark's source produces: ``count(*), sum(length(key)), sum(length(value)),
max(offset), max(timestamp), sum(size(headers))``. ``--warmup`` untimed rounds of each (both
keep speeding up over the first few, Spark's Kafka source more), then ``--runs`` timed pairs,
each source first in every other pair; the medians are compared (ratio = ours / Spark's Kafka
source), and so is each pair. The broker
runs with the JVM flags of Kafka's start scripts and a 1 GiB heap, as in production
(``--test-jvm``: the test suite's quick-start flags, serial GC and the first JIT tier only).

    .venv/bin/python tests/bench/bench_spark.py                    # 1,000,000 records, 3 pairs
    .venv/bin/python tests/bench/bench_spark.py --records 200000 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaProducer  # noqa: E402

from sidecar.kafka.logdir import scan_partition_dir  # noqa: E402
from tests.conftest import stack  # noqa: E402
from tests.helpers import create_topic  # noqa: E402
from tests.sidecar_runner import Sidecar, sidecar_config, sidecar_env  # noqa: E402

TOPIC = "bench-spark"
QUERY = (
    "count(*) AS n",
    "sum(length(key)) AS keys",
    "sum(length(value)) AS bytes",
    "max(offset) AS max_offset",
    "max(timestamp) AS max_ts",
    "sum(size(headers)) AS headers",
)


async def _produce(bootstrap: str, records: int, partitions: int, value_bytes: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        compression_type="lz4",
        linger_ms=20,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    try:
        half = value_bytes // 2
        filler = b"x" * (value_bytes - half)
        pending = []
        for i in range(records):
            pending.append(
                await producer.send(
                    TOPIC,
                    value=os.urandom(half) + filler,
                    key=f"key-{i}".encode(),
                    partition=i % partitions,
                    headers=[("n", str(i).encode())] if i % 10 == 0 else [],
                )
            )
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _rolled(log_dir: Path, partitions: int) -> tuple[int, dict[int, int]]:
    count = 0
    ends: dict[int, int] = {}
    for p in range(partitions):
        scan = scan_partition_dir(log_dir / f"{TOPIC}-{p}")
        assert scan is not None
        rolled = [s for s in scan.segments if not s.is_active]
        count += len(rolled)
        if rolled:
            ends[p] = rolled[-1].end_offset + 1
    return count, ends


def _measure(df: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    row = df.selectExpr(*QUERY).first()
    return time.perf_counter() - started, row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed rounds of each source first (at least 1)"
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--test-jvm",
        action="store_true",
        help="the broker with the test suite's JVM flags (serial GC, first JIT tier only)"
        " instead of those of Kafka's start scripts",
    )
    args = parser.parse_args()
    if args.warmup < 1 or args.runs < 1:
        parser.error("--warmup and --runs take 1 or more")

    root = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    cluster = stack.KafkaCluster.create(root / "kafka", nodes=1)
    # Spark's Kafka source reads from this broker: it runs as in production
    cluster.production_jvm = not args.test_jvm
    cluster.heap = "1g"
    s3 = stack.SeaweedS3.create(root / "s3")
    daemon: Sidecar | None = None
    spark = None
    try:
        cluster.start()
        s3.start()
        bootstrap = cluster.bootstrap_servers
        prefix = "bench/"

        async def setup() -> dict[int, int]:
            nonlocal daemon
            await create_topic(
                bootstrap,
                TOPIC,
                partitions=args.partitions,
                configs={"segment.bytes": str(8 * 1024 * 1024)},
            )
            started = time.perf_counter()
            await _produce(bootstrap, args.records, args.partitions, args.value_bytes)
            print(f"produced {args.records:,} records in {time.perf_counter() - started:.1f} s")
            rolled, ends = _rolled(cluster.log_dirs[0], args.partitions)
            config = sidecar_config(
                root / "sidecar.toml",
                state_dir=root / "state",
                log_dirs=cluster.log_dirs,
                bootstrap=bootstrap,
                s3=s3,
                metrics_port=stack.free_port(),
                metadata_topic="__remote_log_metadata",
                include_topics=[TOPIC],
                prefix=prefix,
            )
            daemon = await Sidecar.start(config, sidecar_env(s3), root / "sidecar.log")
            await daemon.wait_for("segment_tiered", count=rolled, timeout=600, topic=TOPIC)
            await daemon.stop()
            daemon = None
            return ends

        ends = asyncio.run(setup())
        tiered = sum(ends.values())
        print(f"tiered {tiered:,} offsets in {len(ends)} partitions")

        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        from pyspark.sql import SparkSession

        import sidecar.spark

        jars = stack.spark_kafka_jars()
        versions = stack.spark_kafka_versions()
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.jars", ",".join(str(p) for p in jars))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        sidecar.spark.register(spark)
        starting = json.dumps({TOPIC: {str(p): 0 for p in ends}})
        ending = json.dumps({TOPIC: {str(p): e for p, e in ends.items()}})
        theirs = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", TOPIC)
            .option("includeHeaders", "true")
            .option("startingOffsets", starting)
            .option("endingOffsets", ending)
            .load()
        )
        ours = (
            spark.read.format("kafka-tiered")
            .option("subscribe", TOPIC)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("s3.endpoint", s3.endpoint)
            .option("s3.bucket", s3.bucket)
            .option("s3.prefix", prefix)
            .option("s3.accessKeyId", s3.access_key)
            .option("s3.secretAccessKey", s3.secret_key)
            .option("includeHeaders", "true")
            .option("startingOffsets", starting)
            .option("endingOffsets", ending)
            .load()
        )
        load_before = os.getloadavg()
        _, warm_theirs = _measure(theirs)
        _, warm_ours = _measure(ours)
        assert warm_ours == warm_theirs, (warm_ours, warm_theirs)
        for _ in range(args.warmup - 1):
            _measure(theirs)
            _measure(ours)
        rows = warm_ours["n"]
        times: dict[str, list[float]] = {"ours": [], "kafka": []}
        for run in range(args.runs):
            order = (("kafka", theirs), ("ours", ours))
            for name, query in order if run % 2 == 0 else order[::-1]:
                times[name].append(_measure(query)[0])
        load_after = os.getloadavg()
        med = {k: statistics.median(v) for k, v in times.items()}
        rate = {k: rows / v for k, v in med.items()}
        print(
            f"\npyspark {versions['pyspark']}, spark-sql-kafka {versions['connector']},"
            f" Python {platform.python_version()}, {os.cpu_count()} CPUs, local[2]"
        )
        print(f"{rows:,} rows ({args.partitions} partitions, {args.value_bytes} B values, lz4)")
        print(
            "load average (1/5/15 min) before the timed queries "
            + "/".join(f"{x:.2f}" for x in load_before)
            + ", after "
            + "/".join(f"{x:.2f}" for x in load_after)
        )
        for name, label in (
            ("kafka", "Spark Kafka source (broker)"),
            ("ours", "kafka-tiered (S3)"),
        ):
            runs = ", ".join(f"{t:.2f}" for t in times[name])
            print(f"  {label:30} median {med[name]:6.2f} s  {rate[name]:12,.0f} rows/s  [{runs}]")
        pairs = [k / o for k, o in zip(times["kafka"], times["ours"], strict=True)]
        print(
            "  per pair (ours first in pairs 2, 4, ...): "
            + ", ".join(f"{r:.2f}x" for r in pairs)
            + f"; median {statistics.median(pairs):.2f}x"
        )
        print(
            f"ratio ours / Spark Kafka source: {rate['ours'] / rate['kafka']:.2f}x (goal >= 1.0x)"
        )
        return 0
    finally:
        if spark is not None:
            spark.stop()
        if daemon is not None:
            asyncio.run(daemon.kill())
        cluster.stop()
        s3.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
