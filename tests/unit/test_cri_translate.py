"""The manifest-to-CRI translator on the shipped manifests and on small snippets, including
every refusal (a field it cannot reproduce must fail naming its path)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.cri import kubemath as km
from tests.support.cri.translate import (
    SECCOMP_ROOT,
    Node,
    Untranslatable,
    translate,
    translate_all,
)
from tests.support.paths import REPO

pytest.importorskip("grpc_tools")

K8S = REPO / "container" / "k8s"
GiB, MiB = 1 << 30, 1 << 20
NODE = Node("node-1", 4000, 8 * GiB, True)
IMAGES = {"registry.example/guestfs:0.1": "guestfs", "registry.example/app:1.0": "busybox",
          "registry.example/app-with-guestfs:1.0": "guestfs"}


def pb():
    from tests.support.cri import stubs

    return stubs.load()[0]


def env_of(cfg) -> dict[str, str]:
    return {kv.key: kv.value for kv in cfg.envs}


def mount_at(cfg, path: str):
    return next(m for m in cfg.mounts if m.container_path == path)


# ----------------------------------------------------------------------- shipped manifests

def test_wrapper_deployment():
    plan = translate(K8S / "wrapper", images=IMAGES, node=NODE,
                     programs={"app": ["cat", "/proc/meminfo"]})
    assert plan.qos == "Burstable"
    assert plan.sandbox.linux.cgroup_parent == f"/kubepods/burstable/pod{plan.uid}"
    assert plan.sandbox.hostname == ""
    ns = plan.sandbox.linux.security_context.namespace_options
    assert (ns.network, ns.pid) == (pb().NODE, pb().CONTAINER)
    assert ns.userns_options.mode == pb().POD              # hostUsers: false
    (app,) = plan.containers
    cfg = app.config
    argv = list(cfg.command)
    cut = argv.index("--")
    assert argv[:2] == ["guestfs", "run"] and argv[cut + 1:] == ["cat", "/proc/meminfo"]
    assert cfg.image.image == "guestfs.test/guestfs:1"
    res = cfg.linux.resources
    assert res.memory_limit_in_bytes == 512 * MiB
    assert (res.cpu_period, res.cpu_quota) == (100000, 100000)
    assert res.cpu_shares == 512                           # 500m * 1024 / 1000
    # Burstable: 1000 - 1000 * 256Mi / 8Gi = 1000 - 31 (integer division).
    assert res.oom_score_adj == 969
    assert res.memory_swap_limit_in_bytes == 512 * MiB
    sc = cfg.linux.security_context
    assert list(sc.capabilities.add_capabilities) == ["SYS_ADMIN", "SETPCAP", "SYS_CHROOT"]
    assert sc.readonly_rootfs
    assert list(sc.capabilities.drop_capabilities) == ["ALL"]
    assert sc.no_new_privs and not sc.privileged
    assert sc.apparmor.profile_type == pb().SecurityProfile.Unconfined
    assert sc.seccomp.profile_type == pb().SecurityProfile.Unconfined
    assert "/proc/kcore" in sc.masked_paths and "/proc/sys" in sc.readonly_paths
    assert cfg.log_path == "app/0.log"
    assert plan.sandbox.log_directory == f"/var/log/pods/default_{plan.name}_{plan.uid}"
    assert mount_at(cfg, "/etc/hosts").host_path == f"/var/lib/kubelet/pods/{plan.uid}/etc-hosts"
    assert plan.pod_cpu_limit == 1000 and plan.pod_memory_limit == 512 * MiB
    assert plan.pod_cpu_request == 500


def test_wrapper_limits_reach_guestfs_run():
    """The wrapper hands the limits to `guestfs run` through a downward-API volume
    (--limits-dir), which kubelet refreshes on a resize; /dev/fuse comes from the FUSE
    device plugin's resource, never a hostPath."""
    plan = translate(K8S / "wrapper", images=IMAGES, node=NODE)
    (app,) = plan.containers
    cfg, argv = app.config, list(app.config.command)
    vol = next(v for v in plan.volumes if v.kind == "downwardAPI")
    items = {i.path: (i.resource, i.container, i.divisor) for i in vol.items}
    assert items == {"limits.memory": ("limits.memory", "app", "1"),
                     "limits.cpu": ("limits.cpu", "app", "1m")}
    m = next(m for m in cfg.mounts if m.host_path == vol.node_path)
    assert m.readonly
    assert argv[argv.index("--limits-dir") + 1] == m.container_path
    assert vol.node_path == (f"/var/lib/kubelet/pods/{plan.uid}/volumes/"
                             f"kubernetes.io~downward-api/{vol.name}")
    assert "squat.ai/fuse" in app.resources.extended
    assert [(d.container_path, d.permissions) for d in cfg.devices] == [("/dev/fuse", "rwm")]
    assert not any(m.container_path == "/dev/fuse" for m in cfg.mounts)


