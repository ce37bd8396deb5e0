"""`sidecar broker-config`: the broker properties for broker-driven tiering through this sidecar."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sidecar.broker_config import PLUGIN_CLASS, broker_config_command, broker_properties
from sidecar.cli import main
from sidecar.config import load_config
from sidecar.errors import ConfigError


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

    def test_a_renamed_metadata_topic_is_refused(self):
        """Kafka's metadata manager cannot use another topic: say so instead of splitting."""
        config = load_config(None, environ={}, overrides={"remote_log_metadata.topic": "other"})
        with pytest.raises(ConfigError, match="__remote_log_metadata"):
            broker_properties(config)

    def test_cli(self, tmp_path, capsys):
        code = main(["broker-config", "--set", f"state_dir={tmp_path}", "--plugin-jar", "/x.jar"])
        assert code == 0
        props = _properties(capsys.readouterr().out)
        assert props["remote.log.storage.manager.class.path"] == str(Path("/x.jar"))
