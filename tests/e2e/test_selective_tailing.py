"""Selective metadata tailing on a three-broker cluster with one sidecar per broker.

Each sidecar reads only the metadata partitions of the partitions its broker hosts; one of
them, elected through a consumer group, reads all of them and runs the cluster-wide duties.
The test checks, on the real cluster and bucket:

* what each sidecar reads: the coordinator every metadata partition, the others exactly those
  of their brokers' partitions;
* a partition moved (reassigned) to a broker whose sidecar never read its metadata partition:
  that sidecar starts reading it, tiers on where the previous leader stopped (no segment
  uploaded twice beyond Kafka's own hand-over overlap), and serves the partition's tiered
  records from offset 0 over its socket, equal to what a Kafka consumer reads;
* the orphan scrub runs on the coordinator only and deletes an orphan;
* the coordinator stopping hands the duties to another sidecar, which deletes every tiered
  segment of the topic once the topic is deleted.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata
from sidecar.metadata.partitioner import metadata_partition
from sidecar.readserver import ReadClient
from sidecar.storage.keys import KeyLayout, ObjectSuffix
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    multipart_uploads,
    topic_id_partition,
    write_config,
)
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

NODES = (1, 2, 3)
PARTITIONS = 6
METADATA_PARTITIONS = 30
_Row = tuple[int, bytes | None, bytes]


async def _create_placed_topic(bootstrap: str, topic: str) -> dict[int, int]:
    """One replica per partition, partition p on broker p % 3 + 1; partition → broker."""
    placement = {p: NODES[p % len(NODES)] for p in range(PARTITIONS)}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=-1,
                    replication_factor=-1,
                    replica_assignments={p: [b] for p, b in placement.items()},
                    topic_configs={"segment.bytes": "1048576"},
                )
            ]
        )
    finally:
        await admin.close()
    await _wait_leader(bootstrap, topic, placement, timeout=60)
    return placement


async def _wait_leader(
    bootstrap: str, topic: str, wanted: dict[int, int], *, timeout: float
) -> None:
    """Until every partition in ``wanted`` is led by its broker there (each broker applies
    the controller's metadata on its own schedule: re-asked, there is no event for it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    await admin.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            described = await admin.describe_topics([topic])
            found = {p["partition"]: p["leader"] for p in described[0].get("partitions", [])}
            if all(found.get(p) == b for p, b in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"leaders of {topic} are {found}, not {wanted}")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, partitions: list[int], mib: float) -> None:
    """About ``mib`` MiB of incompressible 8 KiB records into each partition (acks=all)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        count = int(mib * 128)
        for partition in partitions:
            sends = [
                await producer.send(
                    topic,
                    value=os.urandom(8192),
                    key=b"%d-%d" % (partition, i),
                    partition=partition,
                )
                for i in range(count)
            ]
            await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _consumed(bootstrap: str, topic: str, partition: int, end: int) -> list[_Row]:
    """Offsets [0, end] of the partition as a Kafka consumer reads them."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    rows: list[_Row] = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while await consumer.position(tp) <= end:
            for records in (await consumer.getmany(tp, timeout_ms=2000)).values():
                rows += [(r.offset, r.key, r.value) for r in records if r.offset <= end]
    finally:
        await consumer.stop()
    return rows


async def _served(socket: Path, topic: str, partition: int) -> tuple[list[_Row], int]:
    """Every tiered record of the partition through a sidecar's socket, from offset 0, and
    the tiered end offset."""
    async with ReadClient(socket_path=socket) as client:
        tiered = (await client.partition(topic, partition))["tiered"]
        assert tiered is not None
        assert tiered["start_offset"] == 0
        end = int(tiered["end_offset"])
        # a sidecar hosting the partition goes on into the broker's local segments
        rows = [
            (r.offset, r.key, r.value)
            async for r in client.iter_records(topic, partition, 0, max_bytes=256 * 1024)
            if r.offset <= end
        ]
    return rows, end


def _tracked(sidecar: Sidecar) -> set[int]:
    """The metadata partitions the sidecar's tailer reads now (its last assignment)."""
    assigned = sidecar.matching("metadata_partitions_assigned")
    return set(assigned[-1]["tracked"]) if assigned else set()


def _holder(sidecars: dict[int, Sidecar]) -> int | None:
    """The broker whose sidecar holds the cluster duties now, by the sidecars' own logs."""
    holding = []
    for node, sidecar in sidecars.items():
        changes = [
            e["event"]
            for e in sidecar.events
            if e.get("event") in ("cluster_duties_taken", "cluster_duties_released")
        ]
        if changes and changes[-1] == "cluster_duties_taken" and not sidecar.exited:
            holding.append(node)
    assert len(holding) <= 1, f"two coordinators at once: {holding}"
    return holding[0] if holding else None


