"""The webhook's manifests (container/k8s/webhook/) agree with each other and with the
command: the Deployment is unprivileged and runs arguments the command parses, the
configuration calls the Service at the server's routes and never fails a pod creation,
the certificate's Secret and names are the ones mounted and called, and `kubectl
kustomize` renders both variants (where kubectl is installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from guestfs.cli.main import build_parser
from guestfs.webhook.server import ROUTES
from tests.unit.test_manifests import K8S, documents

WEBHOOK = K8S / "webhook"
BASE = WEBHOOK / "base"


def one(path, kind: str, name: str | None = None) -> dict:
    (doc,) = [d for d in documents(path) if d["kind"] == kind
              and (name is None or d["metadata"]["name"] == name)]
    return doc


def test_the_deployment_is_unprivileged_and_highly_available():
    dep = one(BASE / "deployment.yaml", "Deployment")
    assert dep["spec"]["replicas"] == 2
    spec = dep["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["automountServiceAccountToken"] is False
    assert not any(spec.get(k) for k in ("hostPID", "hostNetwork", "hostIPC"))
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc.get("privileged") is False
    assert all("hostPath" not in v for v in spec["volumes"])
    pdb = one(BASE / "pdb.yaml", "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def webhook_args() -> tuple[dict, object]:
    spec = one(BASE / "deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    return spec, build_parser().parse_args(c["args"])


def test_the_deployment_runs_the_command_with_its_secret_mounted():
    spec, args = webhook_args()
    (c,) = spec["containers"]
    assert args.command == "webhook" and args.seccomp is True
    (mount,) = [m for m in c["volumeMounts"] if args.tls_cert.startswith(m["mountPath"] + "/")]
    assert args.tls_key.startswith(mount["mountPath"] + "/") and mount["readOnly"] is True
    secret = {v["name"]: v for v in spec["volumes"]}[mount["name"]]["secret"]["secretName"]
    # make-certs.sh names it after the Service; cert-manager's Certificate writes it.
    service = one(BASE / "service.yaml", "Service")
    assert secret == service["metadata"]["name"] + "-tls"
    cert = one(WEBHOOK / "cert-manager" / "certificate.yaml", "Certificate", "guestfs-webhook")
    assert cert["spec"]["secretName"] == secret
    # Probes at the server's health routes, over HTTPS, on the served port.
    port = int(args.listen.rsplit(":", 1)[1])
    assert [p["containerPort"] for p in c["ports"] if p["name"] == "https"] == [port]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {c[p]["httpGet"]["scheme"] for p in ("readinessProbe", "livenessProbe")} == {"HTTPS"}


def test_the_configuration_calls_the_service_and_never_blocks_a_pod():
    config = one(BASE / "webhook.yaml", "MutatingWebhookConfiguration")
    service = one(BASE / "service.yaml", "Service")
    ns, name = service["metadata"]["namespace"], service["metadata"]["name"]
    paths = []
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["reinvocationPolicy"] == "IfNeeded"
        ref = hook["clientConfig"]["service"]
        assert (ref["namespace"], ref["name"], ref["port"]) == \
            (ns, name, service["spec"]["ports"][0]["port"])
        paths.append(ref["path"])
        # guestfs's own namespace (the DaemonSet's and the webhook's pods) is never sent.
        exprs = hook["namespaceSelector"]["matchExpressions"]
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": [ns]} in exprs
        assert hook["objectSelector"]["matchExpressions"] == \
            [{"key": "io.guestfs.enable", "operator": "NotIn", "values": ["false"]}]
    assert sorted(paths) == sorted(ROUTES)
    cert = one(WEBHOOK / "cert-manager" / "certificate.yaml", "Certificate", "guestfs-webhook")
    assert f"{name}.{ns}.svc" in cert["spec"]["dnsNames"]
    daemonset = documents(K8S / "daemonset" / "daemonset.yaml")[0]
    assert daemonset["metadata"]["namespace"] == ns


def kustomize(path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` not run")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def names(docs: list[dict]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_kubectl_kustomize_renders_both_variants():
    base = [d for p in sorted(BASE.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in documents(p)]
    rendered = kustomize(WEBHOOK)
    assert names(rendered) == names(base) and len(rendered) == len(base) == 4
    certs = documents(WEBHOOK / "cert-manager" / "certificate.yaml")
    with_cm = kustomize(WEBHOOK / "cert-manager")
    assert names(with_cm) == names(base) | names(certs)
    config = next(d for d in with_cm if d["kind"] == "MutatingWebhookConfiguration")
    cert = one(WEBHOOK / "cert-manager" / "certificate.yaml", "Certificate", "guestfs-webhook")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
    # Nothing else changed by the variant.
    plain = next(d for d in rendered if d["kind"] == "MutatingWebhookConfiguration")
    assert config["webhooks"] == plain["webhooks"]
