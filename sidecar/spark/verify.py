"""The archive audit job: every finished segment checked on Spark, one report row per segment.

Per segment (one Spark task each): the manifest exists and describes the segment; the ``.log``
object has the size and whole-object CRC-32C of its manifest and metadata; every record batch's
CRC-32C is valid; offsets inside the segment are continuous and end at the segment's end offset;
every index inside the ``indexes`` object matches its manifest CRC-32C. Per partition (on the
driver): the lineage has no offset gaps. Problems name the object key and byte position.

``sidecar spark verify`` (``sidecar.cli``) runs it on a local session or under spark-submit
(``python -m sidecar.spark.verify ...`` is the same command); the exit status is 1 when any
problem is found. Credentials come from the environment (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, or the sidecar's ``SIDECAR_S3__ACCESS_KEY_ID`` /
``SIDECAR_S3__SECRET_ACCESS_KEY``) and are never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import crc32c

from sidecar.errors import ConfigError, SidecarError
from sidecar.kafka.records import iter_batches
from sidecar.spark._options import S3Location, parse_options
from sidecar.spark._segments import SegmentFiles, SegmentRef, segment_ref
from sidecar.storage.manifest import IndexKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["AuditProblem", "AuditTask", "audit_dataframe", "audit_segment", "verify_command"]

_WINDOW = 16 * 1024 * 1024
REPORT_DDL = (
    "topic string, partition int, segment_id string, start_offset long, end_offset long,"
    " log_key string, size long, batches long, status string, problems array<string>"
)


@dataclass(frozen=True, slots=True)
class AuditTask:
    """One segment to audit (picklable)."""

    segment: SegmentRef
    s3: S3Location


@dataclass(frozen=True, slots=True)
class AuditProblem:
    """One report row."""

    topic: str
    partition: int
    segment_id: str | None
    start_offset: int
    end_offset: int
    log_key: str | None
    size: int
    batches: int
    status: str
    problems: tuple[str, ...]


def audit_segment(task: AuditTask) -> AuditProblem:
    """Check one segment; never raises for bad data (it becomes a problem in the row)."""
    from sidecar.spark._s3 import S3Reader

    ref = task.segment
    problems: list[str] = []
    batches = 0
    try:
        files = SegmentFiles(S3Reader(task.s3), ref)
        manifest = files.manifest()
        if manifest.size_bytes != ref.size or manifest.log.size != ref.size:
            problems.append(
                f"size: metadata {ref.size}, manifest {manifest.size_bytes}/{manifest.log.size}"
            )
        crc, batches, walk_problems = _walk_log(files, ref)
        problems += walk_problems
        if crc != manifest.log.crc32c:
            problems.append(
                f"{ref.log_key}: object crc32c {crc:#010x} != manifest {manifest.log.crc32c:#010x}"
            )
        indexes = files.reader.get(manifest.indexes.key)
        if crc32c.crc32c(indexes) != manifest.indexes.crc32c:
            problems.append(f"{manifest.indexes.key}: object crc32c does not match the manifest")
        for kind in IndexKind:
            found = manifest.indexes.ranges.get(kind)
            if found is None:
                continue
            data = indexes[found.start : found.start + found.length]
            if len(data) != found.length or crc32c.crc32c(data) != found.crc32c:
                problems.append(f"{manifest.indexes.key}: {kind.value} crc32c mismatch")
    except SidecarError as exc:
        problems.append(f"{type(exc).__name__}: {exc}")
    return AuditProblem(
        topic=ref.topic,
        partition=ref.partition,
        segment_id=ref.segment_id,
        start_offset=ref.start_offset,
        end_offset=ref.end_offset,
        log_key=ref.log_key,
        size=ref.size,
        batches=batches,
        status="ok" if not problems else "corrupt",
        problems=tuple(problems),
    )


def _walk_log(files: SegmentFiles, ref: SegmentRef) -> tuple[int, int, list[str]]:
    """(whole-object CRC-32C, batches, problems) in windows of ``_WINDOW`` bytes."""
    problems: list[str] = []
    crc = 0
    batches = 0
    expected = ref.start_offset
    position = 0
    carry = b""
    walking = True
    while position < ref.size:
        chunk = files.read_log(position, min(ref.size, position + _WINDOW))
        crc = crc32c.crc32c(chunk, crc)
        data = carry + chunk
        origin = position - len(carry)
        position += len(chunk)
        carry = b""
        if not walking:
            continue
        last = position == ref.size
        consumed = origin
        try:
            for header in iter_batches(
                data, origin=origin, verify_crc=True, tolerate_tail=not last, path=ref.log_key
            ):
                batches += 1
                if header.base_offset != expected:
                    problems.append(
                        f"{ref.log_key}: batch at byte {header.position} starts at offset"
                        f" {header.base_offset}, expected {expected}"
                    )
                expected = header.next_offset
                consumed = header.end_position
        except SidecarError as exc:
            problems.append(str(exc))
            walking = False
            continue
        carry = data[consumed - origin :]
    if walking and expected != ref.end_offset + 1:
        problems.append(
            f"{ref.log_key}: batches end at offset {expected - 1}, metadata says {ref.end_offset}"
        )
    return int(crc), batches, problems


def _run(tasks: Iterable[AuditTask]) -> Iterator[tuple[Any, ...]]:
    for task in tasks:
        row = audit_segment(task)
        yield (
            row.topic,
            row.partition,
            row.segment_id,
            row.start_offset,
            row.end_offset,
            row.log_key,
            row.size,
            row.batches,
            row.status,
            list(row.problems),
        )


def _plan(options: Mapping[str, str]) -> tuple[list[AuditTask], list[AuditProblem]]:
    """(segment tasks, partition-level problems: lineage gaps), on the driver."""
    from sidecar.spark._catalog import build_catalog
    from sidecar.spark._s3 import S3Reader
    from sidecar.storage.keys import KeyLayout

    parsed = parse_options(options)
    catalog = build_catalog(parsed, S3Reader(parsed.s3))
    layout = KeyLayout(prefix=parsed.s3.prefix, hash_prefix=parsed.s3.hash_prefix)
    tasks: list[AuditTask] = []
    gaps: list[AuditProblem] = []
    from sidecar.metadata.store import SegmentSpan

    for part in catalog.partitions:
        for segment in part.finished:
            span = SegmentSpan(segment, segment.start_offset, segment.end_offset)
            manifest = catalog.manifests.get(segment.segment_id.id)
            tasks.append(AuditTask(segment_ref(span, layout, manifest), parsed.s3))
        for before, after in zip(part.spans, part.spans[1:], strict=False):
            if after.start_offset != before.end_offset + 1:
                gaps.append(
                    AuditProblem(
                        part.tp.topic,
                        part.tp.partition,
                        None,
                        before.end_offset + 1,
                        after.start_offset - 1,
                        None,
                        0,
                        0,
                        "gap",
                        (
                            f"offsets {before.end_offset + 1}..{after.start_offset - 1} of"
                            f" {part.tp.topic}-{part.tp.partition} are in no finished segment",
                        ),
                    )
                )
    return tasks, gaps


def audit_dataframe(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """The audit report as a DataFrame (``REPORT_DDL``), one row per segment plus one per gap.
    ``options`` are the data source's (selection, S3 location, metadata source)."""
    tasks, gaps = _plan(options)
    rows: list[tuple[Any, ...]] = []
    if tasks:
        rdd = spark.sparkContext.parallelize(tasks, len(tasks))
        rows = rdd.mapPartitions(_run).collect()
    for gap in gaps:
        rows.append(
            (
                gap.topic,
                gap.partition,
                gap.segment_id,
                gap.start_offset,
                gap.end_offset,
                gap.log_key,
                gap.size,
                gap.batches,
                gap.status,
                list(gap.problems),
            )
        )
    rows.sort(key=lambda r: (r[0], r[1], r[3]))
    return spark.createDataFrame(rows, REPORT_DDL)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``sidecar spark verify`` arguments (shared with ``python -m sidecar.spark.verify``)."""
    parser.add_argument(
        "-c",
        "--config",
        dest="file",
        type=Path,
        default=None,
        help="a sidecar config file: bucket, prefix, endpoint, region, credentials, the metadata"
        " topic and the Kafka cluster with its SASL/TLS settings (flags below override it)",
    )
    parser.add_argument("--bucket", default=None, help="S3 bucket (required without -c)")
    parser.add_argument("--prefix", default=None)
    parser.add_argument("--endpoint", default=None, help="S3 endpoint URL (non-AWS stores)")
    parser.add_argument("--region", default=None)
    parser.add_argument("--hash-prefix", action="store_true", help="keys use hash prefixes")
    parser.add_argument(
        "--bootstrap-server",
        "--bootstrap-servers",
        dest="bootstrap_servers",
        default=None,
        help="read segment metadata from the metadata topic (default: the bucket's manifests)",
    )
    parser.add_argument("--metadata-topic", default=None)
    parser.add_argument(
        "--option",
        dest="spark_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the kafka-tiered source, e.g. kafka.security.protocol=SASL_SSL or"
        " kafka.sasl.jaas.config=... (Spark's Kafka source names; repeatable)",
    )
    parser.add_argument("--topic", action="append", default=[], help="topic to audit (repeat)")
    parser.add_argument("--topic-pattern", default=None, help="regex of topics (default: all)")
    parser.add_argument("--master", default=None, help="Spark master (default: local[2])")


def verify_options(args: argparse.Namespace) -> dict[str, str]:
    """The source's options from ``-c FILE`` (the sidecar's own settings, Kafka security
    included), then the flags, then ``--option KEY=VALUE``."""
    options: dict[str, str] = {"s3.region": "us-east-1", "s3.prefix": ""}
    if args.file is not None:
        from sidecar.config import load_config, secret_values
        from sidecar.observability.logging import redact_secrets
        from sidecar.spark._options import spark_kafka_options

        config = load_config(args.file)
        redact_secrets(secret_values(config))
        options.update(
            {
                "s3.bucket": config.s3.bucket,
                "s3.prefix": config.s3.prefix,
                "s3.region": config.s3.region,
                "s3.pathStyle": str(config.s3.path_style).lower(),
                "s3.hashPrefix": str(config.s3.hash_prefix).lower(),
                "metadata.topic": config.remote_log_metadata.topic,
                **spark_kafka_options(config.kafka),
            }
        )
        if config.s3.endpoint_url:
            options["s3.endpoint"] = config.s3.endpoint_url
        if config.s3.access_key_id and config.s3.secret_access_key:
            options["s3.accessKeyId"] = config.s3.access_key_id.get_secret_value()
            options["s3.secretAccessKey"] = config.s3.secret_access_key.get_secret_value()
    for flag, name in (
        ("bucket", "s3.bucket"),
        ("prefix", "s3.prefix"),
        ("region", "s3.region"),
        ("endpoint", "s3.endpoint"),
        ("bootstrap_servers", "kafka.bootstrap.servers"),
        ("metadata_topic", "metadata.topic"),
    ):
        if getattr(args, flag) is not None:
            options[name] = getattr(args, flag)
    if args.hash_prefix:
        options["s3.hashPrefix"] = "true"
    if "s3.accessKeyId" not in options:
        key = os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("SIDECAR_S3__ACCESS_KEY_ID")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY") or os.environ.get(
            "SIDECAR_S3__SECRET_ACCESS_KEY"
        )
        if key and secret:
            options["s3.accessKeyId"] = key
            options["s3.secretAccessKey"] = secret
    for position, item in enumerate(args.spark_options, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # the item is not echoed: a mistyped s3.secretAccessKey:VALUE carries a secret
            raise ConfigError(f"--option takes KEY=VALUE; option {position} is not one")
        options[key.strip()] = value
    if not options.get("s3.bucket"):
        raise ConfigError("give --bucket or -c FILE")
    if "kafka.bootstrap.servers" not in options:
        options.pop("metadata.topic", None)
    return options


def verify_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run the audit and print the report; 0 when clean, 1 when any problem is found."""
    from pyspark.sql import SparkSession

    options = verify_options(args)
    if args.topic:
        options["subscribe"] = ",".join(args.topic)
    else:
        options["subscribePattern"] = args.topic_pattern or ".*"
    builder = SparkSession.builder.appName("kafka-tiered-verify")
    if args.master or not os.environ.get("SPARK_ENV_LOADED"):
        builder = (
            builder.master(args.master or "local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        report = audit_dataframe(spark, options).collect()
    finally:
        spark.stop()
    bad = [r for r in report if r.status != "ok"]
    print(f"{'status':8} {'partition':>24} {'offsets':>23} {'batches':>8}  object", file=out)
    for r in report:
        where = f"{r.topic}-{r.partition}"
        offsets = f"{r.start_offset}..{r.end_offset}"
        line = f"{r.status:8} {where:>24} {offsets:>23} {r.batches:>8}  {r.log_key or '-'}"
        print(line, file=out)
        for problem in r.problems:
            print(f"         ! {problem}", file=out)
    segments = sum(1 for r in report if r.segment_id)
    print(f"{segments} segments, {len(bad)} with problems", file=out)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sidecar.spark.verify`` (for spark-submit)."""
    parser = argparse.ArgumentParser(description="audit the tiered archive on Spark")
    add_arguments(parser)
    return verify_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
