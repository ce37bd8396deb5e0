"""The Spark source's pure parts, without Spark or S3: options, the Arrow schema Spark checks,
planning over the metadata store (lineage dedupe, gaps, pushed filters, splitting), the executor
read of a segment built with Kafka's layout (control records, aborted transactions, headers,
ranged reads), and the filter translation."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.errors import ObjectTooLargeError
from sidecar.kafka.indexes import AbortedTxn
from sidecar.kafka.records import ControlRecordType
from sidecar.metadata.events import (
    RemoteLogSegmentId,
    RemoteLogSegmentState,
    SegmentMetadata,
    SegmentMetadataUpdate,
    TopicIdPartition,
)
from sidecar.spark._catalog import catalog_from_events
from sidecar.spark._options import SparkOptionError, parse_options
from sidecar.spark._plan import ArchiveDataLossError, PushedFilters, plan_reads
from sidecar.spark._read import ReadTask, arrow_schema, read_task
from sidecar.spark._segments import segment_ref
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import IndexKind, ObjectEntry, SegmentManifest, pack_indexes
from sidecar.testing import TestRecord, build_batch, build_control_batch, write_segment

TOPIC_ID = uuid.UUID(int=7)
TP = TopicIdPartition(TOPIC_ID, "orders", 0)
BASE = {"s3.bucket": "b", "s3.prefix": "p/", "subscribe": "orders"}


class FakeReader:
    """An S3Reader over a dict, recording every GET (key, range)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: list[tuple[str, tuple[int, int] | None]] = []

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        self.gets.append((key, None))
        data = self.objects[key]
        if max_bytes is not None and len(data) > max_bytes:  # as S3Reader, unread past it
            raise ObjectTooLargeError(f"GET s3://b/{key}: more than {max_bytes} bytes")
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets.append((key, (start, length)))
        return self.objects[key][start : start + length]

    def list(self, prefix: str) -> list[tuple[str, int]]:
        return [(k, len(v)) for k, v in self.objects.items() if k.startswith(prefix)]


def _segment(
    start: int,
    end: int,
    *,
    epochs=((0, 0),),
    size=100,
    max_ts=1_700_000_000_000,
    sid=None,
    tp: TopicIdPartition = TP,
) -> list:
    segment_id = RemoteLogSegmentId(tp, sid or uuid.uuid4())
    return [
        SegmentMetadata(
            segment_id=segment_id,
            start_offset=start,
            end_offset=end,
            broker_id=1,
            max_timestamp_ms=max_ts,
            event_timestamp_ms=1,
            segment_leader_epochs=tuple(epochs),
            segment_size_in_bytes=size,
        ),
        SegmentMetadataUpdate(
            segment_id=segment_id,
            broker_id=1,
            event_timestamp_ms=2,
            state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
        ),
    ]


class TestOptions:
    """Options mirror Spark's Kafka source and never show secrets."""

    def test_defaults_and_secrets(self):
        options = parse_options({**BASE, "s3.secretAccessKey": "hunter2", "s3.accessKeyId": "AK"})
        assert options.starting.default == -2
        assert options.ending.default == -1
        assert options.fail_on_data_loss
        assert options.metadata == "manifests"
        assert "hunter2" not in repr(options)
        assert "AK" not in repr(options)

    @pytest.mark.parametrize(
        "extra",
        [
            {"startingOffsets": "latest"},
            {"endingOffsets": "earliest"},
            {"startingOffsets": '{"orders": {"0": -1}}'},
            {"endingOffsets": '{"orders": {"0": -2}}'},
            {"assign": '{"orders": [0]}'},
            {"kafka.isolation.level": "serializable"},
            {"minPartitions": "0"},
            {"metadata": "topic"},
        ],
    )
    def test_invalid(self, extra):
        with pytest.raises(SparkOptionError):
            parse_options({**BASE, **extra})

    def test_selection_kinds(self):
        assign = parse_options({**BASE, "subscribe": "", "assign": '{"orders": [1, 0]}'})
        assert assign.selection.partition_selected("orders", 1)
        assert not assign.selection.partition_selected("orders", 2)
        pattern = parse_options({**BASE, "subscribe": "", "subscribePattern": "ord.*"})
        assert pattern.selection.topic_selected("orders")
        assert not pattern.selection.topic_selected("xorders")


