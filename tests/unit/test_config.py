"""Configuration: file < environment < CLI precedence, typed errors naming the key, masking."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import SidecarConfig, load_config, masked, to_toml
from sidecar.errors import ConfigError

GOOD = """
state_dir = "/tmp/sidecar-state"

[kafka]
bootstrap_servers = ["127.0.0.1:9092"]
sasl_password = "kafka-pass-123"

[broker]
log_dirs = ["/var/lib/kafka/data"]

[s3]
bucket = "from-file"
access_key_id = "key-id-from-file"
secret_access_key = "very-secret-key"
part_size_bytes = 8388608
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


class TestLoadConfig:
    def test_defaults_are_valid(self):
        """An empty configuration validates, with Kafka's metadata-topic defaults."""
        config = load_config(None, environ={})
        assert isinstance(config, SidecarConfig)
        assert config.remote_log_metadata.num_partitions == 50
        assert config.remote_log_metadata.topic == "__remote_log_metadata"

    def test_file_values_are_read(self, tmp_path):
        """Values in the TOML file reach the typed object with their types."""
        config = load_config(_write(tmp_path, GOOD), environ={})
        assert config.s3.bucket == "from-file"
        assert config.s3.part_size_bytes == 8388608
        assert config.broker.log_dirs == [Path("/var/lib/kafka/data")]

    def test_environment_beats_file_and_cli_beats_environment(self, tmp_path):
        """SIDECAR_* variables override the file, and --set overrides both."""
        path = _write(tmp_path, GOOD)
        env = {"SIDECAR_S3__BUCKET": "from-env", "SIDECAR_S3__REGION": "eu-west-1"}
        config = load_config(path, environ=env, overrides={"s3.bucket": "from-cli"})
        assert config.s3.bucket == "from-cli"
        assert config.s3.region == "eu-west-1"

    def test_environment_lists_are_comma_separated(self):
        """A list field given in the environment is split on commas."""
        env = {
            "SIDECAR_KAFKA__BOOTSTRAP_SERVERS": "a:1, b:2",
            "SIDECAR_BROKER__LOG_DIRS": "/d1,/d2",
        }
        config = load_config(None, environ=env)
        assert config.kafka.bootstrap_servers == ["a:1", "b:2"]
        assert config.broker.log_dirs == [Path("/d1"), Path("/d2")]

    def test_environment_maps_are_json_objects(self):
        """A map field (broker.path_map: paths with slashes as keys) is given as a JSON object."""
        env = {"SIDECAR_BROKER__PATH_MAP": '{"/var/lib/kafka/data": "/mnt/kafka"}'}
        config = load_config(None, environ=env)
        assert config.broker.path_map == {"/var/lib/kafka/data": Path("/mnt/kafka")}
        with pytest.raises(ConfigError, match=r"broker\.path_map: not a JSON object"):
            load_config(None, environ={"SIDECAR_BROKER__PATH_MAP": "{nope"})

    def test_unrelated_environment_is_ignored(self):
        """Only SIDECAR_-prefixed variables are read."""
        config = load_config(None, environ={"S3__BUCKET": "nope", "HOME": "/root"})
        assert config.s3.bucket == "kafka-tiered"

    @pytest.mark.parametrize(
        ("text", "key"),
        [
            pytest.param('[s3]\nbuckett = "x"\n', "s3.buckett", id="unknown-key"),
            pytest.param('[s3]\npart_size_bytes = "big"\n', "s3.part_size_bytes", id="wrong-type"),
            pytest.param("[nope]\na = 1\n", "nope", id="unknown-section"),
            pytest.param(
                '[kafka]\nbootstrap_servers = ["no-port"]\n',
                "kafka.bootstrap_servers",
                id="bad-host-port",
            ),
            pytest.param("[s3]\npart_size_bytes = 1024\n", "s3.part_size_bytes", id="too-small"),
            pytest.param(
                "[tiering]\nmax_upload_bytes_per_second = -1\n",
                "tiering.max_upload_bytes_per_second",
                id="negative-upload-cap",
            ),
        ],
    )
    def test_bad_values_name_the_key(self, tmp_path, text, key):
        """An unknown key or a wrong type raises ConfigError that names the key."""
        with pytest.raises(ConfigError) as info:
            load_config(_write(tmp_path, text), environ={})
        assert key in str(info.value)
        assert info.value.exit_code == 2

    def test_bad_environment_value_names_the_key(self):
        """A wrong type from the environment is reported with its key too."""
        with pytest.raises(ConfigError, match=r"metrics\.port"):
            load_config(None, environ={"SIDECAR_METRICS__PORT": "http"})

    def test_invalid_toml(self, tmp_path):
        """A file that is not TOML is a ConfigError naming the file."""
        path = _write(tmp_path, "[s3\nbucket=")
        with pytest.raises(ConfigError, match="not valid TOML"):
            load_config(path, environ={})

    def test_missing_file(self, tmp_path):
        """A missing file is a ConfigError, not a traceback."""
        with pytest.raises(ConfigError, match="cannot read"):
            load_config(tmp_path / "absent.toml", environ={})

    def test_secrets_are_masked(self, tmp_path):
        """Secrets never appear in repr, masked output or rendered TOML."""
        config = load_config(_write(tmp_path, GOOD), environ={})
        rendered = to_toml(masked(config)) + json.dumps(masked(config)) + repr(config)
        assert "very-secret-key" not in rendered
        assert "kafka-pass-123" not in rendered
        assert masked(config)["s3"]["secret_access_key"] == "**********"
        assert config.s3.secret_access_key is not None
        assert config.s3.secret_access_key.get_secret_value() == "very-secret-key"

    def test_config_is_frozen(self):
        """The configuration object cannot be changed after loading."""
        config = load_config(None, environ={})
        with pytest.raises(ValueError, match="frozen"):
            config.s3.bucket = "other"  # type: ignore[misc]


