"""The one typed configuration object, and the only reader of config files and the environment.

Sources, lowest precedence first: defaults < TOML file < ``SIDECAR_*`` environment variables <
CLI flags (``--set section.key=value`` and the dedicated flags of ``sidecar run``).

Environment variables name a field by its path with ``__`` between levels, e.g.
``SIDECAR_S3__BUCKET=tiered`` or ``SIDECAR_KAFKA__BOOTSTRAP_SERVERS=b1:9092,b2:9092`` (lists are
comma-separated). Unknown keys and wrong types are errors that name the key, and the variable
when the environment set it (exit code 2). Kubernetes service-link variables, which a Service
named ``sidecar…`` injects into every pod of its namespace (``SIDECAR_PORT=tcp://…``,
``SIDECAR_SERVICE_HOST``, ``SIDECAR_METRICS_SERVICE_PORT``), are ignored: a ``SIDECAR_`` name
without ``__`` that ends in ``SERVICE_HOST``, ``SERVICE_PORT[_NAME]``, ``PORT`` or
``PORT_<n>_<TCP|UDP|SCTP>[_ADDR|_PORT|_PROTO]`` (see :data:`SERVICE_LINK`).

Secrets are ``SecretStr``: they print as ``**********`` in ``repr``, in ``--json`` output, in
logs and in errors, and as a comment in ``sidecar config check``'s TOML (so that it loads back
with the secrets from the environment); the mask itself is refused as a secret. This module does
no I/O beyond reading the file it is given.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tomllib
import types
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, Union, get_args, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sidecar.errors import ConfigError

__all__ = [
    "BrokerConfig",
    "KafkaConfig",
    "LoggingConfig",
    "MetricsConfig",
    "ReadServerConfig",
    "RemoteLogMetadataConfig",
    "RetentionConfig",
    "RetentionOverride",
    "S3Config",
    "SidecarConfig",
    "TieringConfig",
    "check_warnings",
    "is_secret_key",
    "load_config",
    "masked",
    "reference_markdown",
    "to_toml",
]

ENV_PREFIX = "SIDECAR_"

#: Kubernetes service-link variable names (docker-link style), ignored when they start with
#: ``SIDECAR_``: no setting of ours is spelled like one (nested settings always contain ``__``).
SERVICE_LINK = re.compile(
    r"SIDECAR_(?:[A-Z0-9_]*_)?(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_\d+_(?:TCP|UDP|SCTP)(?:_(?:ADDR|PORT|PROTO))?)?)"
)


def _compiled(patterns: list[str]) -> list[str]:
    """Each pattern compiles as a Python regex (topics are matched with ``re.fullmatch``)."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a valid regex: {exc}") from None
    return patterns


#: what a secret prints as (repr, ``config check``, :func:`masked`)
SECRET_MASK = "**********"  # noqa: S105 - the mask, not a password


def _not_the_mask(value: SecretStr | None) -> SecretStr | None:
    """A secret that is the mask itself was copied from printed output: refused, not sent."""
    if value is not None and value.get_secret_value() == SECRET_MASK:
        raise ValueError(
            f"is {SECRET_MASK}, the mask printed in place of a secret, not the secret: set the"
            " real value, or leave it out and give it in the environment"
        )
    return value


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def _s3_bucket_name(name: str) -> str:
    """Amazon S3's general-purpose bucket naming rules (3-63 characters, lowercase letters,
    digits, dots and hyphens, starting and ending with a letter or digit, no ``..``, not an IP
    address, none of the reserved prefixes and suffixes)."""
    problem = None
    if not _BUCKET.fullmatch(name):
        problem = (
            "3-63 characters of lowercase letters, digits, '.' and '-', starting and ending"
            " with a letter or digit"
        )
    elif ".." in name:
        problem = "no two adjacent periods"
    elif name.startswith(("xn--", "sthree-", "amzn-s3-demo-")) or name.endswith(
        ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
    ):
        problem = "no reserved prefix (xn--, sthree-) or suffix (-s3alias, --ol-s3, --x-s3)"
    else:
        try:
            ipaddress.ip_address(name)
            problem = "not an IP address"
        except ValueError:
            pass
    if problem is not None:
        raise ValueError(f"{name!r} is not a valid S3 bucket name: {problem}")
    return name


def _endpoint(url: str | None) -> str | None:
    """An http(s) URL with a host and a valid port, without credentials: S3 requests are
    signed with the keys, so a ``user:password@`` is of no use to S3, and botocore puts the
    URL in its connection errors, which reach logs and /readyz. Errors never echo what comes
    before an ``@``."""
    if url is None:
        return None
    if "@" in url:
        scheme, sep, _ = url.partition("://")
        shown = f"{scheme}://***@{url.rpartition('@')[2]}" if sep else "***"
        raise ValueError(
            f"{shown!r} holds credentials (user:password@ before the host), which would show"
            " in logs and errors: give the keys as access_key_id and secret_access_key"
        )
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(
            f"{url!r} is not an http:// or https:// URL with a host (e.g. http://minio:9000)"
        )
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    return url


