"""``sidecar broker-config``: the broker properties that make Kafka tier through this sidecar
(broker-driven mode). Paste them into the broker's ``server.properties``; topics then opt in with
``remote.storage.enable=true`` (and ``local.retention.*`` for the local tier's size).

The broker runs the plugin (``deploy/kafka-plugin``) as its RemoteStorageManager, pointed at this
sidecar's read socket, and Kafka's own TopicBasedRemoteLogMetadataManager with the metadata topic
settings the sidecar tails (same topic, same partition count, so both place a partition's events
alike).

``sidecar broker-config --check`` asks the running broker (DescribeConfigs of itself) whether it
has those properties. Kafka shows the values of the properties it defines; a plugin's
``rsm.config.*`` and the metadata manager's ``rlmm.config.*`` come back only when set, their
values hidden, so for those the check can only say that they are set."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal, TextIO

from sidecar.config import SidecarConfig
from sidecar.errors import CommandError, ConfigError
from sidecar.tiering.cluster import BrokerConfigEntry

__all__ = [
    "DEFAULT_PLUGIN_JAR",
    "PLUGIN_CLASS",
    "PropertyCheck",
    "broker_config_command",
    "broker_properties",
    "check_properties",
]

PLUGIN_CLASS: Final = "io.github.kafkatieredsidecar.plugin.SidecarRemoteStorageManager"
RLMM_CLASS: Final = (
    "org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager"
)
#: where the container image holds the plugin jar, and where brokers find it: the Helm chart
#: mounts the init container's copy there, systemd hosts install it there
DEFAULT_PLUGIN_JAR: Final = Path("/opt/kafka-tiered-sidecar/plugin/kafka-tiered-sidecar-plugin.jar")
#: the topic Kafka's TopicBasedRemoteLogMetadataManager uses; it has no setting to change it
KAFKA_METADATA_TOPIC: Final = "__remote_log_metadata"


def broker_properties(
    config: SidecarConfig,
    *,
    plugin_jar: Path = DEFAULT_PLUGIN_JAR,
    listener: str = "PLAINTEXT",
    tcp: bool = False,
) -> dict[str, str]:
    """The broker properties, in the order they are printed."""
    from sidecar.readserver.app import socket_path_for

    meta = config.remote_log_metadata
    if meta.topic != KAFKA_METADATA_TOPIC:
        raise ConfigError(
            f"remote_log_metadata.topic is {meta.topic!r}, but Kafka's metadata manager always"
            f" uses {KAFKA_METADATA_TOPIC!r}: broker-driven tiering needs the default topic"
        )
    props = {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": PLUGIN_CLASS,
        "remote.log.storage.manager.class.path": str(plugin_jar),
    }
    if tcp:
        if config.read_server.tcp_port is None:
            raise ConfigError("--tcp needs read_server.tcp_port to be set")
        props["rsm.config.tcp.port"] = str(config.read_server.tcp_port)
    else:
        props["rsm.config.socket.path"] = str(socket_path_for(config))
    if not config.read_server.offer_cache_files:
        props["rsm.config.fetch.files"] = "false"  # it would only ask in vain
    props |= {
        "rsm.config.read.idle.timeout.ms": str(_plugin_ms(config.read_server.fetch_timeout_s)),
        "remote.log.metadata.manager.class.name": RLMM_CLASS,
        "remote.log.metadata.manager.listener.name": listener,
        "rlmm.config.remote.log.metadata.topic.num.partitions": str(meta.num_partitions),
        "rlmm.config.remote.log.metadata.topic.replication.factor": str(meta.replication_factor),
        "rlmm.config.remote.log.metadata.topic.retention.ms": str(meta.retention_ms),
    }
    return props


def _plugin_ms(seconds: float) -> int:
    """``seconds`` as the plugin's millisecond settings take them: a positive Java int (it
    refuses 0, which a fraction of a millisecond would round down to, and more)."""
    return min(max(1, math.ceil(seconds * 1000)), 2**31 - 1)


def broker_config_command(
    config: SidecarConfig,
    *,
    plugin_jar: Path,
    listener: str,
    tcp: bool,
    out: TextIO,
    check: bool = False,
    broker_id: int | None = None,
    as_json: bool = False,
) -> int:
    """Print the broker properties; with ``check``, compare the running broker's with them
    instead (:func:`_check_command`)."""
    props = broker_properties(config, plugin_jar=plugin_jar, listener=listener, tcp=tcp)
    if check:
        return _check_command(config, props, broker_id=broker_id, as_json=as_json, out=out)
    out.write(
        "# Broker-driven tiered storage through kafka-tiered-sidecar; then, per topic:\n"
        "#   remote.storage.enable=true  local.retention.ms=...  local.retention.bytes=...\n"
    )
    if config.read_server.offer_cache_files:
        out.write(_CACHE_NOTE.format(directory=_broker_cache_dir(config)))
    for key, value in props.items():
        out.write(f"{key}={value}\n")
    if config.kafka.security_protocol != "PLAINTEXT":
        out.write(_SECURED_NOTE.format(protocol=config.kafka.security_protocol, listener=listener))
        for key in _SECURED_KEYS[config.kafka.security_protocol]:
            out.write(f"# {_RLMM_CLIENT}{key}=\n")
    return 0


_RLMM_CLIENT: Final = "rlmm.config.remote.log.metadata.common.client."
#: what Kafka's metadata manager's clients need on a secured listener: the broker gives them
#: only the listener's bootstrap.servers and security.protocol, none of its credentials
_SECURED_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "SSL": ("ssl.truststore.location", "ssl.truststore.password"),
    "SASL_PLAINTEXT": ("sasl.mechanism", "sasl.jaas.config"),
    "SASL_SSL": (
        "sasl.mechanism",
        "sasl.jaas.config",
        "ssl.truststore.location",
        "ssl.truststore.password",
    ),
}
_SECURED_NOTE: Final = (
    "# This sidecar reaches Kafka over {protocol}. If listener {listener} does too, Kafka's\n"
    "# metadata manager needs client credentials of its own: the broker passes it only the\n"
    "# listener's address and security.protocol. Set these (values are secrets):\n"
)


_CACHE_NOTE: Final = (
    "# The plugin reads cached tiered data from the sidecar's chunk cache files: give the\n"
    "# broker read access to {directory} (the Helm chart mounts it read-only),\n"
    "# or set rsm.config.fetch.files=false to have every byte sent over the socket.\n"
)


def _broker_cache_dir(config: SidecarConfig) -> Path:
    """The chunk cache's directory as the broker sees it."""
    from sidecar.readserver.app import cache_dir_for

    return config.read_server.broker_cache_dir or cache_dir_for(config)


