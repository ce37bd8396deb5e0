"""Topic selection and the upload guard of the cluster view (pure rules)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiokafka.admin.config_resource import ConfigResourceType
from aiokafka.errors import KafkaConnectionError
from structlog.testing import capture_logs

from sidecar.tiering import cluster as cluster_module
from sidecar.tiering.cluster import (
    BrokerTiering,
    ClusterView,
    ClusterWatcher,
    TopicConfig,
    TopicSelector,
)
from tests.unit.tiering.test_cluster_lso import Brokers


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
            # its configs could not be read: it may be compacted or broker-driven
            pytest.param("logs.app", None, False, id="unknown-config-not-tiered"),
        ],
    )
    def test_selection(self, topic, config, expected):
        """An include pattern selects; excludes, compaction, remote.storage.enable=true (the
        broker tiers those through the plugin) and unknown configs win."""
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
            assert not selector.selected("orders", TopicConfig())
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


class _Response:
    def __init__(self, obj: dict[str, Any]) -> None:
        self._obj = obj

    def to_object(self) -> dict[str, Any]:
        return self._obj


class _Admin:
    """Answers Metadata (broker 1 leads ``orders-0``, broker 1 live unless ``down``) and
    DescribeConfigs (the topic's configs; the broker's as ``broker`` says: a dict of entries,
    an error code, or an exception to raise)."""

    def __init__(self, broker: dict[str, str] | int | Exception) -> None:
        self.broker = broker
        self.down = False
        self.broker_asks = 0

    async def _get_cluster_metadata(self, topics: object) -> _Response:
        self.metadata_at = time.monotonic()
        brokers = [] if self.down else [{"node_id": 1}]
        partitions = [{"partition": 0, "leader": 1}]
        topic = {"topic": "orders", "error_code": 0, "partitions": partitions}
        return _Response({"brokers": brokers, "topics": [topic]})

    async def describe_configs(self, resources: list[Any]) -> list[_Response]:
        (resource,) = resources
        if resource.resource_type == ConfigResourceType.TOPIC:
            entries = [{"config_names": "remote.storage.enable", "config_value": "true"}]
            answer = {"error_code": 0, "resource_name": "orders", "config_entries": entries}
            return [_Response({"resources": [answer]})]
        self.broker_asks += 1
        assert resource.name == "1"
        assert sorted(resource.configs) == [
            "remote.log.storage.manager.class.name",
            "remote.log.storage.system.enable",
        ]
        if isinstance(self.broker, Exception):
            raise self.broker
        if isinstance(self.broker, int):
            answer = {"error_code": self.broker, "resource_name": "1", "config_entries": []}
        else:
            entries = [{"config_names": k, "config_value": v} for k, v in self.broker.items()]
            answer = {"error_code": 0, "resource_name": "1", "config_entries": entries}
        return [_Response({"resources": [answer]})]


def _watcher(admin: _Admin, monkeypatch: pytest.MonkeyPatch) -> ClusterWatcher:
    watcher = ClusterWatcher(
        bootstrap_servers=["127.0.0.1:1"],
        broker_id=1,
        selector=TopicSelector(),
        plugin_class="org.example.Plugin",
    )

    async def clients() -> tuple[Any, Any]:
        return admin, Brokers({("orders", 0): 42})

    monkeypatch.setattr(watcher, "_clients", clients)
    return watcher


class TestBrokerTiering:
    async def test_the_brokers_rsm_class_says_whether_it_runs_the_plugin(self, monkeypatch):
        """The broker's remote.log.storage.* configs, asked of the broker: the plugin's class
        with the system enabled is the plugin; another class, or tiering off, is not."""
        plugin = {
            "remote.log.storage.system.enable": "true",
            "remote.log.storage.manager.class.name": "org.example.Plugin",
        }
        admin = _Admin(plugin)
        watcher = _watcher(admin, monkeypatch)
        assert watcher.broker_runs_plugin is None  # not asked yet
        view = await watcher.refresh()
        assert view.broker_tiering == BrokerTiering(True, "org.example.Plugin")
        assert watcher.broker_runs_plugin is True
        for broker in (
            {**plugin, "remote.log.storage.manager.class.name": "org.example.OtherRsm"},
            {**plugin, "remote.log.storage.system.enable": "false"},
            {"remote.log.storage.system.enable": "true"},
        ):
            admin.broker = broker
            watcher._broker_tiering_due = 0.0  # the configs are asked once a minute
            await watcher.refresh()
            assert watcher.broker_runs_plugin is False, broker
        assert watcher.view.broker_tiering == BrokerTiering(True, None)

    async def test_a_broker_driven_partition_led_here_gets_its_lso_with_the_refresh(
        self, monkeypatch
    ):
        """The stager needs the LSO of every broker-driven partition this broker leads: the
        refresh asks for them in its one ListOffsets, not the stager one by one."""
        view = await _watcher(_Admin({}), monkeypatch).refresh()
        assert view.configs["orders"].remote_storage_enable
        assert view.lso("orders", 0) == 42

    async def test_the_picture_is_as_old_as_its_first_answer(self, monkeypatch):
        """The later requests of a refresh may take seconds: freshness (and so the hand-over
        of a partition to a new leader) counts from before the leaders were read."""
        admin = _Admin({"remote.log.storage.system.enable": "false"})
        view = await _watcher(admin, monkeypatch).refresh()
        assert view.refreshed_at <= admin.metadata_at

    async def test_a_broker_that_refuses_or_is_down_keeps_the_last_answer(self, monkeypatch):
        """An authorizer's refusal, a failed request or a broker missing from the metadata
        leave the last answer (unknown at first), and never fail the refresh: leadership and
        LSOs do not wait on the broker's own configs."""
        admin = _Admin(31)  # CLUSTER_AUTHORIZATION_FAILED
        watcher = _watcher(admin, monkeypatch)
        view = await watcher.refresh()
        assert view.leads("orders", 0)
        assert view.broker_tiering is None
        assert watcher.broker_runs_plugin is None
        admin.broker = {"remote.log.storage.system.enable": "true"}
        await watcher.refresh()
        assert admin.broker_asks == 1  # a refusal stands for a minute, as an answer does
        watcher._broker_tiering_due = 0.0
        await watcher.refresh()
        assert watcher.broker_runs_plugin is False
        asks = admin.broker_asks
        watcher._broker_tiering_due = 0.0
        admin.broker = KafkaConnectionError("broker 1 gone")
        await watcher.refresh()
        assert watcher.broker_runs_plugin is False
        await watcher.refresh()  # a failed ask is repeated at the next refresh
        assert admin.broker_asks == asks + 2
        admin.down = True
        admin.broker = {}
        await watcher.refresh()
        assert admin.broker_asks == asks + 2  # not asked while it is not in the metadata
        assert watcher.view.broker_tiering == BrokerTiering(True, None)

    async def test_a_broker_back_from_a_restart_is_asked_at_once(self, monkeypatch):
        """A broker reads its properties at start: once it is back in the metadata after
        leaving it, its configs are asked at the next refresh, not a minute later."""
        plugin = {
            "remote.log.storage.system.enable": "true",
            "remote.log.storage.manager.class.name": "org.example.Plugin",
        }
        admin = _Admin({"remote.log.storage.system.enable": "true"})
        watcher = _watcher(admin, monkeypatch)
        await watcher.refresh()
        assert watcher.broker_runs_plugin is False
        admin.down = True
        await watcher.refresh()
        admin.down = False
        admin.broker = plugin
        await watcher.refresh()
        assert admin.broker_asks == 2
        assert watcher.broker_runs_plugin is True

    async def test_without_a_plugin_class_the_broker_is_never_asked(self, monkeypatch):
        admin = _Admin({})
        watcher = _watcher(admin, monkeypatch)
        watcher._plugin_class = None
        await watcher.refresh()
        assert admin.broker_asks == 0
        assert watcher.broker_runs_plugin is None