def _kafka_name(field: str, kafka: str) -> AliasChoices:
    """Accept our snake_case key and Kafka's dotted property name for the same setting."""
    return AliasChoices(field, kafka)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class KafkaConfig(_Section):
    """How the sidecar talks to the Kafka cluster (metadata, offsets, the metadata topic)."""

    bootstrap_servers: list[str] = Field(
        default_factory=lambda: ["127.0.0.1:9092"],
        validation_alias=_kafka_name("bootstrap_servers", "bootstrap.servers"),
        description="host:port of one or more brokers of the cluster (bootstrap.servers)",
    )
    client_id: str = Field("kafka-tiered-sidecar", description="client.id sent to the brokers")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT",
        validation_alias=_kafka_name("security_protocol", "security.protocol"),
        description="Kafka's security.protocol",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None,
        validation_alias=_kafka_name("sasl_mechanism", "sasl.mechanism"),
        description="Kafka's sasl.mechanism",
    )
    sasl_username: str | None = Field(None, description="SASL user name")
    sasl_password: SecretStr | None = Field(None, description="SASL password (secret)")
    _sasl_password_not_masked = field_validator("sasl_password")(_not_the_mask)
    ssl_cafile: Path | None = Field(None, description="CA bundle for SSL listeners")
    ssl_certfile: Path | None = Field(None, description="client certificate for mutual TLS")
    ssl_keyfile: Path | None = Field(None, description="client private key for mutual TLS")
    request_timeout_ms: int = Field(30_000, gt=0, description="per-request timeout")
    metadata_refresh_interval_s: float = Field(
        10.0, gt=0, description="how often leadership, LSOs and topic configs are refreshed"
    )
    metadata_stale_after_s: float = Field(
        60.0, gt=0, description="no uploads when the last successful refresh is older than this"
    )

    @model_validator(mode="after")
    def _stale_after_refresh(self) -> KafkaConfig:
        # a view older than the refresh interval is the normal case between refreshes: with
        # a shorter limit, uploads would pause for most of every interval
        if self.metadata_stale_after_s <= self.metadata_refresh_interval_s:
            raise ValueError(
                f"metadata_stale_after_s ({self.metadata_stale_after_s}) must be longer than"
                f" metadata_refresh_interval_s ({self.metadata_refresh_interval_s}), a few"
                " intervals (the defaults are 60 and 10)"
            )
        return self

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaConfig:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(
                f"sasl_mechanism is set but security_protocol is {self.security_protocol};"
                " use SASL_PLAINTEXT or SASL_SSL"
            )
        return self

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one bootstrap server is required")
        for item in value:
            host, sep, port = item.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{item!r} is not host:port")
        return value


class BrokerConfig(_Section):
    """The broker this sidecar runs beside: its log dirs are read, never written."""

    log_dirs: list[Path] = Field(
        default_factory=lambda: [Path("/var/lib/kafka/data")],
        description="the broker's log.dirs (several for JBOD)",
    )
    broker_id: int | None = Field(
        None, ge=0, description="node.id; read from meta.properties when not set"
    )
    path_map: dict[str, Path] = Field(
        default_factory=dict,
        description="broker-driven copies: a path prefix as the broker names its files → where"
        " this sidecar mounts that directory (read-only); empty = the same paths",
    )
    eager_upload: bool = Field(
        True,
        description="broker-driven topics: upload each segment's .log on roll, so the broker's"
        " copy call binds it with a copy inside the store instead of uploading then",
    )
    startup_wait_s: float = Field(
        300.0,
        ge=0,
        description="at start, how long to wait for the broker (its meta.properties, a Kafka"
        " connection) while serving /healthz, as beside a broker that starts with the sidecar;"
        " then exit as before; 0 = exit at once",
    )


class S3Config(_Section):
    """Where tiered segments go."""

    bucket: str = Field("kafka-tiered", min_length=3, max_length=63, description="bucket name")
    prefix: str = Field("", description="key prefix inside the bucket, e.g. 'prod/cluster-a/'")
    region: str = Field("us-east-1", description="S3 region")
    endpoint_url: str | None = Field(
        None,
        description="S3 endpoint for S3-compatible stores (SeaweedFS, MinIO), without"
        " user:password@ (the keys sign requests); None = AWS",
    )
    access_key_id: SecretStr | None = Field(
        None, description="access key; None = the default AWS credential chain (IRSA, env, ...)"
    )
    secret_access_key: SecretStr | None = Field(None, description="secret key (secret)")
    _keys_not_masked = field_validator("access_key_id", "secret_access_key")(_not_the_mask)
    path_style: bool = Field(True, description="path-style addressing (needed by most non-AWS)")
    hash_prefix: bool = Field(
        False, description="spread keys under 4-hex-digit prefixes (S3 request-rate partitions)"
    )
    part_size_bytes: int = Field(
        16 * 1024 * 1024, ge=5 * 1024 * 1024, description="multipart upload part size"
    )
    max_concurrency: int = Field(2, ge=1, le=64, description="parallel part uploads per segment")
    request_timeout_s: float = Field(30.0, gt=0, description="timeout of one S3 request")
    checksum_echo: Literal["verify", "refuse"] = Field(
        "verify",
        description="an upload answered without its CRC-32C echo: verify = check the stored"
        " object (HEAD with checksums, else read back its last part), refuse = fail the upload",
    )
    sendfile_uploads: bool = Field(
        True,
        description="send segment bodies (single PUTs and parts) with sendfile on http://"
        " endpoints (never through TLS): no copy through the process; the store checks each"
        " body against its CRC-32C header. false = read and check each chunk in the process",
    )
    raw_range_gets: bool = Field(
        True,
        description="ranged GETs (the read path) on http:// endpoints without a proxy (never"
        " through TLS): presigned by botocore, sent by a minimal HTTP/1.1 client that receives"
        " each body straight into its buffer. false = every GET through botocore",
    )

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        return _s3_bucket_name(value)

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        return _endpoint(value)

    @model_validator(mode="after")
    def _key_pair(self) -> Self:
        """One of the two keys alone would be dropped, and the default credential chain (say
        the node's instance role, with other rights) used without a word."""
        if (self.access_key_id is None) != (self.secret_access_key is None):
            given = "access_key_id" if self.secret_access_key is None else "secret_access_key"
            raise ValueError(
                f"s3.{given} is set without its pair: give access_key_id and secret_access_key"
                " together, or neither (the default AWS credential chain)"
            )
        return self