class TestArrowSchema:
    """The batches' schema is what Spark 4.2+ compares them to, exactly."""

    @pytest.mark.parametrize("headers", [False, True])
    def test_equals_sparks_conversion(self, headers):
        from pyspark.sql.pandas.types import to_arrow_schema

        from sidecar.spark.datasource import kafka_schema

        assert arrow_schema(headers).equals(to_arrow_schema(kafka_schema(headers), timezone="UTC"))


class TestPlanning:
    """Lineage dedupe, data loss, pushed filters and splitting."""

    def test_leader_change_copies_do_not_duplicate(self):
        # epoch 0 wrote 0..199 (copy A: 0..99, copy B: 100..199); epoch 1 started at 150, and
        # the new leader's copy C holds 100..249 (epochs 0 from 100, 1 from 150)
        events = (
            _segment(0, 99) + _segment(100, 199) + _segment(100, 249, epochs=((0, 100), (1, 150)))
        )
        catalog = catalog_from_events(parse_options(BASE), events)
        (part,) = catalog.partitions
        covered = [(s.start_offset, s.end_offset) for s in part.spans]
        assert covered[0] == (0, 99)
        flat = [o for s, e in covered for o in range(s, e + 1)]
        assert flat == list(range(250))  # every offset once
        assert len(part.finished) == 3

    def test_gap_is_data_loss_unless_allowed(self):
        events = _segment(0, 99) + _segment(200, 299, epochs=((0, 200),))
        options = parse_options(BASE)
        catalog = catalog_from_events(options, events)
        with pytest.raises(ArchiveDataLossError, match=r"100\.\.199"):
            plan_reads(options, catalog, PushedFilters(), FakeReader({}))
        lenient = parse_options({**BASE, "failOnDataLoss": "false"})
        tasks = plan_reads(lenient, catalog, PushedFilters(), FakeReader({}))
        assert [(t.lo, t.hi) for t in tasks] == [(0, 100), (200, 300)]

    def test_offsets_outside_the_archive(self):
        events = _segment(10, 99, epochs=((0, 10),))
        catalog = catalog_from_events(parse_options(BASE), events)
        early = parse_options({**BASE, "startingOffsets": '{"orders": {"0": 5}}'})
        with pytest.raises(ArchiveDataLossError):
            plan_reads(early, catalog, PushedFilters(), FakeReader({}))
        late = parse_options({**BASE, "endingOffsets": '{"orders": {"0": 500}}'})
        with pytest.raises(ArchiveDataLossError, match=r"100\.\.499"):
            plan_reads(late, catalog, PushedFilters(), FakeReader({}))
        exact = parse_options(
            {**BASE, "startingOffsets": '{"orders": {"0": 20}}', "endingOffsets": "latest"}
        )
        (task,) = plan_reads(exact, catalog, PushedFilters(), FakeReader({}))
        assert (task.lo, task.hi) == (20, 100)

    def test_pushed_filters_prune_segments(self):
        events = (
            _segment(0, 99, max_ts=1000)
            + _segment(100, 199, max_ts=2000, epochs=((0, 100),))
            + _segment(200, 299, max_ts=3000, epochs=((0, 200),))
        )
        options = parse_options(BASE)
        catalog = catalog_from_events(options, events)
        pushed = PushedFilters().narrow_offsets(150, 160)
        (task,) = plan_reads(options, catalog, pushed, FakeReader({}))
        assert (task.segment.start_offset, task.lo, task.hi) == (100, 150, 160)
        by_time = plan_reads(
            options, catalog, PushedFilters().narrow_min_timestamp(2500), FakeReader({})
        )
        assert [t.segment.start_offset for t in by_time] == [200]
        assert plan_reads(options, catalog, PushedFilters(partitions=frozenset({3})), None) == []

    def test_min_partitions_and_max_records_split(self):
        options = parse_options({**BASE, "minPartitions": "4"})
        catalog = catalog_from_events(options, _segment(0, 99))
        tasks = plan_reads(options, catalog, PushedFilters(), FakeReader({}))
        assert len(tasks) == 4
        assert [o for t in tasks for o in range(t.lo, t.hi)] == list(range(100))
        capped = parse_options({**BASE, "maxRecordsPerPartition": "30"})
        tasks = plan_reads(capped, catalog, PushedFilters(), FakeReader({}))
        assert [t.hi - t.lo for t in tasks] == [30, 30, 30, 10]


