"""The `kafka-tiered` PySpark source against the real broker, SeaweedFS and Spark's own Kafka
source (spark-sql-kafka-0-10 from Maven Central) on one local[2] session.

One archive is written for the module: the real broker writes every codec, headers (null
header values and records without headers too), null keys, transactions with aborts, and a
leader change (the single broker is restarted between two halves of the data, which bumps every
partition's leader epoch in KRaft); the sidecar tiers every rolled segment. Then:

* Spark's Kafka source reads the broker (the data is still local) and ours reads S3 over the same
  offset ranges: the full row sets are equal, for read_uncommitted and read_committed.
* Narrow offset and time queries go through a counting proxy in front of SeaweedFS: they fetch
  only a few small ranged GETs, never a whole `.log`.
* The audit job (`sidecar spark verify`) finds a byte flipped in one tiered segment and names it.

On a topic of its own, a segment that the running sidecar's remote retention deletes between a
read's planning and its execution is data loss: ArchiveDataLossError with ``failOnDataLoss=true``,
the other rows and a warning with ``failOnDataLoss=false``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from sidecar.kafka.checkpoints import encode_kafka_uuid, read_leader_epoch_checkpoint
from sidecar.kafka.logdir import scan_partition_dir
from tests.conftest import stack
from tests.e2e._support import CODECS, clean_prefix, delete_topic, produce_per_codec
from tests.helpers import create_topic
from tests.sidecar_runner import Sidecar, sidecar_config, sidecar_env

pytestmark = pytest.mark.e2e

TXN_PARTITION = len(CODECS)
PARTITIONS = range(len(CODECS) + 1)
RECORDS_PER_HALF = 1200  # x 1 KiB random values, twice: two or three 1 MiB segments roll
PER_TRANSACTION = 50


@dataclass
class Archive:
    """What the module's tests share."""

    topic: str
    prefix: str
    bootstrap: str
    tiered_end: dict[int, int]
    """Per partition: the last tiered offset."""
    committed_end: dict[int, int]
    """Per partition: the exclusive end of the range whose transactions are decided in S3."""
    rolled: int
    epochs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def options(self, s3: Any, **extra: str) -> dict[str, str]:
        return {
            "subscribe": self.topic,
            "kafka.bootstrap.servers": self.bootstrap,
            "metadata.topic": f"__rlm_{self.topic}",
            "s3.endpoint": s3.endpoint,
            "s3.bucket": s3.bucket,
            "s3.prefix": self.prefix,
            "s3.accessKeyId": s3.access_key,
            "s3.secretAccessKey": s3.secret_key,
            "includeHeaders": "true",
            **extra,
        }


def _headers(i: int, tag: str) -> list[tuple[str, bytes | None]]:
    if i % 11 == 0:
        return []  # Spark's source gives NULL headers
    return [("tag", tag.encode()), ("i", str(i).encode()), ("null", None), ("empty", b"")]


