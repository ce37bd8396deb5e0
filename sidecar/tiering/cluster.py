"""What the cluster says about this broker's partitions: leadership, last stable offsets and topic
configs, from the Kafka protocol only (Metadata, ListOffsets read_committed, DescribeConfigs),
never from ZooKeeper, so it works with KRaft and ZooKeeper clusters alike.

``ClusterWatcher.run`` refreshes a :class:`ClusterView` periodically and on demand; readers get
the latest immutable view. LSOs are asked of this broker itself, and one counts only when it
answers as the partition's leader: another broker's LSO says nothing about this broker's log,
whose tail past a leadership move may hold records the new leader never had (and that this
broker truncates as its follower). When a refresh fails the view is marked stale and, past
``stale_after_s``, :meth:`ClusterView.may_upload` says no: an old leadership picture must not let
two sidecars upload the same partition. ``healthy`` is stricter (the last refresh succeeded): it
feeds readiness, so a Kafka outage shows at once. The topic-selection rule is pure and lives here
too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar._aio import wait_any
from sidecar.errors import SidecarError
from sidecar.observability.logging import get_logger
from sidecar.tiering._clients import AdminAndConsumer

__all__ = [
    "BrokerConfigEntry",
    "BrokerConfigsRefusedError",
    "BrokerTiering",
    "ClusterUnavailableError",
    "ClusterView",
    "ClusterWatcher",
    "TopicConfig",
    "TopicSelector",
    "describe_broker_configs",
    "describe_broker_tiering",
    "describe_topic_configs",
    "own_last_stable_offsets",
]

log = get_logger(__name__)

# the topic configs the sidecar reads (DescribeConfigs), with Kafka's defaults when absent
_CONFIG_KEYS = (
    "remote.storage.enable",
    "remote.log.copy.disable",
    "cleanup.policy",
    "retention.ms",
    "retention.bytes",
    "local.retention.ms",
    "local.retention.bytes",
)


class ClusterUnavailableError(SidecarError):
    """Kafka did not answer a metadata, offsets or configs request."""

    retriable = True


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """The topic configs that decide tiering and remote retention."""

    remote_storage_enable: bool = False
    #: KIP-950 (Kafka 3.9): the broker copies nothing more; what is remote stays readable
    remote_log_copy_disable: bool = False
    cleanup_policy: str = "delete"
    retention_ms: int = 604_800_000
    retention_bytes: int = -1
    #: -2 = use retention.ms / retention.bytes (Kafka's defaults)
    local_retention_ms: int = -2
    local_retention_bytes: int = -2

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @classmethod
    def from_entries(cls, entries: Mapping[str, str | None]) -> TopicConfig:
        def number(key: str, default: int) -> int:
            value = entries.get(key)
            try:
                return int(value) if value is not None else default
            except ValueError:
                return default

        return cls(
            remote_storage_enable=(entries.get("remote.storage.enable") or "").lower() == "true",
            remote_log_copy_disable=(
                (entries.get("remote.log.copy.disable") or "").lower() == "true"
            ),
            cleanup_policy=entries.get("cleanup.policy") or "delete",
            retention_ms=number("retention.ms", 604_800_000),
            retention_bytes=number("retention.bytes", -1),
            local_retention_ms=number("local.retention.ms", -2),
            local_retention_bytes=number("local.retention.bytes", -2),
        )


#: DescribeConfigs' answer for a topic that does not exist (deleted since the metadata)
_UNKNOWN_TOPIC_OR_PARTITION = 3


async def describe_topic_configs(
    admin: Any, topics: Iterable[str], *, refused: dict[str, int] | None = None
) -> dict[str, TopicConfig]:
    """DescribeConfigs of ``topics`` (the keys tiering and retention read) with an aiokafka
    admin client; a topic the broker answers with an error is left out. A topic that is gone
    is left out silently; with ``refused``, every other error (an authorizer's
    TOPIC_AUTHORIZATION_FAILED, say) goes into it, topic → Kafka error code. Kafka errors of
    the request itself propagate to the caller."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    configs: dict[str, TopicConfig] = {}
    resources = [
        ConfigResource(ConfigResourceType.TOPIC, t, dict.fromkeys(_CONFIG_KEYS))
        for t in sorted(topics)
    ]
    if not resources:
        return configs
    for response in await admin.describe_configs(resources):
        for resource in response.to_object()["resources"]:
            if resource["error_code"] != 0:
                if refused is not None and resource["error_code"] != _UNKNOWN_TOPIC_OR_PARTITION:
                    refused[resource["resource_name"]] = resource["error_code"]
                continue
            entries = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
            configs[resource["resource_name"]] = TopicConfig.from_entries(entries)
    return configs


