"""The ``kafka-tiered`` source's options, parsed once into a frozen :class:`ReadOptions`.

The names and semantics mirror Spark's Kafka source (``KafkaSourceProvider``; option keys are
case-insensitive): exactly one of ``subscribe`` / ``subscribePattern`` / ``assign``;
``startingOffsets`` (``earliest`` or JSON with -2 = earliest) and ``endingOffsets`` (``latest``
or JSON with -1 = latest; ends are exclusive); ``startingTimestamp`` >
``startingOffsetsByTimestamp`` > ``startingOffsets`` in precedence, likewise for the ends;
``includeHeaders``, ``failOnDataLoss``, ``minPartitions``, ``maxRecordsPerPartition`` and
``kafka.isolation.level``. Options only the broker needs (``kafka.group.id``, ...) are accepted
and ignored.

Our own options say where the archive is: ``s3.endpoint``, ``s3.bucket``, ``s3.prefix``,
``s3.region``, ``s3.accessKeyId``, ``s3.secretAccessKey``, ``s3.sessionToken``,
``s3.pathStyle``, ``s3.hashPrefix`` (the sidecar's ``[s3]`` settings), and where the segment
metadata comes from: ``metadata`` = ``topic`` (the remote log metadata topic, read through
``kafka.bootstrap.servers``; the default when bootstrap servers are given) or ``manifests`` (the
bucket's manifests only, no Kafka at all); ``metadata.topic`` names the metadata topic.

Pure: no Spark, no I/O. Secrets never appear in ``repr`` or in error messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from sidecar.errors import ConfigError

if TYPE_CHECKING:
    from sidecar.config import KafkaConfig

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "ReadOptions",
    "S3Location",
    "Selection",
    "SparkOptionError",
    "TimestampSpec",
    "parse_options",
]

#: Kafka's special offsets in the JSON forms of startingOffsets / endingOffsets
EARLIEST = -2
LATEST = -1
DEFAULT_METADATA_TOPIC = "__remote_log_metadata"


class SparkOptionError(ConfigError):
    """An option of the ``kafka-tiered`` source is missing, malformed or contradicts another."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest`` / ``latest`` for every partition, or per-partition offsets (-2/-1 allowed)."""

    default: int
    """EARLIEST or LATEST: the offset of partitions the JSON does not name (or of all)."""
    per_partition: Mapping[tuple[str, int], int] = field(default_factory=dict)
    """(topic, partition) -> offset; from a JSON spec, which must name every partition read."""
    is_json: bool = False