class TestConfigCheckCommand:
    def test_valid_file_prints_effective_config(self, tmp_path):
        """`sidecar config check` prints the effective config with secrets masked, exit 0."""
        result = _cli("config", "check", str(_write(tmp_path, GOOD)))
        assert result.returncode == 0, result.stderr
        assert 'bucket = "from-file"' in result.stdout
        assert "very-secret-key" not in result.stdout
        assert "# secret_access_key = (set; a secret, not shown)" in result.stdout

    def test_unknown_key_exits_2_naming_it(self, tmp_path):
        """An unknown key exits with code 2 and names the key."""
        result = _cli("config", "check", str(_write(tmp_path, '[s3]\nbuckett = "x"\n')))
        assert result.returncode == 2
        assert "s3.buckett" in result.stderr
        assert "unknown key" in result.stderr

    def test_wrong_type_exits_2_naming_it(self, tmp_path):
        """A wrong type exits with code 2 and names the key."""
        result = _cli("config", "check", str(_write(tmp_path, '[metrics]\nport = "x"\n')))
        assert result.returncode == 2
        assert "metrics.port" in result.stderr

    def test_json_output_round_trips(self, tmp_path):
        """--json prints parseable JSON of the effective config."""
        result = _cli(
            "config", "check", str(_write(tmp_path, GOOD)), "--json", "--set", "s3.prefix=p/"
        )
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["s3"]["prefix"] == "p/"
        assert data["kafka"]["sasl_password"] == "**********"

    def test_bad_set_syntax(self, tmp_path):
        """--set without '=' is a configuration error (exit 2)."""
        result = _cli("config", "check", str(_write(tmp_path, GOOD)), "--set", "s3.bucket")
        assert result.returncode == 2
        assert "KEY=VALUE" in result.stderr


