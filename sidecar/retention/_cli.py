"""``sidecar scrub`` and ``sidecar delete-partition``: one-shot commands next to the daemon.

* ``scrub`` reads the *whole* metadata topic into a fresh store in a temporary directory (the
  daemon's store belongs to the daemon), so every partition of the cluster is known, then runs
  the orphan scrub over the configured prefix with the configured grace periods. It only
  reports what it would delete unless given ``--execute``. The daemon runs the same scrub
  periodically. Unless the
  metadata topic's ``retention.ms`` and ``retention.bytes`` are -1 (DescribeConfigs), the scrub
  is refused for everything the metadata decides: it lists those keys as kept and removes only
  staged segments past the grace period (a real scrub then exits 1; a dry run warns). A prefix
  whose ownership marker is missing or names another cluster (or metadata topic) is refused
  whole, dry run or not (exit 1): the scrub never judges another cluster's objects.
* ``delete-partition`` publishes DELETE_PARTITION_MARKED for one partition (the topic id comes
  from the cluster, or ``--topic-id`` for a topic that no longer exists). The running sidecar of
  the broker that leads the partition's metadata partition then deletes every remote segment
  and publishes STARTED and FINISHED (resumable after a crash). If the topic still exists and is
  tiered, the local segments are tiered again afterwards.

  Guard rails: a partition the topic does not have, or one that still exists in the cluster,
  is refused unless ``--force``; the command shows what it will publish and asks for ``yes``
  on a terminal unless ``--yes`` (without a terminal, ``--yes`` is required); ``--dry-run``
  shows the plan and publishes nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TextIO

from sidecar.config import SidecarConfig, kafka_client_options, secret_values
from sidecar.errors import CommandError, ConfigError
from sidecar.metadata.events import (
    PartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from sidecar.metadata.partitioner import metadata_partition
from sidecar.retention.scrub import OrphanScrubber, ScrubReport, metadata_retention_problem
from sidecar.storage.ownership import PrefixOwner

__all__ = ["delete_partition_command", "scrub_command"]


def _log_to_stderr(config: SidecarConfig, *, level: str = "WARNING") -> None:
    """Logs go to stderr (stdout carries the report), secrets masked. A one-shot command logs
    at WARNING unless asked otherwise: the report says what happened."""
    from sidecar.observability.logging import configure_logging

    configure_logging(
        level=level,
        fmt=config.logging.format,
        stream=sys.stderr,
        secrets=secret_values(config),
    )


def _client_options(config: SidecarConfig) -> dict[str, object]:
    return kafka_client_options(config.kafka)


async def _scrub(config: SidecarConfig, *, dry_run: bool, state_dir: Path) -> ScrubReport:
    from sidecar.metadata.store import RemoteSegmentStore
    from sidecar.metadata.tailer import MetadataTailer
    from sidecar.retention._kafka import RetentionKafka
    from sidecar.storage import open_store
    from sidecar.storage.keys import KeyLayout

    meta = config.remote_log_metadata
    options = _client_options(config)
    kafka = RetentionKafka(
        bootstrap_servers=config.kafka.bootstrap_servers,
        request_timeout_ms=config.kafka.request_timeout_ms,
        client_options=options,
    )
    try:
        configs = await kafka.topic_configs([meta.topic])
        owner = PrefixOwner(await kafka.cluster_id(), meta.topic)
    finally:
        await kafka.aclose()
    unsafe = metadata_retention_problem(meta.topic, configs.get(meta.topic))
    async with AsyncExitStack() as stack:
        store = RemoteSegmentStore(state_dir)
        stack.callback(store.close)
        objects = open_store(config.s3)
        stack.push_async_callback(objects.aclose)
        tailer = MetadataTailer(
            bootstrap_servers=config.kafka.bootstrap_servers,
            store=store,
            broker_id=config.broker.broker_id if config.broker.broker_id is not None else -1,
            topic=meta.topic,
            num_partitions=meta.num_partitions,
            client_kwargs={**options, **meta.consumer_kwargs()},
        )
        await tailer.start()
        stack.push_async_callback(tailer.aclose)
        tailer.track(range(meta.num_partitions))
        stopping = asyncio.Event()
        reader = asyncio.create_task(tailer.run(stopping), name="scrub metadata tailer")
        try:
            async with asyncio.timeout(meta.consume_wait_ms / 1000):
                await tailer.wait_caught_up()
            scrubber = OrphanScrubber(
                objects=objects,
                store=store,
                layout=KeyLayout(prefix=config.s3.prefix, hash_prefix=config.s3.hash_prefix),
                owner=owner,
                object_grace_s=config.retention.orphan_grace_s,
                upload_grace_s=config.retention.multipart_grace_s,
                in_scope=tailer.complete,
            )
            report = await scrubber.scrub(dry_run=dry_run, unsafe=unsafe)
        finally:
            stopping.set()
            await reader
    return report


def scrub_command(
    config: SidecarConfig,
    *,
    dry_run: bool,
    as_json: bool,
    out: TextIO,
    log_level: str = "WARNING",
) -> int:
    """Run one scrub; print the report. Exit 0, or 1 when a real scrub was refused for all but
    staged segments (what it removed is printed all the same)."""
    _log_to_stderr(config, level=log_level)
    with tempfile.TemporaryDirectory(prefix="sidecar-scrub-") as tmp:
        report = asyncio.run(_scrub(config, dry_run=dry_run, state_dir=Path(tmp)))
    status = 1 if report.refused is not None and not dry_run else 0
    if as_json:
        print(json.dumps(report.to_json(), indent=2), file=out)
        return status
    verb = "would delete" if dry_run else "deleted"
    if report.refused is not None:
        print(f"WARNING: refused for all but staged segments: {report.refused}", file=out)
    for key in report.orphans:
        print(f"{verb} {key}", file=out)
    for key, _upload_id in report.aborted_uploads:
        print(f"{'would abort' if dry_run else 'aborted'} upload {key}", file=out)
    for key in report.withheld:
        print(f"kept (refused) {key}", file=out)
    for key, _upload_id in report.withheld_uploads:
        print(f"kept (refused) upload {key}", file=out)
    print(
        f"{report.objects_listed} objects listed, {report.referenced} referenced,"
        f" {len(report.orphans)} orphans {verb}, {report.young_orphans} orphans within the grace"
        f" period, {report.foreign} foreign keys, {report.not_ours} keys of other clusters;"
        f" {report.uploads_listed} incomplete uploads,"
        f" {len(report.aborted_uploads)} {'to abort' if dry_run else 'aborted'}"
        f"{_kept(report)} ({report.seconds:.3f} s)",
        file=out,
    )
    return status


def _kept(report: ScrubReport) -> str:
    """The summary's note on what a refusal kept (empty when nothing was refused)."""
    if report.refused is None:
        return ""
    return f"; {len(report.withheld)} orphans and {len(report.withheld_uploads)} uploads kept"


