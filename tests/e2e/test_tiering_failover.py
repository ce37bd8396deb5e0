"""Leader failover on a three-broker cluster with one sidecar per broker: while records keep
coming, the leader of a partition is stopped, the new leader's sidecar continues tiering where
the old one stopped, and the remote log of every partition, resolved by leader-epoch lineage as
Kafka resolves it, covers every committed rolled offset from 0 once: no gap, no double upload,
no copy left unfinished, no object without metadata.

The replicas roll their segments independently, so the new leader's first segment may overlap
the old leader's last copy; Kafka's RemoteLogMetadataCache (the sidecar's store applies its
rules) resolves such overlaps by lineage, and that is what the checks use."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from sidecar.metadata.events import RemoteLogSegmentState, SegmentMetadata
from tests.conftest import stack
from tests.e2e._support import (
    MetadataTopic,
    Sidecar,
    bucket_keys,
    clean_prefix,
    delete_topic,
    end_offsets,
    expected_keys,
    leaders,
    multipart_uploads,
    partition_scan,
    rolled_below,
    topic_id_partition,
    write_config,
)
from tests.helpers import create_topic
from tests.sidecar_runner import sidecar_env

pytestmark = pytest.mark.e2e

PARTITIONS = 3
NODES = (1, 2, 3)


async def _produce_until(stop: asyncio.Event, bootstrap: str, topic: str) -> int:
    """About 300 KiB/s per partition of incompressible 4 KiB records (acks=all) until
    ``stop``; the number of records."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, request_timeout_ms=30000
    )
    await producer.start()
    sent = 0
    try:
        for round_ in itertools.count():
            if stop.is_set():
                break
            futures = [
                await producer.send(
                    topic, value=os.urandom(4096), key=b"%d-%d" % (round_, i), partition=p
                )
                for p in range(PARTITIONS)
                for i in range(32)
            ]
            await asyncio.gather(*futures)
            sent += len(futures)
            with contextlib.suppress(TimeoutError):  # pacing of the load, not a synchronization
                await asyncio.wait_for(stop.wait(), 0.4)
    finally:
        await producer.stop()
    return sent


_Row = tuple[int, int, bytes | None, bytes | None]