class TestUploadCap:
    def test_unlimited_by_default(self):
        """Without the setting uploads are not capped (0)."""
        assert load_config(None, environ={}).tiering.max_upload_bytes_per_second == 0

    def test_file_and_environment(self, tmp_path):
        """The cap is read from the file and from SIDECAR_TIERING__MAX_UPLOAD_BYTES_PER_SECOND."""
        path = _write(tmp_path, "[tiering]\nmax_upload_bytes_per_second = 8388608\n")
        assert load_config(path, environ={}).tiering.max_upload_bytes_per_second == 8388608
        env = {"SIDECAR_TIERING__MAX_UPLOAD_BYTES_PER_SECOND": "104857600"}
        assert load_config(path, environ=env).tiering.max_upload_bytes_per_second == 104857600

    def test_negative_is_refused_with_what_to_give_instead(self):
        """A negative cap says what it means and what the valid values are."""
        env = {"SIDECAR_TIERING__MAX_UPLOAD_BYTES_PER_SECOND": "-5"}
        with pytest.raises(ConfigError) as info:
            load_config(None, environ=env)
        message = str(info.value)
        assert "tiering.max_upload_bytes_per_second" in message
        assert "must not be negative, got -5: 0 means no cap" in message
        assert info.value.exit_code == 2


class TestKafkaNames:
    def test_kafka_property_names_are_accepted(self, tmp_path):
        """Kafka's own names configure the same settings as our snake_case keys."""
        text = """
[kafka]
"bootstrap.servers" = ["b1:9092", "b2:9092"]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"

[remote_log_metadata]
"remote.log.metadata.topic.num.partitions" = 7
"remote.log.metadata.topic.replication.factor" = 2
"remote.log.metadata.topic.retention.ms" = 86400000
"remote.log.metadata.producer.linger.ms" = 5
"remote.log.metadata.consumer.fetch.max.bytes" = 1048576
"remote.log.metadata.common.client.request.timeout.ms" = 15000
"""
        config = load_config(_write(tmp_path, text), environ={})
        meta = config.remote_log_metadata
        assert config.kafka.bootstrap_servers == ["b1:9092", "b2:9092"]
        assert config.kafka.security_protocol == "SASL_SSL"
        assert (meta.num_partitions, meta.replication_factor, meta.retention_ms) == (7, 2, 86400000)
        assert meta.producer_kwargs() == {"linger_ms": 5, "request_timeout_ms": 15000}
        assert meta.consumer_kwargs() == {"fetch_max_bytes": 1048576, "request_timeout_ms": 15000}

    def test_environment_and_cli_override_a_kafka_named_key(self, tmp_path):
        """A setting the file gives under Kafka's name is overridden by the environment and
        by --set like any other, not refused as a second, unknown key, nor kept over them."""
        text = """
[kafka]
"bootstrap.servers" = ["file:9092"]

[remote_log_metadata]
"remote.log.metadata.topic.num.partitions" = 7
"remote.log.metadata.producer.linger.ms" = 5
"""
        path = _write(tmp_path, text)
        env = {
            "SIDECAR_KAFKA__BOOTSTRAP_SERVERS": "env:9092",
            "SIDECAR_REMOTE_LOG_METADATA__NUM_PARTITIONS": "9",
            "SIDECAR_REMOTE_LOG_METADATA__PRODUCER": '{"linger.ms": 20}',
        }
        config = load_config(path, environ=env)
        assert config.kafka.bootstrap_servers == ["env:9092"]
        assert config.remote_log_metadata.num_partitions == 9
        assert config.remote_log_metadata.producer == {"linger.ms": 20}
        config = load_config(
            path,
            environ=env,
            overrides={
                "kafka.bootstrap_servers": "cli:9092",
                "remote_log_metadata.num_partitions": "11",
            },
        )
        assert config.kafka.bootstrap_servers == ["cli:9092"]
        assert config.remote_log_metadata.num_partitions == 11
        # the file alone still counts
        config = load_config(path, environ={})
        assert config.kafka.bootstrap_servers == ["file:9092"]
        assert config.remote_log_metadata.producer == {"linger.ms": 5}

    def test_client_overrides_take_kafka_property_text(self, tmp_path):
        """Values as a properties file writes them ("5", "false", "none") reach the client as
        the numbers and booleans it computes with, not as text it would fail on or take as
        true."""
        text = """
[remote_log_metadata]
"remote.log.metadata.producer.linger.ms" = "5"
"remote.log.metadata.producer.compression.type" = "none"
"remote.log.metadata.consumer.check.crcs" = "false"
"remote.log.metadata.consumer.max.poll.records" = "100"
"remote.log.metadata.common.client.request.timeout.ms" = 15000
"""
        meta = load_config(_write(tmp_path, text), environ={}).remote_log_metadata
        assert meta.producer_kwargs() == {"linger_ms": 5, "request_timeout_ms": 15000}
        assert meta.consumer_kwargs() == {
            "check_crcs": False,
            "max_poll_records": 100,
            "request_timeout_ms": 15000,
        }

    @pytest.mark.parametrize(
        ("table", "value", "expected"),
        [
            ("producer", '{"linger.ms": "5ms"}', "linger.ms must be an integer of 0 or more"),
            ("producer", '{"batch.size": true}', "batch.size must be an integer of 0 or more"),
            ("producer", '{"linger.ms": 1.5}', "linger.ms must be an integer of 0 or more"),
            ("producer", '{"compression.type": "brotli"}', "compression.type must be none"),
            ("consumer", '{"check.crcs": "yes please"}', "check.crcs must be true or false"),
            ("consumer", '{"max.poll.records": 0}', "max.poll.records must be an integer of 1"),
            ("common_client", '{"retry.backoff.ms": -1}', "retry.backoff.ms must be an integer"),
        ],
    )
    def test_client_overrides_of_the_wrong_type_are_refused(self, table, value, expected):
        """A value the client cannot use is a configuration error naming the property."""
        env = {f"SIDECAR_REMOTE_LOG_METADATA__{table.upper()}": value}
        with pytest.raises(ConfigError, match=expected) as info:
            load_config(None, environ=env)
        assert f"remote_log_metadata.{table}" in str(info.value)
        assert info.value.exit_code == 2

    def test_forced_client_settings_cannot_be_overridden(self, tmp_path):
        """acks and idempotence are fixed as in Kafka's TBRLMM: overriding them is an error."""
        text = '[remote_log_metadata]\n"remote.log.metadata.producer.acks" = "1"\n'
        with pytest.raises(ConfigError, match="'acks' is not a supported client property"):
            load_config(_write(tmp_path, text), environ={})

    def test_effective_config_round_trips_through_toml(self, tmp_path):
        """`config check` output is itself a valid config with the same values."""
        text = '[remote_log_metadata]\n"remote.log.metadata.producer.linger.ms" = 5\n'
        config = load_config(_write(tmp_path, text), environ={})
        rendered = to_toml(masked(config)).replace('""  # unset', '""')
        again = tmp_path / "again.toml"
        again.write_text(
            "\n".join(line for line in rendered.splitlines() if not line.endswith('= ""'))
        )
        reloaded = load_config(again, environ={})
        assert reloaded.remote_log_metadata.producer == {"linger.ms": 5}
        assert reloaded.s3 == config.s3


