"""The Helm chart in helm/kafka-tiered-sidecar: ``helm lint --strict`` and ``helm template``
(helm-python-sdk, Helm's Go SDK in-process) for the default values, the examples and both sidecar
modes; ``kubernetes-validate --strict`` on the output; and the pod shape the sidecar relies on."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from sidecar.broker_config import DEFAULT_PLUGIN_JAR
from sidecar.config import load_config
from tests.deploy._tools import CHART, DEPLOY, describe, run, tool

KUBE_VERSION = "1.30.0"
RELEASE, NAMESPACE = "tiered", "kafka"
SIDECAR = "tiered-sidecar"
EXAMPLES = CHART / "examples"
#: the security protocol of every listener in Bitnami's Kafka chart when the values set none
#: (bitnami/kafka values.yaml: listeners.client.protocol and the others)
BITNAMI_LISTENER_PROTOCOL = "SASL_PLAINTEXT"

# Custom resources that kubernetes-validate has no schema for: they are checked against the
# fields prometheus-operator requires (below) instead. Every other kind goes to the validator.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": {"type": "object", "minProperties": 1},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "required": ["port"]},
            },
        },
    },
    "PodMonitor": {
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": {"type": "object", "minProperties": 1},
            "podMetricsEndpoints": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "required": ["port"]},
            },
        },
    },
    "PrometheusRule": {
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["expr"],
                                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                            },
                        }
                    },
                },
            }
        },
    },
}

FULL = {
    "kafka": {"enabled": True},
    "s3": {"existingSecret": "kafka-tiered-s3"},
    "kafkaAuth": {"existingSecret": "kafka-sasl"},
    "serviceAccount": {
        "annotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/kafka-tiered-sidecar"
        }
    },
    "config": {
        "kafka": {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "tiered-sidecar",
        },
        "remote_log_metadata": {"remote.log.metadata.producer.linger.ms": 5},
        # a list of tables: the bucket keeps more than the broker's disks for these topics
        "retention": {
            "overrides": [
                {"topics": ["orders-.*", "audit"], "retention_ms": 7776000000},
                {"topics": ["clicks"], "retention_bytes": -1},
            ]
        },
    },
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True, "additionalRuleLabels": {"team": "streaming"}},
}


def example(name: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return values


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "single-broker-kraft": example("single-broker-kraft.yaml"),
    "single-broker-kraft-plugin": example("single-broker-kraft-plugin.yaml"),
    "bitnami-companion-plugin": merged(
        example("bitnami-companion.yaml"),
        {"plugin": {"enabled": True, "listenerName": "INTERNAL"}},
    ),
    "bitnami-companion": example("bitnami-companion.yaml"),
    "native": merged(FULL, {"sidecar": {"mode": "native"}}),
    "container": merged(FULL, {"sidecar": {"mode": "container"}}),
    "container-plugin": merged(
        FULL, {"sidecar": {"mode": "container"}, "plugin": {"enabled": True}}
    ),
    "single-broker-kraft-plugin-no-files": merged(
        example("single-broker-kraft-plugin.yaml"),
        {"config": {"read_server": {"offer_cache_files": False}}},
    ),
}
WITH_KAFKA = [
    "single-broker-kraft",
    "single-broker-kraft-plugin",
    "single-broker-kraft-plugin-no-files",
    "native",
    "container",
    "container-plugin",
]

# Secrets the pod receives as environment variables: the config test supplies them the same way.
SECRET_ENV = {
    "SIDECAR_S3__ACCESS_KEY_ID": "from-the-secret",
    "SIDECAR_S3__SECRET_ACCESS_KEY": "from-the-secret",
    "SIDECAR_KAFKA__SASL_PASSWORD": "from-the-secret",
}


@cache
def chart() -> helm.Chart:
    return helm.Chart.load(str(CHART))


def render(values: dict[str, Any]) -> dict[str, str]:
    """template path -> manifest, as ``helm template --namespace kafka tiered`` prints them."""
    return chart().render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


@cache
def rendered(scenario: str) -> dict[str, str]:
    return render(SCENARIOS[scenario])


def documents(scenario: str) -> list[dict[str, Any]]:
    docs = []
    for path, manifest in sorted(rendered(scenario).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(manifest) if doc]
    return docs


def of_kind(scenario: str, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents(scenario) if doc["kind"] == kind]


def one(scenario: str, kind: str) -> dict[str, Any]:
    found = of_kind(scenario, kind)
    assert len(found) == 1, f"{scenario}: expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(scenario: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(scenario, "StatefulSet")["spec"]["template"]["spec"]
    return spec


def containers_by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def sidecar_toml(scenario: str) -> str:
    text: str = one(scenario, "ConfigMap")["data"]["sidecar.toml"]
    return text


def kubernetes_validate(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    result = run(
        [tool("kubernetes-validate"), "-k", KUBE_VERSION, "--strict", "--quiet", str(path)]
    )
    assert result.returncode == 0, describe(result)


class TestLintAndRender:
    """helm lint and helm template, for every scenario."""

    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_helm_lint_strict(self, scenario):
        """``helm lint --strict`` finds no error and no warning."""
        report = helm.lint(
            str(CHART), SCENARIOS[scenario], strict=True, kube_version=f"v{KUBE_VERSION}"
        )
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report

    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_kubernetes_validate_strict(self, scenario, tmp_path):
        """``kubernetes-validate --strict`` accepts every built-in object of the output."""
        docs = [doc for doc in documents(scenario) if doc["kind"] not in CRD_SCHEMAS]
        assert docs
        kubernetes_validate(docs, tmp_path)

    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_custom_resources_have_required_fields(self, scenario):
        """ServiceMonitor, PodMonitor and PrometheusRule objects are rendered exactly when their
        values enable them (none by default), and have the fields the CRDs need."""
        values = SCENARIOS[scenario]
        metrics = values.get("metrics", {})
        enabled = {
            "ServiceMonitor": metrics.get("serviceMonitor", {}).get("enabled", False),
            "PodMonitor": metrics.get("podMonitor", {}).get("enabled", False),
            "PrometheusRule": values.get("prometheusRule", {}).get("enabled", False),
        }
        monitors = [doc for doc in documents(scenario) if doc["kind"] in CRD_SCHEMAS]
        assert sorted(doc["kind"] for doc in monitors) == sorted(
            kind for kind, on in enabled.items() if on
        )
        for doc in monitors:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert doc["metadata"]["name"]
            assert doc["metadata"]["namespace"] == NAMESPACE
            jsonschema.validate(doc["spec"], {"type": "object", **CRD_SCHEMAS[doc["kind"]]})

    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_output_passes_yamllint(self, scenario):
        """The rendered YAML is clean for yamllint's relaxed rules (templates cannot be linted)."""
        config = YamlLintConfig("extends: relaxed\nrules: {line-length: disable}")
        for path, manifest in rendered(scenario).items():
            if path.endswith("NOTES.txt"):
                continue
            problems = [p for p in linter.run(manifest, config) if p.level == "error"]
            assert not problems, f"{path}: {problems}"

    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_sidecar_config_loads(self, scenario, tmp_path):
        """The ConfigMap's sidecar.toml loads with the sidecar's own config model."""
        path = tmp_path / "sidecar.toml"
        path.write_text(sidecar_toml(scenario))
        config = load_config(path, environ=SECRET_ENV)
        assert config.metrics.host == "0.0.0.0"
        assert str(config.state_dir) == "/var/lib/kafka-tiered-sidecar"
        overrides = SCENARIOS[scenario].get("config", {}).get("retention", {}).get("overrides")
        assert [
            o.model_dump(include={"topics", "retention_ms", "retention_bytes"}, exclude_unset=True)
            for o in config.retention.overrides
        ] == (overrides or [])

    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_no_secret_is_inlined(self, scenario):
        """No Secret is rendered, the TOML has no credential, secret variables use secretKeyRef."""
        assert not of_kind(scenario, "Secret")
        toml = tomllib.loads(sidecar_toml(scenario))
        assert not {"access_key_id", "secret_access_key"} & set(toml.get("s3", {}))
        assert "sasl_password" not in toml.get("kafka", {})
        if scenario not in WITH_KAFKA:
            return
        for container in containers_by_name(pod_spec(scenario)).values():
            for env in container.get("env", []):
                if any(word in env["name"] for word in ("SECRET", "PASSWORD", "ACCESS_KEY")):
                    assert "value" not in env, env
                    assert env["valueFrom"]["secretKeyRef"]["name"], env

    def test_default_values_render_only_the_companion_objects(self):
        """Without kafka.enabled the chart renders the ConfigMap and ServiceAccount, no pods."""
        kinds = sorted(doc["kind"] for doc in documents("default"))
        assert kinds == ["ConfigMap", "ServiceAccount"]
        notes = rendered("default")["kafka-tiered-sidecar/templates/NOTES.txt"]
        assert f"- name: {SIDECAR}" in notes  # the container to paste into another StatefulSet