ClientValue = str | int | float | bool

# Kafka client property names the sidecar passes through, and the aiokafka argument each becomes.
# Settings Kafka's TBRLMM forces (acks, idempotence, client ids, offsets, group) are not here.
_COMMON_CLIENT: dict[str, str] = {
    "request.timeout.ms": "request_timeout_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}
_PRODUCER_CLIENT: dict[str, str] = {
    **_COMMON_CLIENT,
    "linger.ms": "linger_ms",
    "batch.size": "max_batch_size",
    "max.request.size": "max_request_size",
    "compression.type": "compression_type",
}
_CONSUMER_CLIENT: dict[str, str] = {
    **_COMMON_CLIENT,
    "fetch.max.bytes": "fetch_max_bytes",
    "fetch.min.bytes": "fetch_min_bytes",
    "fetch.max.wait.ms": "fetch_max_wait_ms",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
    "max.poll.records": "max_poll_records",
    "check.crcs": "check_crcs",
    "client.rack": "client_rack",
}
#: the properties that are not integers (Kafka's types); the others take an integer, at least
#: the minimum given here (else 0), as a number or as text, as a properties file has it
_CLIENT_TEXT: dict[str, tuple[str, ...] | None] = {
    "compression.type": ("none", "gzip", "snappy", "lz4", "zstd"),
    "client.rack": None,  # any text
}
_CLIENT_BOOLEAN = frozenset({"check.crcs"})
#: a request timeout of 0 would fail every request
_CLIENT_MINIMUM: dict[str, int] = {"max.poll.records": 1, "request.timeout.ms": 1}
_CLIENT_PREFIXES = {
    "remote.log.metadata.common.client.": ("common_client", _COMMON_CLIENT),
    "remote.log.metadata.producer.": ("producer", _PRODUCER_CLIENT),
    "remote.log.metadata.consumer.": ("consumer", _CONSUMER_CLIENT),
}


class RemoteLogMetadataConfig(_Section):
    """The KIP-405 remote log metadata topic. Kafka's own names are accepted as keys too
    (``"remote.log.metadata.topic.num.partitions" = 50``), and client overrides use Kafka's
    prefixes (``"remote.log.metadata.producer.linger.ms" = 5``), as on a broker with the ``rlmm.``
    prefix stripped."""

    topic: str = Field("__remote_log_metadata", description="metadata topic name")
    num_partitions: int = Field(
        50,
        ge=1,
        validation_alias=_kafka_name("num_partitions", "remote.log.metadata.topic.num.partitions"),
        description="remote.log.metadata.topic.num.partitions (Kafka's default 50)",
    )
    replication_factor: int = Field(
        3,
        ge=1,
        validation_alias=_kafka_name(
            "replication_factor", "remote.log.metadata.topic.replication.factor"
        ),
        description="remote.log.metadata.topic.replication.factor",
    )
    retention_ms: int = Field(
        -1,
        ge=-1,
        validation_alias=_kafka_name("retention_ms", "remote.log.metadata.topic.retention.ms"),
        description="remote.log.metadata.topic.retention.ms",
    )
    min_isr: int = Field(
        2,
        ge=1,
        validation_alias=_kafka_name("min_isr", "remote.log.metadata.topic.min.isr"),
        description="remote.log.metadata.topic.min.isr (Kafka 4.3's default 2): the"
        " min.insync.replicas the metadata topic is created with, at most replication_factor",
    )

    @field_validator("retention_ms")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value == 0:
            raise ValueError(
                "must be -1 (keep every event, Kafka's default) or a positive number of ms, got 0"
            )
        return value

    consume_wait_ms: int = Field(
        120_000,
        gt=0,
        validation_alias=_kafka_name("consume_wait_ms", "remote.log.metadata.consume.wait.ms"),
        description="remote.log.metadata.consume.wait.ms: read-back timeout",
    )
    tailing: Literal["selective", "all"] = Field(
        "selective",
        description="what each sidecar reads and keeps of the metadata topic: 'selective'"
        " (the metadata partitions of the partitions its broker hosts, keeping only those"
        " partitions' events, as Kafka's own metadata manager does; one sidecar per cluster,"
        " elected through coordinator_group, keeps everything and runs topic and partition"
        " deletion and the orphan scrub) or 'all' (every sidecar reads and keeps everything and"
        " scrubs; needs no consumer group)",
    )
    coordinator_group: str = Field(
        "",
        description="consumer group electing the sidecar that runs the cluster-wide duties"
        " (selective tailing; the sidecar's principal needs Read on it); default"
        " '<topic>.sidecar-coordinator'",
    )
    common_client: dict[str, ClientValue] = Field(
        default_factory=dict,
        description="remote.log.metadata.common.client.* overrides (Kafka property names)",
    )
    producer: dict[str, ClientValue] = Field(
        default_factory=dict,
        description="remote.log.metadata.producer.* overrides (e.g. linger.ms, batch.size)",
    )
    consumer: dict[str, ClientValue] = Field(
        default_factory=dict,
        description="remote.log.metadata.consumer.* overrides (e.g. fetch.max.bytes)",
    )

    @model_validator(mode="before")
    @classmethod
    def _prefixed_client_keys(cls, data: Any) -> Any:
        """Move Kafka-prefixed client properties into their override tables."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in list(data):
            for prefix, (table, _allowed) in _CLIENT_PREFIXES.items():
                if isinstance(key, str) and key.startswith(prefix):
                    overrides = dict(data.get(table) or {})
                    overrides[key[len(prefix) :]] = data.pop(key)
                    data[table] = overrides
                    break
        return data

    @field_validator("common_client", "producer", "consumer")
    @classmethod
    def _client_types(cls, value: dict[str, ClientValue]) -> dict[str, ClientValue]:
        """Each value as the client takes it: aiokafka does arithmetic on the numbers and
        tests the booleans, so text such as "5" or "false" would fail at start or be taken
        as true. Unknown names are left to :meth:`_known_client_properties`."""
        return {name: _client_value(name, raw) for name, raw in value.items()}

    @model_validator(mode="after")
    def _known_client_properties(self) -> RemoteLogMetadataConfig:
        for table, allowed in (
            ("common_client", _COMMON_CLIENT),
            ("producer", _PRODUCER_CLIENT),
            ("consumer", _CONSUMER_CLIENT),
        ):
            for name in getattr(self, table):
                if name not in allowed:
                    raise ValueError(
                        f"{table}: {name!r} is not a supported client property here (supported:"
                        f" {', '.join(sorted(allowed))}; acks, idempotence, client ids and"
                        " offsets are fixed as in Kafka)"
                    )
        return self

    def producer_kwargs(self) -> dict[str, ClientValue]:
        """aiokafka producer arguments from the common and producer overrides."""
        return _translate({**self.common_client, **self.producer}, _PRODUCER_CLIENT)

    @property
    def coordinator_group_id(self) -> str:
        """The coordinator group's id (``coordinator_group``, or derived from the topic)."""
        return self.coordinator_group or f"{self.topic}.sidecar-coordinator"

    def consumer_kwargs(self) -> dict[str, ClientValue]:
        """aiokafka consumer arguments from the common and consumer overrides."""
        return _translate({**self.common_client, **self.consumer}, _CONSUMER_CLIENT)


def _client_value(name: str, raw: ClientValue) -> ClientValue:
    """A client override checked and converted to its property's type (see
    :data:`_CLIENT_TEXT`); a name the sidecar does not pass on is returned as it is."""
    known = {*_PRODUCER_CLIENT, *_CONSUMER_CLIENT}
    if name not in known:
        return raw
    if name in _CLIENT_BOOLEAN:
        text = str(raw).strip().lower()
        if isinstance(raw, bool) or text in ("true", "false"):
            return raw if isinstance(raw, bool) else text == "true"
        raise ValueError(f"{name} must be true or false, not {raw!r}")
    if name in _CLIENT_TEXT:
        allowed = _CLIENT_TEXT[name]
        if isinstance(raw, str) and (allowed is None or raw.strip().lower() in allowed):
            return raw if allowed is None else raw.strip().lower()
        expected = "text" if allowed is None else " / ".join(allowed)
        raise ValueError(f"{name} must be {expected}, not {raw!r}")
    minimum = _CLIENT_MINIMUM.get(name, 0)
    number: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        number = raw
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        number = int(raw.strip())
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an integer of {minimum} or more, not {raw!r}")
    return number


def _translate(
    values: Mapping[str, ClientValue], names: Mapping[str, str]
) -> dict[str, ClientValue]:
    # aiokafka spells no compression None, the default, where Kafka has "none"
    return {
        names[key]: value
        for key, value in values.items()
        if not (key == "compression.type" and value == "none")
    }


class TieringConfig(_Section):
    """Which topics are tiered, how the log dirs are watched, and how fast uploads may go."""

    include_topics: list[str] = Field(
        default_factory=list,
        description="regexes of topics the sidecar tiers on its own (never a topic with"
        " remote.storage.enable=true: the broker tiers those through the plugin)",
    )
    exclude_topics: list[str] = Field(
        default_factory=lambda: [r"__.*"], description="regexes of topics never tiered"
    )
    rescan_interval_s: float = Field(
        30.0, gt=0, description="full rescan of the log dirs; inotify events are only hints"
    )
    max_concurrent_uploads: int = Field(
        2, ge=1, le=256, description="segments uploaded at once (across partitions)"
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM, how long uploads in flight may finish"
    )
    max_upload_bytes_per_second: int = Field(
        0,
        description="bytes per second that all uploads of the daemon together may send to S3"
        " (standalone copies, broker-driven copies, eager staging), as Kafka's"
        " remote.log.manager.copy.max.bytes.per.second; 0 = unlimited",
    )

    @field_validator("include_topics", "exclude_topics")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        return _compiled(value)

    @field_validator("max_upload_bytes_per_second")
    @classmethod
    def _upload_cap(cls, value: int) -> int:
        if value < 0:
            raise ValueError(
                f"must not be negative, got {value}: 0 means no cap, otherwise give the bytes"
                " per second all uploads together may send (e.g. 104857600 for 100 MiB/s)"
            )
        return value


# --- remote retention, topic/partition deletion, orphan scrub
class RetentionOverride(_Section):
    """A remote retention of the sidecar's own for some topics (``[[retention.overrides]]``).

    The broker (without KIP-405) deletes its local segments by the topic's retention.ms/bytes;
    an override lets the bucket keep more (or less) than the broker's disks. For a topic with an
    override, the broker's log start offset deletes remote segments only when it lies strictly
    inside the first local segment (a DeleteRecords; local retention always leaves it on a
    segment's base offset) and moved while the broker leads the partition. README: "Remote
    retention"."""

    topics: list[str] = Field(
        min_length=1,
        description="regexes of topics (full match, as tiering.include_topics); first entry wins",
    )
    retention_ms: int = Field(
        -2, ge=-2, description="remote retention.ms: -1 = forever, -2 (unset) = the broker's"
    )
    retention_bytes: int = Field(
        -2, ge=-2, description="remote retention.bytes: -1 = unlimited, -2 (unset) = the broker's"
    )

    @field_validator("topics")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        return _compiled(value)


class RetentionConfig(_Section):
    """Remote retention (Kafka's retention.ms/bytes per topic, or a sidecar override), deletion
    of the tiered data of deleted topics and partitions, the orphan scrub and the
    local-retention safety warnings."""

    overrides: list[RetentionOverride] = Field(
        default_factory=list,
        description=(
            "per-topic remote retention, [[retention.overrides]] with topics (regexes, full"
            " match, first entry wins), retention_ms and retention_bytes (-1 = unlimited,"
            " unset or -2 = the broker's value); on such a topic the broker's log start"
            " offset deletes remote data only after a DeleteRecords inside a local segment"
            " (see Remote retention)"
        ),
    )

    enabled: bool = Field(
        True, description="apply remote retention and topic/partition deletion in the daemon"
    )
    interval_s: float = Field(
        30.0,
        gt=0,
        description="retention pass interval (Kafka's remote.log.manager.task.interval.ms)",
    )
    dry_run: bool = Field(
        False, description="log what retention, deletion and scrub would delete; delete nothing"
    )
    topic_deletion: bool = Field(
        True,
        description=(
            "delete the tiered data of topics whose id the cluster confirms unknown"
            " (UNKNOWN_TOPIC_ID when asked by id; an authorization error never counts)"
        ),
    )
    topic_deletion_grace_s: float = Field(
        6 * 3600.0,
        ge=0,
        description=(
            "a topic id must be confirmed unknown at every pass for this long before its data"
            " is deleted (restarts begin it again)"
        ),
    )
    topic_deletion_max_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description=(
            "a pass whose topic deletions would remove more than this share of the cluster's"
            " tiered segments deletes none of them (topic_deletion_halted)"
        ),
    )
    topic_deletion_override_share: bool = Field(
        False,
        description=(
            "let topic deletion go past topic_deletion_max_share; set it only after checking"
            " that those topics are really deleted, and unset it afterwards"
        ),
    )
    scrub_enabled: bool = Field(True, description="run the orphan scrub periodically")
    scrub_interval_s: float = Field(3600.0, gt=0, description="time between two scrubs")
    orphan_grace_s: float = Field(
        86400.0,
        gt=0,
        description="an unreferenced object is deleted only once older than this",
    )
    multipart_grace_s: float = Field(
        86400.0,
        gt=0,
        description="an incomplete multipart upload is aborted once older than this",
    )
    at_risk_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="warn when an untiered segment has used this much of the local retention",
    )

    def override_for(self, topic: str) -> RetentionOverride | None:
        """The first override whose patterns fully match ``topic``, if any."""
        for override in self.overrides:
            if any(re.fullmatch(p, topic) for p in override.topics):
                return override
        return None