def test_sidecar_deployment():
    plan = translate(K8S / "sidecar", images=IMAGES, node=NODE, programs={"app": ["top"]})
    assert [(c.name, c.role) for c in plan.containers] == [("guestfs", "sidecar"),
                                                           ("app", "main")]
    assert plan.sandbox.linux.security_context.namespace_options.pid == pb().POD
    side, app = plan.containers
    assert side.probes["startup"].command == ("cat", "/run/guestfs/proc/meminfo")
    assert side.probes["startup"].failure_threshold == 30
    assert side.probes["liveness"].period == 5
    assert list(side.config.command) == ["sh", "-c"]       # not the substituted one
    assert list(app.config.command) == ["top"] and list(app.config.args) == []
    assert app.config.image.image == "guestfs.test/busybox:1"
    run = mount_at(side.config, "/run/guestfs")
    assert run.host_path.endswith(f"/pods/{plan.uid}/volumes/kubernetes.io~empty-dir/"
                                  "run-guestfs")
    assert run.propagation == pb().PROPAGATION_PRIVATE
    # The sidecar declares no limits: Burstable; the app's limits are the pod's, as the
    # kubelet counts only regular containers for "declared".
    assert plan.qos == "Burstable"
    assert (plan.pod_cpu_limit, plan.pod_memory_limit) == (1000, 512 * MiB)
    # Burstable without a memory request: 1000 - 0 = 1000, which the kubelet makes 999.
    assert side.config.linux.resources.oom_score_adj == 999


def test_daemonset_needs_a_workload_name():
    with pytest.raises(ValueError, match="3 workloads"):
        translate(K8S / "daemonset", images=IMAGES, node=NODE)
    names = [p.workload for p in translate_all(K8S / "daemonset", images=IMAGES, node=NODE)]
    assert names == ["guestfs", "guestfs-seccomp-guard", "guestfs-fuse-holder"]


def test_daemonset_guestfs():
    plan = translate(K8S / "daemonset", images=IMAGES, node=NODE, workload="guestfs")
    assert plan.namespace == "kube-system" and plan.name.startswith("guestfs-")
    sc = plan.sandbox.linux.security_context
    assert sc.privileged and sc.namespace_options.pid == pb().NODE
    roles = [(c.name, c.role) for c in plan.containers]
    assert roles == [("install-seccomp-profile", "init"), ("guestfs", "main"),
                     ("guestfs-containers", "main"), ("seccomp-agent", "main")]
    install, gfs, _, agent = plan.containers
    profile = mount_at(install.config, "/profile")
    assert profile.readonly
    vol = next(v for v in plan.volumes if v.name == "seccomp-profile")
    (path, content, mode), = vol.files
    assert path == "guestfs-notify.json" and mode == 0o644
    assert b'"listenerPath": "/run/guestfs-seccomp/agent.sock"' in content
    assert mount_at(install.config, "/seccomp").host_path == SECCOMP_ROOT
    m = mount_at(gfs.config, "/var/lib/guestfs")
    assert (m.host_path, m.propagation) == ("/var/lib/guestfs", pb().PROPAGATION_BIDIRECTIONAL)
    assert mount_at(gfs.config, "/sys/fs/cgroup").readonly
    m = mount_at(agent.config, "/var/lib/guestfs")
    assert m.propagation == pb().PROPAGATION_HOST_TO_CONTAINER and m.readonly
    assert gfs.config.linux.security_context.privileged
    assert gfs.probes["liveness"].command == ("cat", "/var/lib/guestfs/by-caller/proc/meminfo")
    res = gfs.config.linux.resources
    assert res.cpu_shares == 51 and res.cpu_quota == 0     # 50m * 1024 / 1000, no limit
    assert res.memory_limit_in_bytes == 128 * MiB
    # requests.cpu without a limit: the pod is Burstable and declares no cpu limit.
    assert plan.qos == "Burstable" and plan.pod_cpu_limit == 0
    assert plan.pod_memory_limit == 3 * 128 * MiB


