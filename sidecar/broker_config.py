"""``sidecar broker-config``: the broker properties that make Kafka tier through this sidecar
(broker-driven mode). Paste them into the broker's ``server.properties``; topics then opt in with
``remote.storage.enable=true`` (and ``local.retention.*`` for the local tier's size).

The broker runs the plugin (``deploy/kafka-plugin``) as its RemoteStorageManager, pointed at this
sidecar's read socket, and Kafka's own TopicBasedRemoteLogMetadataManager with the metadata topic
settings the sidecar tails (same topic, same partition count, so both place a partition's events
alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Final, TextIO

from sidecar.config import SidecarConfig
from sidecar.errors import ConfigError

__all__ = ["DEFAULT_PLUGIN_JAR", "PLUGIN_CLASS", "broker_config_command", "broker_properties"]

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
    props |= {
        "rsm.config.read.idle.timeout.ms": str(int(config.read_server.fetch_timeout_s * 1000)),
        "remote.log.metadata.manager.class.name": RLMM_CLASS,
        "remote.log.metadata.manager.listener.name": listener,
        "rlmm.config.remote.log.metadata.topic.num.partitions": str(meta.num_partitions),
        "rlmm.config.remote.log.metadata.topic.replication.factor": str(meta.replication_factor),
        "rlmm.config.remote.log.metadata.topic.retention.ms": str(meta.retention_ms),
    }
    return props


def broker_config_command(
    config: SidecarConfig, *, plugin_jar: Path, listener: str, tcp: bool, out: TextIO
) -> int:
    props = broker_properties(config, plugin_jar=plugin_jar, listener=listener, tcp=tcp)
    out.write(
        "# Broker-driven tiered storage through kafka-tiered-sidecar; then, per topic:\n"
        "#   remote.storage.enable=true  local.retention.ms=...  local.retention.bytes=...\n"
    )
    for key, value in props.items():
        out.write(f"{key}={value}\n")
    return 0
