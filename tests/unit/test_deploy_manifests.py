"""deploy/: the Kubernetes manifests and the Dockerfile agree with each other and with the
config schema (ports, probe paths, drain timing, mount path, model path, names)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import fetch_model
from shared.config import EngineConfig, load, parse_listen

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
KINDS = {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
MIN_STARTUP_BUDGET_S = 120  # a cold numba compile of every kernel on a slow node
MEASURED_CORE_BASELINE = 1 << 30  # core resident after load with an empty KV cache (~1.05 GB)


def manifests() -> dict[str, dict[str, Any]]:
    """Every document under deploy/k8s, by kind (one of each)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in by_kind, f"two {doc['kind']} documents"
            by_kind[doc["kind"]] = doc
    return by_kind


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    assert not pending, "a continuation runs off the end"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def docker_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in dockerfile():
        if op == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def memory_bytes(quantity: str) -> int:
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity)
    assert match is not None, quantity
    return int(match[1]) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30}[match[2]]


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    return manifests()


@pytest.fixture(scope="module")
def config(
    k8s: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> EngineConfig:
    """The ConfigMap's runtime.toml, loaded as a pod loads it (no overrides)."""
    path = tmp_path_factory.mktemp("cm") / "runtime.toml"
    path.write_text(k8s["ConfigMap"]["data"]["runtime.toml"])
    return load(path, environ={}).engine


@pytest.fixture(scope="module")
def pod(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = k8s["Deployment"]["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def container(pod: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod["containers"]  # one pod = one frontend (+ the core it spawns)
    c: dict[str, Any] = only
    return c


def test_one_of_each_kind_with_api_versions(k8s: dict[str, dict[str, Any]]) -> None:
    assert set(k8s) == KINDS
    assert k8s["Deployment"]["apiVersion"] == "apps/v1"
    assert k8s["HorizontalPodAutoscaler"]["apiVersion"] == "autoscaling/v2"
    assert k8s["PodDisruptionBudget"]["apiVersion"] == "policy/v1"


def test_configmap_runtime_toml_is_a_valid_config(config: EngineConfig) -> None:
    assert (config.http_listen, config.health_listen) == (":8000", ":9464")
    assert config.drain_timeout_s == 30.0
    assert config.spawn_core  # the core is the frontend's child, in the same container


def test_configmap_keys_are_known(k8s: dict[str, dict[str, Any]]) -> None:
    table = tomllib.loads(k8s["ConfigMap"]["data"]["runtime.toml"])
    assert set(table) == {"engine"}
    assert set(table["engine"]) <= set(EngineConfig.__struct_fields__)


def test_container_ports_are_the_listen_ports(
    config: EngineConfig, container: dict[str, Any]
) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    http_host, http_port = parse_listen(config.http_listen)
    health_host, health_port = parse_listen(config.health_listen)
    assert ports == {"http": http_port, "metrics": health_port}
    # a pod listening on loopback only could be neither probed nor reached
    assert http_host == health_host == "0.0.0.0"


def test_probes_hit_the_health_port(container: dict[str, Any]) -> None:
    paths = {
        kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
        for kind in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert paths == {
        "livenessProbe": ("/healthz", "metrics"),
        "readinessProbe": ("/readyz", "metrics"),
        "startupProbe": ("/readyz", "metrics"),  # startup ends when the core has handshaken
    }
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= MIN_STARTUP_BUDGET_S


def test_grace_period_outlasts_the_drain(
    config: EngineConfig, pod: dict[str, Any], container: dict[str, Any]
) -> None:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    # the kubelet's SIGKILL comes terminationGracePeriodSeconds after the preStop hook starts
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + config.drain_timeout_s + 5


def test_resources_hold_the_model_and_the_kv_cache(
    config: EngineConfig, container: dict[str, Any]
) -> None:
    resources = container["resources"]
    request = memory_bytes(resources["requests"]["memory"])
    limit = memory_bytes(resources["limits"]["memory"])
    assert request >= config.kv_cache_bytes + MEASURED_CORE_BASELINE
    assert limit >= request
    cpus = int(resources["requests"]["cpu"])
    env = {e["name"]: e["value"] for e in container["env"]}
    assert config.num_threads == cpus == int(env["OPENBLAS_NUM_THREADS"])


def test_prometheus_scrapes_the_health_port(
    k8s: dict[str, dict[str, Any]], config: EngineConfig
) -> None:
    annotations = k8s["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == parse_listen(config.health_listen)[1]


def test_selectors_match_the_pod_labels(k8s: dict[str, dict[str, Any]]) -> None:
    labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selectors = [
        k8s["Deployment"]["spec"]["selector"]["matchLabels"],
        k8s["Service"]["spec"]["selector"],
        k8s["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= labels.items()


def test_service_targets_named_container_ports(
    k8s: dict[str, dict[str, Any]], container: dict[str, Any]
) -> None:
    named = {p["name"] for p in container["ports"]}
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in k8s["Service"]["spec"]["ports"]}
    assert ports["http"] == (80, "http")
    assert {target for _, target in ports.values()} <= named


def test_hpa_scales_the_deployment_on_cpu(k8s: dict[str, dict[str, Any]]) -> None:
    hpa = k8s["HorizontalPodAutoscaler"]["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    assert target["name"] == k8s["Deployment"]["metadata"]["name"]
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    # the HPA owns the count: a `replicas` here would be reset by every `kubectl apply`
    assert "replicas" not in k8s["Deployment"]["spec"]
    assert k8s["PodDisruptionBudget"]["spec"]["minAvailable"] < hpa["minReplicas"]


def test_dockerfile_exposes_the_container_ports(container: dict[str, Any]) -> None:
    exposed = {int(p) for op, args in dockerfile() if op == "EXPOSE" for p in args.split()}
    assert exposed == {p["containerPort"] for p in container["ports"]}


def test_dockerfile_entrypoint_reads_the_mounted_configmap(
    k8s: dict[str, dict[str, Any]], pod: dict[str, Any], container: dict[str, Any]
) -> None:
    (entrypoint,) = [json.loads(args) for op, args in dockerfile() if op == "ENTRYPOINT"]
    script, flag, config_path = entrypoint
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert script in pyproject["project"]["scripts"] and flag == "--config"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == k8s["ConfigMap"]["metadata"]["name"]
    assert Path(mount["mountPath"]) / "runtime.toml" == Path(config_path)
    assert "subPath" not in mount


def test_configmap_model_is_where_the_image_fetches_it(config: EngineConfig) -> None:
    env = docker_env()
    relative = fetch_model.DEFAULT_DEST.relative_to(Path.home())  # where fetch_model.py writes
    runs = [args for op, args in dockerfile() if op == "RUN"]
    assert any(args.startswith("python ") and "fetch_model.py" in args for args in runs)
    assert not any("--dest" in args for args in runs)
    assert config.model_path == Path(env["HOME"]) / relative


def test_dockerfile_runs_non_root_with_a_numba_cache(pod: dict[str, Any]) -> None:
    ops = dockerfile()
    (user,) = [args for op, args in ops if op == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0 and pod["securityContext"]["runAsUser"] == uid
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert docker_env()["NUMBA_CACHE_DIR"].startswith("/")
    # the warm-up runs after USER, so the cache belongs to the user who may recompile
    warmup = [i for i, (op, args) in enumerate(ops) if op == "RUN" and ".warmup()" in args]
    assert warmup and warmup[0] > [op for op, _ in ops].index("USER")
    assert ops[0] == ("FROM", "python:3.11-slim")
