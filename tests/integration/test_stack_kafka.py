"""The local stack's Kafka: a real KRaft broker from the Maven Central jars, on loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.helpers import create_topic, produce, segment_files, wait_for

pytestmark = pytest.mark.integration


class TestSingleBroker:
    async def test_segments_roll_in_the_log_dir(self, kafka, topic_name):
        """Producing 3 MiB to a topic with 1 MiB segments rolls segments in the broker's log dir."""
        await create_topic(
            kafka.bootstrap_servers, topic_name, configs={"segment.bytes": "1048576"}
        )
        offsets = await produce(kafka.bootstrap_servers, topic_name, count=3000, value_size=1000)
        assert offsets == list(range(3000))

        partition_dir = kafka.log_dir / f"{topic_name}-0"
        wait_for(lambda: len(segment_files(partition_dir)) >= 3, timeout=60, what="3 segments")
        logs = segment_files(partition_dir)
        bases = [int(p.stem) for p in logs]
        assert bases[0] == 0
        assert bases == sorted(bases)
        # every rolled segment is at most segment.bytes and has its indexes beside it
        for log_file in logs[:-1]:
            assert 0 < log_file.stat().st_size <= 1048576
            assert log_file.with_suffix(".index").exists()
            assert log_file.with_suffix(".timeindex").exists()
        # the broker writes a producer snapshot named after each roll's next base offset
        snapshots = {int(p.stem) for p in partition_dir.glob("*.snapshot")}
        assert set(bases[1:]) <= snapshots
        assert (partition_dir / "partition.metadata").exists()
        assert (kafka.log_dir / "meta.properties").exists()

    async def test_records_read_back(self, kafka, topic_name):
        """What we produce, a consumer reads back with keys and headers intact."""
        await create_topic(kafka.bootstrap_servers, topic_name)
        await produce(kafka.bootstrap_servers, topic_name, count=50, value_size=16)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
        await consumer.start()
        try:
            tp = TopicPartition(topic_name, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records = []
            async with asyncio.timeout(60):  # a first fetch may be slow on a loaded broker
                while len(records) < 50:
                    batch = await consumer.getmany(tp, timeout_ms=1000)
                    records.extend(batch.get(tp, []))
        finally:
            await consumer.stop()
        assert [r.key for r in records] == [f"key-{i}".encode() for i in range(50)]
        assert records[7].headers == (("i", b"7"),)

    def test_kafka_tools_run_from_the_same_jars(self, kafka, topic_name):
        """Kafka's own DumpLogSegments (the oracle for format tests) runs from the same jars."""
        assert kafka.cluster is not None
        meta = kafka.log_dir / "meta.properties"
        result = kafka.cluster.tool(
            "org.apache.kafka.tools.DumpLogSegments",
            "--files",
            str(next(kafka.log_dir.glob("__cluster_metadata-0/*.log"))),
        )
        assert result.returncode == 0, result.stderr
        assert "baseOffset" in result.stdout
        assert "cluster.id=" in meta.read_text()


class TestThreeNodeCluster:
    async def test_replicated_topic_spreads_over_three_brokers(self, kafka_cluster3, topic_name):
        """A replication-factor-3 topic has a replica in every node's log dir, and a leader."""
        await create_topic(
            kafka_cluster3.bootstrap_servers, topic_name, partitions=3, replication=3
        )
        await produce(kafka_cluster3.bootstrap_servers, topic_name, count=30, value_size=10)
        for log_dir in kafka_cluster3.log_dirs:
            for p in range(3):
                assert (log_dir / f"{topic_name}-{p}").is_dir()
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_cluster3.bootstrap_servers)
        await admin.start()
        try:
            described = await admin.describe_topics([topic_name])
            cluster = await admin.describe_cluster()
        finally:
            await admin.close()
        leaders = {p["leader"] for p in described[0]["partitions"]}
        assert leaders <= {1, 2, 3}
        assert len(cluster["brokers"]) == 3


class TestFailedStart:
    def test_a_failed_start_leaves_nothing_running(self, tmp_path):
        """Kafka's port is taken: the stack's start fails naming the broker's own bind error
        (from server.log, not the empty stdout), and stops what it had started: SeaweedFS
        and the broker JVM are gone, their PID files removed."""
        import socket

        from tests.conftest import stack

        with socket.socket() as taken:
            taken.bind((stack.LOOPBACK, 0))
            taken.listen()
            port = taken.getsockname()[1]
            local = stack.Stack(
                root=tmp_path,
                kafka=stack.KafkaCluster.create(tmp_path / "kafka", base_port=port),
                s3=stack.SeaweedS3.create(tmp_path / "s3"),
            )
            with pytest.raises(stack.StackError) as failed:
                local.start()
        assert "exited during startup" in str(failed.value)
        assert "server.log" in str(failed.value)
        assert "Address already in use" in str(failed.value)
        assert not local.s3.pid_file.exists()
        assert not local.kafka.nodes[0].pid_file.exists()
        assert not local.s3.running()
        assert not local.kafka.nodes[0].running()


def test_kafka_answers_tells_a_broker_from_an_open_port(kafka):
    """The readiness check of a broker behind a port proxy: a real broker answers ApiVersions,
    a socket that only accepts does not."""
    import socket

    from tests.conftest import stack

    port = int(kafka.bootstrap_servers.rsplit(":", 1)[1])
    assert stack.kafka_answers(port)
    with socket.socket() as silent:
        silent.bind((stack.LOOPBACK, 0))
        silent.listen()
        assert not stack.kafka_answers(silent.getsockname()[1])
