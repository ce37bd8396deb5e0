"""Apache Kafka's own RemoteLogMetadataSerde and partitioner, from the real jars, as a test oracle.

``integration/java/MetadataSerdeCheck.java`` is compiled against Kafka's jars and kept running as
one JVM that answers a line per request (see its header comment). The ``kafka_serde`` fixture is
registered for every test in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.metadata import (
    PartitionDeleteMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.metadata.serde import decode

JAVA_SOURCE = Path(__file__).parent / "integration" / "java" / "MetadataSerdeCheck.java"


class KafkaSerde:
    """One JVM running MetadataSerdeCheck: a line per request in, a line per answer out."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self._stdin: IO[str] = process.stdin
        self._stdout: IO[str] = process.stdout

    def ask(self, line: str) -> tuple[bool, str]:
        """Send one request; return (ok, the rest of the answer line)."""
        self._stdin.write(line + "\n")
        self._stdin.flush()
        answer = self._stdout.readline()
        assert answer, "MetadataSerdeCheck exited (its stderr.log is beside its classes)"
        status, _, rest = answer.rstrip("\n").partition(" ")
        assert status in {"OK", "ERR"}, answer
        return status == "OK", rest

    def decode(self, value: bytes) -> tuple[dict[str, str] | None, str]:
        """Kafka's decoding of ``value``: (fields, toString) or (None, the error)."""
        ok, rest = self.ask(value.hex())
        if not ok:
            return None, rest
        text, _, to_string = rest.partition("\t")
        return dict(pair.split("=", 1) for pair in text.split(" ")), to_string

    def encode(self, event: RemoteLogMetadata) -> bytes:
        """Kafka's serialization of ``event``."""
        ok, rest = self.ask(
            "E " + " ".join(f"{key}={value}" for key, value in fields(event).items())
        )
        assert ok, rest
        return bytes.fromhex(rest)

    def partition(self, tp: TopicIdPartition, num_partitions: int) -> int:
        """Kafka's metadata partition for ``tp``."""
        ok, rest = self.ask(f"P {tp.topic_id.hex} {tp.partition} {num_partitions}")
        assert ok, rest
        return int(rest)


def _custom(custom: bytes | None) -> str:
    return "null" if custom is None else custom.hex()


def _topic_id_partition_fields(tp: TopicIdPartition) -> dict[str, str]:
    return {
        "topic": tp.topic.encode("utf-8").hex(),
        "topicId": tp.topic_id.hex,
        "partition": str(tp.partition),
    }


def _segment_id_fields(segment_id: RemoteLogSegmentId) -> dict[str, str]:
    return _topic_id_partition_fields(segment_id.topic_id_partition) | {
        "segmentId": segment_id.id.hex
    }


def _segment_fields(event: SegmentMetadata | SegmentMetadataSnapshot) -> dict[str, str]:
    return {
        "start": str(event.start_offset),
        "end": str(event.end_offset),
        "broker": str(event.broker_id),
        "maxTs": str(event.max_timestamp_ms),
        "eventTs": str(event.event_timestamp_ms),
        "epochs": ",".join(f"{epoch}:{offset}" for epoch, offset in event.segment_leader_epochs),
        "size": str(event.segment_size_in_bytes),
        "custom": _custom(event.custom_metadata),
        "state": str(int(event.state)),
        "txnEmpty": "true" if event.txn_index_empty else "false",
    }


def fields(event: RemoteLogMetadata) -> dict[str, str]:
    """The text form MetadataSerdeCheck prints and parses (see its header comment)."""
    if isinstance(event, SegmentMetadata):
        return {"type": "segment"} | _segment_id_fields(event.segment_id) | _segment_fields(event)
    if isinstance(event, SegmentMetadataUpdate):
        return (
            {"type": "update"}
            | _segment_id_fields(event.segment_id)
            | {
                "broker": str(event.broker_id),
                "eventTs": str(event.event_timestamp_ms),
                "custom": _custom(event.custom_metadata),
                "state": str(int(event.state)),
            }
        )
    if isinstance(event, PartitionDeleteMetadata):
        return (
            {"type": "delete"}
            | _topic_id_partition_fields(event.topic_id_partition)
            | {
                "broker": str(event.broker_id),
                "eventTs": str(event.event_timestamp_ms),
                "state": str(int(event.state)),
            }
        )
    return {"type": "snapshot", "segmentId": event.segment_id.hex} | _segment_fields(event)