#: the broker's own tiered-storage configs (static, DescribeConfigs of the broker resource)
_BROKER_KEYS = ("remote.log.storage.system.enable", "remote.log.storage.manager.class.name")


#: how often the broker's own configs are asked again, and how long an answer may take
_BROKER_CONFIGS_EVERY_S = 60.0
_BROKER_CONFIGS_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class BrokerTiering:
    """How the broker beside the sidecar tiers: its ``remote.log.storage.system.enable`` and
    the RemoteStorageManager class it loads (``remote.log.storage.manager.class.name``; None
    when unset)."""

    system_enable: bool
    rsm_class: str | None

    def runs(self, plugin_class: str) -> bool:
        """Whether the broker tiers through ``plugin_class``."""
        return self.system_enable and self.rsm_class == plugin_class


class BrokerConfigsRefusedError(ClusterUnavailableError):
    """The broker answered DescribeConfigs of itself with an error (an authorizer without
    DESCRIBE_CONFIGS on the cluster, or not this broker)."""

    retriable = False


@dataclass(frozen=True, slots=True)
class BrokerConfigEntry:
    """One broker property as DescribeConfigs gives it."""

    value: str | None
    #: Kafka does not show the value: a password, or any property it does not define itself
    #: (a plugin's ``rsm.config.*``, ``rlmm.config.*``), which it answers only when it is set
    hidden: bool
    #: Kafka's default: not set in the broker's properties (nor dynamically)
    default: bool


#: DescribeConfigs' config_source for a default value (DescribeConfigsResponse.ConfigSource)
_DEFAULT_CONFIG_SOURCE = 5


async def describe_broker_configs(
    admin: Any, broker_id: int, keys: Iterable[str]
) -> dict[str, BrokerConfigEntry]:
    """DescribeConfigs of broker ``broker_id``'s ``keys``, asked of that broker; a property
    Kafka does not define and the broker does not set is left out. Raises
    :class:`BrokerConfigsRefusedError` when the broker answers with an error; Kafka errors of
    the request itself propagate to the caller."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    resource = ConfigResource(ConfigResourceType.BROKER, str(broker_id), dict.fromkeys(keys))
    found: dict[str, BrokerConfigEntry] = {}
    for response in await admin.describe_configs([resource]):
        for answer in response.to_object()["resources"]:
            if answer["error_code"] != 0:
                message = answer.get("error_message") or ""
                raise BrokerConfigsRefusedError(
                    f"broker {broker_id} refused DescribeConfigs of itself (error"
                    f" {answer['error_code']}{': ' + message if message else ''}); under an"
                    " authorizer the client needs DESCRIBE_CONFIGS on the cluster"
                )
            for entry in answer["config_entries"]:
                found[entry["config_names"]] = BrokerConfigEntry(
                    value=entry["config_value"],
                    hidden=bool(entry.get("is_sensitive")),
                    default=entry.get("config_source") == _DEFAULT_CONFIG_SOURCE,
                )
    return found


async def describe_broker_tiering(admin: Any, broker_id: int) -> BrokerTiering:
    """Broker ``broker_id``'s tiered-storage configs (:func:`describe_broker_configs`)."""
    entries = await describe_broker_configs(admin, broker_id, _BROKER_KEYS)
    enable = entries.get("remote.log.storage.system.enable")
    rsm = entries.get("remote.log.storage.manager.class.name")
    return BrokerTiering(
        system_enable=enable is not None and (enable.value or "").lower() == "true",
        rsm_class=None if rsm is None else rsm.value or None,
    )