def _archive(tmp_path: Path) -> tuple[FakeReader, ReadTask]:
    """One segment at base 0: 3 data batches of 10, an aborted transaction (producer 9) with its
    abort marker, a committed one (producer 8) with its commit marker."""
    plain = [
        build_batch(
            [
                TestRecord(
                    key=None if i == 0 else f"k{b}-{i}".encode(),
                    value=bytes([b]) * 100,
                    headers=() if i % 2 else (("h", f"{i}".encode()), ("n", None)),
                    timestamp=1_700_000_000_000 + 10 * b + i,
                )
                for i in range(10)
            ],
            base_timestamp=1_700_000_000_000 + 10 * b,
        )
        for b in range(3)
    ]
    aborted = build_batch(
        [TestRecord(key=b"bad", value=b"x")] * 5,
        producer_id=9,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
        base_timestamp=1_700_000_000_100,
    )
    committed = build_batch(
        [TestRecord(key=b"good", value=b"y")] * 5,
        producer_id=8,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
        base_timestamp=1_700_000_000_100,
    )
    batches = [
        *plain,
        aborted,
        build_control_batch(ControlRecordType.ABORT, producer_id=9),
        committed,
        build_control_batch(ControlRecordType.COMMIT, producer_id=8),
    ]
    txn = AbortedTxn(0, 9, 30, 35, 30)
    next_offset, max_ts = write_segment(tmp_path, 0, batches, index_interval_bytes=1, aborted=[txn])
    files = {p.suffix: p.read_bytes() for p in tmp_path.iterdir()}
    layout = KeyLayout(prefix="p/")
    segment_id = uuid.UUID(int=99)

    def key(suffix: ObjectSuffix) -> str:
        return layout.segment_key(
            topic="orders",
            topic_id=TOPIC_ID,
            partition=0,
            base_offset=0,
            segment_id=segment_id,
            suffix=suffix,
        )

    packed, ranges = pack_indexes(
        {
            IndexKind.OFFSET_INDEX: files[".index"],
            IndexKind.TIME_INDEX: files[".timeindex"],
            IndexKind.TXN_INDEX: files[".txnindex"],
        }
    )
    log = files[".log"]
    manifest = SegmentManifest(
        topic="orders",
        topic_id=TOPIC_ID,
        partition=0,
        segment_id=segment_id,
        start_offset=0,
        end_offset=next_offset - 1,
        max_timestamp_ms=max_ts,
        size_bytes=len(log),
        leader_epochs=((0, 0),),
        txn_index_empty=False,
        broker_id=1,
        event_timestamp_ms=1,
        log=ObjectEntry(key(ObjectSuffix.LOG), len(log), 0),
        indexes=ObjectEntry(key(ObjectSuffix.INDEXES), len(packed), 0, ranges),
    )
    reader = FakeReader(
        {
            key(ObjectSuffix.LOG): log,
            key(ObjectSuffix.INDEXES): packed,
            key(ObjectSuffix.MANIFEST): manifest.to_json(),
        }
    )
    events = _segment(0, next_offset - 1, size=len(log), max_ts=max_ts, sid=segment_id)
    events[0] = dataclasses.replace(events[0], txn_index_empty=False)
    options = parse_options({**BASE, "includeHeaders": "true"})
    catalog = catalog_from_events(options, events)
    span = catalog.partitions[0].spans[0]
    ref = segment_ref(span, layout)
    return reader, ReadTask(ref, 0, next_offset, options.s3, include_headers=True)


