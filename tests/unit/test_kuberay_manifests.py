"""The KubeRay manifests (deploy/kuberay/) against the Kubernetes API's own models, from the
``kubernetes`` client package: every pod template of the ``RayCluster`` (a CRD, so its
pod templates are what Kubernetes validates), and every built-in object whole
(Deployment, Service).

The client's models ignore fields they do not know, so each document is also written back
from the model and compared with what was read: a misspelt or misplaced field is lost on
the way and fails the comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kuberay"
KINDS = {("apps/v1", "Deployment"): "V1Deployment", ("v1", "Service"): "V1Service"}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _roundtrip(data: dict[str, Any], model: str) -> Any:
    """``data`` as the model ``model``; asserts that nothing was dropped or changed."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    obj = api._ApiClient__deserialize(data, model)  # the client's own JSON -> model step
    assert api.sanitize_for_serialization(obj) == data, f"{model}: a field is not the API's"
    return obj


def test_there_are_manifests() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for _, d in _documents()}
    assert kinds == {("ray.io/v1", "RayCluster"), ("apps/v1", "Deployment"), ("v1", "Service")}


@pytest.mark.parametrize("name,doc", _documents(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_each_manifest_is_valid_for_the_kubernetes_api(name: str, doc: dict[str, Any]) -> None:
    _roundtrip(doc["metadata"], "V1ObjectMeta")
    if doc["kind"] != "RayCluster":
        _roundtrip(doc, KINDS[(doc["apiVersion"], doc["kind"])])
        return
    spec = doc["spec"]
    head = _roundtrip(spec["headGroupSpec"]["template"], "V1PodTemplateSpec")
    assert head.spec.containers[0].name == "ray-head"
    assert "resources" not in spec["headGroupSpec"]["rayStartParams"]  # the head runs no sandbox
    for group in spec["workerGroupSpecs"]:
        template = _roundtrip(group["template"], "V1PodTemplateSpec")
        # ray start's --resources, as KubeRay passes it: a JSON object in a string.
        import json

        assert json.loads(json.loads(group["rayStartParams"]["resources"])) == {"loom_sandboxes": 64}
        container = template.spec.containers[0]
        env = {e.name: e.value for e in container.env}
        assert {"LOOM_WORKSPACE_ROOT", "LOOM_DATA_DIR", "LOOM_RUNTIME"} <= set(env)
        # The host's engine resolves the sandboxes' bind mounts on the host: the
        # workspaces must be at the same path in the pod as on the host.
        mounts = {m.name: m.mount_path for m in container.volume_mounts}
        volumes = {v.name: v for v in template.spec.volumes}
        for name_ in ("workspaces", "egress"):
            assert volumes[name_].host_path.path == mounts[name_]
        assert mounts["workspaces"] == env["LOOM_WORKSPACE_ROOT"]
        assert volumes["docker-sock"].host_path.type == "Socket"
