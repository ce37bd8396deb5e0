"""``make soak-broker`` (not in CI): the broker-driven mode under load for ``SOAK_MINUTES``
(default 20) — a broker that runs the plugin and the sidecar beside it, an idempotent producer,
Kafka consumers reading random offsets through the broker (mostly tiered data: the broker keeps
2 MiB per partition), the broker's own copies, local deletions and remote retention, one S3
fault a minute through the fault proxy — while the sidecar's RSS, open files and threads and
the broker's threads and open files, by kind, are sampled every ``SOAK_SAMPLE_S`` seconds.

Every record's key names its partition and offset and its value is derived from the key, so a
reader checks each record it gets: a wrong value, an offset that is not the one asked for, or a
gap inside a fetch is a failure. At the end, once the broker has copied what rolled, every
partition is read from its earliest offset to its end and must come back whole. It fails
(exit 1) on any of those, when a resource grows without bound (as ``make soak``: the sidecar's
three, and the broker's threads, sockets and the sidecar cache files the plugin keeps open; the
broker's other open files are reported, see ``soak``), or when the sidecar exits. It prints a
JSON summary.

``SOAK_MINUTES=3 make soak-broker`` is a short run.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from tests.conftest import stack
from tests.e2e._support import metric_samples
from tests.e2e.test_broker_plugin import plugged_broker
from tests.faults._harness import FaultProxy, through
from tests.faults.proxy import FAULTS
from tests.faults.soak import bounded, proc_sample, run_soak
from tests.helpers import create_topic

PARTITIONS = 4
READERS = 8
TOPIC = "soak"
TOPIC_CONFIGS = {
    "remote.storage.enable": "true",
    "segment.bytes": str(1024 * 1024),
    "local.retention.bytes": str(2 * 1024 * 1024),
    "retention.bytes": str(24 * 1024 * 1024),  # the broker's remote retention deletes too
}


def record_key(partition: int, offset: int) -> bytes:
    return f"{partition}:{offset}".encode()


def record_value(key: bytes) -> bytes:
    """1 KiB that only this key has."""
    return hashlib.sha256(key).digest() * 32


def check_record(partition: int, offset: int, key: bytes | None, value: bytes | None) -> str | None:
    """What is wrong with the record read at ``offset`` of ``partition``, or None."""
    if key != record_key(partition, offset):
        return "wrong_offset"
    if value != record_value(key):
        return "wrong_bytes"
    return None


async def _produce(
    bootstrap: str, stop: asyncio.Event, counts: Counter[str], sent: list[int]
) -> None:
    """About 1 MB/s over the partitions; ``sent[p]`` is the next offset of partition ``p``
    (idempotent, one producer: the n-th record of a partition lands at offset n)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        while not stop.is_set():
            for _ in range(50):
                for partition in range(PARTITIONS):
                    key = record_key(partition, sent[partition])
                    await producer.send(
                        TOPIC, key=key, value=record_value(key), partition=partition
                    )
                    sent[partition] += 1
            await producer.flush()
            counts["produced"] += 50 * PARTITIONS
            await asyncio.sleep(0.2)
    finally:
        await producer.stop()


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="none",
        max_partition_fetch_bytes=1 << 20,
        request_timeout_ms=60_000,
    )


async def _reader(
    bootstrap: str, stop: asyncio.Event, counts: Counter[str], rng: random.Random
) -> None:
    """Read up to 400 records from random offsets through the broker, checking each."""
    consumer = _consumer(bootstrap)
    await consumer.start()
    try:
        while not stop.is_set():
            tp = TopicPartition(TOPIC, rng.randrange(PARTITIONS))
            consumer.assign([tp])
            try:
                earliest = (await consumer.beginning_offsets([tp]))[tp]
                end = (await consumer.end_offsets([tp]))[tp]
                if end <= earliest:
                    await asyncio.sleep(0.5)
                    continue
                offset = rng.randrange(earliest, end)
                consumer.seek(tp, offset)
                want = offset
                deadline = time.monotonic() + 60
                while want < min(end, offset + 400) and time.monotonic() < deadline:
                    got = await consumer.getmany(tp, timeout_ms=2000)
                    for record in got.get(tp, []):
                        if record.offset != want:
                            counts["gap"] += 1
                            want = record.offset
                        problem = check_record(
                            tp.partition, record.offset, record.key, record.value
                        )
                        if problem:
                            counts[problem] += 1
                        want += 1
                        counts["records"] += 1
                if want < min(end, offset + 400):
                    counts["read_timeout"] += 1
                else:
                    counts["reads"] += 1
            except OffsetOutOfRangeError:
                counts["out_of_range"] += 1  # retention deleted the offset meanwhile
            except KafkaError as exc:
                counts[f"kafka_{type(exc).__name__}"] += 1
                await asyncio.sleep(0.5)
    finally:
        await consumer.stop()