#: ListOffsets' isolation level and timestamp for the last stable offset
_READ_COMMITTED = 1
_LATEST = -1

#: ListOffsets' answers from a broker that does not lead the partition (now, or yet):
#: UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER,
#: FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, OFFSET_NOT_AVAILABLE (a new leader whose high
#: watermark has not caught up)
_NOT_LEADING_HERE = frozenset({3, 5, 6, 74, 75, 78})


async def own_last_stable_offsets(
    client: Any, broker_id: int, partitions: Iterable[tuple[str, int]]
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """The LSOs of ``partitions`` that broker ``broker_id`` answers as their leader: one
    ListOffsets (latest, read_committed) sent to that broker with aiokafka's ``client``, never
    routed to whichever broker the client believes leads. Returns (partition → LSO, partition →
    Kafka error code of each one it did not answer). Kafka errors of the request itself
    propagate to the caller."""
    from aiokafka.protocol.offset import OffsetRequest

    by_topic: dict[str, list[tuple[int, int]]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append((partition, _LATEST))
    if not by_topic:
        return {}, {}
    request = OffsetRequest(-1, _READ_COMMITTED, sorted(by_topic.items()))
    response = await client.send(broker_id, request)
    lsos: dict[tuple[str, int], int] = {}
    refused: dict[tuple[str, int], int] = {}
    for topic in response.to_object()["topics"]:
        for answer in topic["partitions"]:
            key = (topic["topic"], answer["partition"])
            if answer["error_code"] != 0:
                refused[key] = answer["error_code"]
            elif answer["offset"] >= 0:
                lsos[key] = int(answer["offset"])
    return lsos, refused


#: topic names whose selection by name is remembered, at most
_MAX_REMEMBERED_TOPICS = 100_000


@dataclass(frozen=True, slots=True)
class TopicSelector:
    """Which topics the sidecar tiers on its own (standalone mode): an include pattern, never an
    exclude pattern, never a compacted topic (Kafka's ``UnifiedLog.isRemoteLogEnabled``).

    A topic with ``remote.storage.enable=true`` is broker-driven: the broker's RLM copies it
    through the plugin and its RLMM publishes the events and runs remote retention, so the
    sidecar never selects it here (the leader computes its copied offset once per leadership
    and would never see the sidecar's own events)."""

    include: Sequence[str] = ()
    exclude: Sequence[str] = (r"__.*",)
    _include_re: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _exclude_re: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    #: topic → whether its name passes the patterns: callers ask per partition (ten thousand
    #: partitions, a few topics), and the patterns never change
    _matches: dict[str, bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include_re", tuple(re.compile(p) for p in self.include))
        object.__setattr__(self, "_exclude_re", tuple(re.compile(p) for p in self.exclude))
        object.__setattr__(self, "_matches", {})

    def selected(self, topic: str, config: TopicConfig | None) -> bool:
        """Whether the sidecar tiers ``topic`` itself: its name passes the patterns, and its
        config (None: unknown) is known to be neither compacted nor broker-driven. A topic
        whose config cannot be read is not tiered: it may be either."""
        if config is None or config.compacted or config.remote_storage_enable:
            return False
        matches = self._matches.get(topic)
        if matches is None:
            matches = not any(p.fullmatch(topic) for p in self._exclude_re) and any(
                p.fullmatch(topic) for p in self._include_re
            )
            if len(self._matches) >= _MAX_REMEMBERED_TOPICS:
                self._matches.clear()  # topics come and go over months
            self._matches[topic] = matches
        return matches

    @staticmethod
    def broker_driven(config: TopicConfig | None) -> bool:
        """The broker tiers this topic through the plugin (``remote.storage.enable=true``)."""
        return config is not None and config.remote_storage_enable

    @staticmethod
    def broker_copies(config: TopicConfig | None) -> bool:
        """The broker's RLM copies this topic's segments through the plugin: broker-driven,
        without ``remote.log.copy.disable=true`` (which keeps the remote data readable and
        deletable but copies nothing more)."""
        return (
            config is not None
            and config.remote_storage_enable
            and not config.remote_log_copy_disable
        )


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One consistent picture of the cluster, as of ``refreshed_at`` (monotonic seconds)."""

    broker_id: int | None
    leaders: Mapping[tuple[str, int], int]
    """(topic, partition) → leader node id (-1 when leaderless)."""
    configs: Mapping[str, TopicConfig]
    last_stable_offsets: Mapping[tuple[str, int], int]
    """LSO of the partitions this broker leads, as this broker answered it as their leader
    (ListOffsets with read_committed)."""
    refreshed_at: float
    stale_after_s: float
    #: the broker's tiered-storage configs; None while unknown (not asked yet, or refused)
    broker_tiering: BrokerTiering | None = None
    #: topics whose configs the brokers refused at the last refresh (topic → Kafka error
    #: code): each keeps the configs of its last good answer in ``configs``, and one never
    #: answered has none, so it is not tiered by the sidecar
    refused_configs: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, broker_id: int | None, stale_after_s: float) -> ClusterView:
        return cls(broker_id, {}, {}, {}, refreshed_at=-1e18, stale_after_s=stale_after_s)

    @property
    def fresh(self) -> bool:
        return time.monotonic() - self.refreshed_at <= self.stale_after_s

    def leads(self, topic: str, partition: int) -> bool:
        return self.broker_id is not None and self.leaders.get((topic, partition)) == self.broker_id

    def lso(self, topic: str, partition: int) -> int | None:
        return self.last_stable_offsets.get((topic, partition))

    def may_upload(self, topic: str, partition: int) -> bool:
        """Only the leader's sidecar uploads, and only on a fresh picture."""
        return self.fresh and self.leads(topic, partition)

    def led_partitions(self) -> list[tuple[str, int]]:
        return sorted(tp for tp, leader in self.leaders.items() if leader == self.broker_id)


def _track_only(consumer: Any, topics: set[str]) -> None:
    """Have the consumer's metadata updates cover just ``topics``. aiokafka tracks every topic
    a consumer was ever asked about and logs an error for each one deleted since, at every
    metadata update, for good; the watcher asks about the topics this broker tiers now."""
    client = getattr(consumer, "_client", None)
    if client is not None and getattr(client, "_topics", None) != topics:
        client.set_topics(sorted(topics))  # a metadata update when a topic is new to it


class ClusterWatcher:
    """Keeps a :class:`ClusterView` current with an aiokafka admin client and consumer."""

    def __init__(
        self,
        *,
        bootstrap_servers: Sequence[str],
        broker_id: int | None,
        selector: TopicSelector,
        plugin_class: str | None = None,
        refresh_interval_s: float = 10.0,
        stale_after_s: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_options: Mapping[str, Any] | None = None,
        on_refresh: Callable[[ClusterView], None] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._on_refresh = on_refresh
        self._on_error = on_error
        self._selector = selector
        self._plugin_class = plugin_class
        #: when the broker's own configs are asked again (static: they change with a restart)
        self._broker_tiering_due = 0.0
        self._interval = refresh_interval_s
        self.view = ClusterView.empty(broker_id, stale_after_s)
        self._stale_after = stale_after_s
        self._wake = asyncio.Event()
        self.refreshed = asyncio.Event()  # set after every successful refresh
        self.last_error: str | None = None
        #: partitions whose LSO this broker refused, not for leadership (logged once)
        self._lso_refused: dict[tuple[str, int], int] = {}
        #: topic → when the broker last asked the plugin to copy one of its segments (monotonic)
        self._copied_by_broker: dict[str, float] = {}
        self._pair = AdminAndConsumer(
            bootstrap_servers=bootstrap_servers,
            client_id="kafka-tiered-sidecar",
            request_timeout_ms=request_timeout_ms,
            client_options=client_options,
        )

    @property
    def broker_id(self) -> int | None:
        return self.view.broker_id

    @property
    def healthy(self) -> bool:
        """The last refresh succeeded and is recent (readiness)."""
        return self.last_error is None and self.view.fresh

    def request_refresh(self) -> None:
        """Ask for a refresh now (e.g. after NotLeader errors or a new partition dir)."""
        self._wake.set()

    async def _clients(self) -> tuple[Any, Any]:
        return await self._pair.get()

    async def aclose(self) -> None:
        await self._pair.aclose()

    async def refresh(self) -> ClusterView:
        """Fetch leaders, configs and LSOs; raises ClusterUnavailableError on failure."""
        from aiokafka.errors import KafkaError

        # the picture is as old as its first answer, not its last: the later requests may
        # take seconds, and freshness (and the handover to a new leader) counts from here
        asked_at = time.monotonic()
        try:
            admin, consumer = await self._clients()
            metadata = (await admin._get_cluster_metadata(topics=None)).to_object()
            leaders: dict[tuple[str, int], int] = {}
            for topic in metadata["topics"]:
                if topic["error_code"] != 0:
                    continue
                for p in topic["partitions"]:
                    leaders[(topic["topic"], p["partition"])] = p["leader"]
            topics = sorted({t for t, _ in leaders})
            refused: dict[str, int] = {}
            configs = await describe_topic_configs(admin, topics, refused=refused)
            configs.update(
                {t: self.view.configs[t] for t in refused if t in self.view.configs}
            )  # an answer refused now: the topic's configs as last read
            self._apply_broker_copies(configs, refused, asked_at)
            broker_id = self.view.broker_id
            # the LSOs of the partitions this broker copies (standalone) or stages ahead of
            # the broker's copies (broker-driven): one request, not one per partition
            mine = [
                (t, p)
                for (t, p), leader in leaders.items()
                if leader == broker_id
                and (
                    self._selector.selected(t, configs.get(t))
                    or self._selector.broker_copies(configs.get(t))
                )
            ]
            _track_only(consumer, {t for t, _ in mine})
            lsos: dict[tuple[str, int], int] = {}
            if mine and broker_id is not None:
                # asked of this broker: the leaders above may be out of date already
                lsos, lso_refused = await own_last_stable_offsets(consumer._client, broker_id, mine)
                self._report_lso_refused(lso_refused)
            broker_tiering = self.view.broker_tiering
            live = {b["node_id"] for b in metadata["brokers"]}
            if broker_id not in live:
                # away (a restart, perhaps with new properties): asked as soon as it is back
                self._broker_tiering_due = 0.0
            elif (
                broker_id is not None
                and self._plugin_class is not None
                and time.monotonic() >= self._broker_tiering_due
            ):
                broker_tiering = await self._broker_tiering(admin, broker_id)
        except (KafkaError, OSError, TimeoutError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            await self.aclose()  # reconnect from scratch next time
            raise ClusterUnavailableError(f"Kafka cluster unavailable: {self.last_error}") from exc
        if self.last_error is not None:
            log.info("cluster_refresh_recovered", after=self.last_error)
        self.last_error = None
        # again: a copy call noted while the LSOs and the broker's configs were asked changed
        # the view this one replaces
        self._apply_broker_copies(configs, refused, asked_at)
        previous = self.view
        if refused != previous.refused_configs:
            self._report_refused(refused, previous.refused_configs, previous.configs)
        self.view = ClusterView(
            broker_id=broker_id,
            # the same objects when nothing changed: the engine walks every partition again
            # only when leaders or configs did (at thousands of partitions, not every refresh)
            leaders=previous.leaders if leaders == previous.leaders else leaders,
            configs=previous.configs if configs == previous.configs else configs,
            last_stable_offsets=lsos,
            refreshed_at=asked_at,
            stale_after_s=self._stale_after,
            broker_tiering=broker_tiering,
            refused_configs=refused,
        )
        self.refreshed.set()
        if self._on_refresh is not None:
            self._on_refresh(self.view)
        return self.view

    @staticmethod
    def _report_refused(
        refused: Mapping[str, int], before: Mapping[str, int], known: Mapping[str, TopicConfig]
    ) -> None:
        """One log line when the topics whose configs are refused change (not at every
        refresh): which, with what error, and what that means for tiering them."""
        new = sorted(t for t in refused if t not in before)
        if new:
            log.warning(
                "topic_configs_refused",
                topics=new[:20],
                count=len(new),
                error_codes=sorted({refused[t] for t in new}),
                kept_last_known=[t for t in new[:20] if t in known],
                consequence="a topic whose configs were never read is not tiered by the sidecar"
                " (it may be compacted or broker-driven); one read before keeps those configs",
                fix="allow DESCRIBE_CONFIGS on the topics to the sidecar's Kafka principal",
            )
        readable = sorted(t for t in before if t not in refused)
        if readable:
            log.info("topic_configs_readable_again", topics=readable[:20], count=len(readable))

    def _report_lso_refused(self, refused: Mapping[tuple[str, int], int]) -> None:
        """Log the partitions whose LSO this broker did not give: at debug level when it does
        not lead them (a leadership move the next Metadata shows), and once as a warning when
        it refuses others for another reason (an authorizer, say), which stops their
        tiering."""
        moved = sorted(tp for tp, code in refused.items() if code in _NOT_LEADING_HERE)
        if moved:
            log.debug("lso_not_led_here", partitions=moved[:20], count=len(moved))
        other = {tp: code for tp, code in refused.items() if code not in _NOT_LEADING_HERE}
        new = sorted(tp for tp in other if tp not in self._lso_refused)
        if new:
            log.warning(
                "lso_refused",
                partitions=new[:20],
                count=len(new),
                error_codes=sorted({other[tp] for tp in new}),
                consequence="a partition without its LSO is not tiered",
            )
        self._lso_refused = other

    async def _broker_tiering(self, admin: Any, broker_id: int) -> BrokerTiering | None:
        """This broker's tiered-storage configs, asked of the broker itself once a minute; the
        last answer when it is down (its partitions are led elsewhere meanwhile) or refuses."""
        from aiokafka.errors import KafkaError

        try:
            # bounded: a slow answer must not hold up the leadership picture
            async with asyncio.timeout(_BROKER_CONFIGS_TIMEOUT_S):
                answer = await describe_broker_tiering(admin, broker_id)
        except BrokerConfigsRefusedError as exc:
            # an authorizer refuses again: asked again a minute on
            self._broker_tiering_due = time.monotonic() + _BROKER_CONFIGS_EVERY_S
            log.debug("broker_configs_refused", broker_id=broker_id, error=str(exc))
            return self.view.broker_tiering
        except (KafkaError, OSError, TimeoutError) as exc:
            log.debug("broker_configs_unavailable", broker_id=broker_id, error=str(exc))
            return self.view.broker_tiering  # asked again at the next refresh
        self._broker_tiering_due = time.monotonic() + _BROKER_CONFIGS_EVERY_S
        return answer

    @property
    def broker_runs_plugin(self) -> bool | None:
        """Whether the broker beside this sidecar tiers through the sidecar's plugin (its
        RemoteStorageManager class); None while unknown."""
        tiering = self.view.broker_tiering
        if tiering is None or self._plugin_class is None:
            return None
        return tiering.runs(self._plugin_class)

    async def fetch_lso(self, topic: str, partition: int) -> int | None:
        """This broker's LSO of one partition now, asked of this broker itself (one
        ListOffsets, read_committed) and merged into the view; None when it does not answer as
        the leader (a refresh is asked for: the view's leaders are out of date) or Kafka does
        not answer (the periodic refresh reports that)."""
        from aiokafka.errors import KafkaError

        broker_id = self.view.broker_id
        if broker_id is None:
            return None
        key = (topic, partition)
        try:
            _, consumer = await self._clients()
            lsos, refused = await own_last_stable_offsets(consumer._client, broker_id, [key])
        except (KafkaError, OSError, TimeoutError) as exc:
            log.debug("lso_fetch_failed", topic=topic, partition=partition, error=str(exc))
            return None
        lso = lsos.get(key)
        if lso is None:
            code = refused.get(key)
            log.debug("lso_not_answered", topic=topic, partition=partition, error_code=code)
            if code in _NOT_LEADING_HERE:
                self.request_refresh()
            return None
        view = self.view
        if lso > view.last_stable_offsets.get(key, -1):
            self.view = dataclasses.replace(
                view, last_stable_offsets={**view.last_stable_offsets, key: lso}
            )
        return lso

    def note_broker_copy(self, topic: str) -> None:
        """The broker asked the plugin to copy a segment of ``topic``: its RLM tiers the topic,
        whatever the last config read says (a refresh behind the change, or DescribeConfigs
        refused). Until a config answer asked after this says otherwise, the topic counts as
        broker-driven: the sidecar copies, repairs and expires none of it. Its crash repair
        would otherwise take the broker's copy in flight (COPY_SEGMENT_STARTED under the same
        broker id) for its own and delete it, and the broker then deletes its local segment."""
        self._copied_by_broker[topic] = time.monotonic()
        view = self.view
        config = view.configs.get(topic)
        if config is None or config.remote_storage_enable:
            return  # never tiered here, or already broker-driven
        log.warning(
            "topic_copied_by_broker",
            topic=topic,
            detail="the broker copies this topic through the plugin while its last config"
            " read says remote.storage.enable=false: it is left to the broker until a config"
            " read says otherwise",
        )
        configs = dict(view.configs)
        configs[topic] = dataclasses.replace(config, remote_storage_enable=True)
        self.view = dataclasses.replace(view, configs=configs)
        self.request_refresh()

    def _apply_broker_copies(
        self, configs: dict[str, TopicConfig], refused: Mapping[str, int], asked_at: float
    ) -> None:
        """Make the topics the broker copies broker-driven in ``configs`` (a refresh asked at
        ``asked_at``): those whose answer is refused, or older than the broker's copy call. An
        answer asked after the copy call decides from then on."""
        for topic, noted_at in list(self._copied_by_broker.items()):
            if topic not in refused and noted_at < asked_at:
                del self._copied_by_broker[topic]
                continue
            config = configs.get(topic)
            if config is not None and not config.remote_storage_enable:
                configs[topic] = dataclasses.replace(config, remote_storage_enable=True)

    def selected(self, topic: str) -> bool:
        return self._selector.selected(topic, self.view.configs.get(topic))

    def broker_driven(self, topic: str) -> bool:
        """The broker tiers ``topic`` through the plugin (``remote.storage.enable=true``)."""
        return self._selector.broker_driven(self.view.configs.get(topic))

    def tiered(self, topic: str) -> bool:
        """``topic`` is tiered: by the sidecar (selected) or by the broker (broker-driven)."""
        return self.tiering_mode(topic) is not None

    def tiering_mode(self, topic: str) -> str | None:
        """How ``topic`` is tiered: ``standalone`` (the sidecar copies it), ``broker-driven``
        (the broker copies it through the plugin), ``copy-disabled`` (broker-driven with
        ``remote.log.copy.disable=true``: its remote data is read and expired, nothing more is
        copied), or None (not tiered)."""
        config = self.view.configs.get(topic)
        if self._selector.selected(topic, config):
            return "standalone"
        if self._selector.broker_copies(config):
            return "broker-driven"
        if self._selector.broker_driven(config):
            return "copy-disabled"
        return None

    def broker_copies(self, topic: str) -> bool:
        """The broker copies ``topic``'s segments through the plugin (broker-driven, copy not
        disabled): what the eager upload stages ahead of its copy calls."""
        return self._selector.broker_copies(self.view.configs.get(topic))

    async def run(self, stopping: asyncio.Event) -> None:
        """Root task: refresh every ``refresh_interval_s`` or when asked; back off on errors."""
        backoff = 0.5
        try:
            while not stopping.is_set():
                self._wake.clear()
                try:
                    await self.refresh()
                    backoff = 0.5
                    delay = self._interval
                except ClusterUnavailableError as exc:
                    log.warning("cluster_refresh_failed", error=str(exc), retry_in_s=backoff)
                    if self._on_error is not None:
                        self._on_error(str(exc))
                    delay = backoff
                    backoff = min(backoff * 2, self._interval)
                await wait_any(stopping, self._wake, within=delay)
        finally:
            await self.aclose()
