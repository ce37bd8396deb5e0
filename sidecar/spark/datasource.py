"""The ``kafka-tiered`` PySpark data source (Python Data Source API, pyspark >= 4.1).

``spark.read.format("kafka-tiered")`` reads tiered Kafka topics straight from S3 with the schema
of Spark's own Kafka source. Register it with :func:`register`, or let Spark find it: the
top-level module ``pyspark_kafka_tiered`` exposes ``DefaultSource`` and Spark imports every
``pyspark_*`` module on its first data-source lookup.

Filter pushdown is opt-in (``filterPushdown=true``, which also needs
``spark.sql.python.filterPushdown.enabled``; ``register(spark, filter_pushdown=True)`` sets it).
Spark (4.3 at least) keeps the read planned with a query's pushed filters on the DataFrame's data
source and reuses it for that DataFrame's later queries that push no filter, so with pushdown on,
``df.where("partition = 0").count()`` followed by ``df.count()`` counts partition 0 only. Without
pushdown Spark filters every row itself and each query reads what its DataFrame names.

Where things run: ``schema()`` and ``reader()`` in a planner process on the driver;
``pushFilters`` and ``partitions()`` there too (``partitions()`` reads the metadata topic or the
bucket's manifests and plans, see ``_plan``); ``read()`` in executor Python workers, which import
only ``_read`` and the sidecar's pure modules and create their own S3 client.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sidecar.spark._options import parse_options
from sidecar.spark._plan import PushedFilters
from sidecar.spark._read import ReadTask

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "SOURCE_NAME",
    "KafkaTieredDataSource",
    "SegmentPartition",
    "kafka_schema",
    "register",
]

SOURCE_NAME = "kafka-tiered"
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: columns our reader never leaves null
_NEVER_NULL = frozenset({"topic", "partition", "offset", "timestamp", "timestampType"})


def kafka_schema(include_headers: bool = False) -> StructType:
    """The schema of Spark's Kafka source (``KafkaRecordToRowConverter``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class SegmentPartition(InputPartition):
    """One Spark input partition: a :class:`~sidecar.spark._read.ReadTask`."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


class _Reader(DataSourceReader):
    """Plans on the driver, reads in executors; see the module docstring."""

    def __init__(self, options: dict[str, str], include_headers: bool) -> None:
        self.options = options
        self.include_headers = include_headers
        self.pushed = PushedFilters()

    def partitions(self) -> Sequence[InputPartition]:
        from sidecar.spark._catalog import build_catalog
        from sidecar.spark._plan import plan_reads
        from sidecar.spark._s3 import S3Reader

        options = parse_options(self.options)
        reader = S3Reader(options.s3)
        catalog = build_catalog(options, reader)
        tasks = plan_reads(options, catalog, self.pushed, reader)
        return [SegmentPartition(task) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark calls read() once with a placeholder partition when partitions() is empty
        task = getattr(partition, "task", None)
        if not isinstance(task, ReadTask):
            return iter(())
        from sidecar.spark._read import read_task

        return read_task(task)


class _PushdownReader(_Reader):
    """The reader with filter pushdown: partition, topic, offset (exact) and timestamp (pruning
    only: returned to Spark, which still filters the rows)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not self._push(f):
                yield f

    def _push(self, f: Filter) -> bool:
        """Narrow ``self.pushed`` by ``f``; True when the rows need no further check by Spark."""
        path: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
        if len(path) != 1:
            return False
        column = path[0]
        if isinstance(f, IsNotNull):
            return column in _NEVER_NULL
        value: Any = getattr(f, "value", None)
        pushed = self.pushed
        if column == "partition":
            if isinstance(f, EqualTo) and _is_int(value):
                self.pushed = pushed.narrow_partitions([value])
                return True
            if isinstance(f, In) and all(_is_int(v) for v in value):
                self.pushed = pushed.narrow_partitions(list(value))
                return True
            return False
        if column == "topic":
            if isinstance(f, EqualTo) and isinstance(value, str):
                self.pushed = pushed.narrow_topics([value])
                return True
            if isinstance(f, In) and all(isinstance(v, str) for v in value):
                self.pushed = pushed.narrow_topics(list(value))
                return True
            return False
        if column == "offset":
            return self._push_offset(f, value)
        if column == "timestamp":
            micros = _micros(value)
            if micros is None:
                return False
            if isinstance(f, GreaterThanOrEqual | EqualTo):
                self.pushed = pushed.narrow_min_timestamp(-(-micros // 1000))
            elif isinstance(f, GreaterThan):
                self.pushed = pushed.narrow_min_timestamp(micros // 1000 + 1)
            return False  # rows are still checked by Spark
        return False

    def _push_offset(self, f: Filter, value: Any) -> bool:
        pushed = self.pushed
        if isinstance(f, In):
            if value and all(_is_int(v) for v in value):
                self.pushed = pushed.narrow_offsets(min(value), max(value) + 1)
            return False
        if not _is_int(value):
            return False
        if isinstance(f, EqualTo):
            self.pushed = pushed.narrow_offsets(value, value + 1)
        elif isinstance(f, GreaterThan):
            self.pushed = pushed.narrow_offsets(lo=value + 1)
        elif isinstance(f, GreaterThanOrEqual):
            self.pushed = pushed.narrow_offsets(lo=value)
        elif isinstance(f, LessThan):
            self.pushed = pushed.narrow_offsets(hi=value)
        elif isinstance(f, LessThanOrEqual):
            self.pushed = pushed.narrow_offsets(hi=value + 1)
        else:
            return False
        return True


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _micros(value: object) -> int | None:
    if not isinstance(value, datetime):
        return None
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(microseconds=1)


class KafkaTieredDataSource(DataSource):
    """``spark.read.format("kafka-tiered")``: tiered Kafka topics from S3, Kafka-source schema.

    Options: see ``sidecar.spark._options`` and the README ("Reading tiered topics with Spark").
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return kafka_schema(_include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = {str(k): str(v) for k, v in self.options.items()}
        parsed = parse_options(options)  # fail at analysis time on bad options
        include_headers = _include_headers(self.options)
        if parsed.filter_pushdown:
            return _PushdownReader(options, include_headers)
        return _Reader(options, include_headers)


def _include_headers(options: Any) -> bool:
    for key, value in options.items():
        if str(key).lower() == "includeheaders":
            return str(value).strip().lower() == "true"
    return False


def register(spark: SparkSession, *, filter_pushdown: bool = False) -> None:
    """Register ``kafka-tiered`` with ``spark``; with ``filter_pushdown`` also set
    ``spark.sql.python.filterPushdown.enabled=true``, which Spark requires before a read with
    ``filterPushdown=true`` (it affects Python data sources only; see the module docstring for
    what pushdown costs on Spark 4.3)."""
    spark.dataSource.register(KafkaTieredDataSource)
    if filter_pushdown:
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