class ReadServerConfig(_Section):
    """The local read socket (HTTP/1.1) and its disk chunk cache."""

    socket_path: Path | None = Field(
        None, description="Unix socket, mode 0660; unset = <state_dir>/read.sock"
    )
    tcp_port: int | None = Field(None, ge=1, le=65535, description="optional loopback TCP port")
    cache_dir: Path | None = Field(
        None, description="disk chunk cache of remote segments; unset = <state_dir>/read-cache"
    )
    cache_size_bytes: int = Field(
        1024**3, ge=1024 * 1024, description="bytes the chunk cache may keep on disk (LRU)"
    )
    chunk_size_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        le=64 * 1024 * 1024,
        description="bytes per ranged GET and per cached chunk",
    )
    prefetch_chunks: int = Field(
        2,
        ge=0,
        le=64,
        description="chunks fetched ahead of a read, on into the next segments; a reader that"
        " goes on chunk after chunk gets at least two 16 MiB GETs ahead, and"
        " twice as many when it has to wait for one (up to half of max_concurrent_fetches) while"
        " each doubling makes it read at least a quarter faster",
    )
    cache_max_pending_write_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="fetched chunks waiting to be written to the chunk cache (bytes); past it a"
        " chunk is served from memory and not cached (disk slower than S3)",
    )
    cache_direct_io: bool = Field(
        True,
        description="while the cache fills, write chunk files with O_DIRECT, then read them back"
        " into the page cache (far less CPU than a buffered write into fresh pages); at its"
        " budget, and where the filesystem refuses O_DIRECT, buffered writes",
    )
    index_cache_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="memory for remote offset/time indexes and manifests"
    )
    fetch_timeout_s: float = Field(
        30.0, gt=0, description="deadline of one S3 call of the read path, retries included"
    )
    max_concurrent_fetches: int = Field(
        16,
        ge=1,
        le=256,
        description="S3 GETs in flight for reads (demand and prefetch; read-ahead takes at most"
        " half): a far object store (Amazon S3: first-byte latency, about 90 MB/s per"
        " connection) needs the deep read-ahead; a reader goes as deep only while that makes it"
        " read faster, so against one on the same host or LAN (MinIO, SeaweedFS) it stays at"
        " two GETs ahead",
    )
    max_concurrent_requests: int = Field(
        256, ge=1, description="requests served at once; more are answered 429"
    )
    default_response_bytes: int = Field(
        1024 * 1024, ge=1, description="records per response when max_bytes is not given (bytes)"
    )
    max_response_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="largest max_bytes a records request may ask for"
    )
    max_records: int = Field(
        100_000, ge=1, description="largest max_records a records request may ask for"
    )
    max_url_bytes: int = Field(
        4096, ge=256, le=8190, description="longest request target (path and query); else 414"
    )
    max_header_bytes: int = Field(
        8192, ge=1024, description="largest total of request header bytes; else 431"
    )
    shutdown_timeout_s: float = Field(
        5.0, ge=0, description="on stop, how long responses in flight may finish"
    )
    sendfile: bool = Field(
        True,
        description="send warm responses (CRC-checked batches, ranges of cached chunks) from the"
        " chunk files with sendfile; false = read them through memory",
    )
    offer_cache_files: bool = Field(
        True,
        description="answer the broker plugin's segment reads of cached data with where the"
        " chunk files are, and let it read them itself (it needs read access to cache_dir: the"
        " same host, or a volume shared in the pod); it falls back to the socket when it cannot"
        " open them",
    )
    broker_cache_dir: Path | None = Field(
        None,
        description="cache_dir as the broker sees it, when the pod mounts the shared cache"
        " volume elsewhere in the broker's container; unset = the same path",
    )

    @field_validator("socket_path", "cache_dir", "broker_cache_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # the broker's plugin (`sidecar broker-config` prints these for it) and `sidecar read`
        # resolve a relative path against their own working directory, not the daemon's
        return None if value is None else _absolute_path(value)


class MetricsConfig(_Section):
    """Prometheus metrics and health probes."""

    host: str = Field("127.0.0.1", description="listen address for /metrics, /healthz, /readyz")
    port: int = Field(9464, ge=0, le=65535, description="listen port (0 = any free port)")
    s3_probe_interval_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="how often /readyz lists one S3 key while S3 answers (every 1 s while not)",
    )