class TestExecutorRead:
    """A segment in Kafka's layout read the way an executor reads it."""

    def test_full_read(self, tmp_path):
        reader, task = _archive(tmp_path)
        (batch,) = read_task(task, reader)
        assert batch.schema.equals(arrow_schema(True))
        rows = batch.to_pylist()
        assert [r["offset"] for r in rows] == [*range(30), *range(30, 35), *range(36, 41)]
        assert rows[0]["key"] is None
        assert rows[0]["headers"] == [{"key": "h", "value": b"0"}, {"key": "n", "value": None}]
        assert rows[1]["headers"] is None
        assert rows[1]["timestamp"] == datetime.fromtimestamp(1_700_000_000.001, UTC)
        assert {r["topic"] for r in rows} == {"orders"}
        assert reader.gets == [(task.segment.log_key, None)]  # one whole-object GET

    def test_read_committed_drops_aborted(self, tmp_path):
        reader, task = _archive(tmp_path)
        committed = ReadTask(
            task.segment,
            task.lo,
            task.hi,
            task.s3,
            read_committed=True,
            aborted=((9, 30, 35),),
        )
        offsets = [r["offset"] for b in read_task(committed, reader) for r in b.to_pylist()]
        assert offsets == [*range(30), *range(36, 41)]

    def test_narrow_read_is_ranged(self, tmp_path):
        reader, task = _archive(tmp_path)
        narrow = ReadTask(task.segment, 22, 24, task.s3)
        (batch,) = read_task(narrow, reader)
        assert batch.column("offset").to_pylist() == [22, 23]
        log_gets = [g for g in reader.gets if g[0] == task.segment.log_key]
        assert len(log_gets) == 1
        start, length = log_gets[0][1]
        assert start > 0  # the first batch is skipped...
        assert start + length < len(reader.objects[task.segment.log_key])  # ...and the tail

    def test_corrupt_batch_is_an_error(self, tmp_path):
        from sidecar.spark import RemoteDataError

        reader, task = _archive(tmp_path)
        data = bytearray(reader.objects[task.segment.log_key])
        data[200] ^= 1
        reader.objects[task.segment.log_key] = bytes(data)
        with pytest.raises(RemoteDataError, match="crc"):
            list(read_task(task, reader))


class TestFilterPushdown:
    """Filters Spark passes become pushed bounds; exact ones are not handed back."""

    def test_translation(self):
        from pyspark.sql.datasource import (
            EqualTo,
            GreaterThanOrEqual,
            In,
            IsNotNull,
            LessThan,
        )

        from sidecar.spark.datasource import _PushdownReader

        reader = _PushdownReader(dict(BASE), False)
        ts = datetime(2024, 1, 1, tzinfo=UTC)
        filters = [
            IsNotNull(("offset",)),
            EqualTo(("partition",), 0),
            In(("partition",), [0, 1]),
            GreaterThanOrEqual(("offset",), 100),
            LessThan(("offset",), 200),
            GreaterThanOrEqual(("timestamp",), ts),
            IsNotNull(("key",)),
        ]
        returned = list(reader.pushFilters(filters))
        assert returned == [filters[5], filters[6]]
        pushed = reader.pushed
        assert pushed.partitions == frozenset({0})
        assert (pushed.offset_lo, pushed.offset_hi) == (100, 200)
        assert pushed.min_timestamp_ms == int(ts.timestamp() * 1000)

    @pytest.mark.parametrize(
        ("extra", "pushes"),
        [
            ({}, False),
            ({"filterPushdown": "false"}, False),
            ({"filterPushdown": "true"}, True),
            ({"filterpushdown": "TRUE"}, True),
        ],
    )
    def test_opt_in(self, extra, pushes):
        """Pushdown only when asked for: Spark 4.3 reuses a pushed-down plan for the same
        DataFrame's later queries that push no filter."""
        from pyspark.sql.datasource import DataSourceReader

        from sidecar.spark.datasource import KafkaTieredDataSource, kafka_schema

        reader = KafkaTieredDataSource({**BASE, **extra}).reader(kafka_schema())
        # Spark's own test for a reader that pushes filters
        assert (type(reader).pushFilters is not DataSourceReader.pushFilters) is pushes