class _TopicAdmin(_Admin):
    """Answers DescribeConfigs of ``orders`` with ``topic``: its config entries, or a Kafka
    error code."""

    def __init__(self, topic: dict[str, str] | int) -> None:
        super().__init__({})
        self.topic = topic

    async def describe_configs(self, resources: list[Any]) -> list[_Response]:
        (resource,) = resources
        if resource.resource_type != ConfigResourceType.TOPIC:
            return await super().describe_configs(resources)
        if isinstance(self.topic, int):
            answer = {"error_code": self.topic, "resource_name": "orders", "config_entries": []}
        else:
            entries = [{"config_names": k, "config_value": v} for k, v in self.topic.items()]
            answer = {"error_code": 0, "resource_name": "orders", "config_entries": entries}
        return [_Response({"resources": [answer]})]


class TestRefusedTopicConfigs:
    """A topic whose configs an authorizer refuses (TOPIC_AUTHORIZATION_FAILED) may be
    compacted or broker-driven: one never read is not tiered by the sidecar, one read before
    keeps those configs, and each change is logged once."""

    @staticmethod
    def _watcher(admin: _Admin, monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterWatcher, Brokers]:
        watcher = ClusterWatcher(
            bootstrap_servers=["127.0.0.1:1"], broker_id=1, selector=TopicSelector(include=[".*"])
        )
        ends = Brokers({("orders", 0): 100})

        async def clients() -> tuple[Any, Any]:
            return admin, ends

        monkeypatch.setattr(watcher, "_clients", clients)
        return watcher, ends

    async def test_a_topic_never_read_is_not_tiered(self, monkeypatch):
        admin = _TopicAdmin(29)
        watcher, ends = self._watcher(admin, monkeypatch)
        with capture_logs() as logs:
            view = await watcher.refresh()
            await watcher.refresh()
        assert view.leads("orders", 0)
        assert "orders" not in view.configs
        assert view.refused_configs == {"orders": 29}
        assert not watcher.selected("orders")
        assert watcher.tiering_mode("orders") is None
        assert view.lso("orders", 0) is None
        assert ends.asked == []  # no LSO asked: nothing of it will be uploaded
        refused = [e for e in logs if e["event"] == "topic_configs_refused"]
        assert [(e["topics"], e["error_codes"], e["kept_last_known"]) for e in refused] == [
            (["orders"], [29], [])
        ]  # once, not at every refresh

    async def test_a_topic_read_before_keeps_its_configs(self, monkeypatch):
        admin = _TopicAdmin({"cleanup.policy": "compact"})
        watcher, _ = self._watcher(admin, monkeypatch)
        await watcher.refresh()
        assert not watcher.selected("orders")  # compacted
        admin.topic = 29
        with capture_logs() as logs:
            view = await watcher.refresh()
        assert view.configs["orders"].compacted  # not tiered as a plain topic
        assert not watcher.selected("orders")
        assert [e["kept_last_known"] for e in logs if e["event"] == "topic_configs_refused"] == [
            ["orders"]
        ]
        admin.topic = {}
        with capture_logs() as logs:
            view = await watcher.refresh()
        assert view.refused_configs == {}
        assert watcher.selected("orders")  # its configs now say it is a plain topic
        assert view.lso("orders", 0) == 100
        assert [e["event"] for e in logs] == ["topic_configs_readable_again"]

    async def test_a_topic_gone_is_not_refused(self, monkeypatch):
        watcher, _ = self._watcher(_TopicAdmin(3), monkeypatch)  # UNKNOWN_TOPIC_OR_PARTITION
        with capture_logs() as logs:
            view = await watcher.refresh()
        assert view.refused_configs == {}
        assert not [e for e in logs if e["event"] == "topic_configs_refused"]