def test_daemonset_seccomp_guard_is_critical_and_guaranteed():
    plan = translate(K8S / "daemonset", images=IMAGES, node=NODE,
                     workload="guestfs-seccomp-guard")
    assert plan.qos == "Guaranteed"
    assert plan.sandbox.linux.cgroup_parent == f"/kubepods/pod{plan.uid}"
    assert plan.grace_period == 5
    (guard,) = plan.containers
    sc = guard.config.linux.security_context
    assert sc.run_as_user.value == 0 and sc.readonly_rootfs and sc.no_new_privs
    assert list(sc.capabilities.drop_capabilities) == ["ALL"]
    res = guard.config.linux.resources
    assert res.oom_score_adj == -997
    assert (res.cpu_quota, res.cpu_shares) == (5000, 51)
    assert guard.config.annotations["io.kubernetes.pod.terminationGracePeriod"] == "5"


def test_pod_snippet_localhost_seccomp_and_proc_binds():
    plan = translate(K8S / "daemonset" / "pod-snippet.yaml", images=IMAGES, node=NODE)
    want = f"{SECCOMP_ROOT}/guestfs-notify.json"
    for sc in (plan.sandbox.linux.security_context,
               plan.containers[0].config.linux.security_context):
        assert sc.seccomp.profile_type == pb().SecurityProfile.Localhost
        assert sc.seccomp.localhost_ref == want
    m = mount_at(plan.containers[0].config, "/proc/meminfo")
    assert (m.host_path, m.readonly) == ("/var/lib/guestfs/by-caller/proc/meminfo", True)
    assert {v.host_type for v in plan.volumes} == {"File"}


# ------------------------------------------------------------------------ kubelet arithmetic

def test_kubelet_arithmetic():
    assert [km.milli_cpu_to_shares(m) for m in (0, 1, 2, 1000, 10**6)] == [2, 2, 2, 1024,
                                                                          262144]
    assert km.milli_cpu_to_quota(5) == 1000 and km.milli_cpu_to_quota(1500) == 150000
    r = km.Resources(cpu_request=250, cpu_limit=1500, memory_request=0,
                     memory_limit=512 * MiB + 1)
    assert km.downward_resource("limits.cpu", "1", r, 4000, GiB) == "2"     # ceil(1.5)
    assert km.downward_resource("requests.cpu", "1m", r, 4000, GiB) == "250"
    assert km.downward_resource("limits.memory", "1Mi", r, 4000, GiB) == "513"
    no_limit = km.Resources()
    assert km.downward_resource("limits.memory", "1", no_limit, 4000, GiB) == str(GiB)
    assert km.downward_resource("limits.cpu", "1m", no_limit, 4000, GiB) == "4000"
    assert km.oom_score_adj("Burstable", False, 8 * GiB, 8 * GiB) == 2
    assert km.oom_score_adj("Burstable", False, 0, 8 * GiB) == 999
    assert km.oom_score_adj("BestEffort", False, 0, 8 * GiB) == 1000
    assert km.qos_class([km.Resources()]) == "BestEffort"
    full = km.Resources(100, 100, MiB, MiB)
    assert km.qos_class([full, full]) == "Guaranteed"
    assert km.qos_class([full, km.Resources()]) == "Burstable"


def test_sidecar_aware_pod_requests():
    side, init, main = (km.Resources(cpu_request=m) for m in (100, 700, 300))
    # The init container runs beside the sidecar started before it: 100 + 700 > 100 + 300.
    assert km.pod_totals([(side, True), (init, False)], [main], "cpu_request") == 800
    assert km.pod_totals([(init, False), (side, True)], [main], "cpu_request") == 700
    assert km.pod_totals([(side, True)], [main], "cpu_request") == 400


# ------------------------------------------------------------------------------- snippets