class TestListsFromTheEnvironment:
    """A list from SIDECAR_* or --set splits at commas, but not inside a regex's brackets."""

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            ("orders, events-.*", ["orders", "events-.*"]),
            (r"events-\d{1,3},audit", [r"events-\d{1,3}", "audit"]),
            (r"x[,;]y,(a|b,c)", [r"x[,;]y", "(a|b,c)"]),
            (r"a\,b,c", [r"a\,b", "c"]),
            ('["a,b", "c"]', ["a,b", "c"]),
        ],
    )
    def test_include_topics(self, raw, expected):
        config = load_config(None, environ={"SIDECAR_TIERING__INCLUDE_TOPICS": raw})
        assert config.tiering.include_topics == expected
        config = load_config(None, environ={}, overrides={"tiering.include_topics": raw})
        assert config.tiering.include_topics == expected


class TestMaskedSecrets:
    """Secrets print as a mask; printed output loaded back never sends the mask as one."""

    def test_effective_output_loads_back_with_the_secrets_from_the_environment(self, tmp_path):
        result = _cli("config", "check", str(_write(tmp_path, GOOD)), "--effective")
        assert result.returncode == 0, result.stderr
        assert "very-secret-key" not in result.stdout
        assert "# secret_access_key = (set; a secret, not shown)" in result.stdout
        again = tmp_path / "effective.toml"
        again.write_text(result.stdout)
        environ = {
            "SIDECAR_S3__ACCESS_KEY_ID": "id-from-env",
            "SIDECAR_S3__SECRET_ACCESS_KEY": "key-from-env",
            "SIDECAR_KAFKA__SASL_PASSWORD": "pass-from-env",
        }
        reloaded = load_config(again, environ=environ)
        assert reloaded.s3.access_key_id is not None
        assert reloaded.s3.access_key_id.get_secret_value() == "id-from-env"
        assert reloaded.s3.secret_access_key is not None
        assert reloaded.s3.secret_access_key.get_secret_value() == "key-from-env"
        assert reloaded.kafka.sasl_password is not None
        assert reloaded.kafka.sasl_password.get_secret_value() == "pass-from-env"
        assert reloaded.s3.bucket == "from-file"

    @pytest.mark.parametrize(
        ("key", "text"),
        [
            ("s3.access_key_id", '[s3]\naccess_key_id = "**********"\nsecret_access_key = "x"\n'),
            (
                "s3.secret_access_key",
                '[s3]\naccess_key_id = "x"\nsecret_access_key = "**********"\n',
            ),
            ("kafka.sasl_password", '[kafka]\nsasl_password = "**********"\n'),
        ],
    )
    def test_the_mask_as_a_secret_is_refused(self, tmp_path, key, text):
        with pytest.raises(ConfigError, match=r"the mask printed in place of a secret") as info:
            load_config(_write(tmp_path, text), environ={})
        assert key in str(info.value)