class TestPodShape:
    """The broker pod the chart templates with kafka.enabled."""

    def test_native_sidecar_is_a_restartable_init_container(self):
        """In native mode the sidecar is an init container with restartPolicy Always."""
        spec = pod_spec("native")
        init = {c["name"]: c for c in spec["initContainers"]}
        assert init[SIDECAR]["restartPolicy"] == "Always"
        assert SIDECAR not in {c["name"] for c in spec["containers"]}

    def test_classic_sidecar_is_a_regular_container(self):
        """In container mode the sidecar sits beside the broker, with no restartPolicy."""
        spec = pod_spec("container")
        assert SIDECAR not in {c["name"] for c in spec.get("initContainers", [])}
        sidecar = {c["name"]: c for c in spec["containers"]}[SIDECAR]
        assert "restartPolicy" not in sidecar

    @pytest.mark.parametrize("scenario", WITH_KAFKA)
    def test_log_volume_is_read_only_for_the_sidecar(self, scenario):
        """The sidecar mounts the broker's log volume read-only; the broker mounts it writable."""
        containers = containers_by_name(pod_spec(scenario))
        kafka_mount = containers["kafka"]["volumeMounts"][0]
        assert not kafka_mount.get("readOnly", False)
        sidecar_mounts = {m["name"]: m for m in containers[SIDECAR]["volumeMounts"]}
        assert sidecar_mounts[kafka_mount["name"]]["readOnly"] is True
        assert sidecar_mounts[kafka_mount["name"]]["mountPath"] == kafka_mount["mountPath"]

    @pytest.mark.parametrize("scenario", WITH_KAFKA)
    def test_runs_as_non_root(self, scenario):
        """Pod and sidecar run as non-root, with a read-only root and no capabilities."""
        spec = pod_spec(scenario)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["fsGroup"] > 0
        assert spec["automountServiceAccountToken"] is False
        for container in containers_by_name(spec).values():
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["runAsUser"] > 0
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
        assert containers_by_name(spec)[SIDECAR]["securityContext"]["readOnlyRootFilesystem"]

    @pytest.mark.parametrize("scenario", WITH_KAFKA)
    def test_config_matches_the_pod(self, scenario, tmp_path):
        """Kafka's log.dirs are the sidecar's, the metrics port is the container port, and the
        grace period outlasts the drain."""
        spec = pod_spec(scenario)
        containers = containers_by_name(spec)
        path = tmp_path / "sidecar.toml"
        path.write_text(sidecar_toml(scenario))
        config = load_config(path, environ=SECRET_ENV)
        kafka_env = {e["name"]: e.get("value") for e in containers["kafka"]["env"]}
        assert kafka_env["KAFKA_LOG_DIRS"].split(",") == [str(d) for d in config.broker.log_dirs]
        assert containers[SIDECAR]["ports"] == [
            {"name": "metrics", "containerPort": config.metrics.port, "protocol": "TCP"}
        ]
        assert spec["terminationGracePeriodSeconds"] > config.tiering.drain_timeout_s
        assert config.remote_log_metadata.replication_factor == 1  # one broker

    @pytest.mark.parametrize("scenario", WITH_KAFKA)
    def test_probes_never_hold_the_broker_back(self, scenario):
        """Liveness probes /healthz; a native sidecar has no startup probe (it would block the
        broker's start); the readiness probe that couples the broker's readiness is off."""
        spec = pod_spec(scenario)
        sidecar = containers_by_name(spec)[SIDECAR]
        assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert "readinessProbe" not in sidecar
        if sidecar.get("restartPolicy") == "Always":
            assert "startupProbe" not in sidecar
        else:
            assert sidecar["startupProbe"]["httpGet"]["path"] == "/healthz"

    def test_irsa_annotation_and_secret_refs(self):
        """The ServiceAccount carries the IRSA annotation; credentials come from the Secrets."""
        account = one("native", "ServiceAccount")
        assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]
        assert pod_spec("native")["serviceAccountName"] == account["metadata"]["name"]
        env = {e["name"]: e for e in containers_by_name(pod_spec("native"))[SIDECAR]["env"]}
        refs = {name: e["valueFrom"]["secretKeyRef"] for name, e in env.items()}
        assert refs["SIDECAR_S3__ACCESS_KEY_ID"] == {
            "name": "kafka-tiered-s3",
            "key": "access-key-id",
        }
        assert refs["SIDECAR_S3__SECRET_ACCESS_KEY"]["name"] == "kafka-tiered-s3"
        assert refs["SIDECAR_KAFKA__SASL_PASSWORD"] == {
            "name": "kafka-sasl",
            "key": "sasl-password",
        }


