"""The API server's side of a mutating webhook, for tests: which webhook of a
MutatingWebhookConfiguration a pod's creation is sent to (its namespaceSelector and
objectSelector, evaluated as the API server evaluates label selectors), the
AdmissionReview v1 request it posts, and the patch of the response, decoded."""

from __future__ import annotations

import base64
import json
import uuid


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every matchExpression holds; an
    empty or absent selector selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown operator {op}")
    return True


def calls(config: dict, namespace: str, namespace_labels: dict[str, str],
          pod: dict) -> list[dict]:
    """The webhooks of the configuration a pod creation in ``namespace`` is sent to. The
    API server adds kubernetes.io/metadata.name to every namespace's labels."""
    labels = {**namespace_labels, "kubernetes.io/metadata.name": namespace}
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    out = []
    for hook in config["webhooks"]:
        if not any("pods" in r["resources"] and "CREATE" in r["operations"]
                   and "" in r["apiGroups"] for r in hook["rules"]):
            continue
        if selects(hook.get("namespaceSelector"), labels) and \
                selects(hook.get("objectSelector"), pod_labels):
            out.append(hook)
    return out


def review(pod: dict, namespace: str, operation: str = "CREATE") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()),
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": operation, "namespace": namespace,
                        "userInfo": {"username": "system:serviceaccount:kube-system:"
                                                 "replicaset-controller"},
                        "object": pod, "oldObject": None, "dryRun": False}}


def patch_of(answer: dict, request: dict) -> list[dict]:
    """The JSONPatch of an AdmissionReview answer, checked as the API server checks it:
    the uid of the request, allowed, and a JSONPatch where there is a patch."""
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == \
        "AdmissionReview", answer
    resp = answer["response"]
    assert resp["uid"] == request["request"]["uid"] and resp["allowed"] is True, resp
    if "patch" not in resp:
        return []
    assert resp["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(resp["patch"]))


def pod_of(workload: dict) -> dict:
    """The pod a controller creates from a Deployment's, a Job's or a DaemonSet's template,
    as the API server admits it: no name yet, a generateName, the template's metadata."""
    kind, name = workload["kind"], workload["metadata"]["name"]
    tmeta = dict(workload["spec"]["template"].get("metadata") or {})
    prefix = {"Deployment": f"{name}-5d8f7c9b4-", "Job": f"{name}-"}.get(kind, f"{name}-")
    meta = {**tmeta, "generateName": prefix,
            "namespace": workload["metadata"].get("namespace", "default")}
    meta.pop("name", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": json.loads(json.dumps(workload["spec"]["template"]["spec"]))}


SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def as_admitted(pod: dict) -> dict:
    """The pod as mutating webhooks receive it from a real API server: the API's defaults
    set (kubelet-facing fields, requests from limits, an empty pod securityContext) and
    the ServiceAccount admission plugin's token volume mounted in every container, which
    is why a real pod's volumes and volumeMounts lists are never absent."""
    pod = json.loads(json.dumps(pod))
    spec = pod["spec"]
    spec.setdefault("securityContext", {})
    for key, value in (("restartPolicy", "Always"), ("dnsPolicy", "ClusterFirst"),
                       ("schedulerName", "default-scheduler"), ("serviceAccountName", "default"),
                       ("terminationGracePeriodSeconds", 30), ("enableServiceLinks", True)):
        spec.setdefault(key, value)
    spec.setdefault("volumes", []).append({"name": "kube-api-access-7x2kq", "projected": {
        "defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
    for c in spec.get("initContainers", []) + spec["containers"]:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("imagePullPolicy", "IfNotPresent")
        res = c.setdefault("resources", {})
        if res.get("limits"):
            res.setdefault("requests", dict(res["limits"]))
        c.setdefault("volumeMounts", []).append(
            {"name": "kube-api-access-7x2kq", "mountPath": SA_MOUNT, "readOnly": True})
    return pod