class LoggingConfig(_Section):
    """Structured logs."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto = console on a TTY, JSON lines otherwise"
    )


class SidecarConfig(_Section):
    """Everything the sidecar reads from its configuration."""

    state_dir: Path = Field(
        Path("/var/lib/kafka-tiered-sidecar"),
        description="the sidecar's own state (metadata store); never inside a log dir",
    )
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)  # type: ignore[arg-type]
    broker: BrokerConfig = Field(default_factory=BrokerConfig)  # type: ignore[arg-type]
    s3: S3Config = Field(default_factory=S3Config)  # type: ignore[arg-type]
    remote_log_metadata: RemoteLogMetadataConfig = Field(
        default_factory=RemoteLogMetadataConfig  # type: ignore[arg-type]
    )
    tiering: TieringConfig = Field(default_factory=TieringConfig)  # type: ignore[arg-type]
    read_server: ReadServerConfig = Field(default_factory=ReadServerConfig)  # type: ignore[arg-type]
    retention: RetentionConfig = Field(default_factory=RetentionConfig)  # type: ignore[arg-type]
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)  # type: ignore[arg-type]
    logging: LoggingConfig = Field(default_factory=LoggingConfig)  # type: ignore[arg-type]

    @field_validator("state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # a relative path would depend on the working directory, which the daemon (systemd:
        # /) and the CLI's status, read and quarantine commands need not share
        return _absolute_path(value)

    @property
    def read_socket_path(self) -> Path:
        """The read socket's path: ``read_server.socket_path``, else ``<state_dir>/read.sock``."""
        configured = self.read_server.socket_path
        return configured if configured is not None else self.state_dir / "read.sock"

    @property
    def read_cache_dir(self) -> Path:
        """The chunk cache's directory: ``read_server.cache_dir``, else
        ``<state_dir>/read-cache``."""
        configured = self.read_server.cache_dir
        return configured if configured is not None else self.state_dir / "read-cache"

    @model_validator(mode="after")
    def _outside_log_dirs(self) -> Self:
        """The daemon only reads the broker's log dirs: nothing of its own may be created in
        one (the broker takes each directory there for a partition, and one not named
        topic-partition fails its log loading), and the chunk cache, which removes the .tmp
        files it finds below it, may hold none."""
        own = {
            "state_dir": (self.state_dir, False),
            "read_server.cache_dir": (self.read_cache_dir, True),
            "read_server.socket_path": (self.read_socket_path, False),
        }
        for name, (path, may_not_contain) in own.items():
            for log_dir in self.broker.log_dirs:
                for mine, theirs in {(_full(path), _full(log_dir)), (_real(path), _real(log_dir))}:
                    if mine == theirs or mine.is_relative_to(theirs):
                        raise ValueError(
                            f"{name} ({path}) is inside broker.log_dirs entry {log_dir}: the"
                            " sidecar never writes in the broker's log dirs; put it elsewhere"
                        )
                    if may_not_contain and theirs.is_relative_to(mine):
                        raise ValueError(
                            f"{name} ({path}) holds broker.log_dirs entry {log_dir}: the chunk"
                            " cache removes the .tmp files it finds below it; put it elsewhere"
                        )
        return self