async def _read_all(bootstrap: str, counts: Counter[str]) -> dict[int, int]:
    """Every partition from its earliest offset to its end: records read per partition."""
    consumer = _consumer(bootstrap)
    await consumer.start()
    read: dict[int, int] = {}
    try:
        for partition in range(PARTITIONS):
            tp = TopicPartition(TOPIC, partition)
            consumer.assign([tp])
            earliest = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            consumer.seek(tp, earliest)
            want = earliest
            deadline = time.monotonic() + 300
            while want < end and time.monotonic() < deadline:
                try:
                    got = await consumer.getmany(tp, timeout_ms=2000)
                except OffsetOutOfRangeError:
                    # remote retention deleted the start meanwhile: go on from the new one
                    counts["final_start_moved"] += 1
                    moved = (await consumer.beginning_offsets([tp]))[tp]
                    earliest, want = max(earliest, moved), max(want, moved)
                    consumer.seek(tp, want)
                    continue
                for record in got.get(tp, []):
                    if record.offset != want:
                        counts["final_gap"] += 1
                        want = record.offset
                    if check_record(partition, record.offset, record.key, record.value):
                        counts["final_wrong"] += 1
                    want += 1
            read[partition] = want - earliest
            if want < end:
                counts["final_short"] += 1
    finally:
        await consumer.stop()
    return read


