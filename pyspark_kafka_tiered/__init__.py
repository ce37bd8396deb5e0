"""Auto-registration of the ``kafka-tiered`` PySpark data source.

Spark imports every top-level ``pyspark_*`` module on its first data-source lookup and registers
its ``DefaultSource``, so ``spark.read.format("kafka-tiered")`` works without calling
``sidecar.spark.register(spark)``. Filter pushdown, asked for with the option
``filterPushdown=true``, also needs ``spark.sql.python.filterPushdown.enabled=true``.
"""

from sidecar.spark.datasource import KafkaTieredDataSource as DefaultSource

__all__ = ["DefaultSource"]