async def _produce_half(bootstrap: str, topic: str, half: int) -> None:
    await produce_per_codec(
        bootstrap,
        topic,
        range(half * RECORDS_PER_HALF, (half + 1) * RECORDS_PER_HALF),
        codecs=CODECS,
        value=lambda i: None if i % 50 == 25 else os.urandom(1024),
        key=lambda i: None if i % 50 == 0 else f"k{i}".encode(),
        headers=_headers,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"{topic}-txn",
        compression_type="lz4",
        linger_ms=5,
    )
    await producer.start()
    try:
        for t in range(RECORDS_PER_HALF // PER_TRANSACTION):
            aborted = t % 3 == 0
            await producer.begin_transaction()
            for i in range(PER_TRANSACTION):
                await producer.send(
                    topic,
                    value=os.urandom(1024),
                    key=f"h{half}-t{t}-{i}".encode(),
                    partition=TXN_PARTITION,
                    headers=_headers(i, "aborted" if aborted else "committed"),
                )
            await producer.flush()
            if aborted:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
    finally:
        await producer.stop()


async def _transactions(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(first, last) offset of every transaction of the transactional partition, read with a
    read_uncommitted consumer (aborted data included) and grouped by the key's prefix."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_uncommitted"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, TXN_PARTITION)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        spans: dict[str, list[int]] = {}
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(timeout_ms=2000)).values():
                for r in records:
                    name = r.key.decode().rsplit("-", 1)[0]
                    spans.setdefault(name, []).append(r.offset)
        return sorted((min(o), max(o)) for o in spans.values())
    finally:
        await consumer.stop()


def _rolled_ends(log_dir: Path, topic: str) -> dict[int, int]:
    ends = {}
    for p in PARTITIONS:
        scan = scan_partition_dir(log_dir / f"{topic}-{p}")
        assert scan is not None
        rolled = [s for s in scan.segments if not s.is_active]
        assert rolled, f"{topic}-{p} rolled no segment"
        ends[p] = rolled[-1].end_offset
    return ends


@pytest.fixture(scope="module")
def archive(kafka, s3, tmp_path_factory) -> Iterator[Archive]:
    topic = f"t-spark-{secrets.token_hex(3)}"
    prefix = f"tests/{topic}/"
    tmp = tmp_path_factory.mktemp("spark-archive")
    cluster = kafka.cluster
    assert cluster is not None, "the leader change restarts the native broker"

    async def setup() -> Archive:
        bootstrap = kafka.bootstrap_servers
        await create_topic(
            bootstrap, topic, partitions=len(PARTITIONS), configs={"segment.bytes": "1048576"}
        )
        await _produce_half(bootstrap, topic, 0)
        # the leader change: a KRaft broker that restarts comes back with a new leader epoch
        node = cluster.nodes[0].node_id
        await asyncio.to_thread(cluster.stop_node, node)
        await asyncio.to_thread(cluster.start_node, node)
        await _produce_half(bootstrap, topic, 1)
        ends = _rolled_ends(kafka.log_dir, topic)
        rolled = sum(
            sum(1 for s in scan_partition_dir(kafka.log_dir / f"{topic}-{p}").segments
                if not s.is_active)
            for p in PARTITIONS
        )  # fmt: skip
        committed = {p: e + 1 for p, e in ends.items()}
        for first, last in await _transactions(bootstrap, topic):
            # a transaction whose marker lies past the tiered end is undecided in the archive
            if first <= ends[TXN_PARTITION] < last + 1:
                committed[TXN_PARTITION] = min(committed[TXN_PARTITION], first)
        epochs = {
            p: [
                (e.epoch, e.start_offset)
                for e in read_leader_epoch_checkpoint(
                    kafka.log_dir / f"{topic}-{p}" / "leader-epoch-checkpoint"
                )
            ]
            for p in PARTITIONS
        }
        config = sidecar_config(
            tmp / "sidecar.toml",
            state_dir=tmp / "state",
            log_dirs=[kafka.log_dir],
            bootstrap=bootstrap,
            s3=s3,
            metrics_port=stack.free_port(),
            metadata_topic=f"__rlm_{topic}",
            include_topics=[topic],
            prefix=prefix,
        )
        sidecar = await Sidecar.start(config, sidecar_env(s3), tmp / "sidecar.log")
        try:
            await sidecar.wait_for("segment_tiered", count=rolled, timeout=180, topic=topic)
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
        return Archive(topic, prefix, bootstrap, ends, committed, rolled, epochs)

    try:
        yield asyncio.run(setup())
    finally:
        clean_prefix(s3, prefix)


def _ranges(ends: dict[int, int], topic: str) -> tuple[str, str]:
    return (
        json.dumps({topic: {str(p): 0 for p in ends}}),
        json.dumps({topic: {str(p): e for p, e in ends.items()}}),
    )


def _rows(df: Any) -> list[tuple[Any, ...]]:
    rows = [
        (
            r.partition,
            r.offset,
            r.topic,
            r.key,
            r.value,
            r.timestamp,
            r.timestampType,
            None if r.headers is None else [(h.key, h.value) for h in r.headers],
        )
        for r in df.collect()
    ]
    return sorted(rows, key=lambda row: (row[0], row[1]))


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_rows_equal_sparks_kafka_source(spark, s3, archive: Archive, isolation: str):
    """Same offset ranges, same rows: every codec, headers, null keys, null values, aborted
    transactions (dropped under read_committed), and a leader change inside the data."""
    assert all(len(e) >= 2 for e in archive.epochs.values()), archive.epochs  # epochs changed
    ends = (
        {p: e + 1 for p, e in archive.tiered_end.items()}
        if isolation == "read_uncommitted"
        else archive.committed_end
    )
    starting, ending = _ranges(ends, archive.topic)
    theirs = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", archive.bootstrap)
        .option("subscribe", archive.topic)
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", isolation)
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .option("failOnDataLoss", "false")  # aborted records and markers leave offset gaps
        .load()
    )
    ours = (
        spark.read.format("kafka-tiered")
        .options(**archive.options(s3))
        .option("kafka.isolation.level", isolation)
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .load()
    )
    assert ours.schema == theirs.schema
    expected = _rows(theirs)
    got = _rows(ours)
    assert len(got) == len(expected) > 10_000
    assert got == expected
    aborted = [r for r in got if r[0] == TXN_PARTITION and r[7] and ("tag", b"aborted") in r[7]]
    if isolation == "read_committed":
        assert not aborted
    else:
        assert aborted
    assert {r[0] for r in got} == set(PARTITIONS)
    assert any(r[3] is None for r in got)
    assert any(r[4] is None for r in got)
    assert any(r[7] is None for r in got)
    # and the same answer with no bounds at all (latest = the archive's end)
    if isolation == "read_uncommitted":
        assert (
            ours.count()
            == spark.read.format("kafka-tiered").options(**archive.options(s3)).load().count()
        )