class TestMonitoring:
    """ServiceMonitor, PodMonitor, metrics Service and PrometheusRule."""

    @pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
    def test_monitors_scrape_the_metrics_port_as_the_rules_expect(self, kind):
        """Monitors scrape port ``metrics`` and set job="kafka-tiered-sidecar" (alerts' ``up``)."""
        monitor = one("native", kind)
        key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
        endpoint = monitor["spec"][key][0]
        assert endpoint["port"] == "metrics"
        assert {"targetLabel": "job", "replacement": "kafka-tiered-sidecar"} in endpoint[
            "relabelings"
        ]

    def test_selectors_match_the_broker_pods(self):
        """The PodMonitor and the metrics Service select the StatefulSet's pods."""
        pod_labels = one("native", "StatefulSet")["spec"]["template"]["metadata"]["labels"]
        selector = one("native", "PodMonitor")["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        services = {s["metadata"]["name"]: s for s in of_kind("native", "Service")}
        metrics = services[f"{RELEASE}-kafka-tiered-sidecar-metrics"]
        assert metrics["spec"]["selector"].items() <= pod_labels.items()
        assert metrics["spec"]["ports"][0]["targetPort"] == 9464
        service_monitor = one("native", "ServiceMonitor")["spec"]["selector"]["matchLabels"]
        assert service_monitor.items() <= metrics["metadata"]["labels"].items()

    def test_prometheus_rule_is_alerts_yml(self, tmp_path):
        """The PrometheusRule holds deploy/prometheus/alerts.yml (plus the extra labels), and
        promtool accepts it."""
        spec = one("native", "PrometheusRule")["spec"]
        expected = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
        for group in expected["groups"]:
            for rule in group["rules"]:
                rule["labels"]["team"] = "streaming"
        assert spec == expected
        path = tmp_path / "rule.yml"
        path.write_text(yaml.safe_dump(spec))
        result = run([tool("promtool"), "check", "rules", str(path)])
        assert result.returncode == 0, describe(result)


class TestValueChecks:
    """Values the chart refuses, with a message that says what to do."""

    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"config": {"s3": {"secret_access_key": "abc"}}}, "s3.existingSecret"),
            ({"config": {"s3": {"access_key_id": "AKIA"}}}, "s3.existingSecret"),
            ({"config": {"kafka": {"sasl_password": "pw"}}}, "kafkaAuth.existingSecret"),
            ({"config": {"metrics": {"port": 9000}}}, "sidecar.metricsPort"),
            ({"config": {"state_dir": "/data"}}, "set by the chart"),
            ({"config": {"broker": {"log_dirs": ["/kafka"]}}}, "logVolume.mountPath"),
            ({"terminationGracePeriodSeconds": 20}, "drain_timeout_s"),
            ({"metrics": {"podMonitor": {"enabled": True}}}, "metrics.podSelector"),
        ],
        ids=[
            "s3-secret-key",
            "s3-access-key",
            "sasl-password",
            "metrics-port",
            "state-dir",
            "log-dir-outside-mount",
            "grace-below-drain",
            "monitor-without-selector",
        ],
    )
    def test_render_refuses(self, values, message):
        """Rendering fails and names the fix."""
        with pytest.raises(helm.HelmRenderError, match=message.replace(".", r"\.")):
            render(values)

    def test_schema_rejects_an_unknown_mode_and_unknown_keys(self):
        """values.schema.json rejects a misspelled mode and a misspelled top-level key."""
        with pytest.raises(helm.HelmValuesError, match="native"):
            render({"sidecar": {"mode": "sidecar"}})
        with pytest.raises(helm.HelmValuesError, match="sidcar"):
            render({"sidcar": {"mode": "native"}})

    def test_values_and_examples_pass_yamllint(self):
        """values.yaml, Chart.yaml and the examples are clean for yamllint (default rules)."""
        config = YamlLintConfig(
            "extends: default\nrules: {line-length: {max: 120}, document-start: disable}"
        )
        files = [CHART / "values.yaml", CHART / "Chart.yaml", *sorted(EXAMPLES.glob("*.yaml"))]
        for path in files:
            problems = list(linter.run(path.read_text(), config))
            assert not problems, f"{path}: {problems}"