async def _caught_up(metrics_port: int, timeout: float) -> bool:
    """Wait until the sidecar's copy lag of the topic, which it derives from the broker's own
    events, is 0 segments: every rolled segment below the last stable offset is copied."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = await metric_samples(metrics_port)
        lag = [
            v
            for (n, labels), v in metrics.items()
            if n == "kafka_tiered_sidecar_copy_lag_segments" and ("topic", TOPIC) in labels
        ]
        if lag and sum(lag) == 0:
            return True
        await asyncio.sleep(1)
    return False


async def soak(minutes: float, sample_s: float, root: Path) -> dict[str, Any]:
    s3 = stack.SeaweedS3.create(root / "s3")
    s3.start()
    proxy = FaultProxy(s3.endpoint, root / "proxy")
    counts: Counter[str] = Counter()
    sidecar_samples: list[dict[str, int]] = []
    broker_samples: list[dict[str, int]] = []
    faults: list[str] = []
    try:
        (root / "t").mkdir()
        async with plugged_broker(through(s3, proxy), "soak/", root, root / "t") as broker:
            bootstrap = broker.cluster.bootstrap_servers
            await create_topic(bootstrap, TOPIC, partitions=PARTITIONS, configs=TOPIC_CONFIGS)
            broker_pid = broker.cluster.nodes[0].pid()
            assert broker_pid is not None
            stop = asyncio.Event()
            sent = [0] * PARTITIONS
            rng = random.Random(7)
            producer = asyncio.create_task(_produce(bootstrap, stop, counts, sent))
            readers = [
                asyncio.create_task(_reader(bootstrap, stop, counts, random.Random(i)))
                for i in range(READERS)
            ]
            started = time.monotonic()
            end = started + minutes * 60
            next_fault = started + 60
            while time.monotonic() < end:
                if broker.sidecar.exited:
                    raise AssertionError("the sidecar exited\n" + broker.sidecar.tail(60))
                if producer.done():
                    producer.result()  # the producer's error, if it failed
                    raise AssertionError("the producer stopped")
                sidecar_samples.append(proc_sample(broker.sidecar.proc.pid))
                broker_samples.append(broker_sample(broker_pid))
                now = time.monotonic()
                if now >= next_fault:
                    fault = FAULTS[len(faults) % len(FAULTS)]
                    op = rng.choice(["PutObject", "GetObject", "DeleteObjects", "DeleteObject"])
                    proxy.set({"fault": fault, "op": op, "count": 3, "delay_s": 0.5})
                    faults.append(f"{fault}:{op}")
                    next_fault = now + 60
                await asyncio.sleep(sample_s)
            stop.set()
            await asyncio.gather(producer, *readers, return_exceptions=True)
            proxy.clear()  # no more faults: the broker catches up and the last read is whole
            caught_up = await _caught_up(broker.metrics_port, timeout=300)
            final = await _read_all(bootstrap, counts)
            metrics = await metric_samples(broker.metrics_port)
            requests = {
                f"{dict(labels)['endpoint']} {dict(labels)['status']}": v
                for (n, labels), v in metrics.items()
                if n == "kafka_tiered_sidecar_read_requests_total"
            }
            eager = {
                dict(labels)["outcome"]: v
                for (n, labels), v in metrics.items()
                if n == "kafka_tiered_sidecar_eager_uploads_total"
            }
            broker_fds = open_files_by_kind(broker_pid)
            exit_code = await broker.sidecar.stop()
        # The broker's heap is Java's to size. Of its open files, the sidecar's cache files (which
        # the plugin keeps open for its windows) and its sockets are the plugin's to bound; its
        # total is not: Kafka's remote index cache keeps each cached segment's transaction index
        # open, and the local stack rolls the metadata topic every 10 s (log.roll.ms) and keeps
        # it forever. Both are reported.
        limits = {
            "sidecar_rss_kib": bounded(sidecar_samples, "rss_kib", 32 * 1024),
            "sidecar_open_files": bounded(sidecar_samples, "open_files", 32),
            "sidecar_threads": bounded(sidecar_samples, "threads", 8),
            "broker_cache_files": bounded(broker_samples, "cache_files", 16),
            "broker_sockets": bounded(broker_samples, "sockets", 32),
            "broker_threads": bounded(broker_samples, "threads", 16),
        }
        wrong = {
            k: counts[k]
            for k in (
                "wrong_bytes",
                "wrong_offset",
                "gap",
                "final_gap",
                "final_wrong",
                "final_short",
            )
        }
        return {
            "minutes": minutes,
            "faults": faults,
            "counts": dict(counts),
            "produced_per_partition": sent,
            "read_at_the_end_per_partition": final,
            "sidecar_requests": requests,
            "eager_uploads": eager,
            "caught_up": caught_up,
            "samples": len(sidecar_samples),
            "sidecar": _summary(sidecar_samples),
            "broker": _summary(broker_samples),
            "broker_open_files_at_the_end": broker_fds,
            "bounded": limits,
            "exit_code": exit_code,
            "ok": all(limits.values())
            and exit_code == 0
            and caught_up
            and not any(wrong.values())
            and counts["reads"] > 0,
        }
    finally:
        proxy.stop()
        s3.stop()


def broker_sample(pid: int) -> dict[str, int]:
    """:func:`proc_sample` and the broker's open files by kind: the sidecar's cache files (the
    plugin's windows), sockets, Kafka's remote index cache's transaction indexes, and the
    metadata topic's segments."""
    kinds = open_files_by_kind(pid, top=None)
    return {
        **proc_sample(pid),
        "cache_files": sum(n for k, n in kinds.items() if ".chunk" in k),
        "sockets": kinds.get("socket", 0),
        "index_cache_txnindex": sum(
            n for k, n in kinds.items() if k.startswith("remote-log-index-cache/")
        ),
        "metadata_topic_logs": sum(
            n for k, n in kinds.items() if k.startswith("__remote_log_metadata-")
        ),
    }


def open_files_by_kind(pid: int, top: int | None = 12) -> dict[str, int]:
    """What process ``pid`` holds open, counted by kind: sockets, pipes, and files by their
    directory's name and suffix (``soak-0/*.log``), the most first."""
    kinds: Counter[str] = Counter()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue  # closed meanwhile
        if not target.startswith("/"):
            kinds[target.split(":", 1)[0]] += 1
        else:
            path = Path(target.removesuffix(" (deleted)"))
            deleted = " (deleted)" if target.endswith(" (deleted)") else ""
            kinds[f"{path.parent.name}/*{path.suffix}{deleted}"] += 1
    return dict(kinds.most_common(top))


def _summary(samples: list[dict[str, int]]) -> dict[str, Any]:
    if not samples:
        return {}
    third = max(1, len(samples) // 3)
    return {
        "first": samples[0],
        "peak": {k: max(s[k] for s in samples) for k in samples[0]},
        "last": samples[-1],
        # the peak of each third of the run: a leak climbs through all three
        "peak_by_third": {
            k: [max(s[k] for s in part) for part in thirds(samples, third)] for k in samples[0]
        },
    }


def thirds(samples: list[dict[str, int]], size: int) -> list[list[dict[str, int]]]:
    return [samples[:size], samples[size:-size] or samples[:size], samples[-size:]]


def main() -> int:
    return run_soak(soak, "sidecar-soak-broker-")


if __name__ == "__main__":
    sys.exit(main())
