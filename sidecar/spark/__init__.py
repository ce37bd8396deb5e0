"""Read tiered Kafka topics straight from S3 with Spark: the ``kafka-tiered`` data source
(Kafka-source schema, opt-in filter pushdown, segment pruning, ranged GETs) and the archive
audit job.

``register(spark)`` registers the source (``filter_pushdown=True`` also turns on Spark's Python
filter pushdown conf);
the top-level module ``pyspark_kafka_tiered`` makes Spark find it without that call. The names
that need pyspark (``register``, ``KafkaTieredDataSource``, ``kafka_schema``, ``verify``...) are
imported on first access, so executors and the pure planning code never import more than they
use. Must not import the daemon (``sidecar.app``, ``sidecar.tiering``, ``sidecar.readserver``),
aiohttp, or aiokafka's client outside the driver-only ``_metadata_topic``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sidecar.spark._options import ReadOptions, SparkOptionError, parse_options
from sidecar.spark._plan import ArchiveDataLossError, PushedFilters
from sidecar.spark._segments import RemoteDataError

if TYPE_CHECKING:
    from sidecar.spark.datasource import (
        FILTER_PUSHDOWN_CONF,
        SOURCE_NAME,
        KafkaTieredDataSource,
        kafka_schema,
        register,
    )
    from sidecar.spark.verify import AuditProblem, audit_dataframe, verify_command

_LAZY = {
    "FILTER_PUSHDOWN_CONF": "sidecar.spark.datasource",
    "SOURCE_NAME": "sidecar.spark.datasource",
    "KafkaTieredDataSource": "sidecar.spark.datasource",
    "kafka_schema": "sidecar.spark.datasource",
    "register": "sidecar.spark.datasource",
    "AuditProblem": "sidecar.spark.verify",
    "audit_dataframe": "sidecar.spark.verify",
    "verify_command": "sidecar.spark.verify",
}

__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "SOURCE_NAME",
    "ArchiveDataLossError",
    "AuditProblem",
    "KafkaTieredDataSource",
    "PushedFilters",
    "ReadOptions",
    "RemoteDataError",
    "SparkOptionError",
    "audit_dataframe",
    "kafka_schema",
    "parse_options",
    "register",
    "verify_command",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sidecar.spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
