"""The Spark source at the edges a leader change and odd input make: a timestamp whose first
record lies in a segment's tail that the lineage gave to a later copy, JSON offsets that leave a
partition out, Arrow batches of large values, metadata records that did not decode, and a
re-created topic."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import ObjectTooLargeError
from sidecar.kafka.records import BatchHeader, Record, TimestampType
from sidecar.spark import _catalog
from sidecar.spark._catalog import build_catalog, catalog_from_events
from sidecar.spark._options import SparkOptionError, parse_options
from sidecar.spark._plan import PushedFilters, plan_reads
from sidecar.spark._read import (
    ARROW_BYTES_PER_BATCH,
    ARROW_ROWS_PER_BATCH,
    _bytes_after,
    _Columns,
    read_task,
)
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.manifest import (
    MANIFEST_MAX_BYTES,
    IndexKind,
    ObjectEntry,
    SegmentManifest,
    pack_indexes,
)
from sidecar.testing import TestRecord, build_batch, write_segment
from tests.unit.spark.test_spark_source import BASE, TOPIC_ID, FakeReader, _segment

LAYOUT = KeyLayout(prefix="p/")


def _batch(base: int, epoch: int = 0) -> bytes:
    """Ten records from ``base``, record n stamped 1000 + n."""
    return build_batch(
        [
            TestRecord(key=b"k", value=str(base + i).encode(), timestamp=1000 + base + i)
            for i in range(10)
        ],
        base_timestamp=1000 + base,
        leader_epoch=epoch,
    )


class _Archive:
    """Segments of orders-0 in the bucket layout, with their metadata events."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.reader = FakeReader({})
        self.events: list[Any] = []

    def add(self, base: int, batches: list[bytes], epochs: tuple[tuple[int, int], ...]) -> None:
        sid = uuid.uuid4()
        where = self.tmp_path / str(sid)
        where.mkdir()
        next_offset, max_ts = write_segment(where, base, batches, index_interval_bytes=1)
        files = {p.suffix: p.read_bytes() for p in where.iterdir()}

        def key(suffix: ObjectSuffix) -> str:
            return LAYOUT.segment_key(
                topic="orders",
                topic_id=TOPIC_ID,
                partition=0,
                base_offset=base,
                segment_id=sid,
                suffix=suffix,
            )

        packed, ranges = pack_indexes(
            {IndexKind.OFFSET_INDEX: files[".index"], IndexKind.TIME_INDEX: files[".timeindex"]}
        )
        log = files[".log"]
        manifest = SegmentManifest(
            topic="orders",
            topic_id=TOPIC_ID,
            partition=0,
            segment_id=sid,
            start_offset=base,
            end_offset=next_offset - 1,
            max_timestamp_ms=max_ts,
            size_bytes=len(log),
            leader_epochs=epochs,
            txn_index_empty=True,
            broker_id=1,
            event_timestamp_ms=1,
            log=ObjectEntry(key(ObjectSuffix.LOG), len(log), 0),
            indexes=ObjectEntry(key(ObjectSuffix.INDEXES), len(packed), 0, ranges),
        )
        self.reader.objects[key(ObjectSuffix.LOG)] = log
        self.reader.objects[key(ObjectSuffix.INDEXES)] = packed
        self.reader.objects[key(ObjectSuffix.MANIFEST)] = manifest.to_json()
        self.events += _segment(
            base, next_offset - 1, epochs=epochs, size=len(log), max_ts=max_ts, sid=sid
        )

    def offsets(self, extra: dict[str, str] | None = None, pushed: PushedFilters | None = None):
        options = parse_options({**BASE, **(extra or {})})
        catalog = catalog_from_events(options, self.events)
        tasks = plan_reads(options, catalog, pushed or PushedFilters(), self.reader)
        return [
            o
            for t in tasks
            for b in read_task(t, self.reader)
            for o in b.column("offset").to_pylist()
        ]


def _after_a_leader_change(tmp_path: Path) -> _Archive:
    """The old leader (epoch 0) copied 0..199; the new leader (epoch 1 from 250), which rolled
    its log at 100, copied 100..299. The lineage reads the first for 0..99 only."""
    archive = _Archive(tmp_path)
    archive.add(0, [_batch(b) for b in range(0, 200, 10)], ((0, 0),))
    archive.add(
        100,
        [_batch(b) for b in range(100, 250, 10)]
        + [_batch(b, epoch=1) for b in range(250, 300, 10)],
        ((0, 100), (1, 250)),
    )
    return archive


