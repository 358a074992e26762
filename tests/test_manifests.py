"""The Kubernetes manifests in container/k8s/ validate against the API schema, and the
downward-API env names they set are the ones guestfs reads."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from guestfs import explicit

K8S = Path(__file__).resolve().parent.parent / "container" / "k8s"
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")
KUBERNETES = "1.33"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_the_kubernetes_schema(path):
    docs = documents(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_every_pattern_has_a_manifest_and_a_kustomization():
    for pattern in ("wrapper", "sidecar", "daemonset"):
        assert (K8S / pattern / "kustomization.yaml").exists()
        listed = yaml.safe_load((K8S / pattern / "kustomization.yaml").read_text())
        for res in listed["resources"]:
            assert (K8S / pattern / res).exists()


def test_env_names_are_the_ones_guestfs_reads():
    known = {explicit.ENV_MEMORY, explicit.ENV_CPU, explicit.ENV_MEMORY_DIVISOR,
             explicit.ENV_CPU_DIVISOR, explicit.ENV_LIMITS_DIR}
    seen = set()
    for path in MANIFESTS:
        for doc in documents(path):
            spec = doc.get("spec", {}).get("template", {}).get("spec", doc.get("spec", {}))
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                for env in c.get("env", []):
                    if env["name"].startswith("GUESTFS_"):
                        seen.add(env["name"])
    assert seen and seen <= known
    assert {explicit.ENV_MEMORY, explicit.ENV_CPU, explicit.ENV_CPU_DIVISOR} <= seen
