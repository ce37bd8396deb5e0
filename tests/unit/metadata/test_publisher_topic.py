"""The metadata topic as the publisher creates it (a fake admin client records the request)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.admin import NewTopic

from sidecar.metadata.publisher import MetadataPublisher


class _RecordingAdmin:
    def __init__(self) -> None:
        self.created: list[NewTopic] = []

    async def create_topics(self, topics: list[NewTopic]) -> Any:
        self.created.extend(topics)
        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in topics])


async def _created(**kwargs: Any) -> dict[str, str]:
    publisher = MetadataPublisher(bootstrap_servers="127.0.0.1:9", broker_id=1, **kwargs)
    admin = _RecordingAdmin()
    await publisher._create_topic(admin)  # type: ignore[arg-type]
    (topic,) = admin.created
    return dict(topic.topic_configs)


class TestCreatedTopic:
    async def test_kafkas_configs_and_two_replicas_to_acknowledge(self) -> None:
        """As Kafka 4.3's metadata manager creates it: an event is acknowledged (acks=all) only
        once two replicas hold it, not the broker's default of one."""
        configs = await _created(replication_factor=3)
        assert configs == {
            "retention.ms": "-1",
            "cleanup.policy": "delete",
            "remote.storage.enable": "false",
            "min.insync.replicas": "2",
        }

    @pytest.mark.parametrize(("replicas", "min_isr", "expected"), [(1, 2, "1"), (5, 3, "3")])
    async def test_min_isr_is_at_most_the_replication_factor(
        self, replicas: int, min_isr: int, expected: str
    ) -> None:
        """One broker: its one replica acknowledges (more could never be in sync)."""
        configs = await _created(replication_factor=replicas, min_isr=min_isr)
        assert configs["min.insync.replicas"] == expected

    def test_min_isr_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="min_isr"):
            MetadataPublisher(bootstrap_servers="127.0.0.1:9", broker_id=1, min_isr=0)
