"""The executor's fast read path (records decoded straight into column lists, windowed GETs with
a prefetch thread) against the checked reference decoder (``sidecar.kafka.decode_batches``):
every codec, LogAppendTime, NO_TIMESTAMP, compacted batches, headers and null keys; windows
smaller than a batch; narrow ranges cut inside batches; corrupt bytes."""

from __future__ import annotations

import pytest

from sidecar.kafka.records import Compression, TimestampType, decode_batches
from sidecar.spark import RemoteDataError
from sidecar.spark import _segments as segments
from sidecar.spark._options import S3Location
from sidecar.spark._read import ReadTask, arrow_schema, read_task
from sidecar.spark._segments import IndexRanges, SegmentFiles, SegmentRef
from sidecar.testing import TestRecord, build_batch

from .test_spark_source import FakeReader

LOG_KEY = "p/orders/00.log"


def _records(n: int, seed: int) -> list[TestRecord]:
    return [
        TestRecord(
            key=None if i % 7 == 0 else f"k{seed}-{i}".encode(),
            value=None if i % 11 == 5 else bytes([seed % 256]) * (i * 13 % 300),
            headers=(("h", f"{i}".encode()), ("n", None)) if i % 3 == 0 else (),
            timestamp=1_700_000_000_000 + seed * 1000 + i,
        )
        for i in range(n)
    ]


def _log() -> tuple[bytes, int]:
    """Batches of every shape the fast path must decode exactly as the reference does."""
    chunks: list[bytes] = []
    offset = 0
    shapes: list[dict[str, object]] = [
        {"compression": c} for c in Compression if c is not Compression.NONE
    ]
    shapes += [
        {},
        {"timestamp_type": TimestampType.LOG_APPEND_TIME, "log_append_time": 1_700_000_999_000},
        {"no_timestamp": True},
        {"compacted": True, "compression": Compression.LZ4},
        {"big": True, "compression": Compression.NONE},
    ]
    for seed, shape in enumerate(shapes * 2):
        n = 400 if shape.get("big") else 25
        records = _records(n, seed)
        kwargs: dict[str, object] = {
            k: v for k, v in shape.items() if k not in ("no_timestamp", "compacted", "big")
        }
        deltas = None
        if shape.get("no_timestamp"):
            records = [TestRecord(r.key, r.value, r.headers, -1) for r in records]
            kwargs["base_timestamp"] = -1
        if shape.get("compacted"):
            deltas = [2 * i for i in range(n)]
        chunks.append(
            build_batch(records, base_offset=offset, offset_deltas=deltas, **kwargs)  # type: ignore[arg-type]
        )
        offset += 2 * n - 1 if deltas else n
    return b"".join(chunks), offset


def _ref(log: bytes, end_offset: int) -> SegmentRef:
    return SegmentRef(
        topic="orders",
        partition=3,
        segment_id="AAAAAAAAAAAAAAAAAAAAAA",
        start_offset=0,
        end_offset=end_offset - 1,
        max_timestamp_ms=2**62,
        size=len(log),
        log_key=LOG_KEY,
        manifest_key="p/orders/00.json",
        txn_index_empty=True,
        indexes=IndexRanges("p/orders/00.indexes", 0, ()),  # no offset index: whole-log reads
    )


def _expected(log: bytes, lo: int, hi: int, headers: bool) -> list[dict[str, object]]:
    rows = []
    for header, records in decode_batches(log):
        for r in records:
            if lo <= r.offset < hi:
                row: dict[str, object] = {
                    "key": r.key,
                    "value": r.value,
                    "topic": "orders",
                    "partition": 3,
                    "offset": r.offset,
                    "timestamp_ms": r.timestamp,
                    "timestampType": int(header.timestamp_type),
                }
                if headers:
                    row["headers"] = (
                        [{"key": k, "value": v} for k, v in r.headers] if r.headers else None
                    )
                rows.append(row)
    return rows


def _rows(task: ReadTask, reader: FakeReader) -> list[dict[str, object]]:
    rows = []
    for batch in read_task(task, reader):  # type: ignore[arg-type]
        assert batch.schema.equals(arrow_schema(task.include_headers))
        ts = batch.column("timestamp").cast("int64").to_pylist()
        for row, micros in zip(batch.to_pylist(), ts, strict=True):
            del row["timestamp"]
            row["timestamp_ms"] = micros // 1000
            rows.append(row)
    return rows