def _absolute_path(value: Path) -> Path:
    """``value`` with ``~`` expanded; a relative path is refused."""
    value = value.expanduser()
    if not value.is_absolute():
        raise ValueError(f"must be an absolute path, got {value}")
    return value


def _full(path: Path) -> Path:
    """``path`` made absolute and normalised, symlinks left as they are."""
    return Path(os.path.normpath(Path.cwd() / path.expanduser()))


def _real(path: Path) -> Path:
    """``path`` with every symlink of its existing part resolved (reads metadata only)."""
    return path.expanduser().resolve(strict=False)


# ---------------------------------------------------------------------------------------------
# loading


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> SidecarConfig:
    """Build the effective configuration from a TOML file, the environment and CLI overrides.

    ``overrides`` maps dotted paths (``s3.bucket``) to string values, as given on the command
    line. Raises :class:`ConfigError` naming the offending key.
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_file(path)
    env = os.environ if environ is None else environ
    sources: dict[str, str] = {}  # dotted key → where a value other than the file's came from
    for key, raw in sorted(env.items()):
        if not key.startswith(ENV_PREFIX) or _service_link(key):
            continue
        dotted = key[len(ENV_PREFIX) :].lower().replace("__", ".")
        source = f"environment variable {key}"
        _assign(data, dotted, raw, source=source)
        sources[dotted] = source
    for dotted, raw in (overrides or {}).items():
        _assign(data, dotted, raw, source=f"--set {dotted}")
        sources[dotted] = f"--set {dotted}"
    try:
        return SidecarConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, sources)) from None


def _service_link(name: str) -> bool:
    """A variable Kubernetes injects for a Service whose name starts with ``sidecar``."""
    return "__" not in name and name != "SIDECAR_STATE_DIR" and bool(SERVICE_LINK.fullmatch(name))


def check_warnings(config: SidecarConfig) -> list[str]:
    """What ``sidecar config check`` warns about without failing: settings that are valid but
    will not work on this host or will tier nothing. Reads directory metadata only."""
    warnings: list[str] = []
    for log_dir in config.broker.log_dirs:
        if not log_dir.exists():
            warnings.append(
                f"broker.log_dirs: {log_dir} does not exist here (fine on a machine that only"
                " checks the file; `sidecar run` needs it)"
            )
        elif not log_dir.is_dir():
            warnings.append(f"broker.log_dirs: {log_dir} is not a directory")
        elif not os.access(log_dir, os.R_OK | os.X_OK):
            warnings.append(f"broker.log_dirs: {log_dir} is not readable by this user")
    kafka = config.kafka
    if kafka.sasl_mechanism is not None and (
        kafka.sasl_username is None or kafka.sasl_password is None
    ):
        warnings.append(
            "kafka.sasl_mechanism is set without sasl_username and sasl_password; pass the"
            " password as SIDECAR_KAFKA__SASL_PASSWORD"
        )
    if not config.tiering.include_topics:
        warnings.append(
            "tiering.include_topics is empty: only topics with remote.storage.enable=true are"
            " tiered, which needs a KIP-405 broker with the sidecar's plugin; to tier topics"
            ' standalone add e.g. include_topics = ["orders.*"] under [tiering]'
        )
    return warnings


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def _field_at(dotted: str) -> Any:
    """The pydantic FieldInfo for a dotted path, or None when the path names no field."""
    model: type[BaseModel] | None = SidecarConfig
    info = None
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        annotation = info.annotation
        model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
    return info


def is_secret_key(dotted: str) -> bool:
    """Whether a dotted key (as ``--set`` takes it) names a secret, whose value is never
    printed back."""
    info = _field_at(dotted.strip())
    return info is not None and "SecretStr" in str(info.annotation)


def _assign(data: dict[str, Any], dotted: str, raw: str, *, source: str) -> None:
    """Set ``data[a][b] = value`` for ``a.b``, turning comma lists into lists for list fields."""
    parts = dotted.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"{source}: {dotted!r} is not a valid key")
    info = _field_at(dotted)
    value: Any = raw
    if info is not None and "list[" in str(info.annotation):
        stripped = raw.strip()
        if stripped.startswith("["):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{source}: {dotted}: not a JSON list: {exc}") from None
        else:
            value = _comma_list(raw)
    elif info is not None and "dict[" in str(info.annotation) and raw.strip().startswith("{"):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: {dotted}: not a JSON object: {exc}") from None
    elif raw.strip().lower() in {"null", "none"} and _optional(info) and not is_secret_key(dotted):
        # unset; never for a secret, whose value may be any text, nor for a setting that
        # cannot be unset, which may be the text itself (a bucket or topic named "null")
        value = None
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {part!r} is not a section")
        node = child
    for spelling in _other_spellings(info, parts[-1], node):
        del node[spelling]  # the file's Kafka-named key: replaced, not a second value
    node[parts[-1]] = value


def _optional(info: Any) -> bool:
    """Whether the field takes None (is unset by ``null``)."""
    return info is not None and type(None) in get_args(info.annotation)


def _other_spellings(info: Any, name: str, section: Mapping[str, Any]) -> list[str]:
    """The keys of ``section`` that give field ``name`` under another spelling: Kafka's name
    (``"bootstrap.servers"``), or for a client override table, its properties with Kafka's
    prefix (``"remote.log.metadata.producer.linger.ms"``)."""
    if info is None:
        return []
    alias = info.validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else []
    names = {c for c in choices if isinstance(c, str) and c != name}
    prefixes = tuple(p for p, (table, _) in _CLIENT_PREFIXES.items() if table == name)
    return [
        key
        for key in section
        if isinstance(key, str) and (key in names or (prefixes and key.startswith(prefixes)))
    ]


def _comma_list(raw: str) -> list[str]:
    """A comma-separated list, split only at commas outside brackets and not escaped, so that a
    regex keeps its ``{1,3}``, ``[,;]`` or ``(a|b,c)``; a JSON list takes anything else."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    escaped = False
    for char in raw:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _describe(exc: ValidationError, path: Path | None, sources: Mapping[str, str]) -> str:
    """One line per problem, each naming the key and, when the file did not set it, the
    environment variable or ``--set`` that did."""
    problems: list[str] = []
    from_file = False
    for err in exc.errors(include_url=False, include_input=False):
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(root)"
        source = next(
            (
                sources[".".join(loc[:n])]
                for n in range(len(loc), 0, -1)
                if ".".join(loc[:n]) in sources
            ),
            None,
        )
        if err["type"] == "extra_forbidden":
            text = f"{key}: unknown key"
            if source is not None and source.startswith("environment"):
                text += " (nested settings use __ between levels, e.g. SIDECAR_S3__BUCKET)"
        else:
            text = f"{key}: {err['msg']}"
        if source is not None:
            text = f"{source}: {text}"
        else:
            from_file = from_file or path is not None
        problems.append(text)
    where = f" in {path}" if from_file else ""
    if len(problems) == 1:
        return f"invalid configuration{where}: {problems[0]}"
    return "\n".join([f"invalid configuration{where}:", *(f"  {p}" for p in problems)])