class TestBitnamiSnippet:
    """examples/bitnami-sidecars.yaml, the values for Bitnami's Kafka chart."""

    @staticmethod
    def chart_pod() -> dict[str, Any]:
        values = merged(SCENARIOS["bitnami-companion"], {"kafka": {"enabled": True}})
        docs = yaml.safe_load_all(
            render(values)["kafka-tiered-sidecar/templates/kafka-statefulset.yaml"]
        )
        statefulset = next(doc for doc in docs if doc)
        spec: dict[str, Any] = statefulset["spec"]["template"]["spec"]
        return spec

    def test_container_is_the_charts(self):
        """The snippet's native sidecar equals the container the chart renders for Bitnami."""
        snippet = example("bitnami-sidecars.yaml")["controller"]["initContainers"]
        assert snippet == self.chart_pod()["initContainers"], (
            "examples/bitnami-sidecars.yaml is out of date with the chart's container"
        )

    def test_volumes_are_the_charts(self):
        """The snippet's extraVolumes are the chart's sidecar volumes."""
        snippet = example("bitnami-sidecars.yaml")["controller"]["extraVolumes"]
        chart_volumes = [v for v in self.chart_pod()["volumes"] if v["name"].startswith(SIDECAR)]
        assert snippet == chart_volumes

    def test_client_listener_speaks_the_sidecars_protocol(self, tmp_path):
        """Bitnami's client listener takes the sidecar's connection (PLAINTEXT, not Bitnami's
        default SASL_PLAINTEXT)."""
        assert_bitnami_client_listener_fits("bitnami-sidecars.yaml", "bitnami-companion", tmp_path)

    def test_mounts_bitnamis_log_dirs(self):
        """It mounts Bitnami's data volume read-only where the companion config finds log.dirs."""
        sidecar = example("bitnami-sidecars.yaml")["controller"]["initContainers"][0]
        data = next(m for m in sidecar["volumeMounts"] if m["name"] == "data")
        assert data == {"name": "data", "mountPath": "/bitnami/kafka", "readOnly": True}
        log_dirs = SCENARIOS["bitnami-companion"]["config"]["broker"]["log_dirs"]
        assert log_dirs == ["/bitnami/kafka/data"]

    def test_pod_with_the_snippet_validates(self, tmp_path):
        """A Bitnami-like pod with the snippet passes ``kubernetes-validate --strict``."""
        controller = example("bitnami-sidecars.yaml")["controller"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kafka-controller-0", "namespace": NAMESPACE},
            "spec": {
                "terminationGracePeriodSeconds": controller["terminationGracePeriodSeconds"],
                "securityContext": {"fsGroup": 1001},
                "initContainers": controller["initContainers"],
                "containers": [
                    {
                        "name": "kafka",
                        "image": "bitnami/kafka:4.0.0",
                        "volumeMounts": [{"name": "data", "mountPath": "/bitnami/kafka"}],
                    }
                ],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-kafka-0"}},
                    *controller["extraVolumes"],
                ],
            },
        }
        kubernetes_validate([pod], tmp_path)