BASE = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "snip", "labels": {"a": "1", "b": 'say "hi"'}},
    "spec": {
        "containers": [{
            "name": "app", "image": "registry.example/app:1.0",
            "command": ["sh", "-c", "echo $(GREETING) $$(HOME)"],
            "env": [{"name": "GREETING", "value": "hi"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "LABEL", "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.labels['a']"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {
                        "resource": "limits.memory", "divisor": "1Mi"}}}],
            "resources": {"limits": {"memory": "100M", "squat.ai/fuse": 1}},
            "volumeMounts": [{"name": "info", "mountPath": "/info"}],
        }],
        "volumes": [{"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}],
    },
}


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_snippet_env_expansion_downward_and_fuse(tmp_path):
    plan = translate(write(tmp_path, BASE), images=IMAGES, node=NODE)
    cfg = plan.containers[0].config
    env = env_of(cfg)
    assert env["POD"] == "snip" and env["LABEL"] == "1"
    assert env["MEM"] == "96"                  # ceil(100e6 / 2**20) = ceil(95.37)
    assert list(cfg.command) == ["sh", "-c", "echo hi $(HOME)"]
    (dev,) = cfg.devices
    assert (dev.container_path, dev.host_path, dev.permissions) == ("/dev/fuse", "/dev/fuse",
                                                                    "rwm")
    assert mount_at(cfg, "/info").readonly     # downwardAPI volumes are read-only
    assert plan.qos == "Burstable"             # a memory limit only
    assert plan.labels == {"a": "1", "b": 'say "hi"'}


def test_snippet_without_fuse_resource_has_no_device(tmp_path):
    doc = copy.deepcopy(BASE)
    del doc["spec"]["containers"][0]["resources"]["limits"]["squat.ai/fuse"]
    plan = translate(write(tmp_path, doc), images=IMAGES, node=NODE)
    assert list(plan.containers[0].config.devices) == []
    assert plan.qos == "Burstable"


def test_guestfs_run_program_substitution_in_args(tmp_path):
    doc = copy.deepcopy(BASE)
    c = doc["spec"]["containers"][0]
    c["command"], c["args"] = ["guestfs"], ["run", "--view", "self", "--", "java", "-jar"]
    plan = translate(write(tmp_path, doc), images=IMAGES, node=NODE,
                     programs={"app": ["free", "-m"]})
    cfg = plan.containers[0].config
    assert list(cfg.command) == ["guestfs"]
    assert list(cfg.args) == ["run", "--view", "self", "--", "free", "-m"]


def _c(doc: dict) -> dict:
    return doc["spec"]["containers"][0]


REFUSALS: list[tuple[str, Callable[[dict], None], str]] = [
    ("unknown container field", lambda d: _c(d).update(lifecycle={"preStop": {}}),
     "spec.containers[0].lifecycle:"),
    ("typo in a volumeMount", lambda d: _c(d)["volumeMounts"][0].update(mountpath="/x"),
     "spec.containers[0].volumeMounts[0].mountpath:"),
    ("unknown pod field", lambda d: d["spec"].update(schedulerName="x"),
     "spec.schedulerName:"),
    ("nodeSelector", lambda d: d["spec"].update(nodeSelector={"a": "b"}),
     "spec.nodeSelector:"),
    ("unmapped image", lambda d: _c(d).update(image="docker.io/nginx"),
     "spec.containers[0].image:"),
    ("CAP_ prefix", lambda d: _c(d).update(
        securityContext={"capabilities": {"add": ["CAP_SYS_ADMIN"]}}),
     "spec.containers[0].securityContext.capabilities.add[0]:"),
    ("Bidirectional unprivileged", lambda d: _c(d)["volumeMounts"][0].update(
        mountPropagation="Bidirectional"),
     "spec.containers[0].volumeMounts[0].mountPropagation:"),
    ("subPath", lambda d: _c(d)["volumeMounts"][0].update(subPath="x"),
     "spec.containers[0].volumeMounts[0].subPath:"),
    ("tmpfs emptyDir", lambda d: d["spec"]["volumes"].append(
        {"name": "m", "emptyDir": {"medium": "Memory"}}), "spec.volumes[1].emptyDir.medium:"),
    ("secret volume", lambda d: d["spec"]["volumes"].append(
        {"name": "s", "secret": {"secretName": "x"}}), "spec.volumes[1].secret:"),
    ("ephemeral-storage", lambda d: _c(d)["resources"]["limits"].update(
        {"ephemeral-storage": "1Gi"}), "spec.containers[0].resources.limits.ephemeral-storage:"),
    ("fuse request differs", lambda d: _c(d)["resources"].update(
        requests={"squat.ai/fuse": 2}), "spec.containers[0].resources.limits.squat.ai/fuse:"),
    ("secret env", lambda d: _c(d)["env"].append(
        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "x", "key": "y"}}}),
     "spec.containers[0].env[4].valueFrom.secretKeyRef:"),
    ("status field", lambda d: _c(d)["env"].append(
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
     "spec.containers[0].env[4].valueFrom.fieldRef.fieldPath:"),
    ("nodeName in a volume", lambda d: d["spec"]["volumes"][0]["downwardAPI"]["items"].append(
        {"path": "n", "fieldRef": {"fieldPath": "spec.nodeName"}}),
     "spec.volumes[0].downwardAPI.items[1].fieldRef.fieldPath:"),
    ("downward resource without container", lambda d: d["spec"]["volumes"][0]["downwardAPI"][
        "items"].append({"path": "m", "resourceFieldRef": {"resource": "limits.memory"}}),
     "spec.volumes[0].downwardAPI.items[1].resourceFieldRef.containerName:"),
    ("AppArmor Localhost", lambda d: _c(d).update(securityContext={
        "appArmorProfile": {"type": "Localhost", "localhostProfile": "x"}}),
     "spec.containers[0].securityContext.appArmorProfile.type:"),
    ("runAsNonRoot as root", lambda d: _c(d).update(securityContext={"runAsNonRoot": True}),
     "spec.containers[0].securityContext.runAsNonRoot:"),
    ("httpGet probe", lambda d: _c(d).update(livenessProbe={"httpGet": {"port": 80}}),
     "spec.containers[0].livenessProbe.exec:"),
    ("unknown priority class", lambda d: d["spec"].update(priorityClassName="high"),
     "spec.priorityClassName:"),
    ("missing ConfigMap", lambda d: d["spec"]["volumes"].append(
        {"name": "c", "configMap": {"name": "absent"}}), "spec.volumes[1].configMap.name:"),
    ("seccomp path escape", lambda d: d["spec"].update(securityContext={
        "seccompProfile": {"type": "Localhost", "localhostProfile": "../x.json"}}),
     "spec.securityContext.seccompProfile.localhostProfile:"),
    ("fsGroup", lambda d: d["spec"].update(securityContext={"fsGroup": 1000}),
     "spec.securityContext.fsGroup:"),
    ("hostPath type", lambda d: d["spec"]["volumes"].append(
        {"name": "h", "hostPath": {"path": "/x", "type": "Dir"}}),
     "spec.volumes[1].hostPath.type:"),
    ("procMount", lambda d: _c(d).update(securityContext={"procMount": "Unmasked"}),
     "spec.containers[0].securityContext.procMount:"),
    ("unknown metadata field", lambda d: d["metadata"].update(finalizers=["x"]),
     "metadata.finalizers:"),
]


