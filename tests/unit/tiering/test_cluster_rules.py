"""Topic selection and the upload guard of the cluster view (pure rules)."""

from __future__ import annotations

import time

import pytest

from sidecar.tiering.cluster import ClusterView, TopicConfig, TopicSelector


class TestTopicSelector:
    @pytest.mark.parametrize(
        ("topic", "config", "expected"),
        [
            pytest.param(
                "orders", TopicConfig(remote_storage_enable=True), False, id="broker-driven"
            ),
            pytest.param(
                "logs.app", TopicConfig(remote_storage_enable=True), False, id="broker-driven-inc"
            ),
            pytest.param("orders", TopicConfig(), False, id="not-enabled"),
            pytest.param("logs.app", TopicConfig(), True, id="include-pattern"),
            pytest.param(
                "__consumer_offsets",
                TopicConfig(remote_storage_enable=True),
                False,
                id="internal-excluded",
            ),
            pytest.param(
                "logs.app", TopicConfig(cleanup_policy="compact,delete"), False, id="compacted"
            ),
            pytest.param("logs.app", None, True, id="unknown-config-include"),
        ],
    )
    def test_selection(self, topic, config, expected):
        """An include pattern selects; excludes, compaction and remote.storage.enable=true (the
        broker tiers those through the plugin) win."""
        selector = TopicSelector(include=[r"logs\..*"])
        assert selector.selected(topic, config) is expected
        assert TopicSelector.broker_driven(config) is bool(config and config.remote_storage_enable)

    def test_a_topic_name_is_matched_once(self, monkeypatch):
        """Callers ask per partition: the patterns run once per topic name, while the config
        (compaction, remote.storage.enable) is looked at on every call."""
        selector = TopicSelector(include=[r"logs\..*"])
        runs: list[str] = []
        include = selector._include_re[0]

        class Counting:
            def fullmatch(self, topic: str) -> object:
                runs.append(topic)
                return include.fullmatch(topic)

        object.__setattr__(selector, "_include_re", (Counting(),))
        for _ in range(3):
            assert selector.selected("logs.app", TopicConfig())
            assert not selector.selected("logs.app", TopicConfig(cleanup_policy="compact"))
            assert not selector.selected("orders", None)
        assert runs == ["logs.app", "orders"]

    def test_config_parsing_defaults(self):
        """Absent or malformed config values fall back to Kafka's defaults."""
        config = TopicConfig.from_entries({"retention.ms": "abc", "remote.storage.enable": "TRUE"})
        assert config.remote_storage_enable is True
        assert config.retention_ms == 604_800_000
        assert config.retention_bytes == -1


class TestClusterView:
    def _view(self, refreshed_at: float) -> ClusterView:
        return ClusterView(
            broker_id=1,
            leaders={("t", 0): 1, ("t", 1): 2},
            configs={},
            last_stable_offsets={("t", 0): 10},
            refreshed_at=refreshed_at,
            stale_after_s=5,
        )

    def test_only_the_leader_uploads(self):
        """A fresh view lets this broker upload only the partitions it leads."""
        view = self._view(time.monotonic())
        assert view.may_upload("t", 0)
        assert not view.may_upload("t", 1)
        assert not view.may_upload("t", 2)
        assert view.led_partitions() == [("t", 0)]

    def test_stale_view_stops_uploads(self):
        """A view older than stale_after_s forbids uploads even for led partitions."""
        view = self._view(time.monotonic() - 60)
        assert view.leads("t", 0)
        assert not view.may_upload("t", 0)

    def test_unknown_broker_leads_nothing(self):
        """Without a broker id, nothing is led."""
        assert not ClusterView.empty(None, 5).leads("t", 0)
