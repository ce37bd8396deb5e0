"""The cluster watcher against the real broker: leaders, configs, LSO, outage."""

from __future__ import annotations

import asyncio
import time

import pytest

from sidecar.tiering.cluster import ClusterUnavailableError, ClusterWatcher, TopicSelector
from tests.helpers import create_topic, produce

pytestmark = pytest.mark.integration


def _watcher(kafka, topic: str) -> ClusterWatcher:
    """Broker 1's watcher of the test stack, tiering ``topic``."""
    return ClusterWatcher(
        bootstrap_servers=[kafka.bootstrap_servers],
        broker_id=1,
        selector=TopicSelector(include=[topic]),
    )


class TestClusterWatcher:
    async def test_refresh_sees_leaders_configs_and_lso(self, kafka, topic_name):
        """After a refresh, this broker leads the new topic and its LSO is the produced count."""
        await create_topic(
            kafka.bootstrap_servers, topic_name, partitions=2, configs={"retention.ms": "3600000"}
        )
        await produce(kafka.bootstrap_servers, topic_name, count=42, value_size=10, partition=1)
        watcher = _watcher(kafka, topic_name)
        try:
            view = await watcher.refresh()
            again = await watcher.refresh()
        finally:
            await watcher.aclose()
        assert view.may_upload(topic_name, 0)
        # nothing changed in between: the same objects, so the engine need not walk everything
        assert again.refreshed_at > view.refreshed_at
        assert again.leaders is view.leaders
        assert again.configs is view.configs
        assert view.lso(topic_name, 1) == 42
        assert view.lso(topic_name, 0) == 0
        assert view.configs[topic_name].retention_ms == 3_600_000
        assert not view.configs[topic_name].remote_storage_enable
        # internal topics are never selected, so no LSO is fetched for them
        assert all(not t.startswith("__") for t, _ in view.last_stable_offsets)

    async def test_the_lso_stops_at_an_open_transaction(self, kafka, topic_name):
        """The LSO is asked of this broker with read_committed: records of a transaction still
        open are past it, in the refresh and in ``fetch_lso``, until the commit."""
        from aiokafka import AIOKafkaProducer

        await create_topic(kafka.bootstrap_servers, topic_name, partitions=1)
        await produce(kafka.bootstrap_servers, topic_name, count=42, value_size=10)
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"{topic_name}-txn"
        )
        watcher = _watcher(kafka, topic_name)
        await producer.start()
        try:
            await producer.begin_transaction()
            for i in range(5):
                await (await producer.send(topic_name, value=f"open-{i}".encode()))
            view = await watcher.refresh()
            assert view.lso(topic_name, 0) == 42
            assert await watcher.fetch_lso(topic_name, 0) == 42
            await producer.commit_transaction()
            # the five records and the commit marker, which the coordinator writes after the
            # commit returns (no event for it: asked again until it is there)
            deadline = time.monotonic() + 60
            while await watcher.fetch_lso(topic_name, 0) != 48:
                assert time.monotonic() < deadline, "the LSO did not pass the commit"
                await asyncio.sleep(0.1)
            assert watcher.view.lso(topic_name, 0) == 48
        finally:
            await producer.stop()
            await watcher.aclose()

    async def test_a_deleted_topic_is_no_longer_tracked_by_the_consumer(self, kafka, topic_name):
        """aiokafka's consumer keeps every topic it was asked about in its metadata updates and
        logs an error for a deleted one at each of them, for good: after the next refresh the
        watcher's consumer tracks only the topics it tiers."""
        from tests.e2e._support import delete_topic

        await create_topic(kafka.bootstrap_servers, topic_name, partitions=1)
        watcher = _watcher(kafka, topic_name)
        try:
            view = await watcher.refresh()
            assert view.lso(topic_name, 0) == 0
            _admin, consumer = await watcher._clients()
            assert consumer._client._topics == {topic_name}
            await delete_topic(kafka.bootstrap_servers, topic_name)
            deadline = time.monotonic() + 60
            while (topic_name, 0) in (await watcher.refresh()).leaders:  # until brokers know
                assert time.monotonic() < deadline, "the deleted topic is still in the metadata"
                await asyncio.sleep(0.2)
            assert watcher.view.lso(topic_name, 0) is None
            assert consumer._client._topics == set()
        finally:
            await watcher.aclose()

    async def test_unreachable_cluster_is_a_typed_error(self):
        """A cluster that does not answer raises ClusterUnavailableError, not a client error."""
        from tests.conftest import stack

        watcher = ClusterWatcher(
            bootstrap_servers=[f"127.0.0.1:{stack.free_port()}"],
            broker_id=1,
            selector=TopicSelector(),
            request_timeout_ms=2000,
        )
        with pytest.raises(ClusterUnavailableError, match="unavailable"):
            await watcher.refresh()
        await watcher.aclose()
        assert watcher.last_error is not None
        assert not watcher.view.fresh