class TestTimestampInATailGivenToALaterCopy:
    """The time index of the first copy points into its tail (past 99) for any timestamp first
    reached there: that means nothing of its span qualifies, not a corrupt index."""

    def test_whole_archive(self, tmp_path):
        assert _after_a_leader_change(tmp_path).offsets() == list(range(300))

    def test_starting_timestamp(self, tmp_path):
        archive = _after_a_leader_change(tmp_path)
        assert archive.offsets({"startingTimestamp": "1160"}) == list(range(160, 300))

    def test_ending_timestamp(self, tmp_path):
        archive = _after_a_leader_change(tmp_path)
        assert archive.offsets({"endingTimestamp": "1160"}) == list(range(160))

    def test_pushed_timestamp_filter(self, tmp_path):
        archive = _after_a_leader_change(tmp_path)
        pushed = PushedFilters().narrow_min_timestamp(1160)
        assert archive.offsets(pushed=pushed) == list(range(160, 300))


class TestJsonOffsets:
    def test_a_partition_left_out_is_an_error(self, tmp_path):
        archive = _Archive(tmp_path)
        archive.add(0, [_batch(0), _batch(10)], ((0, 0),))
        for key in ("startingOffsets", "endingOffsets"):
            with pytest.raises(SparkOptionError, match=f"{key} gives specific offsets") as info:
                archive.offsets({key: '{"ordrs": {"0": 8}}'})
            assert "orders-0 is missing" in str(info.value)
            assert "ordrs-0" in str(info.value)

    def test_every_partition_named(self, tmp_path):
        archive = _Archive(tmp_path)
        archive.add(0, [_batch(0), _batch(10)], ((0, 0),))
        extra = {
            "startingOffsets": '{"orders": {"0": 8}}',
            "endingOffsets": '{"orders": {"0": -1}}',
        }
        assert archive.offsets(extra) == list(range(8, 20))


def test_an_arrow_batch_ends_at_its_bytes_before_its_rows(tmp_path):
    """Large values end a batch long before 65,536 rows: far from the 2 GiB one array holds."""
    value = b"x" * (1024 * 1024)
    records = 3 * ARROW_BYTES_PER_BATCH // len(value) // 2  # one and a half batches' bytes
    archive = _Archive(tmp_path)
    archive.add(
        0, [build_batch([TestRecord(key=None, value=value)]) for _ in range(records)], ((0, 0),)
    )
    options = parse_options(BASE)
    catalog = catalog_from_events(options, archive.events)
    (task,) = plan_reads(options, catalog, PushedFilters(), archive.reader)
    sizes = [b.num_rows for b in read_task(task, archive.reader)]
    assert sizes == [
        ARROW_BYTES_PER_BATCH // len(value),
        records - ARROW_BYTES_PER_BATCH // len(value),
    ]
    assert sizes[0] < ARROW_ROWS_PER_BATCH


def test_the_columns_count_key_and_value_bytes():
    columns = _Columns()
    header = BatchHeader(0, 0, 0, 0, 2, 0, 0, 0, 0, 0, -1, -1, -1, 2)
    columns.extend(
        header,
        [
            Record(0, 1000, TimestampType.CREATE_TIME, b"kk", b"vvv", ()),
            Record(1, 1000, TimestampType.CREATE_TIME, None, None, ()),
        ],
        False,
    )
    assert columns.data_bytes == 5


