"""sidecar.kafka against files the real broker wrote, field by field against Kafka's own reader.

The session broker (KRaft, Kafka 4.3 from the Maven Central jars) writes two topics with 1 MiB
segments, one with CreateTime and one with ``message.timestamp.type=LogAppendTime``, in three rounds
with a broker restart between rounds (each restart is a new partition leader epoch). Every round
sends records with every codec (none, gzip, snappy, lz4, zstd; idempotent and plain producers),
keys, null keys, null values and headers, plus a transaction that commits and one that aborts (so
``.txnindex`` files and producer snapshots exist). Then, for every segment, our parse is compared
with ``org.apache.kafka.tools.DumpLogSegments`` run from the same jars: batches, records, offset and
time indexes, aborted transactions, producer snapshots, the leader-epoch checkpoint and the segment
facts RemoteLogManager would publish; finally ``python -m sidecar inspect --verify --json`` runs on
the real log dir. Segment rolls are awaited by polling the filesystem with a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.kafka import (
    BatchHeader,
    ControlRecordType,
    EpochEntry,
    OffsetIndex,
    PartitionScan,
    Record,
    TimeIndex,
    TxnIndex,
    decode_batches,
    decode_records,
    iter_batches,
    read_leader_epoch_checkpoint,
    read_meta_properties,
    read_producer_snapshot,
    scan_log_dir,
    scan_partition_dir,
)
from sidecar.kafka.inspect import verify_partition
from tests.helpers import create_topic, wait_for
from tests.integration.kafka_dump import Dump, DumpBatch, dump_files

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
ROUNDS = 3  # a broker restart between rounds: three leader epochs with data
RECORDS_PER_CODEC = 420  # ~700-byte values: ~1.4 MiB per round and topic, so segments roll
TXN_COMMITTED = 7
TXN_ABORTED = 5
KINDS = ("create-time", "log-append-time")
TIMESTAMP_TYPE = {"create-time": "CreateTime", "log-append-time": "LogAppendTime"}
INT32_MAX = 2**31 - 1


@dataclass
class Sent:
    """What the test sent at one offset."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    aborted: bool = False


@dataclass
class Written:
    """One partition the broker wrote, with Kafka's dump of it and what we sent to it."""

    kind: str
    topic: str
    path: Path
    sent: dict[int, Sent]
    aborted_ranges: list[tuple[int, int]]
    """(first offset, last offset) of each aborted transaction's records."""
    dump: Dump
    scan: PartitionScan
    topic_id: str
    """As ``kafka-topics --describe`` prints it."""
    log_files: list[Path] = field(default_factory=list)

    def dumped_batches(self, log: Path) -> list[DumpBatch]:
        return self.dump.file(log).batches


# ---------------------------------------------------------------------------------------------
# producing


def _value(rng: random.Random, size: int = 525) -> bytes:
    """~700 ASCII bytes that compress like real payloads (base64 of random bytes)."""
    return base64.b64encode(rng.randbytes(size))


def _record(rng: random.Random, round_: int, codec: str, i: int) -> Sent:
    key = None if i % 7 == 0 else f"r{round_}-{codec}-{i}".encode()
    value = None if i % 41 == 1 and key is not None else _value(rng)  # never both null
    headers: list[tuple[str, bytes | None]] = []
    if i % 3 == 1:
        headers = [("trace", f"{round_}-{i}".encode())]
    elif i % 3 == 2:
        headers = [("a", b"1"), ("empty", b""), ("null", None)]
    return Sent(key, value, headers)


