"""`sidecar broker-config`: the broker properties for broker-driven tiering through this sidecar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sidecar import broker_config
from sidecar.broker_config import (
    PLUGIN_CLASS,
    broker_config_command,
    broker_properties,
    check_properties,
)
from sidecar.cli import main
from sidecar.config import load_config
from sidecar.errors import ConfigError
from sidecar.tiering.cluster import BrokerConfigEntry


def _properties(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


class TestBrokerConfig:
    def test_properties_point_the_broker_at_this_sidecar(self, tmp_path):
        """The plugin on the read socket, Kafka's RLMM with the metadata topic's settings."""
        config = load_config(
            None,
            environ={},
            overrides={
                "state_dir": str(tmp_path),
                "remote_log_metadata.num_partitions": "7",
                "remote_log_metadata.replication_factor": "2",
            },
        )
        out = io.StringIO()
        jar = tmp_path / "plugin.jar"
        assert (
            broker_config_command(config, plugin_jar=jar, listener="INT", tcp=False, out=out) == 0
        )
        props = _properties(out.getvalue())
        assert props["remote.log.storage.system.enable"] == "true"
        assert props["remote.log.storage.manager.class.name"] == PLUGIN_CLASS
        assert props["remote.log.storage.manager.class.path"] == str(jar)
        assert props["rsm.config.socket.path"] == str(tmp_path / "read.sock")
        assert props["remote.log.metadata.manager.listener.name"] == "INT"
        assert props["rlmm.config.remote.log.metadata.topic.num.partitions"] == "7"
        assert props["rlmm.config.remote.log.metadata.topic.replication.factor"] == "2"

    def test_tcp_needs_a_port(self):
        config = load_config(None, environ={})
        with pytest.raises(ConfigError, match="tcp_port"):
            broker_properties(config, tcp=True)
        config = load_config(None, environ={}, overrides={"read_server.tcp_port": "9100"})
        props = broker_properties(config, tcp=True)
        assert props["rsm.config.tcp.port"] == "9100"
        assert "rsm.config.socket.path" not in props

    def test_the_cache_files_the_plugin_reads(self, tmp_path):
        """By default the output names the cache directory the broker must be able to read
        (as the broker's container mounts it); a sidecar that offers no files has the plugin
        not ask for them."""

        def output(**overrides: str) -> str:
            config = load_config(
                None, environ={}, overrides={"state_dir": str(tmp_path), **overrides}
            )
            out = io.StringIO()
            broker_config_command(
                config, plugin_jar=Path("/p.jar"), listener="L", tcp=False, out=out
            )
            return out.getvalue()

        default = output()
        assert f"read access to {tmp_path / 'read-cache'} " in default
        assert "rsm.config.fetch.files" not in _properties(default)
        pod = output(**{"read_server.broker_cache_dir": "/pod/cache"})
        assert "read access to /pod/cache " in pod
        off = output(**{"read_server.offer_cache_files": "false"})
        assert _properties(off)["rsm.config.fetch.files"] == "false"
        assert "read access" not in off

    @pytest.mark.parametrize(
        ("protocol", "keys"),
        [
            ("PLAINTEXT", []),
            ("SASL_PLAINTEXT", ["sasl.mechanism", "sasl.jaas.config"]),
            ("SSL", ["ssl.truststore.location", "ssl.truststore.password"]),
        ],
    )
    def test_a_secured_cluster_names_the_metadata_managers_credentials(
        self, tmp_path, protocol, keys
    ):
        """Kafka gives its metadata manager the listener's address and protocol, not the
        broker's credentials: on a secured cluster the output names the client settings to
        add, as comments (their values are secrets), and the properties stay the same."""
        overrides = {"state_dir": str(tmp_path), "kafka.security_protocol": protocol}
        if protocol.startswith("SASL"):
            overrides |= {"kafka.sasl_mechanism": "PLAIN", "kafka.sasl_username": "u"}
        config = load_config(
            None, environ={"SIDECAR_KAFKA__SASL_PASSWORD": "p"}, overrides=overrides
        )
        out = io.StringIO()
        broker_config_command(config, plugin_jar=Path("/p.jar"), listener="INT", tcp=False, out=out)
        named = [
            line.removeprefix("# rlmm.config.remote.log.metadata.common.client.").rstrip("=")
            for line in out.getvalue().splitlines()
            if line.startswith("# rlmm.config.")
        ]
        assert named == keys
        assert _properties(out.getvalue()) == broker_properties(
            config, plugin_jar=Path("/p.jar"), listener="INT"
        )

    def test_a_renamed_metadata_topic_is_refused(self):
        """Kafka's metadata manager cannot use another topic: say so instead of splitting."""
        config = load_config(None, environ={}, overrides={"remote_log_metadata.topic": "other"})
        with pytest.raises(ConfigError, match="__remote_log_metadata"):
            broker_properties(config)

    @pytest.mark.parametrize("key", ["socket_path", "cache_dir", "broker_cache_dir"])
    def test_a_relative_read_server_path_is_refused(self, key, capsys):
        """The broker resolves the printed socket path and cache directory against its own
        working directory: a relative one is a configuration error (exit 2), never printed."""
        code = main(["broker-config", "--set", f"read_server.{key}=run/sidecar"])
        captured = capsys.readouterr()
        assert code == 2
        assert captured.out == ""
        assert f"read_server.{key}" in captured.err
        assert "must be an absolute path" in captured.err

    @pytest.mark.parametrize(
        ("seconds", "printed"), [("30", "30000"), ("0.0004", "1"), ("1e7", str(2**31 - 1))]
    )
    def test_the_read_timeout_is_one_the_plugin_takes(self, seconds, printed):
        """The plugin refuses 0 and anything past a Java int: the broker would not start."""
        config = load_config(None, environ={}, overrides={"read_server.fetch_timeout_s": seconds})
        assert broker_properties(config)["rsm.config.read.idle.timeout.ms"] == printed

    def test_cli(self, tmp_path, capsys):
        code = main(["broker-config", "--set", f"state_dir={tmp_path}", "--plugin-jar", "/x.jar"])
        assert code == 0
        props = _properties(capsys.readouterr().out)
        assert props["remote.log.storage.manager.class.path"] == str(Path("/x.jar"))

    @pytest.mark.parametrize("flag", [["--json"], ["--broker-id", "1"]])
    def test_check_only_flags_without_check_are_usage_errors(self, tmp_path, capsys, flag):
        """`--json` without `--check` would print properties text where JSON was asked for;
        it (and `--broker-id`) is refused with exit 2, printing nothing on stdout."""
        code = main(["broker-config", "--set", f"state_dir={tmp_path}", *flag])
        captured = capsys.readouterr()
        assert code == 2
        assert captured.out == ""
        assert f"{flag[0]} goes with --check" in captured.err


def _entry(value: str | None, *, hidden: bool = False, default: bool = False) -> BrokerConfigEntry:
    return BrokerConfigEntry(value=value, hidden=hidden, default=default)


class TestBrokerConfigCheck:
    def test_each_property_gets_a_verdict(self):
        """As printed: ok. Hidden by Kafka (a plugin's own keys): set. Another value set in the
        broker's properties: differs. Unset, or Kafka's default and not the value printed:
        missing; Kafka's default that is the value printed: ok."""
        expected = {
            "a": "1",
            "b": "2",
            "c": "3",
            "d": "4",
            "e": "5",
            "f": "6",
            "rsm.config.socket.path": "/s",
        }
        found = {
            "a": _entry("1"),
            "b": _entry("9"),
            "c": _entry("false", default=True),
            "d": _entry(None, default=True),
            "f": _entry("6", default=True),
            "rsm.config.socket.path": _entry(None, hidden=True),
        }
        checks = check_properties(expected, found)
        assert [(c.key, c.verdict, c.actual) for c in checks] == [
            ("a", "ok", "1"),
            ("b", "differs", "9"),
            ("c", "missing", "false"),
            ("d", "missing", None),
            ("e", "missing", None),
            ("f", "ok", "6"),
            ("rsm.config.socket.path", "set", None),
        ]
        assert [c.passed for c in checks] == [True, False, False, False, False, True, True]

    def test_the_report_names_what_to_fix_and_exits_1(self, tmp_path, monkeypatch, capsys):
        config = load_config(None, environ={}, overrides={"state_dir": str(tmp_path)})
        props = broker_properties(config, plugin_jar=Path("/p.jar"))
        answers = {key: _entry(value) for key, value in props.items()}
        answers["remote.log.storage.manager.class.name"] = _entry("org.example.Other")
        del answers["rsm.config.socket.path"]
        asked: list[tuple[int, list[str]]] = []

        async def describe(_config, broker_id, keys):
            asked.append((broker_id, keys))
            return answers

        monkeypatch.setattr(broker_config, "_describe", describe)
        argv = ["broker-config", "--check", "--set", f"state_dir={tmp_path}"]
        code = main([*argv, "--plugin-jar", "/p.jar", "--broker-id", "7"])
        out = capsys.readouterr().out
        assert code == 1
        assert asked == [(7, list(props))]
        assert f"broker 7: {len(props) - 2} of {len(props)} properties" in out
        differs = "DIFFERS  remote.log.storage.manager.class.name=org.example.Other"
        assert f"{differs} (printed: {PLUGIN_CLASS})" in out
        assert "MISSING  rsm.config.socket.path not set (printed: " in out
        assert "restart it" in out
        # all there: exit 0, and the JSON document says so
        answers = {key: _entry(value) for key, value in props.items()}
        code = main([*argv, "--plugin-jar", "/p.jar", "--broker-id", "7", "--json"])
        document = json.loads(capsys.readouterr().out)
        assert code == 0
        assert document["ok"] is True
        assert {p["verdict"] for p in document["properties"]} == {"ok"}

    def test_the_broker_id_comes_from_the_log_dirs(self, tmp_path, monkeypatch, capsys):
        """Without --broker-id or broker.broker_id, the log dirs' meta.properties name the
        broker; with none of them the command says what to give (exit 2)."""
        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        asked: list[int] = []

        async def describe(_config, broker_id, keys):
            asked.append(broker_id)
            return {}

        monkeypatch.setattr(broker_config, "_describe", describe)
        argv = ["broker-config", "--check", "--set", f"state_dir={tmp_path}"]
        argv += ["--set", f'broker.log_dirs=["{log_dir}"]']
        assert main(argv) == 2
        assert "--broker-id" in capsys.readouterr().err
        (log_dir / "meta.properties").write_text("version=1\nnode.id=3\ncluster.id=abc\n")
        assert main(argv) == 1  # nothing is set on that (fake) broker
        assert asked == [3]

    def test_an_unreachable_cluster_is_one_error_line(self, tmp_path, capsys):
        code = main(
            [
                *("broker-config", "--check", "--broker-id", "1"),
                *("--set", f"state_dir={tmp_path}"),
                *("--set", 'kafka.bootstrap_servers=["127.0.0.1:1"]'),
                *("--set", "kafka.request_timeout_ms=2000"),
            ]
        )
        err = capsys.readouterr().err
        assert code == 1
        assert err.startswith("sidecar: error: cannot ask broker 1 for its configs through Kafka")
        assert len(err.strip().splitlines()) == 1