class _NoWalkFromStart(list):  # type: ignore[type-arg]
    """A column that fails when anything walks it from its first item."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("walked the column from its start")


def test_the_columns_count_each_batch_without_walking_earlier_rows():
    """Counting a Kafka batch's bytes must not step over the rows before it: doing so made
    filling one Arrow batch quadratic in its Kafka batches (a third of a read's CPU)."""
    keys = _NoWalkFromStart([b"a" * 100] * 1000 + [b"kk", None, b"k"])
    assert _bytes_after(keys, 1000) == 3


def test_undecodable_metadata_records_are_reported(monkeypatch, caplog):
    from sidecar.spark import _metadata_topic

    monkeypatch.setattr(_metadata_topic, "read_metadata_events", lambda *a, **k: ([], 3))
    options = parse_options(
        {"subscribe": "orders", "s3.bucket": "b", "kafka.bootstrap.servers": "127.0.0.1:1"}
    )
    with caplog.at_level(logging.WARNING, logger=_catalog.__name__):
        catalog = build_catalog(options)
    assert catalog.undecodable_events == 3
    assert any("3 records of the metadata topic" in r.getMessage() for r in caplog.records)


def test_a_header_key_that_is_not_utf8_reads_as_sparks_kafka_source_reads_it(tmp_path):
    """Kafka's Java consumer (under Spark's Kafka source too) replaces the bad bytes."""
    record = TestRecord(key=b"k", value=b"v", headers=((b"h\xff\xfe", b"1"),), timestamp=1000)
    archive = _Archive(tmp_path)
    archive.add(0, [build_batch([record])], ((0, 0),))
    options = parse_options({**BASE, "includeHeaders": "true"})
    catalog = catalog_from_events(options, archive.events)
    (task,) = plan_reads(options, catalog, PushedFilters(), archive.reader)
    (batch,) = read_task(task, archive.reader)
    assert batch.column("headers").to_pylist() == [[{"key": "h\ufffd\ufffd", "value": b"1"}]]


def test_a_recreated_topic_is_read_once_the_old_ones_segments_are_deleted():
    """Kafka 4 deletes a topic's remote data segment by segment and writes no partition-delete
    event: the re-created topic is the one read, not an ambiguous archive."""
    from sidecar.metadata.events import (
        RemoteLogSegmentState,
        SegmentMetadataUpdate,
        TopicIdPartition,
    )

    new = TopicIdPartition(uuid.UUID(int=8), "orders", 0)
    old_events = _segment(0, 9)
    old_id = old_events[0].segment_id
    deleted = [
        SegmentMetadataUpdate(segment_id=old_id, broker_id=1, event_timestamp_ms=3, state=state)
        for state in (
            RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
            RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
        )
    ]
    new_events = _segment(0, 4, tp=new)
    options = parse_options(BASE)
    with pytest.raises(SparkOptionError, match="several topic ids"):
        catalog_from_events(options, old_events + new_events)  # both hold data: ambiguous
    catalog = catalog_from_events(options, old_events + deleted + new_events)
    assert [p.tp for p in catalog.partitions] == [new]


def test_a_recreated_topic_with_no_tiered_data_left_reads_nothing():
    """Both incarnations of a re-created topic had every segment deleted: the read is empty,
    not an ambiguous archive."""
    from sidecar.metadata.events import (
        RemoteLogSegmentState,
        SegmentMetadataUpdate,
        TopicIdPartition,
    )

    def deleted(events: list[Any]) -> list[Any]:
        return events + [
            SegmentMetadataUpdate(
                segment_id=events[0].segment_id, broker_id=1, event_timestamp_ms=3, state=state
            )
            for state in (
                RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
                RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
            )
        ]

    new = TopicIdPartition(uuid.UUID(int=8), "orders", 0)
    events = deleted(_segment(0, 9)) + deleted(_segment(0, 4, tp=new))
    assert catalog_from_events(parse_options(BASE), events).partitions == []


class TestArchiveLastStableOffset:
    """read_committed ends at the first transaction open at the archive's end; a producer
    snapshot that is missing or does not parse says nothing, so the one before it does."""

    def test_an_unusable_snapshot_falls_back_to_the_segment_before(self, monkeypatch):
        from types import SimpleNamespace

        import sidecar.spark._plan as plan

        answers: dict[str, dict[int, int] | None] = {}

        class Files:
            def __init__(self, reader: object, ref: SimpleNamespace) -> None:
                self.ref = ref

            def ongoing_transactions(self) -> dict[int, int] | None:
                return answers[self.ref.name]

        monkeypatch.setattr(plan, "SegmentFiles", Files)
        refs = [
            SimpleNamespace(name=n, start_offset=o) for n, o in (("a", 0), ("b", 10), ("c", 20))
        ]
        options: Any = SimpleNamespace(read_committed=True)
        for a, b, c, expected in (
            ({}, {}, {}, None),
            ({}, {}, {5: 22}, 22),
            ({}, {}, None, 20),  # c's open transactions are unknown: it is not settled
            ({}, {9: 12}, None, 12),
            ({7: 3}, None, None, 3),
            (None, None, None, 0),
        ):
            answers.update(a=a, b=b, c=c)
            assert plan._archive_lso(options, refs, reader=None) == expected, (a, b, c)  # type: ignore[arg-type]

    def test_a_snapshot_that_does_not_parse_is_unusable(self, monkeypatch):
        from types import SimpleNamespace

        from sidecar.spark._segments import SegmentFiles

        files = SegmentFiles(None, SimpleNamespace(log_key="k", indexes=None))  # type: ignore[arg-type]
        monkeypatch.setattr(files, "index_bytes", lambda kind: b"not a snapshot")
        assert files.ongoing_transactions() is None
        monkeypatch.setattr(files, "index_bytes", lambda kind: None)
        assert files.ongoing_transactions() is None


class TestMetadataTopicFailures:
    """A metadata topic that cannot be read is a typed, retriable error naming the topic and
    the servers, and the consumer is closed."""

    class _Consumer:
        """Stands in for aiokafka's consumer: ``start`` fails or never returns."""

        stopped = False
        start_error: Exception | None = None

        def __init__(self, **kwargs: object) -> None:
            pass

        async def start(self) -> None:
            import asyncio

            if self.start_error is not None:
                raise self.start_error
            await asyncio.Event().wait()

        async def stop(self) -> None:
            type(self).stopped = True

    def _consumer(self, monkeypatch, error: Exception | None) -> type:
        import aiokafka

        consumer = type("Consumer", (self._Consumer,), {"start_error": error})
        monkeypatch.setattr(aiokafka, "AIOKafkaConsumer", consumer)
        return consumer

    def test_an_unreachable_broker(self, monkeypatch):
        from aiokafka.errors import KafkaConnectionError

        from sidecar.metadata.errors import MetadataTailError
        from sidecar.spark._metadata_topic import read_metadata_events

        consumer = self._consumer(monkeypatch, KafkaConnectionError("Unable to bootstrap"))
        with pytest.raises(MetadataTailError, match=r"'__rlm'.*127\.0\.0\.1:1.*bootstrap") as e:
            read_metadata_events("127.0.0.1:1", "__rlm")
        assert e.value.retriable
        assert consumer.stopped

    def test_a_read_that_does_not_finish(self, monkeypatch):
        from sidecar.metadata.errors import MetadataTailError
        from sidecar.spark._metadata_topic import read_metadata_events

        consumer = self._consumer(monkeypatch, None)
        with pytest.raises(MetadataTailError, match=r"'__rlm'.*did not finish in 0\.01 s"):
            read_metadata_events("127.0.0.1:1", "__rlm", timeout_s=0.01)
        assert consumer.stopped


class _DeletingReader(FakeReader):
    """S3 after remote retention ran: a missing key is KeyNotFoundError, and ``doomed`` is
    deleted right after its first GET (retention racing a running query)."""

    def __init__(self, objects: dict[str, bytes], doomed: str | None = None) -> None:
        super().__init__(objects)
        self.doomed = doomed

    def _take(self, key: str) -> bytes:
        from sidecar.errors import KeyNotFoundError

        if key not in self.objects:
            raise KeyNotFoundError(f"GET s3://b/{key}: no such key")
        data = self.objects[key]
        if key == self.doomed:
            del self.objects[key]
        return data

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        return self._take(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._take(key)[start : start + length]


class TestSegmentDeletedAfterPlanning:
    """A segment that retention deletes between planning and reading is data loss, as offsets
    deleted under a running query are for Spark's Kafka source."""

    def _archive(self, tmp_path: Path) -> _Archive:
        archive = _Archive(tmp_path)
        archive.add(0, [_batch(b) for b in range(0, 30, 10)], ((0, 0),))
        archive.add(30, [_batch(b) for b in range(30, 60, 10)], ((0, 30),))
        return archive

    def _read(self, archive: _Archive, reader: FakeReader, extra: dict[str, str]) -> list[int]:
        options = parse_options({**BASE, **extra})
        catalog = catalog_from_events(options, archive.events)
        tasks = plan_reads(options, catalog, PushedFilters(), archive.reader)
        return [
            o for t in tasks for b in read_task(t, reader) for o in b.column("offset").to_pylist()
        ]

    def _second_log(self, archive: _Archive) -> str:
        return sorted(k for k in archive.reader.objects if k.endswith(".log"))[1]

    def test_fails_the_query_by_default(self, tmp_path):
        from sidecar.spark import ArchiveDataLossError

        archive = self._archive(tmp_path)
        objects = dict(archive.reader.objects)
        del objects[self._second_log(archive)]
        with pytest.raises(ArchiveDataLossError, match=r"offsets 30\.\.59 of orders-0.*deleted"):
            self._read(archive, _DeletingReader(objects), {})

    def test_skipped_without_fail_on_data_loss(self, tmp_path, monkeypatch):
        from sidecar.spark import _segments

        archive = self._archive(tmp_path)
        objects = dict(archive.reader.objects)
        del objects[self._second_log(archive)]
        lenient = {"failOnDataLoss": "false"}
        assert self._read(archive, _DeletingReader(objects), lenient) == list(range(30))
        # deleted while it is read: the rows of the window already fetched are kept
        monkeypatch.setattr(_segments, "FIRST_WINDOW_BYTES", len(_batch(30)))
        monkeypatch.setattr(_segments, "WINDOW_BYTES", len(_batch(30)))
        doomed = _DeletingReader(dict(archive.reader.objects), self._second_log(archive))
        assert self._read(archive, doomed, lenient) == list(range(40))


class TestOversizedManifest:
    """An object at a manifest's key larger than any manifest (a corrupt or foreign object) is
    refused with ObjectTooLargeError, never read whole into the driver's or a task's memory."""

    KEY = KeyLayout(prefix="p/").segment_key(
        topic="orders",
        topic_id=TOPIC_ID,
        partition=0,
        base_offset=0,
        segment_id=uuid.UUID(int=5),
        suffix=ObjectSuffix.MANIFEST,
    )

    def _reader(self) -> FakeReader:
        return FakeReader({self.KEY: b"{" + b" " * MANIFEST_MAX_BYTES + b"}"})

    def test_planning_from_the_manifests(self):
        reader = self._reader()
        options = parse_options({**BASE, "metadata": "manifests"})
        with pytest.raises(ObjectTooLargeError, match="more than"):
            build_catalog(options, reader)  # type: ignore[arg-type]
        assert reader.gets == [(self.KEY, None)]

    def test_a_task_reading_the_segment_manifest(self):
        from types import SimpleNamespace

        from sidecar.spark._segments import SegmentFiles

        ref = SimpleNamespace(manifest_key=self.KEY, indexes=None)
        files = SegmentFiles(self._reader(), ref)  # type: ignore[arg-type]
        with pytest.raises(ObjectTooLargeError, match="more than"):
            files.manifest()


class _Trickle:
    """A response body that returns at most 100 bytes per read, as a socket may."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.closed = False

    def read(self, amt: int | None = None) -> bytes:
        n = 100 if amt is None else min(amt, 100)
        piece, self.data = self.data[:n], self.data[n:]
        return piece

    def close(self) -> None:
        self.closed = True


class TestBoundedGetOfTheS3Reader:
    """S3Reader.get(max_bytes=) reads a body that arrives in pieces to its end, and refuses
    one past the limit after at most one byte more."""

    def _reader(self, data: bytes) -> tuple[Any, _Trickle]:
        from types import SimpleNamespace

        from sidecar.spark._s3 import S3Reader

        body = _Trickle(data)
        reader = S3Reader.__new__(S3Reader)
        reader.bucket = "b"
        reader._client = SimpleNamespace(get_object=lambda **kwargs: {"Body": body})
        return reader, body

    @pytest.mark.parametrize("size", [1, 999, 1000])
    def test_a_body_within_the_limit_comes_whole(self, size: int) -> None:
        data = bytes(range(256)) * 4
        reader, body = self._reader(data[:size])
        assert reader.get("k", max_bytes=1000) == data[:size]
        assert body.closed

    def test_a_body_past_the_limit_is_refused(self) -> None:
        reader, body = self._reader(b"x" * 5000)
        with pytest.raises(ObjectTooLargeError, match="more than the 1000 bytes"):
            reader.get("k", max_bytes=1000)
        assert len(body.data) == 5000 - 1001  # read no further than one byte past the limit
        assert body.closed
