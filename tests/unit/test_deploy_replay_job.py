"""deploy/k8s/replay: a replay study as one Kubernetes Indexed Job, a shard per pod. The
objects are valid Kubernetes 1.30, the pods run as the image's non-root user, and the
arguments are a real `rofu replay` command whose shard count is the Job's completions
and whose index is the pod's completion index; the image it names is built with the
replay extra."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from typing import Any

import kubernetes_validate
import pytest

from rofu.replay.arguments import build_parser
from tests.unit.test_deploy_files import DEPLOY, DOCKERFILE, K8S_VERSION, ROOT, render_kustomization

REPLAY = DEPLOY / "k8s" / "replay"
INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render_kustomization(REPLAY)


def _job(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [job] = [o for o in objects if o["kind"] == "Job"]
    return job


def test_every_object_is_valid_kubernetes(objects: list[dict[str, Any]]) -> None:
    assert sorted(o["kind"] for o in objects) == [
        "Job",
        "PersistentVolumeClaim",
        "PersistentVolumeClaim",
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_each_pod_runs_its_own_shard_of_one_replay_command(objects: list[dict[str, Any]]) -> None:
    spec = _job(objects)["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimitPerIndex"] >= 1  # a failed shard is retried, with its own index
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == INDEX
    args = container["args"]
    assert args[0] == "replay"
    assert args[args.index("--shard") + 1] == f"$(SHARD_INDEX)/{spec['completions']}"
    for index in (0, spec["completions"] - 1):
        real = [a.replace("$(SHARD_INDEX)", str(index)) for a in args[1:]]
        parsed = build_parser().parse_args(real)
        assert (parsed.shard.index, parsed.shard.count) == (index, spec["completions"])
        out = parsed.out.as_posix()
        assert out.startswith("/results/")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data"]["readOnly"]
    assert env["ROFU_DATA_DIR"]["value"] == "/data"
    assert not mounts["/results"].get("readOnly", False)
    claims = {
        v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]
    }
    pvcs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    assert claims["results"] in pvcs
    assert pvcs[claims["results"]]["spec"]["accessModes"] == ["ReadWriteMany"]  # every shard writes
    assert claims["data"] in pvcs


def test_the_shard_pods_run_as_the_images_non_root_user(objects: list[dict[str, Any]]) -> None:
    pod = _job(objects)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_the_replay_image_is_built_with_the_replay_extra(objects: list[dict[str, Any]]) -> None:
    comment = (REPLAY / "kustomization.yaml").read_text(encoding="utf-8")
    build = re.search(
        r"docker build -f docker/Dockerfile --build-arg EXTRAS=(\S+) -t rofu:(\S+)", comment
    )
    assert build is not None, "the kustomization says how to build its image"
    extras, tag = build.groups()
    assert _job(objects)["spec"]["template"]["spec"]["containers"][0]["image"] == f"rofu:{tag}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    [program] = set(
        re.findall(r'python -c "([^"]+)" > /tmp/requirements.txt', DOCKERFILE.read_text())
    )
    printed = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"EXTRAS": extras},
    ).stdout.splitlines()
    wanted = [r for e in extras.split(",") for r in project["optional-dependencies"][e]]
    assert printed == project["dependencies"] + [r for r in wanted if not r.startswith("rofu[")]
    assert "scipy>=1.11" in printed  # the replay extra's own, not only the server's