class TestEndpointCredentials:
    """An S3 endpoint never carries credentials: botocore names the URL in its connection
    errors, which reach logs and /readyz, and `config check` prints it."""

    @pytest.mark.parametrize(
        "url",
        [
            "http://user:hunter22pw@minio:9000",
            "http://user:hunter22pw@minio:port",  # also a bad port
            "ftp://user:hunter22pw@minio",  # also a bad scheme
            "user:hunter22pw@minio:9000",  # no scheme
            "http://user:hun/ter22pw@minio:9000",  # a '/' in the password
        ],
    )
    def test_userinfo_is_refused_without_echoing_it(self, url):
        with pytest.raises(ConfigError, match="holds credentials") as info:
            load_config(None, environ={"SIDECAR_S3__ENDPOINT_URL": url})
        assert "hunter22pw" not in str(info.value)
        assert "ter22pw" not in str(info.value)
        assert "s3.endpoint_url" in str(info.value)

    def test_a_plain_endpoint_is_kept(self):
        config = load_config(None, environ={"SIDECAR_S3__ENDPOINT_URL": "http://minio:9000"})
        assert config.s3.endpoint_url == "http://minio:9000"


class TestOwnPathsOutsideTheLogDirs:
    """The daemon never writes in the broker's log dirs: its state, socket and chunk cache
    are refused there, symlinks followed, and the cache (which removes the .tmp files below
    it) may not hold a log dir."""

    @staticmethod
    def _load(**overrides: str) -> SidecarConfig:
        return load_config(None, environ={}, overrides=overrides)

    @pytest.mark.parametrize(
        ("key", "inside"),
        [
            ("state_dir", "sidecar"),
            ("read_server.cache_dir", "cache"),
            ("read_server.socket_path", "read.sock"),
            ("state_dir", ""),
        ],
    )
    def test_inside_a_log_dir_is_refused(self, tmp_path, key, inside):
        logs = tmp_path / "logs"
        with pytest.raises(ConfigError) as info:
            self._load(
                **{"broker.log_dirs": f"{tmp_path / 'other'},{logs}", key: str(logs / inside)}
            )
        assert f"{key} ({logs / inside}" in str(info.value)
        assert f"inside broker.log_dirs entry {logs}" in str(info.value)
        assert info.value.exit_code == 2

    def test_through_a_symlink_is_refused(self, tmp_path):
        logs = tmp_path / "logs"
        logs.mkdir()
        (tmp_path / "link").symlink_to(logs)
        with pytest.raises(ConfigError, match=r"inside broker\.log_dirs entry"):
            self._load(**{"broker.log_dirs": str(logs), "state_dir": str(tmp_path / "link" / "s")})

    def test_a_cache_that_holds_a_log_dir_is_refused(self, tmp_path):
        with pytest.raises(ConfigError, match=r"read_server\.cache_dir .* holds broker\.log_dirs"):
            self._load(
                **{
                    "broker.log_dirs": str(tmp_path / "data" / "logs"),
                    "read_server.cache_dir": str(tmp_path / "data"),
                }
            )

    def test_a_state_dir_beside_or_above_the_log_dirs_is_fine(self, tmp_path):
        config = self._load(
            **{"broker.log_dirs": str(tmp_path / "logs"), "state_dir": str(tmp_path)}
        )
        assert config.read_cache_dir == tmp_path / "read-cache"
        assert config.read_socket_path == tmp_path / "read.sock"