@pytest.mark.parametrize("headers", [True, False])
@pytest.mark.parametrize(
    ("first", "window"), [(None, None), (1, 1), (700, 3000), (5000, 20000), (64, 2**30)]
)
def test_fast_path_equals_reference(monkeypatch, headers, first, window):
    if first is not None:
        monkeypatch.setattr(segments, "FIRST_WINDOW_BYTES", first)
        monkeypatch.setattr(segments, "WINDOW_BYTES", window)
    log, end = _log()
    reader = FakeReader({LOG_KEY: log})
    s3 = S3Location(bucket="b")
    task = ReadTask(_ref(log, end), 0, end, s3, include_headers=headers)
    got = _rows(task, reader)
    assert got == _expected(log, 0, end, headers)
    assert any(r["timestamp_ms"] == -1 for r in got)  # NO_TIMESTAMP kept as Kafka's -1
    assert any(r["timestampType"] == 1 for r in got)  # LogAppendTime
    gets = [g for g in reader.gets if g[0] == LOG_KEY]
    if first is None:
        assert gets == [(LOG_KEY, None)]  # a small segment: one whole-object GET
    else:
        # windows cover the log exactly once, in order, without overlap
        spans = [g[1] for g in gets]
        assert all(s is not None for s in spans)
        assert sum(length for _, length in spans) == len(log)  # type: ignore[misc]
        assert [s for s, _ in spans] == sorted(s for s, _ in spans)  # type: ignore[misc]


@pytest.mark.parametrize(("lo", "hi"), [(3, 4), (10, 60), (26, 300), (0, 1)])
def test_cut_inside_batches(monkeypatch, lo, hi):
    monkeypatch.setattr(segments, "FIRST_WINDOW_BYTES", 500)
    monkeypatch.setattr(segments, "WINDOW_BYTES", 2000)
    log, end = _log()
    task = ReadTask(_ref(log, end), lo, hi, S3Location(bucket="b"), include_headers=True)
    expected = _expected(log, lo, hi, True)
    assert expected  # the range holds records
    assert _rows(task, FakeReader({LOG_KEY: log})) == expected


def test_arrow_batches_are_bounded(monkeypatch):
    from sidecar.spark import _read

    monkeypatch.setattr(_read, "ARROW_ROWS_PER_BATCH", 100)
    log, end = _log()
    task = ReadTask(_ref(log, end), 0, end, S3Location(bucket="b"))
    sizes = [b.num_rows for b in read_task(task, FakeReader({LOG_KEY: log}))]  # type: ignore[arg-type]
    assert len(sizes) > 3
    assert all(s >= 100 for s in sizes[:-1])
    assert sum(sizes) == len(_expected(log, 0, end, False))


def test_undecodable_batch_is_a_typed_error():
    """A batch whose CRC matches but whose compressed payload is garbage (verify_crc off, so the
    fast decoder sees it first): the checked decoder names it."""
    good = build_batch(_records(10, 1), compression=Compression.LZ4)
    bad = bytearray(build_batch(_records(10, 2), base_offset=10, compression=Compression.LZ4))
    bad[70:90] = b"\xff" * 20
    log = good + bytes(bad)
    task = ReadTask(_ref(log, 20), 0, 20, S3Location(bucket="b"), verify_crc=False)
    with pytest.raises(RemoteDataError):
        list(read_task(task, FakeReader({LOG_KEY: log})))  # type: ignore[arg-type]


def test_truncated_object_is_an_error(monkeypatch):
    monkeypatch.setattr(segments, "FIRST_WINDOW_BYTES", 300)
    log, end = _log()
    reader = FakeReader({LOG_KEY: log[: len(log) - 50]})
    task = ReadTask(_ref(log, end), 0, end, S3Location(bucket="b"))
    with pytest.raises(RemoteDataError, match="shorter than its metadata"):
        list(read_task(task, reader))  # type: ignore[arg-type]


def test_early_stop_leaves_no_thread(monkeypatch):
    import threading

    monkeypatch.setattr(segments, "FIRST_WINDOW_BYTES", 200)
    log, end = _log()
    files = SegmentFiles(FakeReader({LOG_KEY: log}), _ref(log, end))  # type: ignore[arg-type]
    walk = files.raw_batches(0, end)
    header, view = next(walk)
    assert header.base_offset == 0
    assert len(view) == header.size
    walk.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("kafka-tiered-get")]