def assert_bitnami_client_listener_fits(values_file: str, scenario: str, tmp_path: Path) -> None:
    """Bitnami's client listener, where the companion's sidecar.toml connects, speaks the
    protocol the sidecar uses there: otherwise the sidecar never reaches Kafka."""
    path = tmp_path / "sidecar.toml"
    path.write_text(sidecar_toml(scenario))
    config = load_config(path, environ=SECRET_ENV)
    assert config.kafka.bootstrap_servers == ["127.0.0.1:9092"]  # Bitnami's client port
    listener = example(values_file).get("listeners", {}).get("client", {})
    assert listener.get("protocol", BITNAMI_LISTENER_PROTOCOL) == config.kafka.security_protocol


def broker_config(toml: str, tmp_path: Path, *args: str) -> list[tuple[str, str]]:
    """What `sidecar broker-config` prints for a sidecar.toml: (key, value) in printed order."""
    path = tmp_path / "sidecar.toml"
    path.write_text(toml)
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "broker-config", "-c", str(path), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **SECRET_ENV},
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line and not line.startswith("#")]
    return [(key, value) for key, _, value in (line.partition("=") for line in lines)]


def env_name(key: str) -> str:
    """The apache/kafka image's variable for a broker property."""
    return "KAFKA_" + key.upper().replace(".", "_")


