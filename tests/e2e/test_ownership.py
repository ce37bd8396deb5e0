"""Data that is not provably ours is never deleted, on real brokers and SeaweedFS.

* A lost Describe ACL hides a topic from the all-topics Metadata answer; asked by id, the broker
  says TOPIC_AUTHORIZATION_FAILED, which is no proof of deletion: nothing is deleted, however
  long it lasts. Once the ACL is gone and the topic really deleted (UNKNOWN_TOPIC_ID), the
  sidecar empties the prefix itself.
* Two clusters share one bucket. With different prefixes (one nested in the other, the shape of
  the empty default prefix) each scrub deletes its own orphans and nothing of the other's, nor
  the segment-shaped objects of a partition its metadata never mentioned; with the same prefix
  the second cluster's daemon refuses to start (exit 4, one clear line).

The brokers: the session's ``kafka``, and a second single-node cluster of this module that runs
the StandardAuthorizer with ``allow.everyone.if.no.acl.found=true`` on PLAINTEXT, so every
client is User:ANONYMOUS and one DENY ACL hides one topic from it and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.kafka.checkpoints import read_meta_properties
from sidecar.kafka.logdir import META_PROPERTIES
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from sidecar.storage.ownership import MARKER_NAME
from tests.conftest import KafkaHandle, stack
from tests.e2e._support import (
    Sidecar,
    bucket_keys,
    delete_topic,
    end_offsets,
    metric_samples,
    multipart_uploads,
    partition_scan,
    rolled_below,
    sample,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

METRIC = "kafka_tiered_sidecar_"
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


@pytest.fixture(scope="module")
def kafka_acl(stack_root: Path) -> Iterator[KafkaHandle]:
    """A second single-node KRaft cluster (its own cluster id) with the StandardAuthorizer."""
    cluster = stack.KafkaCluster.create(stack_root / "kafka-acl", nodes=1, overrides=AUTHORIZER)
    try:
        cluster.start()
        yield KafkaHandle(cluster.bootstrap_servers, cluster.log_dirs, cluster)
    finally:
        cluster.stop()


def _config(
    tmp_path: Path, kafka: Any, s3: Any, topic: str, prefix: str, name: str, **retention: Any
) -> Path:
    return write_config(
        tmp_path / f"{name}.toml",
        state_dir=tmp_path / f"{name}-state",
        log_dir=kafka.log_dir,
        bootstrap=kafka.bootstrap_servers,
        s3=s3,
        metrics_port=stack.free_port(),
        metadata_topic=f"__rlm_{topic}",
        include_topics=[topic],
        prefix=prefix,
        retention={
            "interval_s": 1.0,
            "topic_deletion_grace_s": 1.0,
            # the test's only topic is all of its prefix: proof alone must protect it
            "topic_deletion_override_share": True,
            "scrub_enabled": False,
            **retention,
        },
    )


def _metrics_port(config: Path) -> int:
    for line in config.read_text().splitlines():
        if line.startswith("port = "):
            return int(line.split("=")[1])
    raise AssertionError("no metrics port in the config")


async def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i in range(count):
            await producer.send(topic, value=f"{i:08d}".encode() * 128, key=f"k{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def _start(config: Path, s3: Any, tmp_path: Path, name: str) -> Sidecar:
    sidecar = await Sidecar.start(config, sidecar_env(s3), tmp_path / f"{name}.log", name=name)
    await sidecar.wait_for("sidecar_ready", timeout=90)
    return sidecar


async def _tier_everything(kafka: Any, sidecar: Sidecar, topic: str) -> None:
    lso = (await end_offsets(kafka.bootstrap_servers, topic, [0]))[0]
    rolled = {s.base_offset for s in rolled_below(partition_scan(kafka.log_dir, topic, 0), lso)}
    assert rolled

    def done() -> bool:
        return rolled <= {e["base_offset"] for e in sidecar.matching("segment_tiered")}

    await sidecar.wait_until(done, timeout=120, what="every rolled segment tiered")


async def _acl(kafka: KafkaHandle, action: str, topic: str) -> None:
    """Add or remove the DENY Describe ACL of User:ANONYMOUS on ``topic`` (Kafka's AclCommand)."""
    assert kafka.cluster is not None
    args = ["--bootstrap-server", kafka.bootstrap_servers, f"--{action}", "--force"]
    args += ["--deny-principal", "User:ANONYMOUS", "--operation", "Describe", "--topic", topic]
    done = await asyncio.to_thread(kafka.cluster.tool, "org.apache.kafka.tools.AclCommand", *args)
    assert done.returncode == 0, done.stdout + done.stderr


async def _listed(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _delete_and_wait_empty(kafka: Any, s3: Any, sidecar: Sidecar, topic: str, prefix: str):
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers, request_timeout_ms=30000)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()
    deadline = time.monotonic() + 90
    while bucket_keys(s3, prefix) or multipart_uploads(s3, prefix):
        assert time.monotonic() < deadline, f"{prefix} not emptied:\n{sidecar.tail()}"
        await sidecar.wait_for(
            "retention_pass", count=len(sidecar.matching("retention_pass")) + 1, timeout=60
        )


class TestTopicDeletionNeedsProof:
    async def test_revoked_describe_deletes_nothing(
        self, kafka_acl, s3, topic_name, s3_prefix, tmp_path
    ):
        bootstrap = kafka_acl.bootstrap_servers
        control = f"{topic_name}-control"
        await create_topic(bootstrap, topic_name, configs={"retention.ms": "-1"})
        await create_topic(bootstrap, control)
        await _produce(bootstrap, topic_name, 3000)
        config = _config(tmp_path, kafka_acl, s3, topic_name, s3_prefix, "sidecar")
        sidecar = await _start(config, s3, tmp_path, "sidecar")
        try:
            await _tier_everything(kafka_acl, sidecar, topic_name)
            tiered = set(bucket_keys(s3, s3_prefix))
            assert tiered
            await _acl(kafka_acl, "add", topic_name)
            listed = await _listed(bootstrap)
            assert topic_name not in listed  # hidden from the all-topics answer ...
            assert control in listed  # ... and nothing else is
            unconfirmed = await sidecar.wait_for(
                "topic_deletion_unconfirmed", topic=topic_name, timeout=60
            )
            assert unconfirmed[0]["answer"] == "unauthorized"
            # far past the 1 s grace period: a listing-based sidecar would have deleted by now
            passes = len(sidecar.matching("retention_pass"))
            await sidecar.wait_for("retention_pass", count=passes + 5, timeout=60)
            assert set(bucket_keys(s3, s3_prefix)) == tiered
            assert sidecar.matching("remote_segments_deleting") == []
            assert sidecar.matching("topic_deleted_remote_cleanup") == []
            samples = await metric_samples(_metrics_port(config))
            name = f"{METRIC}topic_deletion_unconfirmed_total"
            assert sample(samples, name, reason="unauthorized") >= 5

            # the real deletion: Describe back, topic deleted, UNKNOWN_TOPIC_ID → emptied
            await _acl(kafka_acl, "remove", topic_name)
            await _delete_and_wait_empty(kafka_acl, s3, sidecar, topic_name, s3_prefix)
            cleanup = sidecar.matching("topic_deleted_remote_cleanup")
            assert cleanup
            assert await sidecar.stop() == 0
        finally:
            if sidecar.proc.returncode is None:
                await sidecar.kill()
            await delete_topic(bootstrap, topic_name)
            await delete_topic(bootstrap, control)


def _cluster_id(kafka: KafkaHandle) -> str:
    cluster_id = read_meta_properties(kafka.log_dir / META_PROPERTIES).cluster_id
    assert cluster_id
    return cluster_id


def _segment_objects(s3: Any, layout: KeyLayout, topic: str, topic_id: uuid.UUID) -> list[str]:
    """Plant one segment's objects (no metadata references them)."""
    segment_id = uuid.uuid4()
    keys = [
        layout.segment_key(
            topic=topic,
            topic_id=topic_id,
            partition=0,
            base_offset=10**9,
            segment_id=segment_id,
            suffix=suffix,
        )
        for suffix in ObjectSuffix
    ]
    client = s3.client()
    try:
        for key in keys:
            client.put_object(Bucket=s3.bucket, Key=key, Body=b"planted")
    finally:
        client.close()
    return keys


async def _scrub(config: Path, s3: Any) -> dict[str, Any]:
    """`sidecar scrub --json` with no grace period."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "scrub", "--execute", "--config", str(config), "--json",
        "--set", "retention.orphan_grace_s=0.001", "--set", "retention.multipart_grace_s=0.001",
        env=sidecar_env(s3), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


class TestTwoClustersOneBucket:
    async def test_scrubs_keep_apart_and_a_shared_prefix_is_refused(
        self, kafka, kafka_acl, s3, topic_name, s3_prefix, tmp_path
    ):
        """Cluster A on ``<p>``, cluster B on ``<p>b/`` (nested: what the empty default prefix
        looks like to a second cluster). Beside its own orphan, each prefix holds planted
        objects of the other cluster's topic id; each scrub deletes only its own orphan.
        Then B on ``<p>`` itself: it refuses to start."""
        prefix_a, prefix_b = s3_prefix, f"{s3_prefix}b/"
        clusters = {"a": (kafka, prefix_a), "b": (kafka_acl, prefix_b)}
        sidecars: dict[str, Sidecar] = {}
        configs: dict[str, Path] = {}
        try:
            for name, (cluster, prefix) in clusters.items():
                await create_topic(
                    cluster.bootstrap_servers, topic_name, configs={"retention.ms": "-1"}
                )
                await _produce(cluster.bootstrap_servers, topic_name, 3000)
                configs[name] = _config(tmp_path, cluster, s3, topic_name, prefix, name)
                sidecars[name] = await _start(configs[name], s3, tmp_path, name)
            for name, (cluster, _) in clusters.items():
                await _tier_everything(cluster, sidecars[name], topic_name)
            tip = {
                n: topic_id_partition(c.log_dir, topic_name, 0) for n, (c, _) in clusters.items()
            }
            assert tip["a"].topic_id != tip["b"].topic_id
            a_only = set(bucket_keys(s3, prefix_a)) - set(bucket_keys(s3, prefix_b))
            b_tiered = set(bucket_keys(s3, prefix_b))
            assert a_only
            assert b_tiered
            layout_a, layout_b = KeyLayout(prefix=prefix_a), KeyLayout(prefix=prefix_b)
            orphan_a = _segment_objects(s3, layout_a, topic_name, tip["a"].topic_id)
            orphan_b = _segment_objects(s3, layout_b, topic_name, tip["b"].topic_id)
            # the other cluster's objects, laid out as if they were ours (a pre-marker bucket)
            b_in_a = _segment_objects(s3, layout_a, "payments", tip["b"].topic_id)
            a_in_b = _segment_objects(s3, layout_b, "payments", tip["a"].topic_id)

            report_a = await _scrub(configs["a"], s3)
            assert sorted(report_a["orphan_keys"]) == sorted(orphan_a)
            assert report_a["not_ours"] == len(b_in_a)
            report_b = await _scrub(configs["b"], s3)
            assert sorted(report_b["orphan_keys"]) == sorted(orphan_b)
            assert report_b["not_ours"] == len(a_in_b)
            left = set(bucket_keys(s3, prefix_a))
            assert left == a_only | set(b_in_a) | b_tiered | set(a_in_b) | {
                f"{prefix_b}{MARKER_NAME}"
            }

            # the same prefix: B refuses to start
            shared = _config(tmp_path, kafka_acl, s3, topic_name, prefix_a, "b-shared")
            intruder = await Sidecar.start(
                shared, sidecar_env(s3), tmp_path / "b-shared.log", name="b-shared"
            )
            assert await intruder.wait_exit(timeout=90) == 4
            failed = [e for e in intruder.events if e.get("event") == "sidecar_failed"]
            assert len(failed) == 1, intruder.tail()
            assert failed[0]["error_type"] == "PrefixOwnershipError"
            message = failed[0]["error"]
            assert "\n" not in message
            assert _cluster_id(kafka) in message  # the owner
            assert _cluster_id(kafka_acl) in message  # the intruder
            assert "s3.prefix" in message  # the fix
            assert intruder.matching("sidecar_ready") == []
            assert set(bucket_keys(s3, prefix_a)) == left  # untouched

            for name in ("b", "a"):
                assert await sidecars[name].stop() == 0
        finally:
            for process in sidecars.values():
                if process.proc.returncode is None:
                    await process.kill()
            for cluster, _ in clusters.values():
                await delete_topic(cluster.bootstrap_servers, topic_name)