async def _produce_round(
    bootstrap: str,
    topics: list[str],
    round_: int,
    sent: dict[str, dict[int, Sent]],
    rng: random.Random,
) -> dict[str, list[tuple[int, int]]]:
    aborted: dict[str, list[tuple[int, int]]] = {t: [] for t in topics}
    for n, codec in enumerate(CODECS):
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            compression_type=None if codec == "none" else codec,
            enable_idempotence=n % 2 == 0,
            linger_ms=5,
        )
        await producer.start()
        try:
            futures = []
            for topic in topics:
                for i in range(RECORDS_PER_CODEC):
                    record = _record(rng, round_, codec, i)
                    future = await producer.send(
                        topic, key=record.key, value=record.value, headers=record.headers
                    )
                    futures.append((topic, record, future))
            for topic, record, future in futures:
                sent[topic][(await future).offset] = record
        finally:
            await producer.stop()

    txn_codec = CODECS[(round_ + 1) % len(CODECS)]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"fmt-{topics[0]}",
        compression_type=None if txn_codec == "none" else txn_codec,
    )
    await producer.start()
    try:
        async with producer.transaction():
            for topic in topics:
                for i in range(TXN_COMMITTED):
                    record = Sent(f"txn-{round_}-{i}".encode(), _value(rng, 60), [("txn", b"c")])
                    meta = await (
                        await producer.send(
                            topic, key=record.key, value=record.value, headers=record.headers
                        )
                    )
                    sent[topic][meta.offset] = record
        await producer.begin_transaction()
        offsets: dict[str, list[int]] = {t: [] for t in topics}
        for topic in topics:
            for i in range(TXN_ABORTED):
                record = Sent(f"abort-{round_}-{i}".encode(), b"aborted", [], aborted=True)
                meta = await (await producer.send(topic, key=record.key, value=record.value))
                sent[topic][meta.offset] = record
                offsets[topic].append(meta.offset)
        await producer.abort_transaction()
        for topic in topics:
            aborted[topic].append((min(offsets[topic]), max(offsets[topic])))
    finally:
        await producer.stop()
    return aborted


async def _stable_offsets(bootstrap: str, topics: list[str]) -> bool:
    """True when every partition's last stable offset reached its high watermark: the commit
    and abort markers (written asynchronously by the coordinator) are in the log."""
    parts = [TopicPartition(t, 0) for t in topics]
    committed = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    uncommitted = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await committed.start()
    await uncommitted.start()
    try:
        lso = await committed.end_offsets(parts)
        hw = await uncommitted.end_offsets(parts)
    finally:
        await committed.stop()
        await uncommitted.stop()
    return lso == hw


