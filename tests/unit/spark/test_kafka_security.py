"""Kafka security settings for the Spark source and `spark verify`: Spark's Kafka source option
names, or a sidecar config file, become the same aiokafka arguments the daemon uses."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sidecar.config import load_config
from sidecar.errors import ConfigError
from sidecar.spark._options import (
    SparkOptionError,
    kafka_security,
    parse_options,
    spark_kafka_options,
)
from sidecar.spark.verify import add_arguments, verify_options

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required"
    ' username="audit" password="s3cr\\"et";'
)


class TestKafkaSecurity:
    def test_spark_names_become_client_options(self):
        """SASL_PLAINTEXT + SCRAM + a JAAS line: aiokafka gets the mechanism and credentials,
        and the password never shows in repr."""
        security = kafka_security(
            {
                "kafka.security.protocol": "sasl_plaintext",
                "kafka.sasl.mechanism": "SCRAM-SHA-512",
                "kafka.sasl.jaas.config": JAAS,
            }
        )
        options = security.client_options()
        assert options["security_protocol"] == "SASL_PLAINTEXT"
        assert options["sasl_mechanism"] == "SCRAM-SHA-512"
        assert options["sasl_plain_username"] == "audit"
        assert options["sasl_plain_password"] == 's3cr"et'
        assert "s3cr" not in repr(security)

    def test_single_quoted_jaas_values(self):
        """Kafka's JAAS parser takes ' as well as " around a value, so Spark's Kafka source
        accepts such a line; the credentials are read from it."""
        security = kafka_security(
            {
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.jaas.config": (
                    "org.apache.kafka.common.security.plain.PlainLoginModule required"
                    " username='audit' password='pa\"ss\\'word';"
                ),
            }
        )
        assert (security.username, security.password) == ("audit", "pa\"ss'word")

    def test_bare_word_jaas_values(self):
        """Kafka's JAAS parser takes an unquoted word as a value too."""
        security = kafka_security(
            {
                "kafka.security.protocol": "SASL_PLAINTEXT",
                "kafka.sasl.jaas.config": (
                    "org.apache.kafka.common.security.plain.PlainLoginModule required"
                    " username=audit password=s3cr-et_$;"
                ),
            }
        )
        assert (security.username, security.password) == ("audit", "s3cr-et_$")

    def test_defaults_are_plaintext(self):
        """Without security options the source connects in plaintext, as before."""
        options = parse_options(
            {"s3.bucket": "b", "kafka.bootstrap.servers": "h:9092", "subscribe": "t"}
        )
        assert options.kafka_security.client_options() == {"security_protocol": "PLAINTEXT"}

    @pytest.mark.parametrize(
        ("options", "words"),
        [
            ({"kafka.security.protocol": "SASL_SSL"}, "kafka.sasl.jaas.config"),
            ({"kafka.security.protocol": "KERBEROS"}, "kafka.security.protocol"),
            (
                {"kafka.ssl.truststore.location": "/x.jks", "kafka.ssl.truststore.type": "JKS"},
                "PEM",
            ),
        ],
    )
    def test_unusable_settings_are_refused(self, options, words):
        """Settings the driver cannot honour are an option error naming the option."""
        with pytest.raises(SparkOptionError, match=words):
            kafka_security(options)

    def test_sidecar_config_round_trips_through_spark_names(self, tmp_path: Path):
        """A sidecar [kafka] section, written as Spark options and read back, gives the same
        aiokafka arguments as the daemon's own translation."""
        from sidecar.config import kafka_client_options

        path = tmp_path / "s.toml"
        path.write_text(
            '[kafka]\nsecurity_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
            'sasl_username = "u"\nsasl_password = "p\\"w"\n'
        )
        kafka = load_config(path, environ={}).kafka
        spark = {k.lower(): v for k, v in spark_kafka_options(kafka).items()}
        assert kafka_security(spark).client_options() == kafka_client_options(kafka)


class TestEndpointCredentials:
    def test_credentials_in_the_endpoint_are_refused_unechoed(self):
        """botocore names the endpoint in its connection errors, which Spark shows with the
        failed task: an s3.endpoint with user:password@ is refused, the password not echoed."""
        with pytest.raises(SparkOptionError, match=r"s3\.endpoint holds credentials") as info:
            parse_options(
                {"s3.bucket": "b", "s3.endpoint": "http://u:hunter22pw@h:9000", "subscribe": "t"}
            )
        assert "hunter22pw" not in str(info.value)


class TestVerifyOptions:
    def _args(self, *argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return parser.parse_args(argv)

    def test_a_malformed_option_is_not_echoed(self):
        """A mistyped `--option s3.secretAccessKey:VALUE` is refused without its text."""
        args = self._args("--bucket", "b", "--option", "s3.secretAccessKey:s3-secret-7c1")
        with pytest.raises(ConfigError, match="option 1 is not one") as info:
            verify_options(args)
        assert "s3-secret-7c1" not in str(info.value)

    def test_config_file_supplies_bucket_cluster_and_security(self, tmp_path: Path, monkeypatch):
        """`spark verify -c FILE` reads the bucket, the metadata topic and the cluster with its
        SASL settings from the sidecar's config; flags and --option override it."""
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name, raising=False)
        path = tmp_path / "s.toml"
        path.write_text(
            '[kafka]\nbootstrap_servers = ["b1:9093"]\nsecurity_protocol = "SASL_SSL"\n'
            'sasl_mechanism = "SCRAM-SHA-256"\nsasl_username = "u"\nsasl_password = "p"\n'
            '[s3]\nbucket = "tier"\nprefix = "p/"\nendpoint_url = "http://127.0.0.1:9000"\n'
            '[remote_log_metadata]\ntopic = "__rlm"\n'
        )
        options = verify_options(
            self._args("-c", str(path), "--prefix", "q/", "--option", "verifyCrc=false")
        )
        assert options["s3.bucket"] == "tier"
        assert options["s3.prefix"] == "q/"
        assert options["s3.endpoint"] == "http://127.0.0.1:9000"
        assert options["kafka.bootstrap.servers"] == "b1:9093"
        assert options["metadata.topic"] == "__rlm"
        assert options["verifyCrc"] == "false"
        parsed = parse_options({**options, "subscribe": "t"})
        assert parsed.kafka_security.protocol == "SASL_SSL"
        assert parsed.kafka_security.username == "u"

    def test_bootstrap_server_spellings(self):
        """--bootstrap-server and --bootstrap-servers both work, as in every command."""
        for flag in ("--bootstrap-server", "--bootstrap-servers"):
            options = verify_options(self._args("--bucket", "b", flag, "h:9092"))
            assert options["kafka.bootstrap.servers"] == "h:9092"