@contextlib.contextmanager
def running_kafka_serde(kafka_libs: Path, workdir: Path) -> Iterator[KafkaSerde]:
    """MetadataSerdeCheck compiled against ``kafka_libs`` into ``workdir`` and running."""
    classpath = str(kafka_libs / "*")
    compiled = subprocess.run(
        ["javac", "-cp", classpath, "-d", str(workdir), str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    with (workdir / "stderr.log").open("w") as stderr:
        process = subprocess.Popen(
            ["java", "-cp", f"{workdir}{os.pathsep}{classpath}", "MetadataSerdeCheck"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            encoding="utf-8",
        )
        try:
            yield KafkaSerde(process)
        finally:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            assert process.stdout is not None
            process.stdout.close()


@pytest.fixture(scope="session")
def kafka_serde(kafka_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSerde]:
    """MetadataSerdeCheck compiled against ``kafka_libs`` and running."""
    with running_kafka_serde(kafka_libs, tmp_path_factory.mktemp("metadata-serde-check")) as serde:
        yield serde


# --- the session-end check: every metadata record the tests produced, decoded by Kafka ---------

#: names of the metadata topics the tests and the sidecar use
METADATA_TOPIC_PREFIXES = ("__rlm", "__remote_log_metadata")


async def metadata_topic_values(
    bootstrap: str, *, only: list[str] | None = None, timeout_s: float = 120.0
) -> dict[str, list[bytes]]:
    """Every record value of every metadata topic on the cluster (or of ``only``), by topic."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        found = await consumer.topics()
        topics = sorted(
            t
            for t in found
            if (t in only if only is not None else t.startswith(METADATA_TOPIC_PREFIXES))
        )
        tps = [TopicPartition(t, p) for t, count in (await _partitions(bootstrap, topics)).items()
               for p in range(count)]  # fmt: skip
        values: dict[str, list[bytes]] = {t: [] for t in topics}
        if not tps:
            return values
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        async with asyncio.timeout(timeout_s):
            while remaining:
                fetched = await consumer.getmany(*remaining, timeout_ms=1000)
                for tp, records in fetched.items():
                    values[tp.topic] += [r.value for r in records if r.value is not None]
                    if records and records[-1].offset + 1 >= ends[tp]:
                        remaining.discard(tp)
        return values
    finally:
        await consumer.stop()


async def _partitions(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Partition counts of ``topics`` (the consumer's ``topics()`` does not keep the metadata)."""
    if not topics:
        return {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described if not d["error_code"]}


#: records checked so far this session (by the checks before deletion and at the end) and the
#: problems found; printed in the terminal summary
SERDE_REPORT: dict[str, Any] = {"records": 0, "topics": 0, "problems": []}


def check_values(
    topic: str, values: list[bytes], serde: KafkaSerde, *, report: bool = True
) -> list[str]:
    """Decode ``values`` with Kafka's serde and with ours; a line per record Kafka refuses or
    reads differently. Counted in ``SERDE_REPORT`` unless ``report`` is false."""
    problems: list[str] = []
    for n, value in enumerate(values):
        kafka_fields, text = serde.decode(value)
        if kafka_fields is None:
            problems.append(f"{topic} record {n}: Kafka cannot decode it: {text}")
        elif kafka_fields != fields(decode(value)):
            problems.append(f"{topic} record {n}: Kafka reads {kafka_fields}")
    if report:
        SERDE_REPORT["records"] += len(values)
        SERDE_REPORT["topics"] += 1
        SERDE_REPORT["problems"] += problems
    return problems


def check_metadata_topics(bootstrap: str) -> list[str]:
    """Every metadata topic left on the cluster, checked with :func:`check_values` (the JVM
    starts only when there is a record to check)."""
    values = asyncio.run(metadata_topic_values(bootstrap))
    problems: list[str] = []
    for topic, records in values.items():
        if records:
            problems += check_values(topic, records, shared_kafka_serde())
    return problems


# --- one JVM for the whole session, started on first use --------------------------------------

_shared: dict[str, Any] = {}


def shared_kafka_serde() -> KafkaSerde:
    """The session's MetadataSerdeCheck (compiled against the stack's Kafka jars on first use);
    :func:`close_shared_kafka_serde` stops it."""
    if "serde" not in _shared:
        from tests.conftest import stack

        stack_ = contextlib.ExitStack()
        workdir = Path(tempfile.mkdtemp(prefix="metadata-serde-check-"))
        stack_.callback(shutil.rmtree, workdir, ignore_errors=True)
        _shared["serde"] = stack_.enter_context(running_kafka_serde(stack.kafka_libs(), workdir))
        _shared["stack"] = stack_
    serde: KafkaSerde = _shared["serde"]
    return serde


def close_shared_kafka_serde() -> None:
    stack_ = _shared.pop("stack", None)
    _shared.pop("serde", None)
    if stack_ is not None:
        stack_.close()


async def check_metadata_topic(bootstrap: str, topic: str) -> None:
    """Before a test deletes its metadata topic: Kafka's serde must read every record in it
    exactly as we do (invariant 3: every record we produce decodes with Kafka's serde)."""
    values = (await metadata_topic_values(bootstrap, only=[topic])).get(topic, [])
    problems = await asyncio.to_thread(check_values, topic, values, shared_kafka_serde())
    assert not problems, "Kafka's serde disagrees:\n  " + "\n  ".join(problems[:50])
