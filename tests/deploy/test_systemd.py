"""The systemd unit, its environment file and its sysusers.d entry in deploy/systemd/:
``systemd-analyze verify`` is silent, the sandbox scores OK, and the paths agree with the config."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sidecar.broker_config import DEFAULT_PLUGIN_JAR
from sidecar.config import load_config
from sidecar.readserver.app import SOCKET_MODE
from tests.deploy._tools import DEPLOY, describe, run, tool

UNIT = DEPLOY / "systemd" / "kafka-tiered-sidecar.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "kafka-tiered-sidecar.env.example"
SYSUSERS = DEPLOY / "systemd" / "kafka-tiered-sidecar.sysusers"
BROKER_PROPERTIES = DEPLOY / "systemd" / "server.properties.tiered"
INSTALLED_EXEC = "/opt/kafka-tiered-sidecar/bin/sidecar"
MAX_EXPOSURE = 2.5  # systemd-analyze security calls < 2.5 "OK"


def directives(section: str) -> list[tuple[str, str]]:
    """(key, value) pairs of one section, in order; a key may repeat (systemd accumulates)."""
    current, pairs = None, []
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section:
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def values(key: str, section: str = "Service") -> list[str]:
    return [value for k, value in directives(section) if k == key]


def single(key: str, section: str = "Service") -> str:
    found = values(key, section)
    assert len(found) == 1, f"{key}= appears {len(found)} times in [{section}]"
    return found[0]


def seconds(value: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "ms": 0.001, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def env_example() -> dict[str, str]:
    environ = {}
    for raw in ENV_EXAMPLE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"not KEY=VALUE: {line!r}"
            environ[key] = value
    return environ


def local_executable() -> str:
    """An executable that exists here, to stand in for the installed ``sidecar`` script."""
    script = Path(sysconfig.get_path("scripts")) / "sidecar"
    if script.is_file():
        return str(script)
    return f"{sys.executable} -m sidecar"


@pytest.fixture
def unit_here(tmp_path: Path) -> Path:
    """The unit with ExecStart= pointing at this environment's sidecar (verify checks it)."""
    text = UNIT.read_text()
    assert f"ExecStart={INSTALLED_EXEC} " in text
    path = tmp_path / UNIT.name
    path.write_text(
        text.replace(f"ExecStart={INSTALLED_EXEC} ", f"ExecStart={local_executable()} ")
    )
    return path


class TestUnitWithSystemdAnalyze:
    """systemd's own checks of the unit."""

    def test_verify_is_silent(self, unit_here: Path):
        """``systemd-analyze verify`` exits 0 and prints nothing (its warnings exit 0 too)."""
        result = run([tool("systemd-analyze"), "verify", str(unit_here)], cwd=unit_here.parent)
        assert result.returncode == 0, describe(result)
        assert result.stderr.strip() == "", describe(result)
        assert result.stdout.strip() == "", describe(result)

    def test_security_exposure_is_ok(self, unit_here: Path):
        """``systemd-analyze security --offline=true`` rates the sandbox below 2.5 (OK)."""
        result = run([tool("systemd-analyze"), "security", "--offline=true", str(unit_here)])
        assert result.returncode == 0, describe(result)
        match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", result.stdout)
        assert match, describe(result)
        score = float(match.group(1))
        print(f"\nsystemd-analyze security: {score} {match.group(2)}")
        assert score < MAX_EXPOSURE, describe(result)

    def test_sysusers_entry_creates_the_unit_user(self, tmp_path: Path):
        """The sysusers.d entry is valid and creates the User= of the unit."""
        (tmp_path / "etc").mkdir()
        result = run(
            [
                tool("systemd-sysusers"),
                f"--root={tmp_path}",
                "--dry-run",
                str(SYSUSERS.resolve()),
            ]
        )
        assert result.returncode == 0, describe(result)
        assert "ignoring" not in result.stderr.lower(), describe(result)
        user = single("User")
        assert f"Creating user '{user}'" in result.stdout + result.stderr, describe(result)