# --- GET counting: a proxy in front of SeaweedFS that forwards every request unchanged (the
# SigV4 signature covers the Host header, which is passed through as the client sent it)


@dataclass
class _Request:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


class _CountingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.requests: list[_Request] = []
        lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname, proxy.upstream.port, timeout=60
                )
                try:
                    headers = {k: v for k, v in self.headers.items()}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                with lock:
                    proxy.requests.append(
                        _Request(
                            self.command,
                            self.path,
                            self.headers.get("Range"),
                            response.status,
                            len(data),
                        )
                    )
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _CountingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def gets(self, suffix: str) -> list[_Request]:
        return [
            r for r in self.requests if r.method == "GET" and r.path.split("?")[0].endswith(suffix)
        ]


def _segment_sizes(s3: Any, prefix: str) -> dict[str, int]:
    client = s3.client()
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}
    finally:
        client.close()


def test_a_filtered_query_leaves_its_dataframe_whole(spark, s3, archive: Archive):
    """By default nothing is pushed down, so a filtered query cannot narrow what later queries
    on the same DataFrame read (Spark keeps a pushed-down plan with the DataFrame)."""
    df = spark.read.format("kafka-tiered").options(**archive.options(s3)).load()
    whole = df.count()
    assert 0 < df.where("partition = 0").count() < whole
    assert df.count() == whole
    assert df.where("offset < 0").count() == 0
    assert df.count() == whole


