"""Offline checks of the deployment files: docker/, deploy/ and the root .dockerignore.

Nothing here needs a Docker engine, a cluster, kubectl or Prometheus: YAML is linted with
yamllint, the kustomizations are rendered by a small loader below and validated against
the Kubernetes OpenAPI schemas that kubernetes-validate ships, and every PromQL
expression (alert rules, dashboard) may only name metrics that rofu/service/metrics.py
exports. `docker compose config` runs when a Compose v2 client is installed.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from yamllint import linter
from yamllint.config import YamlLintConfig

from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DEPLOY = ROOT / "deploy"
K8S_BASE = DEPLOY / "k8s" / "base"
K8S_GPU = DEPLOY / "k8s" / "overlays" / "gpu"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "rofu-dashboard.json"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"

# A Kubernetes minor whose strict schemas ship inside kubernetes-validate (>= 1.30): no network.
K8S_VERSION = "1.30"
SECRET_NAME = "rofu-secrets"
SECRET_KEYS = {"database-url", "api-keys", "admin-api-keys"}
# Settings that other modules add (the API keys) or that select the TOML file.
EXTRA_SETTINGS = {"ROFU_CONFIG_FILE", "ROFU_API_KEYS_FILE", "ROFU_ADMIN_API_KEYS_FILE"}
# Labels Prometheus adds to every series of rofu's scrape jobs.
TARGET_LABELS = {"job", "instance", "namespace", "pod"}

YAMLLINT_CONFIG = YamlLintConfig(
    "extends: relaxed\nrules:\n  line-length:\n    max: 120\n    level: error\n"
)


def _yaml_files() -> list[Path]:
    found = [
        path
        for top in (DOCKER, DEPLOY)
        for pattern in ("*.yaml", "*.yml")
        for path in top.rglob(pattern)
    ]
    return sorted(found)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------
# YAML lint
# --------------------------------------------------------------------------------------


def test_the_deployment_files_exist() -> None:
    expected = {
        ".dockerignore",
        "docker/Dockerfile",
        "docker/compose.yaml",
        "docker/compose.gpu.yaml",
        "docker/nginx.conf",
        "docker/grafana/provisioning/datasources/prometheus.yaml",
        "docker/grafana/provisioning/dashboards/rofu.yaml",
        "deploy/k8s/base/kustomization.yaml",
        "deploy/k8s/base/secret.example.yaml",
        "deploy/k8s/overlays/gpu/kustomization.yaml",
        "deploy/prometheus/prometheus.yml",
        "deploy/prometheus/alerts.yml",
        "deploy/grafana/rofu-dashboard.json",
    }
    missing = sorted(name for name in expected if not (ROOT / name).is_file())
    assert not missing, f"missing deployment files: {missing}"


@pytest.mark.parametrize("path", _yaml_files(), ids=_rel)
def test_yaml_lints_clean(path: Path) -> None:
    problems = list(linter.run(path.read_text(encoding="utf-8"), YAMLLINT_CONFIG, str(path)))
    assert not problems, "\n".join(f"{_rel(path)}:{p.line}:{p.column} {p}" for p in problems)


def test_yamllint_config_catches_a_problem() -> None:
    problems = list(linter.run("a: 1\na: 2\n", YAMLLINT_CONFIG))
    assert [p.rule for p in problems] == ["key-duplicates"]


# --------------------------------------------------------------------------------------
# Kustomize, rendered without kubectl
# --------------------------------------------------------------------------------------

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "patches", "images", "labels"}


def _merge(target: Any, patch: Any) -> Any:
    """A strategic merge patch as far as these manifests need: maps merge recursively,
    lists of named items (containers, env, volumes, ...) merge by name, others replace."""
    if isinstance(target, dict) and isinstance(patch, dict):
        merged = dict(target)
        for key, value in patch.items():
            merged[key] = _merge(target[key], value) if key in target else copy.deepcopy(value)
        return merged
    named = isinstance(target, list) and isinstance(patch, list)
    named = named and all(isinstance(item, dict) and "name" in item for item in target + patch)
    if named:
        merged_list = [copy.deepcopy(item) for item in target]
        index = {item["name"]: i for i, item in enumerate(merged_list)}
        for item in patch:
            if item["name"] in index:
                position = index[item["name"]]
                merged_list[position] = _merge(merged_list[position], item)
            else:
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec: dict[str, Any] = obj["spec"]["template"]["spec"]
        return spec
    return None


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = _pod_spec(obj)
    if spec is None:
        return []
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _set_image(image: str, rule: dict[str, str]) -> str:
    name = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
    if name != rule["name"]:
        return image
    return f"{rule.get('newName', name)}:{rule['newTag']}" if "newTag" in rule else image


def render_kustomization(directory: Path) -> list[dict[str, Any]]:
    """Render `directory/kustomization.yaml`: resources (files or other kustomizations),
    strategic-merge patches, image tags and metadata labels. Any other field is refused
    rather than ignored."""
    kustomization = _load_yaml(directory / "kustomization.yaml")
    unsupported = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unsupported, f"{_rel(directory)}: the test's loader does not render {unsupported}"
    assert kustomization["kind"] == "Kustomization"
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        if path.is_dir():
            objects.extend(render_kustomization(path))
        else:
            docs = yaml.safe_load_all(path.read_text(encoding="utf-8"))
            objects.extend(doc for doc in docs if doc is not None)
    for patch_ref in kustomization.get("patches", []):
        patch = _load_yaml(directory / patch_ref["path"])
        key = (patch["kind"], patch["metadata"]["name"])
        matches = [i for i, o in enumerate(objects) if (o["kind"], o["metadata"]["name"]) == key]
        assert len(matches) == 1, f"patch {patch_ref['path']} matches {len(matches)} objects"
        objects[matches[0]] = _merge(objects[matches[0]], patch)
    for rule in kustomization.get("images", []):
        for obj in objects:
            for container in _containers(obj):
                container["image"] = _set_image(container["image"], rule)
    for label_rule in kustomization.get("labels", []):
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(label_rule["pairs"])
    return objects


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render_kustomization(K8S_BASE)


@pytest.fixture(scope="module")
def gpu() -> list[dict[str, Any]]:
    return render_kustomization(K8S_GPU)


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _component(objects: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"expected one {kind} for {component}, found {len(found)}"
    return found[0]


@pytest.mark.parametrize("overlay", [K8S_BASE, K8S_GPU], ids=_rel)
def test_every_rendered_object_is_a_valid_kubernetes_object(overlay: Path) -> None:
    objects = render_kustomization(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "Job", "ConfigMap"} <= kinds
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            pytest.fail(f"{_rel(overlay)}: {name} at {list(exc.path)}: {exc.message}")


def test_the_validator_refuses_an_unknown_field(base: list[dict[str, Any]]) -> None:
    bad = copy.deepcopy(_component(base, "Deployment", "api"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_loader_merges_patches_by_name() -> None:
    target = {"containers": [{"name": "a", "image": "x"}, {"name": "b"}], "n": {"k": 1}}
    patch = {"containers": [{"name": "b", "image": "y"}], "n": {"j": 2}}
    assert _merge(target, patch) == {
        "containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
        "n": {"k": 1, "j": 2},
    }
    assert _set_image("rofu", {"name": "rofu", "newTag": "1"}) == "rofu:1"
    assert _set_image("rofu:0", {"name": "rofu", "newTag": "1"}) == "rofu:1"
    assert _set_image("other:0", {"name": "rofu", "newTag": "1"}) == "other:0"


def _http_port(container: dict[str, Any], port: int | str) -> int:
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    return ports[port] if isinstance(port, str) else port


def test_api_probes_point_at_readyz_and_healthz(base: list[dict[str, Any]]) -> None:
    api = _component(base, "Deployment", "api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert readiness["httpGet"]["path"] == "/readyz"
    assert liveness["httpGet"]["path"] == "/healthz"
    for probe in (readiness, liveness, container.get("startupProbe", liveness)):
        assert _http_port(container, probe["httpGet"]["port"]) == 8000
    assert container["args"][:1] == ["serve"]
    assert "0.0.0.0" in container["args"]


def test_trainer_is_single_and_never_overlaps(base: list[dict[str, Any]]) -> None:
    trainer = _component(base, "Deployment", "trainer")
    assert trainer["spec"]["replicas"] == 1
    assert trainer["spec"]["strategy"]["type"] == "Recreate"
    (container,) = trainer["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["trainer"]
    hpas = [o for o in base if o["kind"] == "HorizontalPodAutoscaler"]
    assert all(h["spec"]["scaleTargetRef"]["name"] != trainer["metadata"]["name"] for h in hpas)


def test_hpa_scales_the_api_on_cpu(base: list[dict[str, Any]]) -> None:
    api = _component(base, "Deployment", "api")
    hpa = _one(base, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", api["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    # The autoscaler owns the count: a replicas field would be reset by every apply.
    assert "replicas" not in api["spec"]
    (container,) = api["spec"]["template"]["spec"]["containers"]
    assert "cpu" in container["resources"]["requests"]


def test_service_routes_to_the_api_pods(base: list[dict[str, Any]]) -> None:
    api = _component(base, "Deployment", "api")
    service = _one(base, "Service")
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert api["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (container,) = api["spec"]["template"]["spec"]["containers"]
    for port in service["spec"]["ports"]:
        assert _http_port(container, port["targetPort"]) == 8000


def test_migration_job_runs_rofu_migrate(base: list[dict[str, Any]]) -> None:
    job = _one(base, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")


def test_pods_run_as_the_images_non_root_user(base: list[dict[str, Any]]) -> None:
    uid = int(_dockerfile_user(_stages(_dockerfile())[-1]).split(":")[0])
    workloads = [o for o in base if _pod_spec(o) is not None]
    assert len(workloads) == 3
    for obj in workloads:
        spec = _pod_spec(obj)
        assert spec is not None
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == uid != 0
        for container in _containers(obj):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
            assert "memory" in container["resources"]["limits"]
            assert container["image"].startswith("rofu:")


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in container.get("env", [])}


def test_settings_come_from_the_configmap_and_secrets_from_files(
    base: list[dict[str, Any]],
) -> None:
    config = _one(base, "ConfigMap")
    data = config["data"]
    for obj in (o for o in base if _pod_spec(o) is not None):
        spec = _pod_spec(obj)
        assert spec is not None
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in _containers(obj):
            refs = [e["configMapRef"]["name"] for e in container.get("envFrom", [])]
            assert refs == [config["metadata"]["name"]]
            database = _env(container)["ROFU_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
            assert (database["name"], database["key"]) == (SECRET_NAME, "database-url")
            # Each key file lies in a read-only mount of the Secret that holds that key.
            for setting, key in (
                ("ROFU_API_KEYS_FILE", "api-keys"),
                ("ROFU_ADMIN_API_KEYS_FILE", "admin-api-keys"),
            ):
                path = Path(data[setting])
                mounts = [
                    m
                    for m in container.get("volumeMounts", [])
                    if Path(m["mountPath"]) == path.parent
                ]
                assert len(mounts) == 1, f"{setting}: no mount at {path.parent}"
                assert mounts[0].get("readOnly") is True
                secret = volumes[mounts[0]["name"]]["secret"]
                assert secret["secretName"] == SECRET_NAME
                items = {i["key"]: i["path"] for i in secret.get("items", [])}
                assert items.get(key) == path.name


def test_no_secret_values_are_in_the_kustomizations(
    base: list[dict[str, Any]], gpu: list[dict[str, Any]]
) -> None:
    assert not [o for o in base + gpu if o["kind"] == "Secret"]
    listed = _load_yaml(K8S_BASE / "kustomization.yaml")["resources"]
    assert "secret.example.yaml" not in listed
    # Only the example Secret exists, and it holds placeholders.
    for path in DEPLOY.rglob("*.y*ml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                assert path.name == "secret.example.yaml", f"{_rel(path)} holds a Secret"
    example = _load_yaml(K8S_BASE / "secret.example.yaml")
    assert example["metadata"]["name"] == SECRET_NAME
    assert set(example["stringData"]) == SECRET_KEYS
    assert "data" not in example
    for key, value in example["stringData"].items():
        lines = [line for line in value.splitlines() if line.strip()]
        assert lines, key
        assert all("CHANGE-ME" in line for line in lines), f"{key} is not a placeholder"
    assert "EXAMPLE" in (K8S_BASE / "secret.example.yaml").read_text(encoding="utf-8")
    kubernetes_validate.validate(example, K8S_VERSION, strict=True)


def test_manifests_reference_only_the_documented_secret_keys(
    base: list[dict[str, Any]],
) -> None:
    used: set[str] = set()
    for obj in base:
        for container in _containers(obj):
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == SECRET_NAME
                    used.add(ref["key"])
        spec = _pod_spec(obj) or {}
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] == SECRET_NAME
                used.update(i["key"] for i in volume["secret"]["items"])
    assert used == SECRET_KEYS


def test_pods_carry_prometheus_scrape_annotations(base: list[dict[str, Any]]) -> None:
    for component, port in (("api", 8000), ("trainer", 9101)):
        deployment = _component(base, "Deployment", component)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert int(annotations["prometheus.io/port"]) == port
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert port in {p["containerPort"] for p in container["ports"]}
    config = _one(base, "ConfigMap")["data"]
    assert int(config["ROFU_TRAINER_METRICS_PORT"]) == 9101
    assert config["ROFU_HOST"] == "0.0.0.0"  # the trainer's metrics bind ROFU_HOST


def test_gpu_overlay_uses_cuda_and_requests_a_gpu(gpu: list[dict[str, Any]]) -> None:
    assert _one(gpu, "ConfigMap")["data"]["ROFU_DEVICE"] == "cuda"
    for component in ("api", "trainer"):
        (container,) = _component(gpu, "Deployment", component)["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["image"].endswith("-cuda")
        assert "memory" in container["resources"]["limits"]  # the base's limits survive


# --------------------------------------------------------------------------------------
# Settings: every ROFU_* in the manifests is a real setting with a valid value
# --------------------------------------------------------------------------------------

KNOWN_SETTINGS = {f"ROFU_{name.upper()}" for name in Settings.model_fields} | EXTRA_SETTINGS


def _check_settings(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Settings:
    unknown = sorted(
        name for name in env if name.startswith("ROFU_") and name not in KNOWN_SETTINGS
    )
    assert not unknown, f"not settings of rofu/service/settings.py: {unknown}"
    with monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.startswith("ROFU_"):
                patch.delenv(name)
        for name, value in env.items():
            if name in ("ROFU_API_KEYS_FILE", "ROFU_ADMIN_API_KEYS_FILE"):
                key_file = tmp_path / name.lower()
                key_file.write_text("test-key-0123456789abcdef\n", encoding="utf-8")
                value = str(key_file)
            patch.setenv(name, value)
        return Settings()


def test_configmap_settings_are_valid(
    base: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = dict(_one(base, "ConfigMap")["data"])
    env["ROFU_DATABASE_URL"] = "postgresql://rofu:secret@db:5432/rofu"  # from the Secret
    settings = _check_settings(env, monkeypatch, tmp_path)
    assert settings.mode == "production"
    assert settings.device == "cpu"


def test_settings_check_refuses_an_unknown_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(AssertionError, match="ROFU_NOT_A_SETTING"):
        _check_settings({"ROFU_NOT_A_SETTING": "1"}, monkeypatch, tmp_path)


# --------------------------------------------------------------------------------------
# Compose
# --------------------------------------------------------------------------------------

COMPOSE_SERVICES = {
    "postgres",
    "redis",
    "migrate",
    "api",
    "proxy",
    "trainer",
    "prometheus",
    "grafana",
}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_yaml(COMPOSE)  # type: ignore[no-any-return]


def _interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with the defaults (the variables are unset in tests)."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def _depends(service: dict[str, Any]) -> dict[str, str]:
    depends = service.get("depends_on", {})
    if isinstance(depends, list):
        return dict.fromkeys(depends, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in depends.items()}


def test_compose_has_every_service_with_an_image(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == COMPOSE_SERVICES
    for name, service in services.items():
        assert service.get("image") or service.get("build"), f"{name}: no image or build"
    for name in ("migrate", "api", "trainer"):
        build = services[name]["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")
    assert "healthcheck" in services["postgres"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])


def test_compose_order_migrate_then_api_and_trainer(compose: dict[str, Any]) -> None:
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert _depends(migrate) == {"postgres": "service_healthy"}
    for name in ("api", "trainer"):
        depends = _depends(services[name])
        assert depends["migrate"] == "service_completed_successfully"
        assert depends["redis"] == "service_healthy"
    assert services["api"]["deploy"]["replicas"] == 2
    assert services["trainer"]["deploy"]["replicas"] == 1
    assert services["trainer"]["command"] == ["trainer"]
    assert services["api"]["command"][:1] == ["serve"]
    assert _depends(services["proxy"]) == {"api": "service_healthy"}
    api_health = " ".join(services["api"]["healthcheck"]["test"])
    assert "/readyz" in api_health


def test_compose_secrets_are_files_mounted_into_the_app(compose: dict[str, Any]) -> None:
    secrets = compose["secrets"]
    assert {"api-keys", "admin-api-keys"} <= set(secrets)
    for name, secret in secrets.items():
        assert set(secret) == {"file"}, f"secret {name} must be a file"
        assert (COMPOSE.parent / secret["file"]).parent.resolve() == DOCKER / "secrets"
    gitignore = (DOCKER / "secrets" / ".gitignore").read_text(encoding="utf-8").split()
    assert "*" in gitignore, "docker/secrets/ must never be committed"
    for name in ("migrate", "api", "trainer"):
        service = compose["services"][name]
        env = service["environment"]
        assert env["ROFU_API_KEYS_FILE"] == "/run/secrets/api-keys"
        assert env["ROFU_ADMIN_API_KEYS_FILE"] == "/run/secrets/admin-api-keys"
        assert {"api-keys", "admin-api-keys"} <= set(service["secrets"])


def test_compose_settings_are_valid(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    envs = [compose["services"][name]["environment"] for name in ("migrate", "api", "trainer")]
    assert envs[0] == envs[1] == envs[2], "every rofu process must read the same settings"
    env = {name: _interpolate(str(value)) for name, value in envs[0].items()}
    settings = _check_settings(env, monkeypatch, tmp_path)
    assert settings.mode == "production"
    assert settings.host == "0.0.0.0"
    assert settings.trainer_metrics_port == 9101
    assert settings.database_url.startswith("postgresql://")
    assert "@postgres:5432/" in settings.database_url
    assert settings.redis_url == "redis://redis:6379/0"


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def test_compose_bind_mounts_exist_and_match_the_configs(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for target, source in _bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
    prometheus = _bind_mounts(services["prometheus"])
    config = _load_yaml(prometheus["/etc/prometheus/prometheus.yml"])
    for rule_file in config["rule_files"]:
        assert prometheus[rule_file] == ALERTS
    grafana = _bind_mounts(services["grafana"])
    dashboard_target = next(t for t, s in grafana.items() if s == DASHBOARD)
    provisioning = grafana["/etc/grafana/provisioning"]
    providers = _load_yaml(provisioning / "dashboards" / "rofu.yaml")["providers"]
    assert [p["options"]["path"] for p in providers] == [str(Path(dashboard_target).parent)]
    assert _bind_mounts(services["proxy"])["/etc/nginx/nginx.conf"] == DOCKER / "nginx.conf"


def test_prometheus_scrapes_the_api_replicas_and_the_trainer(compose: dict[str, Any]) -> None:
    config = _load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"rofu-api", "rofu-trainer"}
    api = jobs["rofu-api"]["dns_sd_configs"][0]
    assert api["names"] == ["api"]
    assert api["port"] == int(compose["services"]["api"]["environment"]["ROFU_PORT"])
    (trainer,) = jobs["rofu-trainer"]["static_configs"][0]["targets"]
    port = compose["services"]["trainer"]["environment"]["ROFU_TRAINER_METRICS_PORT"]
    assert trainer == f"trainer:{port}"
    kubernetes = _load_yaml(DEPLOY / "prometheus" / "kubernetes-scrape.yml")
    relabel = kubernetes["scrape_configs"][0]["relabel_configs"]
    (job,) = [r for r in relabel if r.get("target_label") == "job"]
    assert job["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
    assert job["replacement"] == "rofu-$1"  # rofu-api, rofu-trainer: the jobs alerts use


def test_nginx_balances_over_the_api_service(compose: dict[str, Any]) -> None:
    conf = (DOCKER / "nginx.conf").read_text(encoding="utf-8")
    upstream = re.search(r"upstream\s+(\w+)\s*\{([^}]*)\}", conf)
    assert upstream, "nginx.conf has no upstream"
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)([^;]*);", upstream.group(2), re.M)
    assert servers == [("api", compose["services"]["api"]["environment"]["ROFU_PORT"], " resolve")]
    assert f"proxy_pass http://{upstream.group(1)};" in conf
    assert conf.count("{") == conf.count("}")
    # `server ... resolve` in an upstream needs nginx >= 1.27.3.
    tag = compose["services"]["proxy"]["image"].split(":")[1].split("-")[0]
    assert tuple(int(part) for part in tag.split(".")) >= (1, 27)


def _compose_client() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone:
        probe = subprocess.run([standalone, "version"], capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and re.search(r"\bv?2\.", probe.stdout):
            return [standalone]
    return None


@pytest.mark.parametrize(
    "files", [["compose.yaml"], ["compose.yaml", "compose.gpu.yaml"]], ids=lambda f: "+".join(f)
)
def test_docker_compose_config_accepts_the_files(files: list[str]) -> None:
    client = _compose_client()
    if client is None:
        pytest.skip(
            "no Docker Compose v2 client here (neither the `docker compose` plugin nor a "
            "v2 `docker-compose`); `compose config` needs only the client, not an engine"
        )
    options = [part for name in files for part in ("-f", str(DOCKER / name))]
    result = subprocess.run(
        [*client, *options, "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_compose_gpu_override_only_reserves_gpus(compose: dict[str, Any]) -> None:
    override = _load_yaml(DOCKER / "compose.gpu.yaml")
    assert set(override) == {"services"}
    assert set(override["services"]) == {"api", "trainer"}
    for service in override["services"].values():
        assert set(service) == {"deploy"}
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia"
        assert device["capabilities"] == ["gpu"]
    build = compose["services"]["api"]["build"]
    assert build["target"] == "${ROFU_BUILD_TARGET:-runtime}"  # cuda for the GPU image


# --------------------------------------------------------------------------------------
# PromQL: alert rules and the dashboard use only the metrics the app exports
# --------------------------------------------------------------------------------------

PROMQL_WORDS = {
    *("by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"),
    *("and", "or", "unless", "inf", "nan"),
}
PROMQL_FUNCTIONS = {
    *("sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk"),
    *("quantile", "count_values", "rate", "irate", "increase", "delta", "idelta", "deriv"),
    *("histogram_quantile", "clamp", "clamp_min", "clamp_max", "absent", "absent_over_time"),
    *("abs", "ceil", "floor", "round", "sqrt", "exp", "ln", "log2", "log10", "sgn"),
    *("time", "timestamp", "vector", "scalar", "label_replace", "label_join", "sort"),
    *("sort_desc", "changes", "resets", "predict_linear", "avg_over_time", "min_over_time"),
    *("max_over_time", "sum_over_time", "count_over_time", "quantile_over_time"),
    *("last_over_time", "present_over_time", "stddev_over_time"),
}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`")
NUMBER = re.compile(r"(?<![A-Za-z0-9_:.])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
TOKEN = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^{}]*\})?\s*(\()?")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*\"\"")


def exported_metrics() -> dict[str, frozenset[str]]:
    """Every series name the API replica and the trainer export, with its label names."""
    metrics = ServiceMetrics()
    labels: dict[str, tuple[str, ...]] = {}
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase):
            for family in collector.describe():
                labels[family.name] = tuple(getattr(collector, "_labelnames", ()))
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    series: dict[str, frozenset[str]] = {}
    for family in metrics.registry.collect():
        own = set(labels[family.name]) | TARGET_LABELS
        names = {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in suffixes[family.type]}
        for name in names:
            series[name] = frozenset(own | ({"le"} if name.endswith("_bucket") else set()))
    return series


@pytest.fixture(scope="module")
def exported() -> dict[str, frozenset[str]]:
    return exported_metrics()


def _balanced(text: str) -> bool:
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for char in text:
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def promql_problems(expr: str, exported: dict[str, frozenset[str]]) -> tuple[set[str], list[str]]:
    """The metric names an expression selects, and what is wrong with it: unbalanced
    brackets, unknown functions, metrics or labels. A light check, not a parser."""
    problems: list[str] = []
    text = STRING.sub('""', expr)
    if re.search(r"[\"'`]", text.replace('""', "")):
        problems.append("unterminated string")
    if not _balanced(text):
        problems.append("unbalanced brackets")
    if not text.strip() or re.search(r"(?:[-+*/%^,(]|==|!=|>=|<=|[<>])\s*$", text.strip()):
        problems.append("empty or incomplete expression")
    all_labels = frozenset().union(*exported.values())
    for match in GROUPING.finditer(text):
        for label in filter(None, (part.strip() for part in match.group(2).split(","))):
            if label not in all_labels:
                problems.append(f"unknown label {label!r} in {match.group(1)}()")
    text = GROUPING.sub(" ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range selectors and subqueries
    text = NUMBER.sub(" 0 ", text)
    metrics: set[str] = set()
    for match in TOKEN.finditer(text):
        name, braces, call = match.groups()
        if name.lower() in PROMQL_WORDS:
            continue
        if call and not braces:
            if name not in PROMQL_FUNCTIONS:
                problems.append(f"unknown function {name}()")
            continue
        metrics.add(name)
        if name not in exported:
            problems.append(f"metric {name} is not exported by rofu/service/metrics.py")
            continue
        for label, _ in MATCHER.findall(braces or ""):
            if label not in exported[name]:
                problems.append(f"{name} has no label {label!r}")
    if not metrics:
        problems.append("selects no metric")
    return metrics, problems


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("rate(rofu_made_up_total[5m])", "not exported"),
        ("sum(rate(rofu_http_requests_total[5m])", "unbalanced"),
        ('rofu_http_requests_total{code="500"}', "no label 'code'"),
        ("sum by (colour) (rofu_model_version)", "unknown label 'colour'"),
        ("rat(rofu_rewards_total[5m])", "unknown function rat()"),
        ("rofu_model_version >", "incomplete"),
        ("vector(1)", "selects no metric"),
    ],
)
def test_promql_check_catches(expr: str, problem: str, exported: dict[str, frozenset[str]]) -> None:
    _, problems = promql_problems(expr, exported)
    assert any(problem in p for p in problems), problems


def test_exported_metrics_are_the_apps(exported: dict[str, frozenset[str]]) -> None:
    assert "rofu_http_requests_total" in exported
    assert "rofu_http_request_duration_seconds_bucket" in exported
    assert {"endpoint", "method", "status", "le"} <= exported[
        "rofu_http_request_duration_seconds_bucket"
    ]
    assert "rofu_http_requests" not in exported  # a counter is exported with _total
    assert "rofu_model_version_total" not in exported


def _alert_rules() -> list[dict[str, Any]]:
    groups = _load_yaml(ALERTS)["groups"]
    return [rule for group in groups for rule in group["rules"]]


@pytest.mark.parametrize("rule", _alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_rule_uses_exported_metrics(
    rule: dict[str, Any], exported: dict[str, frozenset[str]]
) -> None:
    _, problems = promql_problems(rule["expr"], exported)
    assert not problems, f"{rule['alert']}: {problems}"
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"]
    assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s"))


def test_alert_rules_cover_the_failure_modes(exported: dict[str, frozenset[str]]) -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in _alert_rules()}
    assert len(exprs) == len(_alert_rules()), "alert names must be unique"

    def alerts_on(*needles: str) -> list[str]:
        return [name for name, expr in exprs.items() if all(n in expr for n in needles)]

    assert alerts_on("rofu_http_requests_total", 'status=~"5..')
    assert alerts_on("histogram_quantile(0.99", "_bucket", 'endpoint="/v1/select"')
    assert alerts_on("rofu_checkpoint_age_seconds")
    assert alerts_on("rofu_trainer_failures_total")
    assert alerts_on("rofu_trainer_publish_failures_total")
    assert alerts_on("rofu_rewards_total", 'outcome="accepted"', "rofu_selections_total")
    assert alerts_on("rofu_checkpoint_rejected_total")
    assert alerts_on("rofu_select_shed_total")


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _dashboard_targets() -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            yield f"{panel['title']}/{target.get('refId')}", target


@pytest.mark.parametrize(
    ("where", "target"), [pytest.param(w, t, id=w) for w, t in _dashboard_targets()]
)
def test_dashboard_target_uses_exported_metrics(
    where: str, target: dict[str, Any], exported: dict[str, frozenset[str]]
) -> None:
    _, problems = promql_problems(target["expr"], exported)
    assert not problems, f"{where}: {problems}"


def test_dashboard_panels_have_a_datasource_and_targets() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"]
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    provisioned = _load_yaml(DOCKER / "grafana/provisioning/datasources/prometheus.yaml")
    (datasource,) = provisioned["datasources"]
    assert datasource["type"] == "prometheus"
    assert variable["current"]["value"] == datasource["uid"]
    accepted_uids = {f"${{{variable['name']}}}", f"${variable['name']}", datasource["uid"]}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["datasource"]["type"] == "prometheus", panel["title"]
        assert panel["datasource"]["uid"] in accepted_uids, panel["title"]
        assert panel["targets"], f"{panel['title']}: no target"
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["refId"], panel["title"]
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]
        grid = panel["gridPos"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert grid["x"] + grid["w"] <= 24
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_dashboard_shows_every_exported_metric(exported: dict[str, frozenset[str]]) -> None:
    families = {family.name for family in ServiceMetrics().registry.collect()}
    shown: set[str] = set()
    for _, target in _dashboard_targets():
        shown |= promql_problems(target["expr"], exported)[0]
    missing = sorted(f for f in families if not any(name.startswith(f) for name in shown))
    assert not missing, f"metrics without a panel: {missing}"
    titles = " | ".join(panel["title"].lower() for panel in _dashboard()["panels"])
    for topic in ("request rate", "latency", "error", "batch", "arm", "reward", "join"):
        assert topic in titles, f"no panel about {topic}"
    for topic in ("model version", "checkpoint age", "rejection", "loss", "rows", "duration"):
        assert topic in titles, f"no panel about {topic}"
    assert "published" in titles
    assert "failures" in titles


# --------------------------------------------------------------------------------------
# Dockerfile and .dockerignore
# --------------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        pending += (" " if pending else "") + line.rstrip("\\").strip()
        if line.endswith("\\"):
            continue
        keyword, _, arguments = pending.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def _stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions:
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, arguments))
    return stages


def _stage_name(stage: list[tuple[str, str]]) -> str:
    parts = stage[0][1].split()
    return parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else ""


def _dockerfile_user(stage: list[tuple[str, str]]) -> str:
    users = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert users, f"stage {_stage_name(stage)} sets no USER"
    return users[-1]


def _global_args(instructions: list[tuple[str, str]]) -> dict[str, str]:
    args: dict[str, str] = {}
    for keyword, arguments in instructions:
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in arguments:
            name, _, default = arguments.partition("=")
            args[name] = default.strip('"')
    return args


def test_dockerfile_is_multi_stage_with_cpu_and_cuda_targets() -> None:
    instructions = _dockerfile()
    stages = _stages(instructions)
    names = [_stage_name(stage) for stage in stages]
    assert len(stages) >= 3
    assert "builder" in names
    assert "cuda" in names
    assert names[-1] == "runtime", "the default (last) target is the CPU image"
    args = _global_args(instructions)
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim")
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:")
    assert "runtime" in args["CUDA_IMAGE"]
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    pinned = re.search(r"torch==([\w.]+)", setup)
    assert pinned
    for stage in stages:
        torch_args = [a for k, a in stage if k == "ARG" and a.startswith("TORCH_SPEC=")]
        for torch_arg in torch_args:
            assert f"torch=={pinned.group(1)}" in torch_arg, "TORCH_SPEC differs from setup.sh"
        if torch_args:
            assert any(k == "RUN" and "pip install ${TORCH_SPEC}" in a for k, a in stage)
            assert any(
                k == "RUN" and re.search(r"pip install (--no-deps )?\.", a) for k, a in stage
            )
    builder = stages[names.index("builder")]
    (cpu_torch,) = [a for k, a in builder if k == "ARG" and a.startswith("TORCH_SPEC=")]
    assert "download.pytorch.org/whl/cpu" in cpu_torch


def test_dockerfile_installs_the_servers_dependencies() -> None:
    # The base dependencies are the client's; the image serves, so it needs the server extra.
    programs = re.findall(r'python -c "([^"]+)" > /tmp/requirements.txt', DOCKERFILE.read_text())
    assert len(programs) == 2, "one requirements list per builder (CPU and CUDA)"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    expected = project["dependencies"] + project["optional-dependencies"]["server"]
    assert any(line.startswith("torch") for line in expected)
    for program in programs:
        printed = subprocess.run(
            [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True
        )
        assert printed.stdout.splitlines() == expected


@pytest.mark.parametrize("target", ["runtime", "cuda"])
def test_dockerfile_final_stage_is_slim_and_non_root(target: str) -> None:
    stages = _stages(_dockerfile())
    stage = next(s for s in stages if _stage_name(s) == target)
    user = _dockerfile_user(stage)
    assert user.split(":")[0] not in ("root", "0")
    assert any(k == "COPY" and a.startswith("--from=") and "/opt/venv" in a for k, a in stage)
    copied = {
        a.split()[-2].rstrip("/") for k, a in stage if k == "COPY" and not a.startswith("--from=")
    }
    app = {"rofu", "migrations", "alembic.ini", "config"}
    assert copied == app, "the final image holds the venv and the app code only"
    commands = dict(stage)
    assert json.loads(commands["ENTRYPOINT"]) == ["rofu"]
    assert json.loads(commands["CMD"]) == ["serve", "--host", "0.0.0.0"]
    assert "8000" in commands["EXPOSE"].split()
    healthcheck = commands["HEALTHCHECK"]
    exec_form = json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())
    assert exec_form[0] == "python"
    assert "/healthz" in " ".join(exec_form)
    env = commands["ENV"]
    assert "PYTHONPATH=/app" in env  # rofu/service/migrate.py finds alembic.ini beside service/


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_context_small_and_secret_free() -> None:
    patterns = _dockerignore()
    for path in (".venv", ".git", "var", "results/tmp", ".pytest_cache", ".mypy_cache"):
        assert _ignored(path, patterns), f"{path} is in the build context"
    for path in ("var/rofu.sqlite", "x.sqlite", "docker/secrets/api-keys", "tests/unit"):
        assert _ignored(path, patterns), f"{path} is in the build context"
    assert _ignored("rofu/service/__pycache__/x.pyc", patterns)
    sources = {
        part
        for keyword, arguments in _dockerfile()
        if keyword == "COPY" and not arguments.startswith("--from=")
        for part in arguments.split()[:-1]
        if not part.startswith("--")
    }
    assert {"pyproject.toml", "README.md", "rofu"} <= sources
    for source in sorted(sources):
        assert (ROOT / source).exists(), f"COPY {source}: no such path"
        assert not _ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"