@pytest.mark.parametrize("mutate,where", [(m, w) for _, m, w in REFUSALS],
                         ids=[name for name, _, _ in REFUSALS])
def test_refusal_names_the_field(tmp_path, mutate, where):
    doc = copy.deepcopy(BASE)
    mutate(doc)
    with pytest.raises(Untranslatable) as err:
        translate(write(tmp_path, doc), images=IMAGES, node=NODE)
    assert f"pod.yaml[0].{where}" in str(err.value)


def test_deployment_replicas_refused(tmp_path):
    doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"replicas": 3, "selector": {}, "template": {
               "metadata": {"labels": {}}, "spec": copy.deepcopy(BASE["spec"])}}}
    with pytest.raises(Untranslatable, match=r"spec\.replicas:"):
        translate(write(tmp_path, doc), images=IMAGES, node=NODE)
    doc["spec"]["replicas"] = 1
    plan = translate(write(tmp_path, doc), images=IMAGES, node=NODE)
    assert plan.name.startswith("d-") and plan.workload == "d"


def test_program_for_an_unknown_container_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"programs= names \['ap'\]"):
        translate(write(tmp_path, BASE), images=IMAGES, node=NODE, programs={"ap": ["x"]})


def test_configmap_of_another_namespace_is_not_found(tmp_path):
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "c", "namespace": "other"}, "data": {"k": "v"}}
    doc = copy.deepcopy(BASE)
    doc["spec"]["volumes"].append({"name": "c", "configMap": {"name": "c"}})
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump_all([cm, doc]))
    with pytest.raises(Untranslatable, match=r"pod\.yaml\[1\]\.spec\.volumes\[1\]\.configMap"
                       r"\.name: no ConfigMap 'c' in namespace default"):
        translate(path, images=IMAGES, node=NODE)
    cm["metadata"]["namespace"] = "default"
    path.write_text(yaml.safe_dump_all([cm, doc]))
    plan = translate(path, images=IMAGES, node=NODE)
    assert plan.volumes[1].files == (("k", b"v", 0o644),)