def test_narrow_queries_fetch_only_the_ranges_they_need(spark, s3, archive: Archive):
    """An offset window in the middle of a segment: one task, a manifest GET, one ranged GET of
    the offset index and one small ranged GET of the `.log`. A time window: segments whose max
    timestamp is below it are never touched; the others seek through their time index."""
    sizes = _segment_sizes(s3, archive.prefix)
    logs = {k: v for k, v in sizes.items() if k.endswith(".log")}
    partition = 2  # snappy
    middle = archive.tiered_end[partition] // 3
    with _CountingProxy(s3.endpoint) as proxy:
        options = archive.options(s3, filterPushdown="true")
        options["s3.endpoint"] = proxy.endpoint
        df = spark.read.format("kafka-tiered").options(**options).load()
        narrow = df.where(
            f"partition = {partition} AND offset >= {middle} AND offset < {middle + 5}"
        )
        assert narrow.rdd.getNumPartitions() == 1
        rows = narrow.select("offset").collect()
        assert sorted(r.offset for r in rows) == list(range(middle, middle + 5))
        log_gets = proxy.gets(".log")
        assert len(log_gets) == 1
        assert log_gets[0].range is not None
        assert log_gets[0].body_bytes < 128 * 1024  # a batch or two, not the 1 MiB segment
        assert len(proxy.gets(".indexes")) == 1
        assert proxy.gets(".indexes")[0].range is not None
        assert len(proxy.gets(".manifest.json")) == 1
        assert len([r for r in proxy.requests if r.method == "GET"]) == 3
        assert not [r for r in proxy.requests if r.method == "HEAD"]

        # a time window from the timestamp of a record in the middle of partition 0's last
        # tiered segment
        segments = sorted(
            (int(k.rsplit("/", 1)[1].split("-")[0]), k)
            for k in logs
            if k.removeprefix(archive.prefix).split("/")[1] == "0"
        )
        assert len(segments) >= 2
        inside = (segments[-1][0] + archive.tiered_end[0]) // 2
        (lo,) = (
            spark.read.format("kafka-tiered")
            .options(**archive.options(s3))
            .load()
            .where(f"partition = 0 AND offset = {inside}")
            .selectExpr("unix_micros(timestamp)")
            .first()
        )
        proxy.requests.clear()
        window = df.where(f"partition = 0 AND timestamp >= timestamp_micros({lo})")
        count = window.count()
        time_gets = {r.path.split("?")[0].split("/", 2)[2]: r for r in proxy.gets(".log")}
    expected = (
        spark.read.format("kafka-tiered")
        .options(**archive.options(s3), filterPushdown="false")
        .load()
        .where(f"partition = 0 AND timestamp >= timestamp_micros({lo})")
        .count()
    )
    assert count == expected > 0
    # the segments before (max timestamp below the bound) are never fetched; the last one is
    # read from its time-index position with one ranged GET
    holding = len(segments) - 1
    assert not [k for _, k in segments[:holding] if k in time_gets]
    boundary = time_gets[segments[holding][1]]
    assert boundary.range is not None
    assert boundary.body_bytes < logs[segments[holding][1]]
    assert set(time_gets) == {segments[holding][1]}