async def _wait_holder(sidecars: dict[int, Sidecar], *, avoid: int | None = None) -> int:
    deadline = time.monotonic() + 90
    while True:
        holder = _holder(sidecars)
        if holder is not None and holder != avoid:
            return holder
        if time.monotonic() > deadline:
            raise AssertionError(
                "no coordinator elected\n" + "".join(s.tail(20) for s in sidecars.values())
            )
        waits = [asyncio.ensure_future(s._changed.wait()) for s in sidecars.values()]
        for sidecar in sidecars.values():
            sidecar._changed.clear()
        await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()


def _overlaps(a: SegmentMetadata, b: SegmentMetadata) -> bool:
    return a.start_offset <= b.end_offset and b.start_offset <= a.end_offset


class TestSelectiveTailing:
    async def test_reads_own_partitions_moves_serves_scrubs_and_deletes(
        self, kafka_cluster3, s3, topic_name, s3_prefix, tmp_path
    ):
        cluster = kafka_cluster3.cluster
        assert cluster is not None
        bootstrap = kafka_cluster3.bootstrap_servers
        metadata_topic = f"__rlm_{topic_name}"
        placement = await _create_placed_topic(bootstrap, topic_name)
        env = sidecar_env(s3)
        sidecars: dict[int, Sidecar] = {}
        states = {node: tmp_path / f"sidecar-{node}" for node in NODES}
        try:
            for node in NODES:
                states[node].mkdir()
                config = write_config(
                    states[node] / "sidecar.toml",
                    state_dir=states[node] / "state",
                    log_dir=cluster.node(node).log_dir,
                    bootstrap=bootstrap,
                    s3=s3,
                    metrics_port=stack.free_port(),
                    metadata_topic=metadata_topic,
                    metadata_replication=3,
                    include_topics=[topic_name],
                    prefix=s3_prefix,
                    remote_log_metadata={"num_partitions": METADATA_PARTITIONS},
                    kafka={"metadata_stale_after_s": 15.0},
                    retention={
                        "interval_s": 1.0,
                        "scrub_interval_s": 2.0,
                        "orphan_grace_s": 1.0,
                        "topic_deletion_grace_s": 1.0,
                        # the test's topic is all this bucket prefix holds
                        "topic_deletion_override_share": True,
                    },
                )
                sidecars[node] = await Sidecar.start(
                    config, env, states[node] / "sidecar.log", name=f"sidecar-{node}"
                )
            for sidecar in sidecars.values():
                await sidecar.wait_for("sidecar_ready", timeout=90)

            # every partition tiered by its broker's sidecar
            await _produce(bootstrap, topic_name, list(range(PARTITIONS)), 2.5)
            for partition, node in placement.items():
                await sidecars[node].wait_for(
                    "segment_tiered", count=2, timeout=90, topic=topic_name, partition=partition
                )
            tips = {
                p: topic_id_partition(cluster.node(b).log_dir, topic_name, p)
                for p, b in placement.items()
            }
            mps = {p: metadata_partition(tip, METADATA_PARTITIONS) for p, tip in tips.items()}

            # one coordinator reads every metadata partition, the others their brokers' only
            coordinator = await _wait_holder(sidecars)
            await sidecars[coordinator].wait_until(
                lambda: _tracked(sidecars[coordinator]) == set(range(METADATA_PARTITIONS)),
                timeout=60,
                what="the coordinator reading every metadata partition",
            )
            others = [n for n in NODES if n != coordinator]
            for node in others:
                hosted = {mps[p] for p, b in placement.items() if b == node}
                assert _tracked(sidecars[node]) == hosted, (node, hosted, sidecars[node].tail())

            # a partition moves to a broker whose sidecar has not read its metadata partition
            moves = [
                (p, node)
                for node in others
                for p, b in placement.items()
                if b != node and mps[p] not in _tracked(sidecars[node])
            ]
            assert moves, f"every metadata partition is read by every sidecar: {mps}"
            moved, target = moves[0]
            source = placement[moved]
            uploads_before = len(
                sidecars[source].matching("segment_tiered", topic=topic_name, partition=moved)
            )
            plan = tmp_path / "reassign.json"
            plan.write_text(
                json.dumps(
                    {
                        "version": 1,
                        "partitions": [
                            {"topic": topic_name, "partition": moved, "replicas": [target]}
                        ],
                    }
                )
            )
            result = await asyncio.to_thread(
                cluster.tool,
                "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                "--bootstrap-server",
                bootstrap,
                "--reassignment-json-file",
                str(plan),
                "--execute",
            )
            assert result.returncode == 0, result.stdout + result.stderr
            await _wait_leader(bootstrap, topic_name, {moved: target}, timeout=120)
            await _produce(bootstrap, topic_name, [moved], 2.5)
            await sidecars[target].wait_for(
                "segment_tiered", count=1, timeout=120, topic=topic_name, partition=moved
            )
            assert mps[moved] in _tracked(sidecars[target])
            # the old leader's sidecar uploads nothing of it once it no longer leads it
            assert (
                len(sidecars[source].matching("segment_tiered", topic=topic_name, partition=moved))
                == uploads_before
            )

            # the new broker's sidecar serves the whole tiered partition, from offset 0
            served, end = await _served(states[target] / "state" / "read.sock", topic_name, moved)
            assert len(served) == end + 1
            assert served == await _consumed(bootstrap, topic_name, moved, end)

            # a sidecar whose broker does not host a partition serves it too: the read starts
            # reading the partition's metadata partition
            bystander = next(n for n in others if n != target)
            far = [
                p
                for p, b in placement.items()
                if p != moved and b != bystander and mps[p] not in _tracked(sidecars[bystander])
            ]
            assert far, f"the bystander reads every metadata partition: {mps}"
            # its store holds its broker's partitions only (the moved one too, if it was the
            # source: a partition that moved away stays kept), though it reads their metadata
            # partitions whole (other partitions' events on them are skipped)
            socket = states[bystander] / "state" / "read.sock"
            async with ReadClient(socket_path=socket) as client:
                listed = {t["topic"]: t["partitions"] for t in await client.topics()}
            assert sorted(listed.get(topic_name, [])) == sorted(
                p for p, b in placement.items() if b == bystander
            )
            served, end = await _served(
                states[bystander] / "state" / "read.sock", topic_name, far[0]
            )
            assert len(served) == end + 1
            assert served == await _consumed(bootstrap, topic_name, far[0], end)
            # logged before the read was answered; read from the process as it comes
            await sidecars[bystander].wait_for(
                "metadata_partition_read_for_a_read", timeout=60, topic=topic_name
            )

            # the scrub: the coordinator's only, and it deletes an orphan
            layout = KeyLayout(prefix=s3_prefix)
            tip = tips[moved]
            orphan = layout.segment_key(
                topic=topic_name,
                topic_id=tip.topic_id,
                partition=moved,
                base_offset=0,
                segment_id=uuid.uuid4(),
                suffix=ObjectSuffix.LOG,
            )
            client_s3 = s3.client()
            try:
                client_s3.put_object(Bucket=s3.bucket, Key=orphan, Body=b"orphan")
            finally:
                client_s3.close()
            await sidecars[coordinator].wait_until(
                lambda: (
                    orphan not in bucket_keys(s3, s3_prefix)
                    and any(
                        e["orphans"] >= 1 for e in sidecars[coordinator].matching("scrub_finished")
                    )
                ),
                timeout=90,
                what="the orphan scrubbed",
            )
            for node in others:
                assert not sidecars[node].matching("scrub_finished"), sidecars[node].tail()

            # the coordinator stops: another takes the duties, and deletes the deleted topic
            assert await sidecars[coordinator].stop() == 0, sidecars[coordinator].tail()
            successor = await _wait_holder(sidecars, avoid=coordinator)
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
            await admin.start()
            try:
                await admin.delete_topics([topic_name])
            finally:
                await admin.close()
            topic_keys = [layout.topic_prefix(topic_name, tip.topic_id)]
            # the log lines are read from the process as they come: wait for them too, not
            # only for the bucket
            await sidecars[successor].wait_until(
                lambda: (
                    not [k for k in bucket_keys(s3, s3_prefix) if k.startswith(tuple(topic_keys))]
                    and bool(sidecars[successor].matching("topic_deleted_remote_cleanup"))
                ),
                timeout=120,
                what="every object of the deleted topic deleted, by the successor",
            )
            for node in NODES:
                if node != successor:
                    assert not sidecars[node].matching("topic_deleted_remote_cleanup")
            for node in others:
                assert await sidecars[node].stop() == 0, sidecars[node].tail()

            async with MetadataTopic(bootstrap, metadata_topic, tmp_path / "m") as topic:
                await topic.read_to_end()
                assert not topic.store.unfinished_copies()
                assert not topic.store.unfinished_deletes()
                states_ = topic.final_states()
                assert states_
                assert set(states_.values()) == {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED}
                finished = sorted(topic.copies(tips[moved]), key=lambda c: c.start_offset)
                # no offset uploaded twice but at the one hand-over between the two brokers
                overlaps = [
                    (a, b)
                    for i, a in enumerate(finished)
                    for b in finished[i + 1 :]
                    if _overlaps(a, b)
                ]
                assert len(overlaps) <= 1, overlaps
                assert all(a.broker_id != b.broker_id for a, b in overlaps)
                assert {c.broker_id for c in finished} == {source, target}
            assert multipart_uploads(s3, s3_prefix) == []
        finally:
            for sidecar in sidecars.values():
                if sidecar.proc.returncode is None:
                    await sidecar.kill()
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)  # and its metadata topic