class TestUnitDirectives:
    """The hardening and lifecycle directives the deployment relies on."""

    @pytest.mark.parametrize(
        ("key", "expected"),
        [
            ("Type", "exec"),
            ("Restart", "on-failure"),
            ("KillSignal", "SIGTERM"),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("PrivateDevices", "yes"),
            ("CapabilityBoundingSet", ""),
            ("AmbientCapabilities", ""),
            ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
            ("MemoryDenyWriteExecute", "yes"),
            ("LockPersonality", "yes"),
            ("RestrictNamespaces", "yes"),
            ("RestrictSUIDSGID", "yes"),
            ("SystemCallArchitectures", "native"),
        ],
    )
    def test_directive(self, key, expected):
        """The directive is set once, to the hardened value."""
        assert single(key) == expected

    def test_lasting_errors_are_not_restarted_forever(self):
        """A configuration error and a prefix owned by another cluster stay until an operator
        acts: the unit fails instead of restarting every RestartSec."""
        from sidecar.errors import ConfigError
        from sidecar.storage.ownership import PrefixOwnershipError

        codes = {int(code) for code in single("RestartPreventExitStatus").split()}
        assert codes == {ConfigError.exit_code, PrefixOwnershipError.exit_code}

    def test_the_broker_config_step_runs_with_the_units_settings(self):
        """The install comment runs broker-config with the unit's environment file and its
        installed script: without them it prints the defaults' socket path, not the unit's."""
        text = UNIT.read_text()
        assert ". /etc/kafka-tiered-sidecar/kafka-tiered-sidecar.env" in text
        assert "/opt/kafka-tiered-sidecar/bin/sidecar broker-config'" in text
        assert "pip install kafka-tiered-sidecar\n" not in text

    def test_system_call_filter_allows_only_system_service(self):
        """The first SystemCallFilter= is the @system-service allow list."""
        assert values("SystemCallFilter")[0] == "@system-service"

    def test_runs_as_a_dedicated_user(self):
        """User= and Group= name an unprivileged account, not root."""
        assert single("User") not in {"root", "0"}
        assert single("Group") not in {"root", "0"}

    def test_exec_start_runs_the_installed_script(self):
        """ExecStart= runs ``sidecar run`` from the documented install path."""
        assert single("ExecStart").split()[:2] == [INSTALLED_EXEC, "run"]
        assert single("EnvironmentFile").startswith("/etc/kafka-tiered-sidecar/")

    def test_stop_timeout_exceeds_the_drain_timeout(self):
        """TimeoutStopSec= leaves room above the configured drain before SIGKILL."""
        drain = load_config(environ=env_example()).tiering.drain_timeout_s
        assert seconds(single("TimeoutStopSec")) > drain + 10

    def test_log_dirs_are_read_only_and_state_is_writable(self):
        """The broker's log dirs are ReadOnlyPaths=; state and cache are ReadWritePaths=."""
        config = load_config(environ=env_example())
        read_only = " ".join(values("ReadOnlyPaths")).split()
        read_write = " ".join(values("ReadWritePaths")).split()
        for log_dir in config.broker.log_dirs:
            assert str(log_dir) in read_only
            assert not any(str(log_dir).startswith(path) for path in read_write)
        assert str(config.state_dir) in read_write
        assert str(config.read_server.cache_dir) in read_write
        runtime = f"/run/{single('RuntimeDirectory')}"
        assert str(config.read_server.socket_path).startswith(runtime + "/")
        assert config.state_dir == Path("/var/lib") / single("StateDirectory")
        assert config.read_server.cache_dir == Path("/var/cache") / single("CacheDirectory")


class TestEnvironmentFile:
    """The unit's environment file example, kafka-tiered-sidecar.env.example."""

    def test_every_variable_is_a_config_key(self):
        """The file loads with the sidecar's config model (unknown SIDECAR_* keys are errors)."""
        environ = env_example()
        assert all(key.startswith("SIDECAR_") for key in environ)
        load_config(environ=environ)

    def test_s3_credentials_are_placeholders(self):
        """The S3 key pair is present as obvious placeholders, never as a real-looking secret."""
        environ = env_example()
        for key in ("SIDECAR_S3__ACCESS_KEY_ID", "SIDECAR_S3__SECRET_ACCESS_KEY"):
            assert environ[key].startswith("REPLACE_WITH_"), key
        config = load_config(environ=environ)
        assert config.s3.secret_access_key is not None
        assert "REPLACE" not in repr(config.s3)

    def test_readme_moves_every_non_secret_setting_to_the_toml(self):
        """The README's advice to keep the settings the CLI needs in a world-readable
        sidecar.toml names each non-secret key the file sets: a key left behind (the socket
        path) sends `sidecar read -c` and `sidecar broker-config -c` to the defaults' paths."""
        readme = (DEPLOY.parent / "README.md").read_text()
        advice = readme[readme.index("Keep the non-secret settings") :]
        advice = advice[: advice.index("in a world-readable")]
        named = set(re.findall(r"`([a-z0-9_.*]+)`", advice))
        secrets = {"s3.access_key_id", "s3.secret_access_key", "kafka.sasl_password"}
        for variable in env_example():
            key = variable.removeprefix("SIDECAR_").lower().replace("__", ".")
            if key in secrets:
                continue
            section = key.split(".")[0]
            assert key in named or f"{section}.*" in named, f"{key} is not named in: {advice}"


class TestBrokerPluginOnSystemd:
    """server.properties.tiered: what a broker host appends for broker-driven tiering."""

    @staticmethod
    def properties() -> list[str]:
        lines = BROKER_PROPERTIES.read_text().splitlines()
        return [line for line in lines if line and not line.startswith("#")]

    def test_properties_are_sidecar_broker_config(self):
        """The example's properties are, line for line, what `sidecar broker-config` prints with
        the environment file's settings."""
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "broker-config"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            env={"PATH": os.environ.get("PATH", ""), **env_example()},
        )
        assert result.returncode == 0, result.stderr
        printed = [line for line in result.stdout.splitlines() if not line.startswith("#")]
        assert self.properties() == printed

    def test_jar_path_is_the_images(self):
        """The broker loads the jar from the path the image and the Helm chart use too, and the
        install steps put it there."""
        props = dict(line.split("=", 1) for line in self.properties())
        jar = props["remote.log.storage.manager.class.path"]
        assert jar == str(DEFAULT_PLUGIN_JAR)
        assert f"{jar}" in UNIT.read_text()
        assert "install -D -m 0644 kafka-tiered-sidecar-plugin.jar" in BROKER_PROPERTIES.read_text()

    def test_broker_user_can_reach_the_socket(self):
        """The socket lies in the unit's runtime directory, whose group (the unit's) may enter
        it; the socket itself is group read-write, and the steps add the broker to the group."""
        props = dict(line.split("=", 1) for line in self.properties())
        socket = Path(props["rsm.config.socket.path"])
        runtime = single("RuntimeDirectory")
        assert socket.parent == Path("/run") / runtime
        assert int(single("RuntimeDirectoryMode"), 8) & 0o050 == 0o050
        assert SOCKET_MODE & 0o060 == 0o060
        group = single("Group")
        assert f"usermod -aG {group} kafka" in BROKER_PROPERTIES.read_text()