async def _consumed(bootstrap: str, topic: str, ends: dict[int, int]) -> list[_Row]:
    """(partition, offset, key, value) of offsets [0, ends[p]) read from the brokers."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    rows: list[_Row] = []
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        for tp in tps:
            while await consumer.position(tp) < ends[tp.partition]:
                for records in (await consumer.getmany(tp, timeout_ms=2000)).values():
                    rows += [
                        (r.partition, r.offset, r.key, r.value)
                        for r in records
                        if r.offset < ends[tp.partition]
                    ]
    finally:
        await consumer.stop()
    return sorted(rows)


def _read_with_spark(
    spark: Any, s3: Any, prefix: str, bootstrap: str, topic: str, ends: dict[int, int]
) -> list[_Row]:
    """The same offsets through the kafka-tiered source, planned from the metadata topic."""
    frame = (
        spark.read.format("kafka-tiered")
        .option("subscribe", topic)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("metadata.topic", f"__rlm_{topic}")
        .option("s3.endpoint", s3.endpoint)
        .option("s3.bucket", s3.bucket)
        .option("s3.prefix", prefix)
        .option("s3.accessKeyId", s3.access_key)
        .option("s3.secretAccessKey", s3.secret_key)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({topic: {str(p): end for p, end in ends.items()}}))
        .load()
    )
    return sorted(
        (r.partition, r.offset, None if r.key is None else bytes(r.key), bytes(r.value))
        for r in frame.select("partition", "offset", "key", "value").collect()
    )


def _overlaps(a: SegmentMetadata, b: SegmentMetadata) -> bool:
    return a.start_offset <= b.end_offset and b.start_offset <= a.end_offset


class TestLeaderFailover:
    """Tiering moves with partition leadership from one broker's sidecar to another's."""

    async def test_stopping_the_leader_hands_tiering_over_without_gaps_or_doubles(
        self, kafka_cluster3, s3, topic_name, s3_prefix, tmp_path, spark
    ):
        """The stopped leader's partitions are tiered on by the new leaders' sidecars; every
        partition's FINISHED copies cover 0 up to the last committed rolled offset along the
        current leader's lineage, overlap only where leadership changed (a new leader's first
        copy with the old leader's last ones), and nothing unfinished or orphaned is left."""
        cluster = kafka_cluster3.cluster
        assert cluster is not None
        bootstrap = kafka_cluster3.bootstrap_servers
        metadata_topic = f"__rlm_{topic_name}"
        await create_topic(
            bootstrap,
            topic_name,
            partitions=PARTITIONS,
            replication=3,
            # time-based rolls with a random per-segment jitter: the replicas roll at other
            # offsets, so a new leader's segments do not line up with the old leader's copies
            configs={"segment.bytes": "1048576", "segment.ms": "3000", "segment.jitter.ms": "2000"},
        )
        env = sidecar_env(s3)
        sidecars: dict[int, Sidecar] = {}
        stopped: int | None = None
        stop_producing = asyncio.Event()
        producing: asyncio.Task[int] | None = None
        try:
            for node in NODES:
                state = tmp_path / f"sidecar-{node}"
                state.mkdir()
                config = write_config(
                    state / "sidecar.toml",
                    state_dir=state / "state",
                    log_dir=cluster.node(node).log_dir,
                    bootstrap=bootstrap,
                    s3=s3,
                    metrics_port=stack.free_port(),
                    metadata_topic=metadata_topic,
                    metadata_replication=3,
                    include_topics=[topic_name],
                    prefix=s3_prefix,
                    # bounds the wait for another broker's unfinished copy (the grace period)
                    kafka={"metadata_stale_after_s": 15.0},
                )
                sidecars[node] = await Sidecar.start(
                    config, env, state / "sidecar.log", name=f"sidecar-{node}"
                )
            for sidecar in sidecars.values():
                await sidecar.wait_for("sidecar_ready", timeout=60)
            producing = asyncio.create_task(_produce_until(stop_producing, bootstrap, topic_name))

            # the leader of partition 0 tiers a few segments, then its broker stops
            before = await leaders(bootstrap, topic_name)
            old = before[0]
            await sidecars[old].wait_for(
                "segment_tiered", count=2, timeout=60, topic=topic_name, partition=0
            )
            moved = sorted(p for p, leader in before.items() if leader == old)
            stopped = old
            await asyncio.to_thread(cluster.stop_node, old)
            after = await leaders(bootstrap, topic_name, avoid={old})

            # the new leaders' sidecars take over and tier on
            for partition in moved:
                new = after[partition]
                await sidecars[new].wait_for(
                    "segment_tiered", count=2, timeout=60, topic=topic_name, partition=partition
                )
            # the old leader's broker comes back as a follower; its sidecar stays quiet
            await asyncio.to_thread(cluster.start_node, old)
            stopped = None
            uploads_by_old = len(sidecars[old].matching("segment_tiered"))
            stop_producing.set()
            await producing

            # every committed rolled segment of the current leaders is covered from offset 0
            current = await leaders(bootstrap, topic_name)
            lsos = await end_offsets(bootstrap, topic_name, range(PARTITIONS))
            targets: dict[int, tuple[Any, list[tuple[int, int]], int]] = {}
            for partition in range(PARTITIONS):
                scan = partition_scan(
                    cluster.node(current[partition]).log_dir, topic_name, partition
                )
                rolled = rolled_below(scan, lsos[partition])
                epochs = [(e.epoch, e.start_offset) for e in scan.leader_epochs]
                targets[partition] = (scan, epochs, rolled[-1].end_offset)
            tips = {
                p: topic_id_partition(cluster.node(current[p]).log_dir, topic_name, p)
                for p in range(PARTITIONS)
            }
            async with MetadataTopic(bootstrap, metadata_topic, tmp_path / "m") as topic:
                await topic.wait_until(
                    lambda: (
                        all(
                            topic.covered_to(tips[p], targets[p][1]) >= targets[p][2]
                            for p in range(PARTITIONS)
                        )
                        and not topic.store.unfinished_copies()
                        and not topic.store.unfinished_deletes()
                    ),
                    timeout=90,
                    what="every committed rolled offset covered, nothing unfinished",
                )
                for sidecar in sidecars.values():
                    assert await sidecar.stop() == 0, sidecar.tail()
                await topic.read_to_end()
                assert not topic.store.unfinished_copies()
                assert not topic.store.unfinished_deletes()
                for state_ in topic.final_states().values():
                    assert state_ in {
                        RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                        RemoteLogSegmentState.DELETE_SEGMENT_FINISHED,
                    }
                finished_all: list[SegmentMetadata] = []
                for partition in range(PARTITIONS):
                    tip = tips[partition]
                    _scan, epochs, target = targets[partition]
                    assert topic.covered_to(tip, epochs) >= target
                    finished = topic.finished_in_order(tip)
                    finished_all += finished
                    changes = 1 if partition in moved else 0
                    self._check_no_double_upload(partition, finished, changes)
            # the old leader's sidecar uploaded nothing once its broker had stopped
            assert len(sidecars[old].matching("segment_tiered")) == uploads_by_old
            for partition in moved:
                assert sidecars[after[partition]].matching(
                    "segment_tiered", topic=topic_name, partition=partition
                )
            assert set(bucket_keys(s3, s3_prefix)) == expected_keys(s3_prefix, finished_all)
            assert multipart_uploads(s3, s3_prefix) == []

            # the Spark source resolves the same copies by lineage: across the hand-over it
            # returns every offset once, the records the brokers hold
            ends = {p: targets[p][2] + 1 for p in range(PARTITIONS)}
            expected = await _consumed(bootstrap, topic_name, ends)
            read = await asyncio.to_thread(
                _read_with_spark, spark, s3, s3_prefix, bootstrap, topic_name, ends
            )
            assert len(read) == sum(ends.values())  # no gap, no duplicate offset
            assert read == expected
        finally:
            stop_producing.set()
            if producing is not None:
                with contextlib.suppress(Exception):
                    await producing
            for sidecar in sidecars.values():
                if sidecar.proc.returncode is None:
                    await sidecar.kill()
            if stopped is not None:
                await asyncio.to_thread(cluster.start_node, stopped)
            clean_prefix(s3, s3_prefix)
            await delete_topic(bootstrap, topic_name)

    @staticmethod
    def _check_no_double_upload(
        partition: int, finished: list[SegmentMetadata], leader_changes: int
    ) -> None:
        """No offset was uploaded twice, except where Kafka itself overlaps copies: a broker's
        copies never overlap each other, and a copy overlaps earlier ones only when it is the
        first of a new leader after a hand-over (its segment started before the old leader's
        last copy ended). ``finished`` is in the order the copies were finished."""
        handovers = 0
        for i, copy in enumerate(finished):
            earlier = [c for c in finished[:i] if _overlaps(copy, c)]
            if not earlier:
                continue
            assert all(c.broker_id != copy.broker_id for c in earlier), (partition, copy, earlier)
            assert finished[i - 1].broker_id != copy.broker_id, (partition, copy, earlier)
            handovers += 1
        assert handovers <= leader_changes, (partition, finished)