async def _wait_stable(bootstrap: str, topics: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await _stable_offsets(bootstrap, topics):
        if time.monotonic() > deadline:
            raise AssertionError(f"transaction markers not written within {timeout} s")
        await asyncio.sleep(0.2)


async def _wait_leaders(bootstrap: str, topics: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
        try:
            await admin.start()
            described = await admin.describe_topics(topics)
            if len(described) == len(topics) and all(
                p.get("leader", -1) >= 0 for topic in described for p in topic["partitions"]
            ):
                return
        except Exception as exc:  # noqa: BLE001 - the broker is still starting: retry
            last_error = exc
        finally:
            await admin.close()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no partition leaders within {timeout} s after the restart ({last_error!r})"
            )
        await asyncio.sleep(0.2)


def _restart(kafka: Any, topics: list[str]) -> None:
    """Stop and start the broker: its partitions get a new leader epoch."""
    kafka.cluster.stop_node(1)
    kafka.cluster.start_node(1)
    asyncio.run(_wait_leaders(kafka.bootstrap_servers, topics))


def _ready(path: Path) -> bool:
    """Every rolled segment has trimmed indexes and a valid ``<nextBase>.snapshot``."""
    scan = scan_partition_dir(path)
    return (
        scan is not None
        and len(scan.segments) >= 4
        and all(s.ready for s in scan.segments[:-1])
        and not scan.transient_files
    )


def _topic_ids(kafka: Any, topics: list[str]) -> dict[str, str]:
    result = kafka.cluster.tool(
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server",
        kafka.bootstrap_servers,
        "--describe",
        "--topic",
        "|".join(topics),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    ids = {}
    for line in result.stdout.splitlines():
        fields = dict(part.split(": ", 1) for part in line.split("\t") if ": " in part)
        if "TopicId" in fields:
            ids[fields["Topic"].strip()] = fields["TopicId"].strip()
    return ids


@pytest.fixture(scope="module")
def written(kafka: Any) -> dict[str, Written]:
    """Both topics written by the broker in three epochs, dumped by Kafka, scanned by us."""
    assert kafka.cluster is not None, "needs the native stack: broker restarts and Kafka's tools"
    suffix = secrets.token_hex(3)
    topics = {"create-time": f"fmt-ct-{suffix}", "log-append-time": f"fmt-lat-{suffix}"}
    names = list(topics.values())
    base_config = {"segment.bytes": "1048576"}
    asyncio.run(create_topic(kafka.bootstrap_servers, topics["create-time"], configs=base_config))
    asyncio.run(
        create_topic(
            kafka.bootstrap_servers,
            topics["log-append-time"],
            configs={**base_config, "message.timestamp.type": "LogAppendTime"},
        )
    )
    rng = random.Random(1234)
    sent: dict[str, dict[int, Sent]] = {t: {} for t in names}
    aborted: dict[str, list[tuple[int, int]]] = {t: [] for t in names}
    try:
        for round_ in range(ROUNDS):
            if round_:
                _restart(kafka, names)
            got = asyncio.run(_produce_round(kafka.bootstrap_servers, names, round_, sent, rng))
            for topic, ranges in got.items():
                aborted[topic].extend(ranges)
            asyncio.run(_wait_stable(kafka.bootstrap_servers, names))
    finally:
        if not kafka.cluster.running():
            kafka.cluster.start_node(1)

    paths = {kind: kafka.log_dir / f"{topic}-0" for kind, topic in topics.items()}
    for path in paths.values():
        wait_for(lambda p=path: _ready(p), timeout=60, what=f"rolled, ready segments in {path}")
    topic_ids = _topic_ids(kafka, names)

    out = {}
    for kind, topic in topics.items():
        path = paths[kind]
        scan = scan_partition_dir(path)
        assert scan is not None
        files = sorted(
            p
            for p in path.iterdir()
            if p.suffix in (".log", ".index", ".timeindex", ".txnindex", ".snapshot")
        )
        out[kind] = Written(
            kind=kind,
            topic=topic,
            path=path,
            sent=sent[topic],
            aborted_ranges=aborted[topic],
            dump=dump_files(kafka.cluster, files),
            scan=scan,
            topic_id=topic_ids[topic],
            log_files=sorted(path.glob("*.log")),
        )
    return out


@pytest.fixture(params=KINDS)
def part(request: pytest.FixtureRequest, written: dict[str, Written]) -> Written:
    """One of the two partitions (CreateTime, LogAppendTime)."""
    return written[request.param]


@pytest.fixture(scope="module")
def recompressed(kafka: Any) -> dict[str, Written]:
    """Topics with ``compression.type=<codec>`` fed uncompressed batches: the broker compresses
    them with Kafka's own Java codecs (zstd-jni, lz4-java framing, xerial snappy, JDK gzip)."""
    assert kafka.cluster is not None, "needs the native stack for Kafka's tools"
    suffix = secrets.token_hex(3)
    topics = {codec: f"fmt-java-{codec}-{suffix}" for codec in CODECS if codec != "none"}
    for codec, topic in topics.items():
        asyncio.run(
            create_topic(kafka.bootstrap_servers, topic, configs={"compression.type": codec})
        )
    sent: dict[str, dict[int, Sent]] = {t: {} for t in topics.values()}

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=20)
        await producer.start()
        try:
            rng = random.Random(99)
            futures = []
            for topic in topics.values():
                for i in range(600):
                    record = _record(rng, 9, "java", i)
                    future = await producer.send(
                        topic, key=record.key, value=record.value, headers=record.headers
                    )
                    futures.append((topic, record, future))
            for topic, record, future in futures:
                sent[topic][(await future).offset] = record
        finally:
            await producer.stop()

    asyncio.run(produce())
    paths = {codec: kafka.log_dir / f"{topic}-0" for codec, topic in topics.items()}
    logs = sorted(p for path in paths.values() for p in path.glob("*.log"))
    dump = dump_files(kafka.cluster, logs)
    out = {}
    for codec, topic in topics.items():
        scan = scan_partition_dir(paths[codec])
        assert scan is not None
        out[codec] = Written(
            kind=codec,
            topic=topic,
            path=paths[codec],
            sent=sent[topic],
            aborted_ranges=[],
            dump=dump,
            scan=scan,
            topic_id="",
            log_files=sorted(paths[codec].glob("*.log")),
        )
    return out


# ---------------------------------------------------------------------------------------------
# expectations derived from Kafka's dump, independently of sidecar.kafka


def _last_sequence(base_sequence: int, delta: int) -> int:
    """``DefaultRecordBatch.lastSequence``: wraps at Integer.MAX_VALUE; -1 stays -1."""
    if base_sequence < 0:
        return -1
    value = base_sequence + delta
    return value - INT32_MAX - 1 if value > INT32_MAX else value


def _header_as_dumped(h: BatchHeader) -> dict[str, Any]:
    """Our header in DumpLogSegments' vocabulary."""
    return {
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "count": h.record_count,
        "base_sequence": h.base_sequence,
        "last_sequence": _last_sequence(h.base_sequence, h.last_offset_delta),
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "partition_leader_epoch": h.partition_leader_epoch,
        "is_transactional": h.is_transactional,
        "is_control": h.is_control,
        "delete_horizon_ms": h.delete_horizon_ms,
        "position": h.position,
        "timestamp_type": "LogAppendTime" if h.timestamp_type.value else "CreateTime",
        "max_timestamp": h.max_timestamp,
        "size": h.size,
        "magic": h.magic,
        "codec": h.compression.name.lower(),
        "crc": h.crc,
        "is_valid": True,  # iter_batches(verify_crc=True) raised nothing for it
    }


def _dumped_header(b: DumpBatch) -> dict[str, Any]:
    return {k: v for k, v in vars(b).items() if k != "records"}


def _record_as_dumped(h: BatchHeader, r: Record) -> dict[str, Any]:
    marker = None
    coordinator_epoch = None
    if r.control_type is not None:
        marker = r.control_type.name
        assert r.value is not None
        coordinator_epoch = int.from_bytes(r.value[2:6], "big", signed=True)
    return {
        "offset": r.offset,
        "timestamp_type": "LogAppendTime" if r.timestamp_type.value else "CreateTime",
        "timestamp": r.timestamp,
        "key_size": -1 if r.key is None else len(r.key),
        "value_size": -1 if r.value is None else len(r.value),
        "sequence": -1 if h.base_sequence < 0 else h.base_sequence + r.offset - h.base_offset,
        "header_keys": [k for k, _ in r.headers],
        "key": None if r.key is None or marker else r.key.decode(),
        "payload": None if r.value is None or marker else r.value.decode(),
        "end_txn_marker": marker,
        "coordinator_epoch": coordinator_epoch,
    }


def _epoch_transitions(batches: list[DumpBatch]) -> list[tuple[int, int]]:
    """(epoch, first offset) each time partitionLeaderEpoch changes along the log."""
    out: list[tuple[int, int]] = []
    for b in batches:
        if not out or out[-1][0] != b.partition_leader_epoch:
            out.append((b.partition_leader_epoch, b.base_offset))
    return out


def _segments(part: Written) -> Iterator[tuple[int, Path, int | None]]:
    """(base offset, .log path, next base offset or None) for every segment."""
    logs = part.log_files
    for i, log in enumerate(logs):
        nxt = int(logs[i + 1].stem) if i + 1 < len(logs) else None
        yield int(log.stem), log, nxt


def _inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "inspect", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


# ---------------------------------------------------------------------------------------------
# tests


class TestWhatTheBrokerWrote:
    """The broker wrote what the comparisons need (guards against a vacuous pass)."""

    def test_segments_codecs_epochs_and_transactions(self, part: Written) -> None:
        """Several rolled segments, every codec, three epochs, commits, aborts, a .txnindex."""
        batches = [b for log in part.log_files for b in part.dumped_batches(log)]
        assert len(part.log_files) >= 4  # three rolled segments and the active one
        assert {b.codec for b in batches} == set(CODECS)
        assert len({b.partition_leader_epoch for b in batches}) >= ROUNDS
        markers = [r.end_txn_marker for b in batches if b.is_control for r in b.records]
        assert markers.count("ABORT") == ROUNDS
        assert markers.count("COMMIT") == ROUNDS
        assert any(b.producer_id >= 0 and not b.is_transactional for b in batches)
        assert {b.timestamp_type for b in batches} == {TIMESTAMP_TYPE[part.kind]}
        assert any(not s.txn_index_empty for s in part.scan.segments[:-1])

    def test_kafka_reports_no_inconsistency(self, part: Written) -> None:
        """DumpLogSegments finds no index mismatch in rolled segments (its only report is its
        quirk of counting each non-zero base offset as following offset -1)."""
        active = part.log_files[-1].stem
        for heading, details in part.dump.reports:
            if heading.startswith("Non-consecutive offsets in "):
                base = int(Path(heading.split(" in ", 1)[1]).stem)
                assert details == [f"-1 is followed by {base}"], (heading, details)
            else:
                assert active in heading, (heading, details)


class TestBatches:
    """Batch headers: our walk against DumpLogSegments, field by field."""

    def test_headers_match_kafka(self, part: Written) -> None:
        """Base/last offsets, positions, sizes, CRCs, timestamps, codec, flags, producer fields."""
        for base, log, nxt in _segments(part):
            ours = list(iter_batches(log, verify_crc=True, tolerate_tail=nxt is None))
            dumped = part.dumped_batches(log)
            assert part.dump.file(log).log_start_offset == base
            assert [_dumped_header(b) for b in dumped] == [_header_as_dumped(h) for h in ours]
            assert ours[-1].end_position == log.stat().st_size

    def test_buffer_file_and_path_walks_agree(self, part: Written) -> None:
        """Walking a segment from a buffer, an open file and a path gives the same headers."""
        log = part.log_files[0]
        data = log.read_bytes()
        with log.open("rb") as fh:
            from_file = list(iter_batches(fh))
        assert list(iter_batches(data)) == from_file == list(iter_batches(log))


class TestRecords:
    """Records: our decoding against DumpLogSegments and against what was produced."""

    def test_records_match_kafka(self, part: Written) -> None:
        """Offset, timestamp (LogAppendTime too), sizes, sequence, header keys, key, payload."""
        for _base, log, nxt in _segments(part):
            dumped = part.dumped_batches(log)
            decoded = list(decode_batches(log, tolerate_tail=nxt is None))
            assert len(decoded) == len(dumped)
            for (header, records), batch in zip(decoded, dumped, strict=True):
                assert len(records) == batch.count == header.record_count
                expected = [vars(r) for r in batch.records]
                assert [_record_as_dumped(header, r) for r in records] == expected

    def test_records_match_what_was_produced(self, part: Written) -> None:
        """Keys, values, header values and nulls are exactly what the producers sent."""
        seen: dict[int, Record] = {}
        markers: dict[int, ControlRecordType] = {}
        for _base, log, nxt in _segments(part):
            for header, records in decode_batches(log, tolerate_tail=nxt is None):
                for r in records:
                    if header.is_control:
                        assert r.control_type is not None
                        markers[r.offset] = r.control_type
                    else:
                        seen[r.offset] = r
        assert set(seen) == set(part.sent)
        for offset, sent in part.sent.items():
            got = seen[offset]
            assert (got.key, got.value, list(got.headers)) == (sent.key, sent.value, sent.headers)
        assert list(markers.values()).count(ControlRecordType.ABORT) == ROUNDS
        for first, last in part.aborted_ranges:
            abort = min(o for o, t in markers.items() if o > last)
            assert markers[abort] is ControlRecordType.ABORT
            assert all(part.sent[o].aborted for o in range(first, last + 1) if o in part.sent)

    def test_fast_path_matches_per_batch_decoding(self, part: Written) -> None:
        """decode_batches (CRC once, no copies) equals decode_records batch by batch."""
        for _base, log, nxt in _segments(part):
            data = log.read_bytes()
            fast = list(decode_batches(data, tolerate_tail=nxt is None))
            for header, records in fast:
                single = decode_records(data[header.position : header.end_position])
                assert records == single
            assert fast == list(decode_batches(log, tolerate_tail=nxt is None))


class TestJavaCodecs:
    """Batches the broker compressed with Kafka's Java codecs decode as Kafka reads them."""

    @pytest.mark.parametrize("codec", [c for c in CODECS if c != "none"])
    def test_broker_compressed_batches(self, recompressed: dict[str, Written], codec: str) -> None:
        """Headers and records match DumpLogSegments, and records match what was sent."""
        part = recompressed[codec]
        seen: dict[int, Record] = {}
        for _base, log, nxt in _segments(part):
            ours = list(decode_batches(log, tolerate_tail=nxt is None))
            dumped = part.dumped_batches(log)
            assert {b.codec for b in dumped} == {codec}
            assert [_dumped_header(b) for b in dumped] == [_header_as_dumped(h) for h, _ in ours]
            for (header, records), batch in zip(ours, dumped, strict=True):
                assert [_record_as_dumped(header, r) for r in records] == [
                    vars(r) for r in batch.records
                ]
                seen.update((r.offset, r) for r in records)
        assert set(seen) == set(part.sent)
        for offset, sent in part.sent.items():
            got = seen[offset]
            assert (got.key, got.value, list(got.headers)) == (sent.key, sent.value, sent.headers)


class TestIndexes:
    """.index, .timeindex and .txnindex entries against DumpLogSegments."""

    @staticmethod
    def _kafka_entries(
        entries: list[tuple[int, int]], phantom: tuple[int, int], active: bool
    ) -> list[tuple[int, int]]:
        # For the active segment's preallocated index DumpLogSegments prints the all-zero first
        # slot as (base offset, 0) when nothing was indexed yet; we report no entries.
        if active and entries == [phantom]:
            return []
        return entries

    def test_offset_index_matches_kafka(self, part: Written) -> None:
        """Every offset -> position entry, in order; rolled indexes are trimmed and valid."""
        for base, log, nxt in _segments(part):
            index = OffsetIndex.read(log.with_suffix(".index"), base_offset=base)
            dumped = part.dump.file(log.with_suffix(".index")).index
            expected = self._kafka_entries(dumped, (base, 0), nxt is None)
            assert [tuple(e) for e in index] == expected
            if nxt is not None:
                assert index.trimmed
                assert index.validate(log_size=log.stat().st_size, end_offset=nxt - 1) == []
                positions = {b.position for b in part.dumped_batches(log)}
                assert {e.position for e in index} <= positions

    def test_time_index_matches_kafka(self, part: Written) -> None:
        """Every timestamp -> offset entry, in order, including the entry added on roll."""
        for base, log, nxt in _segments(part):
            index = TimeIndex.read(log.with_suffix(".timeindex"), base_offset=base)
            dumped = part.dump.file(log.with_suffix(".timeindex")).timeindex
            expected = self._kafka_entries(dumped, (0, base), nxt is None)
            assert [tuple(e) for e in index] == expected
            if nxt is not None:
                assert index.trimmed
                assert index.validate(end_offset=nxt - 1) == []
                max_ts = max(b.max_timestamp for b in part.dumped_batches(log))
                assert index.last_entry().timestamp == max_ts

    def test_txn_index_matches_kafka(self, part: Written) -> None:
        """Aborted transactions: version, producer id, first/last offset, last stable offset."""
        found: list[tuple[int, int]] = []
        for base, log, _nxt in _segments(part):
            path = log.with_suffix(".txnindex")
            index = TxnIndex.read(path, base_offset=base)
            dumped = part.dump.file(path).txns if path.exists() else []
            assert [tuple(t) for t in index] == dumped
            assert index.validate() == []
            found.extend((t.first_offset, t.last_offset) for t in index)
        # each aborted transaction: from its first record to its abort marker
        assert [first for first, _ in found] == [first for first, _ in part.aborted_ranges]
        for (_, marker), (_, last_record) in zip(found, part.aborted_ranges, strict=True):
            assert marker > last_record


class TestCheckpointsAndSnapshots:
    """Producer snapshots, the leader-epoch checkpoint, partition.metadata, meta.properties."""

    def test_producer_snapshots_match_kafka(self, part: Written) -> None:
        """Every snapshot's entries: producer id/epoch, sequences, offsets, timestamps, txn."""
        snapshots = sorted(part.path.glob("*.snapshot"))
        assert snapshots
        for path in snapshots:
            ours = read_producer_snapshot(path)
            mine = sorted(
                (
                    {
                        "producerId": e.producer_id,
                        "producerEpoch": e.epoch,
                        "coordinatorEpoch": e.coordinator_epoch,
                        "currentTxnFirstOffset": e.current_txn_first_offset,
                        "lastTimestamp": e.timestamp,
                        "firstSequence": e.last_sequence - e.offset_delta,
                        "lastSequence": e.last_sequence,
                        "lastOffset": e.last_offset,
                        "offsetDelta": e.offset_delta,
                        "timestamp": e.timestamp,
                    }
                    for e in ours.entries
                ),
                key=lambda d: d["producerId"],
            )
            theirs = sorted(part.dump.file(path).producers, key=lambda d: d["producerId"])
            assert mine == theirs
        assert any(read_producer_snapshot(p).entries for p in snapshots)

    def test_leader_epoch_checkpoint_matches_the_log(self, part: Written) -> None:
        """The checkpoint holds exactly the epoch changes Kafka's dump shows along the log."""
        batches = [b for log in part.log_files for b in part.dumped_batches(log)]
        epochs = read_leader_epoch_checkpoint(part.path / "leader-epoch-checkpoint")
        assert [tuple(e) for e in epochs] == _epoch_transitions(batches)
        assert part.scan.leader_epochs == epochs
        assert len(epochs) >= ROUNDS

    def test_topic_id_and_broker_identity(self, part: Written, kafka: Any) -> None:
        """partition.metadata holds the id kafka-topics prints; meta.properties the cluster."""
        assert part.scan.topic_id == part.topic_id
        meta = read_meta_properties(kafka.log_dir / "meta.properties")
        assert (meta.version, meta.node_id, meta.cluster_id) == (1, 1, kafka.cluster.cluster_id)


class TestSegmentFacts:
    """The RemoteLogManager facts and readiness from scan_partition_dir."""

    def test_facts_match_kafka(self, part: Written) -> None:
        """Start/end offsets, size, max timestamp, epochs in range, txn-index-empty, ready."""
        segments = part.scan.segments
        assert [s.base_offset for s in segments] == [int(p.stem) for p in part.log_files]
        for segment, (base, log, nxt) in zip(segments, _segments(part), strict=True):
            batches = part.dumped_batches(log)
            txn = log.with_suffix(".txnindex")
            txns = part.dump.file(txn).txns if txn.exists() else []
            assert segment.start_offset == base == batches[0].base_offset
            assert segment.next_base_offset == nxt
            assert segment.size == log.stat().st_size == batches[-1].position + batches[-1].size
            assert segment.txn_index_empty == (not txns)
            epochs = _epoch_transitions(batches)
            epochs[0] = (epochs[0][0], base)  # epochEntriesInRange starts at the base offset
            assert [tuple(e) for e in segment.leader_epochs] == epochs
            if nxt is None:
                assert segment.is_active
                assert segment.end_offset is None
                continue
            assert segment.end_offset == nxt - 1 == batches[-1].last_offset
            assert segment.max_timestamp_ms == max(b.max_timestamp for b in batches)
            assert segment.ready, segment.not_ready
            assert segment.snapshot_path == part.path / f"{nxt:020d}.snapshot"
            assert segment.leader_epochs[0] == EpochEntry(batches[0].partition_leader_epoch, base)

    def test_verify_finds_no_problem(self, part: Written) -> None:
        """verify_partition (every CRC, offsets, indexes, txn index) is clean on real files."""
        scan = scan_partition_dir(part.path)
        assert scan is not None
        assert verify_partition(scan) == []


class TestInspect:
    """``python -m sidecar inspect`` on the broker's real log dir."""

    def test_verify_json_on_the_log_dir(self, written: dict[str, Written], kafka: Any) -> None:
        """--verify --json exits 0, and its segment rows agree with Kafka's dump."""
        result = _inspect(str(kafka.log_dir), "--verify", "--json")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        document = json.loads(result.stdout)
        assert document["ok"] is True
        assert document["problems"] == []
        assert document["meta"]["cluster_id"] == kafka.cluster.cluster_id
        assert scan_log_dir(kafka.log_dir).meta == read_meta_properties(
            kafka.log_dir / "meta.properties"
        )
        by_topic = {p["topic"]: p for p in document["partitions"]}
        for part in written.values():
            entry = by_topic[part.topic]
            assert entry["topic_id"] == part.topic_id
            rows = entry["segments"]
            assert [r["base_offset"] for r in rows] == [int(p.stem) for p in part.log_files]
            for row, (_base, log, nxt) in zip(rows, _segments(part), strict=True):
                batches = part.dumped_batches(log)
                assert row["size"] == log.stat().st_size
                assert row["active"] == (nxt is None)
                if nxt is not None:
                    assert row["end_offset"] == batches[-1].last_offset
                    assert row["max_timestamp"] == max(b.max_timestamp for b in batches)
                    assert row["ready"] is True
                txn = log.with_suffix(".txnindex")
                has_txns = txn.exists() and bool(part.dump.file(txn).txns)
                assert row["txn_index_empty"] == (not has_txns)

    def test_records_json_on_a_partition(self, part: Written) -> None:
        """--json --records on a partition dir lists every record Kafka's dump lists."""
        result = _inspect(str(part.path), "--json", "--records", "--verify")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        (entry,) = json.loads(result.stdout)["partitions"]
        ours = [(b["batch"], b["records"]) for b in entry["records"]]
        dumped = [b for log in part.log_files for b in part.dumped_batches(log)]
        assert len(ours) == len(dumped)
        for (batch_row, record_rows), batch in zip(ours, dumped, strict=True):
            assert (batch_row["base_offset"], batch_row["crc"]) == (batch.base_offset, batch.crc)
            assert batch_row["compression"] == batch.codec
            got = [
                (r["offset"], r["timestamp"], r["key"] if r["control"] is None else None)
                for r in record_rows
            ]
            assert got == [(r.offset, r.timestamp, r.key) for r in batch.records]
            assert [r["value"] for r in record_rows if r["control"] is None] == [
                r.payload for r in batch.records if r.end_txn_marker is None
            ]