def kafka_client_options(kafka: KafkaConfig) -> dict[str, Any]:
    """aiokafka keyword arguments for the cluster's security settings (no secrets logged)."""
    options: dict[str, Any] = {"security_protocol": kafka.security_protocol}
    if kafka.sasl_mechanism is not None:
        options["sasl_mechanism"] = kafka.sasl_mechanism
        options["sasl_plain_username"] = kafka.sasl_username
        if kafka.sasl_password is not None:
            options["sasl_plain_password"] = kafka.sasl_password.get_secret_value()
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        options["ssl_context"] = create_ssl_context(
            cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None,
            certfile=str(kafka.ssl_certfile) if kafka.ssl_certfile else None,
            keyfile=str(kafka.ssl_keyfile) if kafka.ssl_keyfile else None,
        )
    return options


def secret_values(config: SidecarConfig) -> list[str]:
    """The secrets the configuration holds, in clear: what logs and errors must redact."""
    values = [config.s3.access_key_id, config.s3.secret_access_key, config.kafka.sasl_password]
    return [v.get_secret_value() for v in values if v is not None]


def masked(config: SidecarConfig) -> dict[str, Any]:
    """The effective configuration as plain data with every secret replaced by asterisks."""

    def walk(value: Any) -> Any:
        if isinstance(value, SecretStr):
            return SECRET_MASK
        if isinstance(value, BaseModel):
            return {name: walk(getattr(value, name)) for name in type(value).model_fields}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): walk(v) for k, v in value.items()}
        if isinstance(value, Path):
            return str(value)
        return value

    result: dict[str, Any] = walk(config)
    return result