async def _plan(
    config: SidecarConfig,
    topic: str,
    partition: int,
    topic_id: str | None,
    *,
    force: bool,
) -> tuple[TopicIdPartition, str]:
    """The partition to mark and a description of what marking it does; refuses (CommandError)
    a partition the topic does not have or one that still exists, unless ``force``."""
    from sidecar.kafka.checkpoints import decode_kafka_uuid, encode_kafka_uuid
    from sidecar.retention._kafka import RetentionKafka

    if partition < 0:
        raise ConfigError(f"--partition must be 0 or more, not {partition}")
    kafka = RetentionKafka(
        bootstrap_servers=config.kafka.bootstrap_servers,
        request_timeout_ms=config.kafka.request_timeout_ms,
        client_options=_client_options(config),
    )
    try:
        topics = await kafka.topic_partitions()
    finally:
        await kafka.aclose()
    in_cluster = topics.get(topic)
    if topic_id is not None:
        try:
            tid = decode_kafka_uuid(topic_id)
        except ValueError:
            try:
                tid = uuid.UUID(topic_id)
            except ValueError as exc:
                raise ConfigError(f"--topic-id {topic_id!r} is not a Kafka topic id") from exc
    elif in_cluster is None:
        raise CommandError(
            f"topic {topic!r} does not exist in the cluster; pass --topic-id for a deleted one"
        )
    else:
        tid = in_cluster[0]
    override = " (--force given)"
    if in_cluster is not None and in_cluster[0] == tid:
        count = in_cluster[1]
        if partition >= count:
            if not force:
                raise CommandError(
                    f"topic {topic!r} has {count} partitions (0-{count - 1}); partition"
                    f" {partition} does not exist, so it has no tiered data to delete"
                    " (pass --force to publish the marker anyway)"
                )
        elif not force:
            raise CommandError(
                f"{topic}-{partition} still exists in the cluster: its tiered data would be"
                " deleted while the broker still serves the partition, and its local segments"
                " would be tiered again; delete the topic instead, or pass --force"
            )
        else:
            override = " (the partition still exists: --force given)"
    else:
        override = ""
    meta = config.remote_log_metadata
    if meta.topic not in topics:
        raise CommandError(
            f"the metadata topic {meta.topic} does not exist on"
            f" {','.join(config.kafka.bootstrap_servers)}: no sidecar has run against this"
            " cluster with this remote_log_metadata.topic, so nothing is tiered to delete"
        )
    tp = TopicIdPartition(tid, topic, partition)
    mp = metadata_partition(tp, meta.num_partitions)
    plan = (
        f"will publish DELETE_PARTITION_MARKED for {topic}-{partition} (topic id"
        f" {encode_kafka_uuid(tid)}) to {meta.topic}-{mp}; the sidecar that leads that metadata"
        f" partition then deletes every tiered segment of it from s3://{config.s3.bucket}/"
        f"{config.s3.prefix}{override}"
    )
    return tp, plan