class TestBrokerPlugin:
    """plugin.enabled: the init container, the shared volume, the broker's mounts and properties."""

    SCENARIO = "single-broker-kraft-plugin"

    def test_container_mode_has_only_the_copy_as_init_container(self):
        """With the sidecar as a regular container, the jar's copy is the only init container
        and the broker's mounts are the same."""
        spec = pod_spec("container-plugin")
        assert [c["name"] for c in spec["initContainers"]] == ["tiered-sidecar-plugin"]
        assert [c["name"] for c in spec["containers"]] == ["kafka", SIDECAR]
        kafka = containers_by_name(spec)["kafka"]
        native_kafka = containers_by_name(pod_spec(self.SCENARIO))["kafka"]
        assert kafka["volumeMounts"] == native_kafka["volumeMounts"]

    def test_init_container_copies_the_jar_into_the_shared_volume(self):
        """A first init container (the sidecar image) copies the image's jar into the emptyDir
        tiered-sidecar-plugin, before the native sidecar starts."""
        spec = pod_spec(self.SCENARIO)
        first, sidecar = spec["initContainers"]
        assert first["name"] == "tiered-sidecar-plugin"
        assert sidecar["name"] == SIDECAR
        assert first["image"] == sidecar["image"]
        assert "restartPolicy" not in first  # runs to completion
        mounts = {m["name"]: m["mountPath"] for m in first["volumeMounts"]}
        assert mounts == {"tiered-sidecar-plugin": "/plugin"}
        assert first["command"] == [
            "cp",
            str(DEFAULT_PLUGIN_JAR),
            f"/plugin/{DEFAULT_PLUGIN_JAR.name}",
        ]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "emptyDir" in volumes["tiered-sidecar-plugin"]

    def test_broker_mounts_the_jar_the_socket_and_the_cache(self):
        """Kafka's container mounts the plugin volume where remote.log.storage.manager.class.path
        points, the sidecar's socket directory at the path the sidecar binds, and its chunk cache
        where the sidecar has it."""
        kafka = containers_by_name(pod_spec(self.SCENARIO))["kafka"]
        mounts = {m["name"]: m for m in kafka["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in kafka["env"]}
        jar = Path(env[env_name("remote.log.storage.manager.class.path")])
        assert mounts["tiered-sidecar-plugin"]["mountPath"] == str(jar.parent)
        assert mounts["tiered-sidecar-plugin"]["readOnly"] is True
        assert jar == DEFAULT_PLUGIN_JAR  # the image's path: one path on every host
        socket = tomllib.loads(sidecar_toml(self.SCENARIO))["read_server"]["socket_path"]
        assert mounts["tiered-sidecar-run"]["mountPath"] == str(Path(socket).parent)
        sidecar = containers_by_name(pod_spec(self.SCENARIO))[SIDECAR]
        assert {"name": "tiered-sidecar-run", "mountPath": str(Path(socket).parent)} in sidecar[
            "volumeMounts"
        ]
        # the chunk cache, read-only at the sidecar's path: the plugin reads cached files itself
        cache = tomllib.loads(sidecar_toml(self.SCENARIO))["read_server"]["cache_dir"]
        assert mounts["tiered-sidecar-cache"]["mountPath"] == cache
        assert mounts["tiered-sidecar-cache"]["readOnly"] is True
        assert {"name": "tiered-sidecar-cache", "mountPath": cache} in sidecar["volumeMounts"]

    @pytest.mark.parametrize("scenario", [SCENARIO, "single-broker-kraft-plugin-no-files"])
    def test_broker_properties_are_sidecar_broker_configs(self, tmp_path, scenario):
        """The broker's KAFKA_* variables carry exactly what `sidecar broker-config` prints for
        the rendered sidecar.toml, and no other tiered-storage property (also when the chunk
        cache's files are not offered: the plugin then does not ask for them)."""
        kafka = containers_by_name(pod_spec(scenario))["kafka"]
        env = {e["name"]: e.get("value") for e in kafka["env"]}
        expected = broker_config(
            sidecar_toml(scenario), tmp_path, "--plugin-jar", str(DEFAULT_PLUGIN_JAR)
        )
        assert {env_name(k): v for k, v in expected} == {
            name: value
            for name, value in env.items()
            if name.startswith(("KAFKA_REMOTE_", "KAFKA_RSM_", "KAFKA_RLMM_"))
        }
        # the image maps a variable back to its property by "_" -> "."
        assert all("_" not in key and "-" not in key for key, _ in expected)

    def test_notes_print_the_pieces_for_other_charts(self, tmp_path):
        """Without kafka.enabled, the install notes print the init container, the broker's
        mounts and the properties of `sidecar broker-config --listener` for the release."""
        notes = rendered("bitnami-companion-plugin")["kafka-tiered-sidecar/templates/NOTES.txt"]
        assert "- name: tiered-sidecar-plugin" in notes
        expected = broker_config(
            sidecar_toml("bitnami-companion-plugin"), tmp_path, "--listener", "INTERNAL"
        )
        for key, value in expected:
            assert f"\n{key}={value}\n" in notes
        # and how to check the broker once it restarted with them, with the same jar and listener
        jar = dict(expected)["remote.log.storage.manager.class.path"]
        check = re.search(r"-c tiered-sidecar -- (sidecar broker-config .*)", notes)
        assert check is not None
        args = check.group(1).split()
        assert args[args.index("--plugin-jar") + 1] == jar
        assert args[args.index("--listener") + 1] == "INTERNAL"
        assert "--check" in args

    @pytest.mark.parametrize("scenario", ["single-broker-kraft", "native", "default"])
    def test_off_by_default(self, scenario):
        """Without plugin.enabled nothing of the plugin is rendered."""
        text = "".join(rendered(scenario).values())
        assert "tiered-sidecar-plugin" not in text
        assert "remote.log.storage" not in text.lower().replace("_", ".")


class TestBitnamiPlugin:
    """examples/bitnami-plugin.yaml, Bitnami's values for broker-driven tiering."""

    @staticmethod
    def chart_pod() -> dict[str, Any]:
        values = merged(SCENARIOS["bitnami-companion-plugin"], {"kafka": {"enabled": True}})
        docs = yaml.safe_load_all(
            render(values)["kafka-tiered-sidecar/templates/kafka-statefulset.yaml"]
        )
        statefulset = next(doc for doc in docs if doc)
        spec: dict[str, Any] = statefulset["spec"]["template"]["spec"]
        return spec

    def test_init_containers_are_the_charts(self):
        """The jar-copying init container and the native sidecar equal the chart's."""
        snippet = example("bitnami-plugin.yaml")["controller"]["initContainers"]
        assert snippet == self.chart_pod()["initContainers"]

    def test_volumes_and_broker_mounts_are_the_charts(self):
        """extraVolumes are the chart's sidecar volumes (the plugin's among them), and Kafka's
        extraVolumeMounts are the chart's broker mounts for the plugin."""
        controller = example("bitnami-plugin.yaml")["controller"]
        pod = self.chart_pod()
        assert controller["extraVolumes"] == [
            v for v in pod["volumes"] if v["name"].startswith(SIDECAR)
        ]
        kafka = containers_by_name(pod)["kafka"]
        assert controller["extraVolumeMounts"] == [
            m for m in kafka["volumeMounts"] if m["name"].startswith(SIDECAR)
        ]

    def test_client_listener_speaks_the_sidecars_protocol(self, tmp_path):
        """Bitnami's client listener takes the sidecar's connection (PLAINTEXT, not Bitnami's
        default SASL_PLAINTEXT)."""
        assert_bitnami_client_listener_fits(
            "bitnami-plugin.yaml", "bitnami-companion-plugin", tmp_path
        )

    def test_extra_config_is_sidecar_broker_config(self, tmp_path):
        """extraConfig is, line for line, `sidecar broker-config --listener INTERNAL` for the
        companion release's sidecar.toml."""
        extra = example("bitnami-plugin.yaml")["extraConfig"].splitlines()
        expected = broker_config(
            sidecar_toml("bitnami-companion-plugin"), tmp_path, "--listener", "INTERNAL"
        )
        assert extra == [f"{key}={value}" for key, value in expected]

    def test_pod_with_the_snippet_validates(self, tmp_path):
        """A Bitnami-like pod with the snippet passes ``kubernetes-validate --strict``."""
        controller = example("bitnami-plugin.yaml")["controller"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kafka-controller-0", "namespace": NAMESPACE},
            "spec": {
                "terminationGracePeriodSeconds": controller["terminationGracePeriodSeconds"],
                "securityContext": {"fsGroup": 1001},
                "initContainers": controller["initContainers"],
                "containers": [
                    {
                        "name": "kafka",
                        "image": "bitnami/kafka:4.0.0",
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/bitnami/kafka"},
                            *controller["extraVolumeMounts"],
                        ],
                    }
                ],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-kafka-0"}},
                    *controller["extraVolumes"],
                ],
            },
        }
        kubernetes_validate([pod], tmp_path)
