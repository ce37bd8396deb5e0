"""Apache Kafka's own RemoteLogMetadataSerde and partitioner, from the real jars, as a test oracle.

``integration/java/MetadataSerdeCheck.java`` is compiled against Kafka's jars and kept running as
one JVM that answers a line per request (see its header comment). The ``kafka_serde`` fixture is
registered for every test in tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from sidecar.metadata import (
    PartitionDeleteMetadata,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    SegmentMetadata,
    SegmentMetadataSnapshot,
    SegmentMetadataUpdate,
    TopicIdPartition,
)

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


@pytest.fixture(scope="session")
def kafka_serde(kafka_libs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSerde]:
    """MetadataSerdeCheck compiled against ``kafka_libs`` and running."""
    classes = tmp_path_factory.mktemp("metadata-serde-check")
    classpath = str(kafka_libs / "*")
    compiled = subprocess.run(
        ["javac", "-cp", classpath, "-d", str(classes), str(JAVA_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    with (classes / "stderr.log").open("w") as stderr:
        process = subprocess.Popen(
            ["java", "-cp", f"{classes}{os.pathsep}{classpath}", "MetadataSerdeCheck"],
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
