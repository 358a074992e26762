"""The Kubernetes manifests in container/k8s/ validate against the API schema, and the
downward-API env names they set are the ones guestfs reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from guestfs.engine import explicit
from tests.support.paths import REPO

K8S = REPO / "container" / "k8s"
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")
KUBERNETES = "1.33"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# cert-manager's kinds are CRDs, which kubernetes-validate has no schema for: the subset of
# cert-manager.io/v1's CRD schemas (cert-manager 1.x) that the webhook's variant uses, with
# every other field refused, so that a misspelt one fails here rather than in a cluster.
_ISSUER_REF = {"type": "object", "required": ["name"], "additionalProperties": False,
               "properties": {"name": {"type": "string"},
                              "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                              "group": {"type": "string"}}}
_META = {"type": "object", "required": ["name"],
         "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                        "labels": {"type": "object"}, "annotations": {"type": "object"}}}
CERT_MANAGER = {
    "Certificate": {
        "type": "object", "required": ["secretName", "issuerRef"], "additionalProperties": False,
        "properties": {
            "secretName": {"type": "string"}, "issuerRef": _ISSUER_REF,
            "isCA": {"type": "boolean"}, "commonName": {"type": "string"},
            "duration": {"type": "string", "pattern": r"^(\d+h)?(\d+m)?(\d+s)?$"},
            "renewBefore": {"type": "string", "pattern": r"^(\d+h)?(\d+m)?(\d+s)?$"},
            "dnsNames": {"type": "array", "items": {"type": "string"}},
            "ipAddresses": {"type": "array", "items": {"type": "string"}},
            "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "size": {"type": "integer"},
                "rotationPolicy": {"enum": ["Never", "Always"]}}}}},
    "Issuer": {
        "type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
        "properties": {
            "selfSigned": {"type": "object", "additionalProperties": False,
                           "properties": {"crlDistributionPoints": {"type": "array"}}},
            "ca": {"type": "object", "required": ["secretName"], "additionalProperties": False,
                   "properties": {"secretName": {"type": "string"}}}}},
}


def validate(doc: dict) -> None:
    if doc.get("apiVersion") == "cert-manager.io/v1":
        import jsonschema

        schema = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
                  "additionalProperties": False,
                  "properties": {"apiVersion": {}, "kind": {"enum": sorted(CERT_MANAGER)},
                                 "metadata": _META,
                                 "spec": CERT_MANAGER.get(doc.get("kind"), {})}}
        jsonschema.validate(doc, schema)
        return
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_the_kubernetes_schema(path):
    docs = documents(path)
    assert docs
    for doc in docs:
        validate(doc)


def test_the_cert_manager_subset_refuses_what_cert_manager_would():
    """The hand-written subset is no schema that accepts anything."""
    import jsonschema

    (cert,) = [d for d in documents(K8S / "webhook" / "cert-manager" / "certificate.yaml")
               if d["kind"] == "Certificate" and d["metadata"]["name"] == "guestfs-webhook"]
    for broken in ({**cert, "spec": {**cert["spec"], "dnsName": ["x"]}},
                   {**cert, "spec": {k: v for k, v in cert["spec"].items() if k != "issuerRef"}},
                   {**cert, "spec": {**cert["spec"], "duration": "90d"}},
                   {**cert, "kind": "Certificat"}):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


def test_every_pattern_has_a_manifest_and_a_kustomization():
    for pattern in ("wrapper", "sidecar", "daemonset", "fuse-device-plugin", "webhook",
                    "webhook/base", "webhook/cert-manager"):
        assert (K8S / pattern / "kustomization.yaml").exists()
        listed = yaml.safe_load((K8S / pattern / "kustomization.yaml").read_text())
        for res in listed["resources"]:
            assert (K8S / pattern / res).exists()


def test_env_names_are_the_ones_guestfs_reads():
    known = {explicit.ENV_MEMORY, explicit.ENV_CPU, explicit.ENV_MEMORY_DIVISOR,
             explicit.ENV_CPU_DIVISOR, explicit.ENV_LIMITS_DIR}
    for path in MANIFESTS:
        for doc in documents(path):
            spec = doc.get("spec", {}).get("template", {}).get("spec", doc.get("spec", {}))
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                for env in c.get("env", []):
                    assert not env["name"].startswith("GUESTFS_") or env["name"] in known


def test_wrapper_takes_its_limits_from_a_downward_api_volume_that_kubelet_refreshes():
    """Env vars keep their start values after an in-place resize and, being part of the
    minimum, would hide a raised limit: the limits come from a volume, in the units the
    command line says."""
    from guestfs.cli.main import build_parser

    spec = pod_spec("wrapper", "deployment.yaml")
    (app,) = spec["containers"]
    assert not any(e["name"].startswith("GUESTFS_") for e in app.get("env", []))
    args = build_parser().parse_args(app["command"][1:])
    assert args.cmd[1:] == ["java", "-jar", "/app/app.jar"]
    (vm,) = [m for m in app["volumeMounts"] if m["mountPath"] == args.limits_dir]
    volume = {v["name"]: v for v in spec["volumes"]}[vm["name"]]
    items = {i["path"]: i["resourceFieldRef"] for i in volume["downwardAPI"]["items"]}
    assert items[explicit.DOWNWARD_MEMORY_FILE] == \
        {"containerName": "app", "resource": "limits.memory", "divisor": "1"}
    assert items[explicit.DOWNWARD_CPU_FILE] == \
        {"containerName": "app", "resource": "limits.cpu", "divisor": args.cpu_divisor}


def test_dev_fuse_comes_from_the_device_plugin_never_from_a_hostpath():
    """A hostPath /dev/fuse is bound but cannot be opened in a non-privileged container
    (containerd's CRI denies every device the request does not list); the device plugin's
    resource brings the node and its device-cgroup rule."""
    plugin = documents(K8S / "fuse-device-plugin" / "daemonset.yaml")[0]
    (dp,) = plugin["spec"]["template"]["spec"]["containers"]
    device = yaml.safe_load(dp["args"][dp["args"].index("--device") + 1])
    assert device["name"] == "fuse"
    assert [p["path"] for g in device["groups"] for p in g["paths"]] == ["/dev/fuse"]
    resource = "squat.ai/" + device["name"]
    for pattern, name in (("wrapper", "app"), ("sidecar", "guestfs")):
        spec = pod_spec(pattern, "deployment.yaml")
        (c,) = [c for c in all_containers(spec) if c["name"] == name]
        assert c["resources"]["limits"][resource] == "1"
    for path in MANIFESTS:
        for doc in documents(path):
            assert "/dev/fuse" not in json.dumps(doc.get("spec", {}).get("template", {})
                                                 .get("spec", {}).get("volumes", [])), path


def pod_spec(pattern: str, name: str, workload: str | None = None) -> dict:
    docs = documents(K8S / pattern / name)
    doc = next(d for d in docs if d["metadata"]["name"] == workload) if workload else docs[0]
    return doc["spec"]["template"]["spec"]


def all_containers(spec: dict) -> list[dict]:
    return spec.get("containers", []) + spec.get("initContainers", [])


def test_wrapper_is_user_namespaced_with_three_capabilities_and_a_read_only_root():
    """The recommended wrapper: a pod user namespace (tests/external/test_real_runc_userns.py
    runs the same setup under runc), CAP_SYS_ADMIN added (and CAP_SETPCAP, with which `run`
    takes CAP_SYS_ADMIN out of the app's bounding set, and CAP_SYS_CHROOT, with which it
    re-binds after a daemon restart: tests/external/test_real_runc_caps.py) and nothing
    privileged."""
    spec = pod_spec("wrapper", "deployment.yaml")
    assert spec["hostUsers"] is False
    (app,) = spec["containers"]
    assert app["command"][:2] == ["guestfs", "run"]
    sc = app["securityContext"]
    assert sc.get("privileged") is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "SETPCAP", "SYS_CHROOT"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False


def test_sidecar_needs_no_privileged_mode_nor_bidirectional_propagation():
    """attach moves the files in (open_tree + move_mount, tests/host/test_attach_userns.py), so
    the sidecar needs three capabilities of the pod's user namespace and no propagation."""
    spec = pod_spec("sidecar", "deployment.yaml")
    assert spec["hostUsers"] is False and spec["shareProcessNamespace"] is True
    (sidecar,) = spec["initContainers"]
    assert "guestfs attach --watch" in " ".join(sidecar["args"])
    sc = sidecar["securityContext"]
    assert sc.get("privileged") is False
    assert set(sc["capabilities"]["add"]) == {"SYS_ADMIN", "SYS_PTRACE", "SYS_CHROOT"}
    assert sc["capabilities"]["drop"] == ["ALL"]
    for c in all_containers(spec):
        assert not c.get("securityContext", {}).get("privileged")
        for vm in c.get("volumeMounts", []):
            assert vm.get("mountPropagation", "None") == "None", (c["name"], vm)
    for app in spec["containers"]:   # the app images and specs stay untouched
        assert "securityContext" not in app and "volumeMounts" not in app


def test_daemonset_shares_the_nodes_mount_lock_directory():
    """Two pods of a rolling update on one node must see one lock, or both would mount."""
    from guestfs.daemon.mountlock import LOCK_DIR

    spec = pod_spec("daemonset", "daemonset.yaml")
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    # Two daemons: the per-caller mount and the per-container one (the OCI hook's source).
    daemons = [c for c in spec["containers"] if c["args"][0] == "mount"]
    assert [c["args"][1] for c in daemons] == ["/var/lib/guestfs/by-caller",
                                               "/var/lib/guestfs/by-container"]
    assert "--per-container" in daemons[1]["args"]
    for daemon in daemons:
        mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
        assert any(path == LOCK_DIR and volumes.get(name) == LOCK_DIR
                   for name, path in mounts.items())
        # Each serves its mountpoint to the node from below a hostPath of its parent (a
        # plain directory: a restarted container's volume is never a mount's own root).
        parent = os.path.dirname(daemon["args"][1])
        assert volumes.get(next(n for n, p in mounts.items() if p == parent)) == parent
        # Held by the holder's DaemonSet, which shares the lock directory.
        assert {"--hold", "--external-holder"} <= set(daemon["args"])
    holder = pod_spec("daemonset", "daemonset.yaml", "guestfs-fuse-holder")
    (c,) = holder["containers"]
    assert c["args"] == ["fuse-holder", "--lock-dir", LOCK_DIR]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {v["hostPath"]["path"] for v in holder["volumes"]} == {LOCK_DIR}


def host_paths(spec: dict, container: dict) -> dict[str, dict]:
    """mountPath -> the container's volumeMount, with the node path as "node"."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    out = {}
    for vm in container.get("volumeMounts", []):
        out[vm["mountPath"]] = dict(vm, node=volumes[vm["name"]].get("hostPath", {}).get("path"))
    return out


def test_daemonset_runs_the_seccomp_agent_on_the_per_container_mount():
    """The agent's socket is the profile's listenerPath, on the node; it reads the
    per-container mount the node sees (HostToContainer) in the node's pid namespace; it
    never starts a guard of its own in its container (--external-guard)."""
    from guestfs.cli.main import build_parser
    from tests.external.test_real_seccomp_agent import docs_profile

    spec = pod_spec("daemonset", "daemonset.yaml")
    assert spec["hostPID"] is True
    (agent,) = [c for c in spec["containers"] if c["args"][0] == "seccomp-agent"]
    args = build_parser().parse_args(agent["args"])
    assert (args.socket, args.source, args.external_guard) == \
        ("/run/guestfs-seccomp/agent.sock", "/var/lib/guestfs/by-container", True)
    assert docs_profile(args.socket)["listenerPath"] == \
        json.loads(profile_configmap()["data"]["guestfs-notify.json"])["listenerPath"]
    mounts = host_paths(spec, agent)
    assert mounts["/run/guestfs-seccomp"]["node"] == "/run/guestfs-seccomp"
    src = mounts[os.path.dirname(args.source)]   # the mount's parent: see the daemons'
    assert (src["node"], src["mountPropagation"], src["readOnly"]) == \
        (os.path.dirname(args.source), "HostToContainer", True)


def profile_configmap() -> dict:
    (doc,) = documents(K8S / "daemonset" / "seccomp-profile.yaml")
    return doc


def test_the_profile_installed_on_nodes_is_the_documented_one_and_pods_name_it():
    from tests.external.test_real_seccomp_agent import docs_profile

    installed = json.loads(profile_configmap()["data"]["guestfs-notify.json"])
    assert installed == docs_profile("/run/guestfs-seccomp/agent.sock")
    spec = pod_spec("daemonset", "daemonset.yaml")
    (init,) = spec["initContainers"]
    mounts = host_paths(spec, init)
    assert mounts["/seccomp"]["node"] == "/var/lib/kubelet/seccomp"
    script = init["command"][-1]
    assert "/profile/guestfs-notify.json" in script and \
        script.endswith("/seccomp/guestfs-notify.json")
    snippet = documents(K8S / "daemonset" / "pod-snippet.yaml")[0]
    assert snippet["spec"]["securityContext"]["seccompProfile"] == \
        {"type": "Localhost", "localhostProfile": "guestfs-notify.json"}


def test_the_seccomp_guard_outlives_agent_restarts_and_guestfs_upgrades():
    """A DaemonSet of its own, updated only when its pod is deleted: an upgrade of the
    guestfs DaemonSet replaces the agent's pod, never the guard's. Unprivileged, never
    evicted, Guaranteed; its directory is the agent socket's, on the node."""
    from guestfs.cli.main import build_parser

    guards = [d for d in documents(K8S / "daemonset" / "daemonset.yaml")
              if d["metadata"]["name"] == "guestfs-seccomp-guard"]
    (ds,) = guards
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    (guard,) = spec["containers"]
    args = build_parser().parse_args(guard["args"])
    from guestfs.cli import seccomp

    assert args.func is seccomp.guard and args.dir == "/run/guestfs-seccomp"
    assert host_paths(spec, guard)[args.dir]["node"] == args.dir
    sc = guard["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False
    res = guard["resources"]
    assert res["requests"] == res["limits"]          # Guaranteed: last for the OOM killer