@dataclass(frozen=True, slots=True)
class TimestampSpec:
    """A timestamp (ms) for every partition, or per partition."""

    everywhere: int | None = None
    per_partition: Mapping[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class S3Location:
    """Where the archive is, and how to reach it. ``repr`` masks the credentials."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str = "us-east-1"
    path_style: bool = True
    hash_prefix: bool = False
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        creds = "set" if self.access_key_id else "default chain"
        return (
            f"S3Location(bucket={self.bucket!r}, prefix={self.prefix!r}, "
            f"endpoint={self.endpoint!r}, region={self.region!r}, credentials={creds})"
        )


@dataclass(frozen=True, slots=True)
class KafkaSecurity:
    """How the driver reaches the metadata topic, from Spark's Kafka source option names:
    ``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config`` (the
    ``username="…" password="…"`` of a PlainLoginModule or ScramLoginModule), and PEM files:
    ``kafka.ssl.truststore.location`` (with ``kafka.ssl.truststore.type=PEM``),
    ``kafka.ssl.keystore.location`` (certificate and key, ``kafka.ssl.keystore.type=PEM``).
    ``repr`` masks the password."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None

    def client_options(self) -> dict[str, object]:
        """aiokafka keyword arguments (the same translation as the daemon's)."""
        from sidecar.config import KafkaConfig, kafka_client_options

        settings: dict[str, object] = {
            "security_protocol": self.protocol,
            "sasl_mechanism": self.mechanism,
            "sasl_username": self.username,
            "sasl_password": self.password,
            "ssl_cafile": self.cafile,
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.certfile,
        }
        return kafka_client_options(KafkaConfig.model_validate(settings))


# Kafka's JaasConfig tokenizes with Java's StreamTokenizer: " and ' both quote a value, and a
# bare word is a value too
_JAAS_FIELD = re.compile(
    r"""\b(username|password)\s*=\s*"""
    r"""(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|([^\s;'"=]+))"""
)
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def kafka_security(options: Mapping[str, str]) -> KafkaSecurity:
    """The security settings of lower-cased Spark options (see :class:`KafkaSecurity`)."""
    protocol = options.get("kafka.security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in _PROTOCOLS:
        raise SparkOptionError(f"option kafka.security.protocol must be one of {_PROTOCOLS}")
    mechanism = options.get("kafka.sasl.mechanism")
    if mechanism is not None:
        mechanism = mechanism.strip().upper()
        if mechanism not in _MECHANISMS:
            raise SparkOptionError(f"option kafka.sasl.mechanism must be one of {_MECHANISMS}")
    elif protocol.startswith("SASL_"):
        mechanism = "PLAIN"  # Kafka's default sasl.mechanism
    fields = {
        # a quoted value's \" \' \\ are escapes; a bare word is taken as it is
        match[1]: match[4] or re.sub(r"\\(.)", r"\1", match[2] or match[3] or "")
        for match in _JAAS_FIELD.finditer(options.get("kafka.sasl.jaas.config", ""))
    }
    if protocol.startswith("SASL_") and not {"username", "password"} <= fields.keys():
        raise SparkOptionError(
            f"kafka.security.protocol={protocol} needs kafka.sasl.jaas.config with"
            ' username="…" password="…"'
        )
    for kind in ("truststore", "keystore"):
        location = options.get(f"kafka.ssl.{kind}.location")
        if location and options.get(f"kafka.ssl.{kind}.type", "PEM").strip().upper() != "PEM":
            raise SparkOptionError(
                f"option kafka.ssl.{kind}.location must be a PEM file"
                f" (kafka.ssl.{kind}.type=PEM); JKS and PKCS12 stores are not read"
            )
    return KafkaSecurity(
        protocol=protocol,  # type: ignore[arg-type]
        mechanism=mechanism if protocol.startswith("SASL_") else None,  # type: ignore[arg-type]
        username=fields.get("username"),
        password=fields.get("password"),
        cafile=options.get("kafka.ssl.truststore.location") or None,
        certfile=options.get("kafka.ssl.keystore.location") or None,
    )


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(kafka: KafkaConfig) -> dict[str, str]:
    """The Spark option names for a sidecar ``[kafka]`` section (for ``spark verify -c``)."""
    options = {
        "kafka.bootstrap.servers": ",".join(kafka.bootstrap_servers),
        "kafka.security.protocol": kafka.security_protocol,
    }
    if kafka.sasl_mechanism is not None:
        options["kafka.sasl.mechanism"] = kafka.sasl_mechanism
        module = (
            "plain.PlainLoginModule"
            if kafka.sasl_mechanism == "PLAIN"
            else ("scram.ScramLoginModule")
        )
        password = "" if kafka.sasl_password is None else kafka.sasl_password.get_secret_value()
        options["kafka.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{module} required"
            f" username={_jaas_quoted(kafka.sasl_username or '')}"
            f" password={_jaas_quoted(password)};"
        )
    if kafka.ssl_cafile is not None:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = str(kafka.ssl_cafile)
    if kafka.ssl_certfile is not None:
        options["kafka.ssl.keystore.type"] = "PEM"
        options["kafka.ssl.keystore.location"] = str(kafka.ssl_certfile)
    return options


@dataclass(frozen=True, slots=True)
class Selection:
    """Which topics and partitions are read: ``subscribe``, ``pattern`` or ``assign``."""

    kind: Literal["subscribe", "pattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[tuple[str, int], ...] = ()

    def topic_selected(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "pattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)

    def partition_selected(self, topic: str, partition: int) -> bool:
        if self.kind == "assign":
            return (topic, partition) in self.assigned
        return self.topic_selected(topic)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Every option of one read, validated."""

    selection: Selection
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: TimestampSpec | None
    ending_timestamp: TimestampSpec | None
    starting_by_timestamp_strategy: Literal["error", "latest"]
    include_headers: bool
    fail_on_data_loss: bool
    min_partitions: int | None
    max_records_per_partition: int | None
    read_committed: bool
    s3: S3Location
    metadata: Literal["topic", "manifests"]
    bootstrap_servers: str | None
    metadata_topic: str
    filter_pushdown: bool
    verify_crc: bool
    kafka_security: KafkaSecurity = KafkaSecurity()


_TRUE = {"true": True, "false": False}


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key.lower())
    if raw is None:
        return default
    value = _TRUE.get(raw.strip().lower())
    if value is None:
        raise SparkOptionError(f"option {key} must be true or false, not {raw!r}")
    return value


def _positive_int(options: Mapping[str, str], key: str) -> int | None:
    raw = options.get(key.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SparkOptionError(f"option {key} must be an integer, not {raw!r}") from None
    if value <= 0:
        raise SparkOptionError(f"option {key} must be positive, not {value}")
    return value


def _json_object(key: str, raw: str) -> dict[str, object]:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise SparkOptionError(f"option {key} is not valid JSON: {raw!r}") from None
    if not isinstance(doc, dict):
        raise SparkOptionError(f"option {key} must be a JSON object, not {raw!r}")
    return doc


def _per_partition(key: str, raw: str) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": 23, "1": -1}}`` -> {(topic, 0): 23, (topic, 1): -1}."""
    out: dict[tuple[str, int], int] = {}
    for topic, partitions in _json_object(key, raw).items():
        if not isinstance(partitions, dict):
            raise SparkOptionError(f"option {key}: topic {topic!r} needs an object of partitions")
        for partition, value in partitions.items():
            try:
                p = int(partition)
            except ValueError:
                raise SparkOptionError(
                    f"option {key}: partition {partition!r} of {topic!r} is not a number"
                ) from None
            if not isinstance(value, int) or isinstance(value, bool):
                raise SparkOptionError(f"option {key}: {topic}-{p} needs an integer, not {value!r}")
            out[(topic, p)] = value
    return out


def _offsets(options: Mapping[str, str], key: str, *, starting: bool) -> OffsetSpec:
    raw = options.get(key.lower())
    default = EARLIEST if starting else LATEST
    if raw is None:
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() == "earliest":
        if not starting:
            raise SparkOptionError("endingOffsets may not be 'earliest' for a batch query")
        return OffsetSpec(EARLIEST)
    if text.lower() == "latest":
        if starting:
            raise SparkOptionError("startingOffsets may not be 'latest' for a batch query")
        return OffsetSpec(LATEST)
    offsets = _per_partition(key, text)
    for (topic, p), value in offsets.items():
        if starting and value == LATEST:
            raise SparkOptionError(
                f"startingOffsets for {topic}-{p} may not be -1 (latest) for a batch query"
            )
        if not starting and value == EARLIEST:
            raise SparkOptionError(f"endingOffsets for {topic}-{p} may not be -2 (earliest)")
        if value < EARLIEST:
            raise SparkOptionError(f"option {key}: offset {value} of {topic}-{p} is invalid")
    return OffsetSpec(default, offsets, is_json=True)


def _timestamps(options: Mapping[str, str], one: str, many: str) -> TimestampSpec | None:
    raw = options.get(one.lower())
    if raw is not None:
        try:
            return TimestampSpec(everywhere=int(raw))
        except ValueError:
            raise SparkOptionError(f"option {one} must be milliseconds, not {raw!r}") from None
    raw = options.get(many.lower())
    if raw is not None:
        return TimestampSpec(per_partition=_per_partition(many, raw))
    return None


def _selection(options: Mapping[str, str]) -> Selection:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if options.get(k)]
    if len(given) != 1:
        raise SparkOptionError(
            "exactly one of the options subscribe, subscribePattern and assign is required"
        )
    key = given[0]
    raw = options[key]
    if key == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise SparkOptionError("option subscribe names no topic")
        return Selection("subscribe", topics=topics)
    if key == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise SparkOptionError(f"option subscribePattern is not a regex: {exc}") from None
        return Selection("pattern", pattern=raw)
    assigned: list[tuple[str, int]] = []
    for topic, partitions in _json_object("assign", raw).items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in partitions
        ):
            raise SparkOptionError(f"option assign: topic {topic!r} needs a list of partitions")
        assigned += [(topic, p) for p in partitions]
    if not assigned:
        raise SparkOptionError("option assign names no partition")
    return Selection("assign", assigned=tuple(sorted(set(assigned))))


def parse_options(raw: Mapping[str, str]) -> ReadOptions:
    """Validate the options of one read (keys are case-insensitive)."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    bucket = options.get("s3.bucket")
    if not bucket:
        raise SparkOptionError("option s3.bucket is required")
    isolation = options.get("kafka.isolation.level", "read_uncommitted").strip().lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise SparkOptionError(
            "option kafka.isolation.level must be read_uncommitted or read_committed"
        )
    bootstrap = options.get("kafka.bootstrap.servers") or None
    metadata = options.get("metadata", "topic" if bootstrap else "manifests").strip().lower()
    if metadata not in ("topic", "manifests"):
        raise SparkOptionError("option metadata must be 'topic' or 'manifests'")
    if metadata == "topic" and not bootstrap:
        raise SparkOptionError("metadata=topic needs the option kafka.bootstrap.servers")
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise SparkOptionError("option startingOffsetsByTimestampStrategy must be error or latest")
    prefix = options.get("s3.prefix", "")
    endpoint = options.get("s3.endpoint") or None
    if endpoint is not None and "@" in endpoint:
        # botocore names the URL in its connection errors, which Spark shows with the task's
        raise SparkOptionError(
            "option s3.endpoint holds credentials (user:password@ before the host), which"
            " would show in errors: give the keys as s3.accessKeyId and s3.secretAccessKey"
        )
    return ReadOptions(
        selection=_selection(options),
        starting=_offsets(options, "startingOffsets", starting=True),
        ending=_offsets(options, "endingOffsets", starting=False),
        starting_timestamp=_timestamps(options, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_timestamp=_timestamps(options, "endingTimestamp", "endingOffsetsByTimestamp"),
        starting_by_timestamp_strategy="latest" if strategy == "latest" else "error",
        include_headers=_bool(options, "includeHeaders", False),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        min_partitions=_positive_int(options, "minPartitions"),
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
        read_committed=isolation == "read_committed",
        s3=S3Location(
            bucket=bucket,
            prefix=prefix,
            endpoint=endpoint,
            region=options.get("s3.region", "us-east-1"),
            path_style=_bool(options, "s3.pathStyle", True),
            hash_prefix=_bool(options, "s3.hashPrefix", False),
            access_key_id=options.get("s3.accesskeyid") or None,
            secret_access_key=options.get("s3.secretaccesskey") or None,
            session_token=options.get("s3.sessiontoken") or None,
        ),
        metadata="topic" if metadata == "topic" else "manifests",
        bootstrap_servers=bootstrap,
        metadata_topic=options.get("metadata.topic", DEFAULT_METADATA_TOPIC),
        filter_pushdown=_bool(options, "filterPushdown", False),
        verify_crc=_bool(options, "verifyCrc", True),
        kafka_security=kafka_security(options),
    )