def test_audit_finds_a_planted_corrupt_byte(spark, s3, archive: Archive, tmp_path):
    """`sidecar spark verify` over the archive: clean, then one byte flipped in one segment's
    `.log` in the bucket: the report names that segment and only that one."""
    from sidecar.spark.verify import audit_dataframe

    options = archive.options(s3)
    report = audit_dataframe(spark, options).collect()
    assert len([r for r in report if r.segment_id]) >= archive.rolled
    assert all(r.status == "ok" for r in report), [r for r in report if r.status != "ok"]

    keys = sorted(k for k in _segment_sizes(s3, archive.prefix) if k.endswith(".log"))
    victim = keys[len(keys) // 2]
    client = s3.client()
    try:
        original = client.get_object(Bucket=s3.bucket, Key=victim)["Body"].read()
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x40
        client.put_object(Bucket=s3.bucket, Key=victim, Body=bytes(flipped))
        try:
            report = audit_dataframe(spark, options).collect()
            bad = [r for r in report if r.status != "ok"]
            assert [r.log_key for r in bad] == [victim]
            assert any("crc" in p.lower() for p in bad[0].problems)
            # the CLI names it too and fails
            env = {
                **os.environ,
                "AWS_ACCESS_KEY_ID": s3.access_key,
                "AWS_SECRET_ACCESS_KEY": s3.secret_key,
                "PYSPARK_PYTHON": sys.executable,
            }
            done = subprocess.run(
                [
                    sys.executable, "-m", "sidecar", "spark", "verify",
                    "--bucket", s3.bucket, "--prefix", archive.prefix,
                    "--endpoint", s3.endpoint, "--topic", archive.topic,
                ],
                capture_output=True, text=True, env=env, timeout=300, check=False,
            )  # fmt: skip
            assert done.returncode == 1, done.stderr[-3000:]
            assert victim in done.stdout
            assert s3.secret_key not in done.stdout + done.stderr
        finally:
            client.put_object(Bucket=s3.bucket, Key=victim, Body=original)
    finally:
        client.close()


# --- a segment that remote retention deletes between planning and the read

WORKER_LOGGING_CONF = "spark.sql.pyspark.worker.logging.enabled"


def _value(i: int) -> bytes:
    return f"{i:08d}".encode() * 128


async def _produce_numbered(bootstrap: str, topic: str, count: int) -> None:
    """Records 0..count-1 to partition 0, each value naming its offset (1 KiB)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i in range(count):
            await producer.send(topic, value=_value(i), partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def test_a_segment_deleted_after_planning_is_data_loss(
    spark, kafka, s3, topic_name, s3_prefix, tmp_path
):
    """Two reads are planned (``df.rdd`` runs the source's ``partitions()`` once, and its
    collects reuse that plan); then a DeleteRecords makes the running sidecar's remote retention
    delete the first tiered segment. The read with ``failOnDataLoss=true`` (the default) fails
    with ArchiveDataLossError naming the segment; the one with ``failOnDataLoss=false`` returns
    every other planned row and logs a warning. A read planned after the deletion starts past
    it and fails nothing."""
    from pyspark.errors import PythonException

    bootstrap = kafka.bootstrap_servers
    await create_topic(
        bootstrap, topic_name, configs={"segment.bytes": "1048576", "retention.ms": "-1"}
    )
    await _produce_numbered(bootstrap, topic_name, 3500)  # three 1 MiB segments roll
    scan = scan_partition_dir(kafka.log_dir / f"{topic_name}-0")
    assert scan is not None
    rolled = [s for s in scan.segments if not s.is_active]
    assert len(rolled) >= 3
    config = sidecar_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dirs=[kafka.log_dir],
        bootstrap=bootstrap,
        s3=s3,
        metrics_port=stack.free_port(),
        metadata_topic=f"__rlm_{topic_name}",
        include_topics=[topic_name],
        prefix=s3_prefix,
        extra="[retention]\ninterval_s = 1.0\nscrub_enabled = false\n",
    )
    sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / "sidecar.log")
    options = {
        "subscribe": topic_name,
        "kafka.bootstrap.servers": bootstrap,
        "metadata.topic": f"__rlm_{topic_name}",
        "s3.endpoint": s3.endpoint,
        "s3.bucket": s3.bucket,
        "s3.prefix": s3_prefix,
        "s3.accessKeyId": s3.access_key,
        "s3.secretAccessKey": s3.secret_key,
    }
    # the Python workers' log lines, for the warning; set before planning (the plan carries it)
    spark.conf.set(WORKER_LOGGING_CONF, "true")
    try:
        await sidecar.wait_for("segment_tiered", count=len(rolled), timeout=180)

        def planned(**extra: str) -> Any:
            """The read's RDD: its partitions (the source's plan) are fixed from here on."""
            return spark.read.format("kafka-tiered").options(**options, **extra).load().rdd

        # planned on the test's thread: planned from another thread (asyncio.to_thread), the
        # reads ran without the session's worker-logging setting
        failing = planned()
        lenient = planned(failOnDataLoss="false")
        assert failing.getNumPartitions() >= len(rolled)

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        await admin.start()
        try:
            await admin.delete_records(
                {TopicPartition(topic_name, 0): RecordsToDelete(rolled[1].base_offset)}
            )
        finally:
            await admin.close()
        (deleted,) = await sidecar.wait_for("remote_segment_deleted", timeout=60)
        assert (deleted["start_offset"], deleted["end_offset"]) == (0, rolled[0].end_offset)
        segment_id = encode_kafka_uuid(uuid.UUID(deleted["segment_id"]))

        with pytest.raises(PythonException) as failed:
            await asyncio.to_thread(failing.collect)
        assert "ArchiveDataLossError" in str(failed.value)
        assert f"segment {segment_id} is not in the bucket" in str(failed.value)

        rows = await asyncio.to_thread(lenient.collect)
        kept = list(range(rolled[1].base_offset, rolled[-1].end_offset + 1))
        assert sorted(r.offset for r in rows) == kept
        assert all(r.value == _value(r.offset) for r in rows)
        warnings = [
            r.msg
            for r in spark.tvf.python_worker_logs()
            .where("logger = 'sidecar.spark._read' AND level = 'WARNING'")
            .collect()
            if segment_id in r.msg
        ]
        assert warnings, spark.tvf.python_worker_logs().collect()
        assert all("skipped (failOnDataLoss=false)" in w for w in warnings)

        fresh = await asyncio.to_thread(planned().collect)
        assert sorted(r.offset for r in fresh) == kept
        assert await sidecar.stop() == 0
    finally:
        spark.conf.unset(WORKER_LOGGING_CONF)
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        await delete_topic(bootstrap, topic_name)