async def _mark(config: SidecarConfig, tp: TopicIdPartition) -> str:
    from sidecar.metadata.publisher import MetadataPublisher

    meta = config.remote_log_metadata
    publisher = MetadataPublisher(
        bootstrap_servers=config.kafka.bootstrap_servers,
        broker_id=config.broker.broker_id if config.broker.broker_id is not None else -1,
        topic=meta.topic,
        num_partitions=meta.num_partitions,
        replication_factor=meta.replication_factor,
        retention_ms=meta.retention_ms,
        min_isr=meta.min_isr,
        client_kwargs=_client_options(config),
        producer_kwargs=meta.producer_kwargs(),
    )
    await publisher.start()
    try:
        mp, offset = await publisher.publish(
            PartitionDeleteMetadata(
                topic_id_partition=tp,
                broker_id=publisher.broker_id,
                event_timestamp_ms=time.time_ns() // 1_000_000,
                state=RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
            )
        )
    finally:
        await publisher.aclose()
    return f"{tp}: DELETE_PARTITION_MARKED published to {meta.topic}-{mp} at offset {offset}"


def _confirmed(plan: str, *, answer: TextIO, err: TextIO) -> bool:
    """Ask on the terminal; anything but ``yes`` (or ``y``) declines."""
    print(f"{plan}\nProceed? Type yes to publish: ", end="", file=err, flush=True)
    reply = answer.readline().strip().lower()
    return reply in ("y", "yes")


def delete_partition_command(
    config: SidecarConfig,
    *,
    topic: str,
    partition: int,
    topic_id: str | None,
    out: TextIO,
    force: bool = False,
    yes: bool = False,
    dry_run: bool = False,
    answer: TextIO | None = None,
    err: TextIO | None = None,
    log_level: str = "WARNING",
) -> int:
    """Check, show the plan, confirm, publish DELETE_PARTITION_MARKED; the running sidecars do
    the rest. Exit 0 when published (or on a dry run), 1 when refused or declined."""
    _log_to_stderr(config, level=log_level)
    answer = sys.stdin if answer is None else answer
    err = sys.stderr if err is None else err
    tp, plan = asyncio.run(_plan(config, topic, partition, topic_id, force=force))
    if dry_run:
        print(f"dry run: {plan}; nothing published", file=out)
        return 0
    if not yes:
        if not answer.isatty():
            raise CommandError(f"{plan}; not confirmed: pass --yes (no terminal to ask on)")
        if not _confirmed(plan, answer=answer, err=err):
            raise CommandError("not confirmed; nothing published")
    else:
        print(plan, file=err)
    print(asyncio.run(_mark(config, tp)), file=out)
    return 0