class TestValuesThatWouldMisbehaveLater:
    def test_metadata_retention_of_zero_is_refused(self):
        with pytest.raises(ConfigError) as info:
            load_config(None, environ={}, overrides={"remote_log_metadata.retention_ms": "0"})
        assert "remote_log_metadata.retention_ms" in str(info.value)
        assert "must be -1" in str(info.value)

    @pytest.mark.parametrize("given", ["access_key_id", "secret_access_key"])
    def test_one_s3_key_without_its_pair_is_refused(self, given):
        with pytest.raises(ConfigError) as info:
            load_config(None, environ={f"SIDECAR_S3__{given.upper()}": "k-123"})
        assert f"s3.{given} is set without its pair" in str(info.value)
        assert "k-123" not in str(info.value)

    def test_a_secret_spelled_none_is_kept(self):
        env = {"SIDECAR_S3__ACCESS_KEY_ID": "None", "SIDECAR_S3__SECRET_ACCESS_KEY": "null"}
        config = load_config(None, environ=env)
        assert config.s3.access_key_id is not None
        assert config.s3.access_key_id.get_secret_value() == "None"
        assert config.s3.secret_access_key is not None
        assert config.s3.secret_access_key.get_secret_value() == "null"

    def test_null_unsets_only_a_setting_that_can_be_unset(self):
        """`null` unsets an optional setting; a text setting keeps the word, which the file
        could give as a string too (a bucket or a topic may be named "null")."""
        env = {
            "SIDECAR_S3__BUCKET": "null",
            "SIDECAR_S3__PREFIX": "None",
            "SIDECAR_REMOTE_LOG_METADATA__TOPIC": "null",
            "SIDECAR_S3__ENDPOINT_URL": "null",
        }
        config = load_config(None, environ=env, overrides={"read_server.tcp_port": "none"})
        assert (config.s3.bucket, config.s3.prefix) == ("null", "None")
        assert config.remote_log_metadata.topic == "null"
        assert config.s3.endpoint_url is None
        assert config.read_server.tcp_port is None

    def test_a_stale_limit_within_the_refresh_interval_is_refused(self):
        overrides = {
            "kafka.metadata_refresh_interval_s": "30",
            "kafka.metadata_stale_after_s": "20",
        }
        with pytest.raises(ConfigError, match=r"metadata_stale_after_s \(20.0\) must be longer"):
            load_config(None, environ={}, overrides=overrides)

    def test_a_relative_state_dir_is_refused(self):
        with pytest.raises(ConfigError, match=r"state_dir.*must be an absolute path, got state"):
            load_config(None, environ={}, overrides={"state_dir": "state"})
        home = load_config(None, environ={}, overrides={"state_dir": "~/sidecar"}).state_dir
        assert home == Path.home() / "sidecar"

    def test_json_output_with_a_path_map(self, tmp_path):
        """--json renders mappings of paths (broker.path_map) as JSON objects."""
        result = _cli(
            "config",
            "check",
            str(_write(tmp_path, GOOD)),
            "--json",
            "--set",
            'broker.path_map={"/kafka/data": "/mnt/broker"}',
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["broker"]["path_map"] == {"/kafka/data": "/mnt/broker"}
