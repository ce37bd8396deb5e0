"""Reading tiered data through the socket on the real broker and SeaweedFS: what a Kafka consumer
read from the broker (every codec, headers, transactions committed and aborted) is what the
socket returns, after the broker deleted its local copy, and while the broker is stopped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from sidecar.kafka.logdir import scan_partition_dir
from sidecar.kafka.records import Record, decode_batches
from sidecar.readserver import ReadClient
from tests.conftest import stack
from tests.e2e._support import CODECS, produce_per_codec
from tests.helpers import create_topic, wait_for
from tests.sidecar_runner import Sidecar, sidecar_config, sidecar_env

pytestmark = pytest.mark.e2e

TXN_PARTITION = len(CODECS)  # the partition written by a transactional producer
MIB_PER_PARTITION = 2.3  # 1 MiB segments: two roll, the third stays active

Row = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _row(offset: int, timestamp: int, key: Any, value: Any, headers: Any) -> Row:
    return (offset, timestamp, key, value, [(k, v) for k, v in headers])


def _socket_row(record: Record) -> Row:
    return _row(record.offset, record.timestamp, record.key, record.value, record.headers)


def _headers(i: int, codec: str) -> list[tuple[str, bytes]]:
    return [("codec", codec.encode()), ("i", str(i).encode()), ("empty", b"")]


async def _produce(bootstrap: str, topic: str, *, mib: float = MIB_PER_PARTITION) -> None:
    """Partitions 0-4: one codec each, random 1 KiB values (they do not compress, so segments
    roll), a null key now and then. The last partition: lz4 transactions, every third aborted."""
    count = int(mib * 1024)
    await produce_per_codec(
        bootstrap,
        topic,
        range(count),
        codecs=CODECS,
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
        per_transaction = 100
        for t in range(count // per_transaction + 1):
            async with producer.transaction() if t % 3 else _aborting(producer):
                for i in range(per_transaction):
                    await producer.send(
                        topic,
                        value=os.urandom(1024),
                        key=f"t{t}-{i}".encode(),
                        partition=TXN_PARTITION,
                        headers=_headers(i, "aborted" if t % 3 == 0 else "committed"),
                    )
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def _aborting(producer: AIOKafkaProducer) -> AsyncIterator[None]:
    await producer.begin_transaction()
    yield
    await producer.flush()
    await producer.abort_transaction()


async def _consume(
    bootstrap: str, topic: str, partitions: range, isolation: str = "read_uncommitted"
) -> dict[int, list[Row]]:
    """Every record of the partitions, as a consumer of that isolation level reads them
    (read_uncommitted: aborted data included; transaction markers never)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=isolation,
        max_partition_fetch_bytes=1024 * 1024,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        rows: dict[int, list[Row]] = {p: [] for p in partitions}
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=2000)).items():
                rows[tp.partition] += [
                    _row(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records
                ]
        return rows
    finally:
        await consumer.stop()


def _rolled(log_dir: Path, topic: str, partitions: range) -> int:
    total = 0
    for partition in partitions:
        scan = scan_partition_dir(log_dir / f"{topic}-{partition}")
        assert scan is not None
        total += sum(1 for s in scan.segments if not s.is_active)
    return total


async def _read_all(
    client: ReadClient, topic: str, partition: int, isolation: str = "read_uncommitted"
) -> tuple[list[Row], int]:
    """Every tiered record of the partition through the socket, and the tiered end offset."""
    info = await client.partition(topic, partition)
    tiered = info["tiered"]
    assert tiered is not None
    assert tiered["start_offset"] == 0
    records = client.iter_records(topic, partition, 0, max_bytes=256 * 1024, isolation=isolation)
    rows = [_socket_row(r) async for r in records]
    return rows, int(tiered["end_offset"])


async def _read_all_json(
    client: ReadClient, topic: str, partition: int, end: int, isolation: str
) -> list[Row]:
    """The same through the server's decoded (JSON) responses."""
    rows: list[Row] = []
    offset = 0
    while offset <= end:
        page = await client.records_json(
            topic, partition, offset, max_bytes=300 * 1024, isolation=isolation
        )
        rows += [_socket_row(r) for r in page.records]
        assert page.next_offset > offset
        offset = page.next_offset
    return rows


async def _check_read_committed(
    client: ReadClient, topic: str, committed: list[Row], uncommitted: list[Row], end: int
) -> None:
    """read_committed through the client (raw batches, filtered with the aborted list) and
    the server (JSON) equals a read_committed consumer; read_uncommitted JSON equals a
    read_uncommitted consumer."""
    expected = [r for r in committed if r[0] <= end]
    rows, _ = await _read_all(client, topic, TXN_PARTITION, "read_committed")
    assert len(rows) == len(expected) > 500
    assert rows == expected
    assert await _read_all_json(client, topic, TXN_PARTITION, end, "read_committed") == expected
    everything = [r for r in uncommitted if r[0] <= end]
    assert await _read_all_json(client, topic, TXN_PARTITION, end, "read_uncommitted") == (
        everything
    )


async def _check_batch_starts(client: ReadClient, topic: str, partition: int, rows: list[Row]):
    """From the first, last and a middle offset of every batch (transaction markers too), the
    first data record returned is the first one at or after that offset."""
    offset = 0
    bounds: list[tuple[int, int]] = []
    end = rows[-1][0]
    while offset <= end:
        raw = await client.record_batches(topic, partition, offset, max_bytes=1 << 20)
        for header, _ in decode_batches(raw):
            bounds.append((header.base_offset, header.last_offset))
            offset = header.next_offset
    probes = sorted({o for b, e in bounds for o in (b, (b + e) // 2, e) if o <= end})
    for probe in probes:
        page = await client.records(topic, partition, probe, max_bytes=1)
        if not page.records:  # a transaction marker's batch: no data, go on after it
            assert page.next_offset > probe
            page = await client.records(topic, partition, page.next_offset, max_bytes=1)
        want = next(r for r in rows if r[0] >= probe)
        assert _socket_row(page.records[0]) == want, (partition, probe)


async def test_socket_reads_equal_what_a_consumer_read(kafka, s3, topic_name, tmp_path):
    """Every codec, headers, committed and aborted transactions: the socket's records equal the
    consumer's over the whole tiered range, before and after the broker deletes its copy."""
    partitions = range(len(CODECS) + 1)
    await create_topic(
        kafka.bootstrap_servers,
        topic_name,
        partitions=len(partitions),
        configs={"segment.bytes": "1048576"},
    )
    await _produce(kafka.bootstrap_servers, topic_name)
    consumed = await _consume(kafka.bootstrap_servers, topic_name, partitions)
    txn_only = range(TXN_PARTITION, TXN_PARTITION + 1)
    committed = (await _consume(kafka.bootstrap_servers, topic_name, txn_only, "read_committed"))[
        TXN_PARTITION
    ]
    assert 0 < len(committed) < len(consumed[TXN_PARTITION])
    rolled = _rolled(kafka.log_dir, topic_name, partitions)
    assert rolled >= 2 * len(partitions)
    prefix = f"tests/{topic_name}/"
    config = sidecar_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dirs=[kafka.log_dir],
        bootstrap=kafka.bootstrap_servers,
        s3=s3,
        metrics_port=stack.free_port(),
        metadata_topic=f"__rlm_{topic_name}",
        include_topics=[topic_name],
        prefix=prefix,
        # DeleteRecords below stands for "the broker deleted its local copy"; remote retention
        # would delete the tiered range too (Kafka's log-start-offset rule): off here
        extra="[retention]\nenabled = false\n",
    )
    sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / "sidecar.log")
    try:
        await sidecar.wait_for("segment_tiered", count=rolled, timeout=120, topic=topic_name)
        async with ReadClient(socket_path=tmp_path / "state" / "read.sock") as client:
            ends: dict[int, int] = {}
            for partition in partitions:
                rows, ends[partition] = await _read_all(client, topic_name, partition)
                expected = [r for r in consumed[partition] if r[0] <= ends[partition]]
                assert len(rows) == len(expected) > 1000
                assert rows == expected, partition
                await _check_batch_starts(client, topic_name, partition, rows)
            aborted = [r for r in consumed[TXN_PARTITION] if ("codec", b"aborted") in r[4]]
            assert aborted  # aborted data is returned, as to a read_uncommitted consumer
            page = await client.records_json(topic_name, TXN_PARTITION, 0, max_records=500)
            assert [_socket_row(r) for r in page.records] == consumed[TXN_PARTITION][:500]
            await _check_read_committed(
                client, topic_name, committed, consumed[TXN_PARTITION], ends[TXN_PARTITION]
            )
            # the broker deletes its local copy of the tiered range: reads do not change
            await _delete_records(kafka.bootstrap_servers, topic_name, ends)
            for partition in partitions:
                wait_for(
                    lambda p=partition: _local_start(kafka.log_dir, topic_name, p) > ends[p],
                    timeout=60,
                    what=f"the broker deleting {topic_name}-{partition}'s tiered segments",
                )
            for partition in partitions:
                rows, end = await _read_all(client, topic_name, partition)
                assert end == ends[partition]
                assert rows == [r for r in consumed[partition] if r[0] <= end]
            end = ends[TXN_PARTITION]
            await _check_read_committed(client, topic_name, committed, consumed[TXN_PARTITION], end)
            # ListOffsets' EARLIEST and LATEST over the tiered range
            earliest = await client.offset_for_timestamp(topic_name, TXN_PARTITION, -2)
            latest = await client.offset_for_timestamp(topic_name, TXN_PARTITION, -1)
            assert (earliest["offset"], latest["offset"]) == (0, end + 1)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sidecar", "read", "--socket",
            str(tmp_path / "state" / "read.sock"), "--topic", topic_name, "--partition",
            str(TXN_PARTITION), "--offset", "0", "--json", "--isolation", "read_committed",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        printed = [json.loads(line)["offset"] for line in out.decode().splitlines()]
        assert printed == [r[0] for r in committed if r[0] <= end]
        assert await sidecar.stop() == 0
    finally:
        if sidecar.proc.returncode is None:
            await sidecar.kill()
        await _delete_prefix(s3, prefix)


async def _delete_records(bootstrap: str, topic: str, ends: dict[int, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records(
            {TopicPartition(topic, p): RecordsToDelete(end + 1) for p, end in ends.items()}
        )
    finally:
        await admin.close()


def _local_start(log_dir: Path, topic: str, partition: int) -> int:
    """The base offset of the broker's first local segment (files marked .deleted excluded)."""
    bases = [int(p.name.split(".")[0]) for p in (log_dir / f"{topic}-{partition}").glob("*.log")]
    return min(bases) if bases else 0


async def _delete_prefix(s3: Any, prefix: str) -> None:
    def delete() -> None:
        client = s3.client()
        try:
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=s3.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    client.delete_object(Bucket=s3.bucket, Key=item["Key"])
        finally:
            client.close()

    await asyncio.to_thread(delete)


async def _start_read_only(config: Path, env: dict[str, str], socket: Path, log: Path):
    """``python -m sidecar.readserver`` (no Kafka) on its own socket; returns once it listens."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar.readserver",
        "--config",
        str(config),
        "--set",
        f"read_server.socket_path={socket}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    listening = False
    try:
        with log.open("w") as out:
            while not listening:
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                out.write(line.decode())
                assert line, f"read server exited: see {log}"
                listening = b"read_server_listening" in line
    finally:
        if not listening:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    return proc


async def test_reads_work_while_the_broker_is_stopped(s3, topic_name, tmp_path):
    """A dedicated broker: tiered, then stopped. The daemon keeps serving reads; then, with the
    broker's log dir gone too, a read-only server on the same state dir serves `sidecar read`."""
    cluster = stack.KafkaCluster.create(tmp_path / "kafka", nodes=1)
    cluster.start()
    sidecar = None
    prefix = f"tests/{topic_name}/"
    try:
        bootstrap = cluster.bootstrap_servers
        await create_topic(bootstrap, topic_name, configs={"segment.bytes": "1048576"})
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            for i in range(2500):
                await producer.send(
                    topic_name, value=os.urandom(1024), key=f"k{i}".encode(), partition=0,
                    headers=[("i", str(i).encode())],
                )  # fmt: skip
            await producer.flush()
        finally:
            await producer.stop()
        consumed = (await _consume(bootstrap, topic_name, range(1)))[0]
        rolled = _rolled(cluster.log_dirs[0], topic_name, range(1))
        config = sidecar_config(
            tmp_path / "sidecar.toml",
            state_dir=tmp_path / "state",
            log_dirs=cluster.log_dirs,
            bootstrap=bootstrap,
            s3=s3,
            metrics_port=stack.free_port(),
            metadata_topic=f"__rlm_{topic_name}",
            include_topics=[topic_name],
            prefix=prefix,
        )
        env = sidecar_env(s3)
        sidecar = await Sidecar.start(config, env, tmp_path / "sidecar.log")
        await sidecar.wait_for("segment_tiered", count=rolled, timeout=60, topic=topic_name)
        cluster.stop()
        async with ReadClient(socket_path=tmp_path / "state" / "read.sock") as client:
            rows, end = await _read_all(client, topic_name, 0)
        assert rows == [r for r in consumed if r[0] <= end]
        assert sidecar.proc.returncode is None  # still up, with Kafka gone
        await sidecar.stop()
        sidecar = None
        shutil.rmtree(cluster.log_dirs[0])  # nothing local is left to read from
        socket = tmp_path / "ro.sock"
        server = await _start_read_only(config, env, socket, tmp_path / "read-only.log")
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sidecar", "read", "--socket", str(socket),
                "--topic", topic_name, "--partition", "0", "--offset", "0", "--json",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await process.communicate()
            assert process.returncode == 0, err.decode()
            printed = [json.loads(line) for line in out.decode().splitlines()]
            assert [p["offset"] for p in printed] == [r[0] for r in consumed if r[0] <= end]
            assert [p["key"] for p in printed[:3]] == ["k0", "k1", "k2"]
            assert printed[7]["headers"] == ["i", "7"]
        finally:
            server.terminate()
            assert await server.wait() == 0
    finally:
        if sidecar is not None and sidecar.proc.returncode is None:
            await sidecar.kill()
        cluster.stop()
        await _delete_prefix(s3, prefix)