class TestBrokerCopies:
    """A copy call from the broker proves that its RLM tiers the topic: the topic is
    broker-driven from then on, whatever a config read asked before it (or refused) says, so
    the sidecar's own copies and crash repair (which would delete the broker's copy in flight,
    STARTED under the same broker id) leave it alone."""

    async def test_a_copy_call_makes_a_standalone_topic_broker_driven(self, monkeypatch):
        admin = _TopicAdmin({})
        watcher, _ = TestRefusedTopicConfigs._watcher(admin, monkeypatch)
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "standalone"
        with capture_logs() as logs:
            watcher.note_broker_copy("orders")
        assert not watcher.selected("orders")
        assert watcher.tiering_mode("orders") == "broker-driven"
        assert [e["event"] for e in logs] == ["topic_copied_by_broker"]
        admin.topic = 29  # refused: the copy call still decides
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "broker-driven"
        admin.topic = {}  # asked after the copy call: the topic was turned off since
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "standalone"

    async def test_an_answer_asked_before_the_copy_call_does_not_undo_it(self, monkeypatch):
        admin = _TopicAdmin({})
        watcher, _ = TestRefusedTopicConfigs._watcher(admin, monkeypatch)
        await watcher.refresh()
        answer = admin.describe_configs

        async def copy_call_meanwhile(resources: list[Any]) -> list[_Response]:
            watcher.note_broker_copy("orders")  # the broker's copy arrives during the refresh
            return await answer(resources)

        monkeypatch.setattr(admin, "describe_configs", copy_call_meanwhile)
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "broker-driven"
        monkeypatch.setattr(admin, "describe_configs", answer)
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "standalone"

    async def test_a_copy_call_while_the_lsos_are_asked_is_kept(self, monkeypatch):
        """The copy call comes after the refresh read the configs, while it asks the LSOs: the
        view the refresh ends with still counts the topic as broker-driven (the copy call is
        newer than the config answer)."""
        admin = _TopicAdmin({})
        watcher, _ = TestRefusedTopicConfigs._watcher(admin, monkeypatch)
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "standalone"
        asked = cluster_module.own_last_stable_offsets

        async def copy_call_meanwhile(*args: Any) -> Any:
            watcher.note_broker_copy("orders")
            return await asked(*args)

        monkeypatch.setattr(cluster_module, "own_last_stable_offsets", copy_call_meanwhile)
        await watcher.refresh()
        assert watcher.tiering_mode("orders") == "broker-driven"
        monkeypatch.setattr(cluster_module, "own_last_stable_offsets", asked)
        await watcher.refresh()  # asked after the copy call: its answer decides
        assert watcher.tiering_mode("orders") == "standalone"