def to_toml(data: Mapping[str, Any]) -> str:
    """Render :func:`masked` output as TOML (scalars first, then one table per section)."""

    def scalar(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return repr(value)
        if isinstance(value, list):
            return "[" + ", ".join(scalar(v) for v in value) + "]"
        if isinstance(value, Mapping):
            return "{" + ", ".join(f"{json.dumps(k)} = {scalar(v)}" for k, v in value.items()) + "}"
        return json.dumps(str(value))

    def line(key: str, value: Any) -> str:
        # TOML has no null: an unset setting is a comment, so the output loads back as is;
        # so is a set secret, which loading back would otherwise take for the mask itself
        if value is None:
            return f"# {key} = (unset)"
        if value == SECRET_MASK:
            return f"# {key} = (set; a secret, not shown)"
        return f"{key} = {scalar(value)}"

    lines = [line(k, v) for k, v in data.items() if not isinstance(v, Mapping)]
    for section, values in data.items():
        if isinstance(values, Mapping):
            lines.append("")
            lines.append(f"[{section}]")
            lines.extend(line(k, v) for k, v in values.items())
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """The configuration reference as a Markdown table, generated from the model (README)."""
    rows = [
        "| key | type | default | environment variable | description |",
        "|---|---|---|---|---|",
    ]

    def type_name(annotation: Any) -> str:
        origin, args = get_origin(annotation), get_args(annotation)
        if origin is Literal:
            return " / ".join(str(a) for a in args)
        if origin in (Union, types.UnionType):
            return " or ".join(type_name(a) for a in args)
        if origin is list:
            return f"list of {type_name(args[0])}"
        if annotation is type(None):
            return "unset"
        return str(getattr(annotation, "__name__", annotation))

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name}.")
                continue
            if info.default_factory is not None:
                default: Any = info.default_factory()  # type: ignore[call-arg]
            else:
                default = info.default
            if isinstance(default, list):
                default = ", ".join(str(d) for d in default) or "(empty)"
            shown = "(unset)" if default is None else str(default)
            key = f"{prefix}{name}"
            env = ENV_PREFIX + key.upper().replace(".", "__")
            description = (info.description or "").replace("|", "/")
            rows.append(
                f"| `{key}` | {type_name(annotation)} | `{shown}` | `{env}` | {description} |"
            )

    walk(SidecarConfig, "")
    return "\n".join(rows) + "\n"
