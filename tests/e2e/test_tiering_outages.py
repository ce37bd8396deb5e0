"""Outages of S3 and of Kafka after startup: the sidecar keeps running, backs off, reports not
ready with the failing check and why (/readyz, metrics, a log line), publishes no FINISHED copy
whose objects are not in S3, and converges once the dependency is back: every rolled segment
tiered once, no unfinished copy or delete left, no orphan object, no open multipart upload.

Both servers are session fixtures: each test restarts what it stops in a ``finally``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sidecar.metadata.events import RemoteLogSegmentState
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    end_offsets,
    expected_keys,
    metric_samples,
    multipart_uploads,
    partition_scan,
    readyz,
    rolled_below,
    sample,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic, produce
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

PARTITIONS = 2
METRIC = "kafka_tiered_sidecar_"


async def _produce_all(bootstrap: str, topic: str, *, count: int) -> None:
    for partition in range(PARTITIONS):
        await produce(bootstrap, topic, count=count, partition=partition)


async def _rolled(kafka: Any, topic: str) -> dict[int, list[Any]]:
    lsos = await end_offsets(kafka.bootstrap_servers, topic, range(PARTITIONS))
    return {
        p: rolled_below(partition_scan(kafka.log_dir, topic, p), lsos[p]) for p in range(PARTITIONS)
    }


def _tiered(sidecar: Sidecar, topic: str, partition: int) -> set[int]:
    return {e["base_offset"] for e in sidecar.matching("segment_tiered", partition=partition)}


async def _wait_all_tiered(
    sidecars: Sequence[Sidecar], topic: str, rolled: dict[int, list[Any]], *, timeout: float
) -> None:
    """Until every rolled segment was logged ``segment_tiered`` by one of the runs."""
    current = sidecars[-1]

    def done() -> bool:
        for partition, segments in rolled.items():
            tiered = set().union(*(_tiered(s, topic, partition) for s in sidecars))
            if not {s.base_offset for s in segments} <= tiered:
                return False
        return True

    await current.wait_until(done, timeout=timeout, what="every rolled segment tiered")


async def _check_converged(
    kafka: Any, s3: Any, topic: str, prefix: str, rolled: dict[int, list[Any]], state: Path
) -> None:
    """Exactly one FINISHED copy per rolled segment, nothing unfinished, every object accounted
    for, no multipart upload left."""
    async with MetadataTopic(kafka.bootstrap_servers, f"__rlm_{topic}", state) as topic_log:
        tips = {p: topic_id_partition(kafka.log_dir, topic, p) for p in range(PARTITIONS)}
        await topic_log.wait_until(
            lambda: (
                not topic_log.store.unfinished_copies() and not topic_log.store.unfinished_deletes()
            ),
            timeout=60,
            what="no unfinished copy or delete",
        )
        await topic_log.read_to_end()
        finished = []
        for partition, tip in tips.items():
            copies = topic_log.finished(tip)
            assert [(m.start_offset, m.end_offset) for m in copies] == [
                (s.base_offset, s.end_offset) for s in rolled[partition]
            ]
            finished += copies
        for state_ in topic_log.final_states().values():
            assert state_ in {
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
            }
    assert set(bucket_keys(s3, prefix)) == expected_keys(prefix, finished)
    assert multipart_uploads(s3, prefix) == []


def _config(tmp_path: Path, kafka: Any, s3: Any, topic: str, prefix: str, port: int) -> Path:
    return write_config(
        tmp_path / "sidecar.toml",
        state_dir=tmp_path / "state",
        log_dir=kafka.log_dir,
        bootstrap=kafka.bootstrap_servers,
        s3=s3,
        metrics_port=port,
        metadata_topic=f"__rlm_{topic}",
        include_topics=[topic],
        prefix=prefix,
    )


class TestS3Outage:
    """S3 stopped and started again under a running sidecar."""

    async def test_s3_outage_backs_off_reports_and_converges(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """While S3 is down the sidecar stays up, /readyz is 503 naming s3, the metrics and a
        log line say why, segments rolled meanwhile get no FINISHED copy; once S3 is back every
        segment is tiered exactly once and nothing is left behind."""
        bootstrap = kafka.bootstrap_servers
        await create_topic(
            bootstrap,
            topic_name,
            partitions=PARTITIONS,
            configs={"segment.bytes": "1048576", "segment.ms": "3600000"},
        )
        port = stack.free_port()
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix, port)
        sidecar = None
        s3_stopped = False
        try:
            await _produce_all(bootstrap, topic_name, count=6000)  # a backlog of ~10 segments
            sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / "sidecar.log")
            await sidecar.wait_for("sidecar_ready")
            await sidecar.wait_for("segment_tiered")
            # S3 goes away while the backlog is uploaded: copies in flight fail
            await asyncio.to_thread(s3.stop)
            s3_stopped = True
            await _produce_all(bootstrap, topic_name, count=2300)  # more rolls, not tierable
            unreachable = await sidecar.wait_for("s3_unreachable", timeout=60)
            assert unreachable[0]["error"]
            not_ready = await sidecar.wait_for("sidecar_not_ready", timeout=60)
            assert "s3" in not_ready[0]["failing"]
            await sidecar.wait_for("tiering_paused", timeout=60)
            status, body = await readyz(port)
            assert status == 503
            assert body["ready"] is False
            assert body["checks"]["s3"] is False
            assert "s3" in body["failing"]
            assert body["failing"]["s3"]
            samples = await metric_samples(port)
            assert sample(samples, f"{METRIC}readiness_check", check="s3") == 0
            assert sample(samples, f"{METRIC}readiness_check", check="kafka") == 1
            assert (
                sample(
                    samples,
                    f"{METRIC}dependency_errors_total",
                    dependency="s3",
                    component="readiness_probe",
                )
                >= 1
            )

            await asyncio.to_thread(s3.start)
            s3_stopped = False
            await sidecar.wait_for("s3_reachable", timeout=60)
            await sidecar.wait_for("sidecar_ready", count=2, timeout=60)
            await sidecar.wait_for("tiering_resumed", timeout=60)
            # nothing was finished while S3 was known to be down
            names = [e.get("event") for e in sidecar.events]
            outage = names[names.index("tiering_paused") : names.index("tiering_resumed")]
            assert "segment_tiered" not in outage
            after = await _rolled(kafka, topic_name)
            await _wait_all_tiered([sidecar], topic_name, after, timeout=60)
            assert not sidecar.exited
            status, body = await readyz(port)
            assert status == 200, body
            await _check_converged(kafka, s3, topic_name, s3_prefix, after, tmp_path / "m")
            assert await sidecar.stop() == 0
        finally:
            if s3_stopped:
                await asyncio.to_thread(s3.start)
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)


class TestKafkaOutage:
    """The (single-node) Kafka cluster stopped and started again under a running sidecar."""

    async def test_kafka_outage_backs_off_reports_and_recovers(
        self, kafka, s3, topic_name, s3_prefix, tmp_path
    ):
        """With every broker down the sidecar does not exit: it retries, /readyz is 503 naming
        kafka with the error, the metrics and log lines say why; once Kafka is back it is ready
        again and tiers what rolled since, leaving nothing unfinished."""
        assert kafka.cluster is not None, "the Kafka outage test needs the native broker"
        bootstrap = kafka.bootstrap_servers
        await create_topic(
            bootstrap,
            topic_name,
            partitions=PARTITIONS,
            configs={"segment.bytes": "1048576", "segment.ms": "3600000"},
        )
        port = stack.free_port()
        config = _config(tmp_path, kafka, s3, topic_name, s3_prefix, port)
        sidecar = None
        kafka_stopped = False
        try:
            await _produce_all(bootstrap, topic_name, count=2300)
            before = await _rolled(kafka, topic_name)
            sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / "sidecar.log")
            await _wait_all_tiered([sidecar], topic_name, before, timeout=60)
            await sidecar.wait_for("sidecar_ready")

            kafka_stopped = True
            await asyncio.to_thread(kafka.cluster.stop_node, 1)
            failed = await sidecar.wait_for("cluster_refresh_failed", timeout=60)
            assert "Kafka cluster unavailable" in failed[0]["error"]
            not_ready = await sidecar.wait_for("sidecar_not_ready", timeout=60)
            assert "kafka" in not_ready[0]["failing"]
            await sidecar.wait_for("tiering_paused", reason="Kafka is unreachable")
            status, body = await readyz(port)
            assert status == 503
            assert body["checks"]["kafka"] is False
            assert body["failing"]["kafka"]
            samples = await metric_samples(port)
            assert sample(samples, f"{METRIC}readiness_check", check="kafka") == 0
            assert (
                sample(
                    samples,
                    f"{METRIC}dependency_errors_total",
                    dependency="kafka",
                    component="cluster_watcher",
                )
                >= 1
            )
            # the daemon keeps retrying instead of exiting (Kubernetes would crash-loop it)
            await sidecar.wait_for("cluster_refresh_failed", count=3, timeout=60)
            assert not sidecar.exited

            await asyncio.to_thread(kafka.cluster.start_node, 1)
            kafka_stopped = False
            await sidecar.wait_for("cluster_refresh_recovered", timeout=60)
            await sidecar.wait_for("sidecar_ready", count=2, timeout=60)
            await sidecar.wait_for("tiering_resumed")
            await _produce_all(bootstrap, topic_name, count=2300)
            after = await _rolled(kafka, topic_name)
            assert sum(map(len, after.values())) > sum(map(len, before.values()))
            await _wait_all_tiered([sidecar], topic_name, after, timeout=60)
            await _check_converged(kafka, s3, topic_name, s3_prefix, after, tmp_path / "m")
            assert await sidecar.stop() == 0
            assert not sidecar.matching("task_failed")
        finally:
            if kafka_stopped:
                await asyncio.to_thread(kafka.cluster.start_node, 1)
            if sidecar is not None and sidecar.proc.returncode is None:
                await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)