Verdict = Literal["ok", "set", "differs", "missing"]


@dataclass(frozen=True, slots=True)
class PropertyCheck:
    """One broker property against the value ``sidecar broker-config`` prints for it."""

    key: str
    expected: str
    #: the broker's value; None when unset or hidden
    actual: str | None
    #: ok (as printed), set (present, Kafka hides the value), differs, missing (not set, and
    #: Kafka's default, if any, is not the value printed)
    verdict: Verdict

    @property
    def passed(self) -> bool:
        return self.verdict in ("ok", "set")


def check_properties(
    expected: Mapping[str, str], found: Mapping[str, BrokerConfigEntry]
) -> list[PropertyCheck]:
    """Each expected property against the broker's."""
    checks = []
    for key, want in expected.items():
        entry = found.get(key)
        actual = None if entry is None or entry.hidden else entry.value
        verdict: Verdict
        if entry is None or (entry.default and actual != want):
            verdict = "missing"
        elif entry.hidden:
            verdict = "set"
        else:
            verdict = "ok" if actual == want else "differs"
        checks.append(PropertyCheck(key, want, actual, verdict))
    return checks


async def _describe(
    config: SidecarConfig, broker_id: int, keys: list[str]
) -> dict[str, BrokerConfigEntry]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    from sidecar.config import kafka_client_options
    from sidecar.tiering.cluster import BrokerConfigsRefusedError, describe_broker_configs

    bootstrap = ",".join(config.kafka.bootstrap_servers)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=config.kafka.request_timeout_ms,
        **kafka_client_options(config.kafka),
    )
    try:
        await admin.start()
        # the brokers only: an empty topic list asks for no topic's metadata
        brokers = (await admin._get_cluster_metadata(topics=[])).to_object()["brokers"]
        live = sorted(b["node_id"] for b in brokers)
        if broker_id not in live:
            raise CommandError(
                f"broker {broker_id} is not in the cluster at {bootstrap} (its brokers: "
                f"{', '.join(map(str, live)) or 'none'}); give the broker's id with --broker-id,"
                " or wait until it is back"
            )
        return await describe_broker_configs(admin, broker_id, keys)
    except BrokerConfigsRefusedError as exc:
        raise CommandError(str(exc)) from exc
    except (KafkaError, OSError, TimeoutError) as exc:
        raise CommandError(
            f"cannot ask broker {broker_id} for its configs through Kafka at {bootstrap}:"
            f" {exc or type(exc).__name__}; is the broker up, and is kafka.bootstrap_servers"
            " (with its security settings) right?"
        ) from exc
    finally:
        await admin.close()


def _broker_id(config: SidecarConfig, broker_id: int | None) -> int:
    from sidecar.kafka.logdir import read_broker_identity

    if broker_id is not None:
        return broker_id
    if config.broker.broker_id is not None:
        return config.broker.broker_id
    identity = read_broker_identity(config.broker.log_dirs)
    if identity is None or identity.node_id is None:
        raise ConfigError(
            "which broker to check? give --broker-id, or set broker.broker_id, or broker.log_dirs"
            " with the broker's meta.properties"
        )
    return identity.node_id


def _check_command(
    config: SidecarConfig,
    props: Mapping[str, str],
    *,
    broker_id: int | None,
    as_json: bool,
    out: TextIO,
) -> int:
    """Compare the running broker's properties with ``props``; 0 when all are there, 1 when
    one differs or is missing (each named, with the value printed)."""
    node = _broker_id(config, broker_id)
    found = asyncio.run(_describe(config, node, list(props)))
    checks = check_properties(props, found)
    failed = [c for c in checks if not c.passed]
    if as_json:
        document = {"broker_id": node, "ok": not failed, "properties": [asdict(c) for c in checks]}
        out.write(json.dumps(document, indent=2) + "\n")
        return 1 if failed else 0
    out.write(
        f"broker {node}: {len(checks) - len(failed)} of {len(checks)} properties as `sidecar"
        " broker-config` prints them\n"
    )
    for check in checks:
        if check.verdict == "ok":
            line = f"{check.key}={check.expected}"
        elif check.verdict == "set":
            line = f"{check.key} (Kafka does not show its value; printed: {check.expected})"
        elif check.verdict == "differs":
            line = f"{check.key}={check.actual} (printed: {check.expected})"
        else:
            line = f"{check.key} not set (printed: {check.expected})"
        out.write(f"  {check.verdict.upper() if not check.passed else check.verdict:<8} {line}\n")
    if failed:
        out.write(
            "The broker reads these at start: add the properties above to its server.properties"
            " (or fix them) and restart it. A different plugin jar path is right when the jar is"
            " mounted elsewhere: pass that path with --plugin-jar.\n"
        )
    return 1 if failed else 0
