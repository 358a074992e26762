"""The shipped manifests, turned into the CRI requests a kubelet would send for them.

translate(path) reads a kustomization directory (its `resources`) or one YAML file:
Deployment, DaemonSet and Pod documents are workloads, ConfigMap documents feed configMap
volumes and env. For the chosen workload it returns a PodPlan: the PodSandboxConfig, one
ContainerConfig per container in the kubelet's start order (initContainers first, native
sidecars among them), and the volumes the kubelet stand-in (kubelet.py) realizes on the node.

What the harness substitutes, and nothing else:
- images: each image name of the manifest maps to a local image (images.py); there is no
  registry, and a name without a mapping is refused;
- programs: the app's own program, per container: for `guestfs run [opts] -- PROGRAM...`
  PROGRAM... is replaced, for any other container its command and args;
- the network: every pod runs in the node's network namespace (NamespaceOption.network =
  NODE) with an empty hostname, as the kubelet sends for hostNetwork pods, because the node
  has no CNI plugin (a pod network sandbox never becomes ready without one).

Kubelet behaviour reproduced: API defaulting (requests default to limits), QoS class and the
pod's cgroup parent, cpu shares/quota and oom_score_adj, downward-API env and files, hostPath
type checks, emptyDir/configMap/downwardAPI directories under /var/lib/kubelet/pods, the
managed /etc/hosts (a copy of the node's for host-network pods) and the termination-log
file, seccomp Localhost profiles under /var/lib/kubelet/seccomp, kubelet's masked and
read-only /proc paths, and a FUSE device plugin's allocation (squat.ai/fuse,
smarter-devices/fuse) as the CRI Device /dev/fuse rwm. Exec probes are carried in the plan:
the stand-in waits for a native sidecar's startupProbe before starting the next container,
and Pod.probe() runs any probe once; it runs no periodic liveness restarts.
Not reproduced, as there is no API server: service-account token volumes and service env
vars; hugepage limits (kubelet sends 0 for every page size) are left out of the subset.
Every other field is refused with Untranslatable naming its path.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.cri import images as local_images
from tests.support.cri import kubemath as km
from tests.support.cri import stubs
from tests.support.cri.fields import Fields, Reader, Untranslatable

__all__ = ["PodPlan", "ContainerPlan", "VolumePlan", "DownwardItem", "Probe", "Node",
           "Untranslatable", "translate", "translate_all", "field_value", "linux_resources",
           "FUSE_RESOURCES"]

KUBELET_ROOT = "/var/lib/kubelet"
SECCOMP_ROOT = f"{KUBELET_ROOT}/seccomp"
LOG_ROOT = "/var/log/pods"
# Device plugins that advertise /dev/fuse: squat/generic-device-plugin and
# smarter-device-manager. Their allocation is this one CRI Device.
FUSE_RESOURCES = ("squat.ai/fuse", "smarter-devices/fuse")
CRITICAL_PRIORITIES = {"system-node-critical": 2000001000,
                       "system-cluster-critical": 2000000000}
# pkg/securitycontext/util.go: defaultMaskedPaths / defaultReadonlyPaths (ProcMount Default).
MASKED_PATHS = ("/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys",
                "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/sys/devices/virtual/powercap")
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
PROPAGATION = {None: "PROPAGATION_PRIVATE", "None": "PROPAGATION_PRIVATE",
               "HostToContainer": "PROPAGATION_HOST_TO_CONTAINER",
               "Bidirectional": "PROPAGATION_BIDIRECTIONAL"}
HOSTPATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                  "CharDevice", "BlockDevice")
USERNS_LENGTH = 65536


@dataclass(frozen=True)
class DownwardItem:
    """One file of a downwardAPI volume: a pod field or a container's resource."""

    path: str
    mode: int
    field_path: str = ""
    resource: str = ""
    container: str = ""
    divisor: str = "1"


@dataclass(frozen=True)
class VolumePlan:
    """A pod volume as realized on the node: node_path is the hostPath path or the volume's
    directory under /var/lib/kubelet/pods/<uid>/volumes."""

    name: str
    kind: str                   # hostPath | emptyDir | downwardAPI | configMap
    node_path: str
    host_type: str = ""
    files: tuple[tuple[str, bytes, int], ...] = ()      # configMap: path, content, mode
    items: tuple[DownwardItem, ...] = ()                # downwardAPI


@dataclass(frozen=True)
class Probe:
    """An exec probe (startup, liveness or readiness) of a container."""

    command: tuple[str, ...]
    period: int = 10
    failure_threshold: int = 3
    initial_delay: int = 0
    timeout: int = 1


@dataclass(frozen=True)
class ContainerPlan:
    """One container: its role in the kubelet's start order and its CRI ContainerConfig.

    role is "init" (runs to completion before the next starts), "sidecar" (an init container
    with restartPolicy: Always: started in order, kept running) or "main". The config's
    mounts do not yet hold the image's content binds (kubelet.py adds them).
    """

    name: str
    role: str
    config: Any                 # runtime.v1.ContainerConfig
    resources: km.Resources
    probes: dict[str, Probe] = field(default_factory=dict)
    termination_log: str = ""   # the node file behind terminationMessagePath


@dataclass(frozen=True)
class PodPlan:
    """Everything the kubelet sends and prepares for one pod.

    sandbox.linux.cgroup_parent is relative to the kubelet's --cgroup-root (the node
    prefixes its own). etc_hosts is the managed /etc/hosts file's content.
    """

    name: str
    namespace: str
    uid: str
    workload: str               # the Deployment/DaemonSet/Pod's metadata.name
    qos: str
    sandbox: Any                # runtime.v1.PodSandboxConfig
    containers: tuple[ContainerPlan, ...]
    volumes: tuple[VolumePlan, ...]
    pod_cpu_request: int        # millicores, pod level (kubelet's PodRequests)
    pod_cpu_limit: int          # 0: not every container declares one
    pod_memory_limit: int       # 0: not every container declares one
    labels: dict[str, str]      # the pod's own (what metadata.labels shows)
    annotations: dict[str, str]
    etc_hosts: str
    node: Node
    critical: bool = False      # a system-*-critical priority class
    grace_period: int = 30

    def container(self, name: str) -> ContainerPlan:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(f"pod {self.name} has no container {name!r}")

    def volume_dir(self) -> str:
        return f"{KUBELET_ROOT}/pods/{self.uid}"


@dataclass(frozen=True)
class Node:
    """What the kubelet knows of its node and uses in the translation."""

    name: str
    cpu_milli: int
    memory: int
    swap_controller: bool

    @staticmethod
    def this_machine() -> Node:
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemTotal:"))
        return Node(socket.gethostname(), (os.cpu_count() or 1) * 1000, total,
                    os.path.exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"))


# ---------------------------------------------------------------------------------- input

def load_documents(path: Path) -> list[tuple[str, dict]]:
    """(where, document) for every YAML document of a kustomization dir or a YAML file."""
    path = Path(path)
    if path.is_dir():
        kfile = path / "kustomization.yaml"
        reader = Reader()
        k = reader.root(yaml.safe_load(kfile.read_text()), str(kfile))
        k.accept("apiVersion", "kind")
        resources = k.get("resources") or []
        reader.check_all()
        docs: list[tuple[str, dict]] = []
        for res in resources:
            docs += load_documents(path / res)
        return docs
    return [(f"{path}[{i}]", d) for i, d in enumerate(yaml.safe_load_all(path.read_text()))
            if d is not None]


def translate_all(path: Path, images: dict[str, str] | None = None,
                  programs: dict[str, list[str]] | None = None,
                  node: Node | None = None, workload: str | None = None) -> list[PodPlan]:
    """A PodPlan for every workload (Deployment, DaemonSet, Pod) of path, or for those
    whose metadata.name is `workload`."""
    docs = load_documents(path)
    configmaps = {}
    for where, d in docs:
        if d.get("kind") == "ConfigMap":
            _check_configmap(where, d)
            meta = d.get("metadata") or {}
            configmaps[(meta.get("namespace") or "default", meta.get("name"))] = (where, d)
    plans = []
    for index, (where, doc) in enumerate(docs):
        if doc.get("kind") == "ConfigMap":
            continue
        if workload is not None and (doc.get("metadata") or {}).get("name") != workload:
            continue
        plans.append(_translate_workload(where, doc, configmaps, images or {},
                                         programs or {}, node or Node.this_machine(),
                                         index + 1))
    return plans


def translate(path: Path, images: dict[str, str] | None = None,
              programs: dict[str, list[str]] | None = None, workload: str | None = None,
              node: Node | None = None) -> PodPlan:
    """The PodPlan of the one workload of path (or of the one named `workload`).

    images maps the manifest's image names to local image keys (images.py: "busybox",
    "debian", "guestfs", variants) or full local references; programs maps container
    names to the program that replaces the app's (see the module docstring).
    """
    plans = translate_all(path, images, programs, node, workload)
    if len(plans) != 1:
        names = [p.workload for p in plans]
        raise ValueError(f"{path}: {len(plans)} workloads {names}; name one with workload=")
    return plans[0]


def _check_configmap(where: str, doc: dict) -> None:
    reader = Reader()
    cm = reader.root(doc, where)
    cm.accept("apiVersion", "kind", "data")
    meta = cm.sub("metadata")
    if meta is not None:
        meta.accept("name", "namespace", "labels", "annotations")
    cm.refuse("binaryData", "binaryData is not supported")
    reader.check_all()


# -------------------------------------------------------------------------------- workload

def _translate_workload(where: str, doc: dict, configmaps: dict, images: dict[str, str],
                        programs: dict[str, list[str]], node: Node, index: int) -> PodPlan:
    reader = Reader()
    root = reader.root(doc, where)
    kind = root.get("kind")
    root.accept("apiVersion")
    meta = root.sub("metadata") or reader.root({}, root.at("metadata"))
    meta.accept("labels", "annotations")
    workload = meta.get("name")
    namespace = meta.get("namespace") or "default"
    if kind == "Pod":
        template, pod_name = root, workload
    elif kind in ("Deployment", "DaemonSet"):
        spec = root.sub("spec")
        if spec is None:
            raise root.fail("spec", "missing")
        spec.accept("selector", "revisionHistoryLimit", "minReadySeconds")
        # One node: a rollout strategy has nothing to order.
        spec.accept("strategy" if kind == "Deployment" else "updateStrategy")
        if kind == "Deployment" and spec.get("replicas", 1) != 1:
            raise spec.fail("replicas", "the harness runs one pod per workload")
        template = spec.sub("template")
        if template is None:
            raise spec.fail("template", "missing")
        suffix = secrets.token_hex(3)[:5]
        pod_name = (f"{workload}-{secrets.token_hex(5)[:10]}-{suffix}"
                    if kind == "Deployment" else f"{workload}-{suffix}")
    else:
        raise root.fail("kind", f"{kind!r} is not a workload the translator knows")
    tmeta = template.sub("metadata") if kind != "Pod" else meta
    labels = dict((tmeta.get("labels") if tmeta else None) or {})
    annotations = dict((tmeta.get("annotations") if tmeta else None) or {})
    if tmeta is not None and tmeta is not meta:
        tmeta.accept("name")
    pod = template.sub("spec")
    if pod is None:
        raise template.fail("spec", "missing")
    ctx = _PodContext(reader, pod, pod_name, namespace, str(uuid.uuid4()), labels,
                      annotations, configmaps, images, programs, node, index)
    plan = ctx.build(workload)
    reader.check_all()
    return plan


class _PodContext:
    """One pod spec being translated."""

    def __init__(self, reader: Reader, pod: Fields, name: str, namespace: str, uid: str,
                 labels: dict, annotations: dict, configmaps: dict, images: dict,
                 programs: dict, node: Node, index: int) -> None:
        self.reader, self.pod, self.name, self.namespace, self.uid = (
            reader, pod, name, namespace, uid)
        self.labels, self.annotations = labels, annotations
        self.configmaps, self.images, self.programs, self.node = (
            configmaps, images, programs, node)
        self.index = index
        self.pb = stubs.load()[0]

    # -- pod level
    def build(self, workload: str) -> PodPlan:
        grace = self._pod_fields()
        inits, mains = self._container_specs(workload)
        specs = inits + mains
        self.volumes = {v.name: v for v in self._volumes()}
        self.resources = {c.get("name"): self._resources(c) for c, _ in specs}
        self.qos = km.qos_class(list(self.resources.values()))
        cpu_req, cpu_lim, mem_lim = self._pod_resources(inits, mains)
        sandbox = self._sandbox(specs, cpu_req, cpu_lim, mem_lim)
        self._pod_sc_rest()
        containers = tuple(self._container(c, role, self.resources[c.get("name")], grace)
                           for c, role in specs)
        return PodPlan(self.name, self.namespace, self.uid, workload, self.qos, sandbox,
                       containers, tuple(self.volumes.values()), cpu_req, cpu_lim, mem_lim,
                       self.labels, self.annotations, _etc_hosts(), self.node, self.critical,
                       grace)

    def _pod_fields(self) -> int:
        """The pod-level fields outside containers and volumes; the grace period."""
        pod = self.pod
        pod.accept("tolerations", "imagePullSecrets")   # one untainted node, local images
        pod.accept("hostNetwork")                       # always the node's (module doc)
        pod.get("dnsPolicy")                            # host network: the node's resolv.conf
        pod.get("automountServiceAccountToken")         # no API server: no token either way
        pod.refuse("serviceAccountName", "no API server issues service-account tokens")
        pod.refuse("nodeSelector", "scheduling constraints are not reproduced")
        pod.refuse("affinity", "scheduling constraints are not reproduced")
        if pod.get("restartPolicy", "Always") not in ("Always", "OnFailure", "Never"):
            raise pod.fail("restartPolicy", "unknown value")
        priority = pod.get("priorityClassName")
        if priority is not None and priority not in CRITICAL_PRIORITIES:
            raise pod.fail("priorityClassName", f"{priority!r}: only the built-in "
                           f"{sorted(CRITICAL_PRIORITIES)} exist without an API server")
        self.critical = priority in CRITICAL_PRIORITIES
        self.pod_sc = pod.sub("securityContext") or self.reader.root({}, pod.at("sc"))
        self.namespaces = self._namespace_options()
        return int(pod.get("terminationGracePeriodSeconds", 30))

    def _container_specs(self, workload: str) -> tuple[list[tuple[Fields, str]],
                                                      list[tuple[Fields, str]]]:
        """(init containers with role init or sidecar, main containers), in spec order."""
        pod = self.pod
        inits = [(c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
                 for c in pod.subs("initContainers")]
        for c, _ in inits:
            if c.get("restartPolicy") not in (None, "Always"):
                raise c.fail("restartPolicy", "an init container's is Always or unset")
        mains = [(c, "main") for c in pod.subs("containers")]
        if not mains:
            raise pod.fail("containers", "a pod needs at least one container")
        for c, _ in mains:
            c.refuse("restartPolicy", "only init containers have one")
        self.container_names = [c.get("name") for c, _ in inits + mains]
        if len(set(self.container_names)) != len(self.container_names):
            raise pod.fail("containers", "container names must be unique")
        unknown = sorted(set(self.programs) - set(self.container_names))
        if unknown:
            raise ValueError(f"programs= names {unknown}, not containers of "
                             f"{workload} ({self.container_names})")
        return inits, mains

    def _pod_resources(self, inits: list[tuple[Fields, str]],
                       mains: list[tuple[Fields, str]]) -> tuple[int, int, int]:
        """Pod cpu request, cpu limit and memory limit (0: not declared by every regular
        container, as ResourceConfigForPod counts them)."""
        init_res = [(self.resources[c.get("name")], role == "sidecar") for c, role in inits]
        main_res = [self.resources[c.get("name")] for c, _ in mains]
        cpu_lim = km.pod_totals(init_res, main_res, "cpu_limit")
        mem_lim = km.pod_totals(init_res, main_res, "memory_limit")
        return (km.pod_totals(init_res, main_res, "cpu_request"),
                cpu_lim if all(r.cpu_limit for r in main_res) else 0,
                mem_lim if all(r.memory_limit for r in main_res) else 0)

    def _sandbox(self, specs: list[tuple[Fields, str]], cpu_req: int, cpu_lim: int,
                 mem_lim: int) -> Any:
        pb = self.pb
        labels = {**self.labels, "io.kubernetes.pod.name": self.name,
                  "io.kubernetes.pod.namespace": self.namespace,
                  "io.kubernetes.pod.uid": self.uid}
        sandbox = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=self.name, uid=self.uid,
                                           namespace=self.namespace, attempt=0),
            hostname="",                # host network: kubelet leaves it empty
            log_directory=f"{LOG_ROOT}/{self.namespace}_{self.name}_{self.uid}",
            labels=labels, annotations=self.annotations)
        lin = sandbox.linux
        lin.cgroup_parent = {"Guaranteed": "/kubepods", "Burstable": "/kubepods/burstable",
                             "BestEffort": "/kubepods/besteffort"}[self.qos] + f"/pod{self.uid}"
        sc = lin.security_context
        sc.namespace_options.CopyFrom(self.namespaces)
        self._run_as_values(self.pod_sc.data, sc, self.pod_sc.path, verify=False)
        sc.supplemental_groups.extend(int(g) for g in self.pod_sc.get("supplementalGroups")
                                      or [])
        sc.privileged = any(_privileged(c) for c, _ in specs)
        sc.seccomp.CopyFrom(self._seccomp(None))
        lin.resources.CopyFrom(self._linux_resources(
            km.Resources(cpu_req, cpu_lim, 0, mem_lim), self.qos, sandbox_level=True))
        return sandbox

    def _pod_sc_rest(self) -> None:
        psc = self.pod_sc
        psc.refuse("fsGroup", "volume ownership changes are not reproduced")
        psc.refuse("sysctls", "pod sysctls are not reproduced")
        psc.refuse("seLinuxOptions", "SELinux is off on this node")
        psc.accept("runAsNonRoot", "runAsUser", "runAsGroup", "supplementalGroups")
        app = psc.sub("appArmorProfile")
        if app is not None:
            self._apparmor_check(app)

    def _namespace_options(self) -> Any:
        pod, pb = self.pod, self.pb
        pid = ("NODE" if pod.get("hostPID") else
               "POD" if pod.get("shareProcessNamespace") else "CONTAINER")
        if pod.get("hostPID") and pod.get("shareProcessNamespace"):
            raise pod.fail("shareProcessNamespace", "conflicts with hostPID")
        ns = pb.NamespaceOption(network=pb.NODE, pid=getattr(pb, pid),
                                ipc=pb.NODE if pod.get("hostIPC") else pb.POD)
        host_users = pod.get("hostUsers")
        if host_users is False:
            # kubelet's userns manager hands each pod a 65536-id range at a multiple of
            # 65536 above the first; containerd 1.6 does not read any of it.
            base = USERNS_LENGTH * (self.index + 1)
            ns.userns_options.mode = pb.POD
            for ids in (ns.userns_options.uids, ns.userns_options.gids):
                ids.add(host_id=base, container_id=0, length=USERNS_LENGTH)
        return ns

    # -- volumes
    def _volumes(self) -> list[VolumePlan]:
        out = []
        vdir = f"{KUBELET_ROOT}/pods/{self.uid}/volumes"
        for v in self.pod.subs("volumes"):
            name = v.get("name")
            kinds = [k for k in v.data if k != "name"]
            if len(kinds) != 1:
                raise v.fail("name", f"volume {name!r} needs exactly one source, has {kinds}")
            kind = kinds[0]
            src = v.sub(kind) or self.reader.root({}, v.at(kind))
            if kind == "hostPath":
                htype = src.get("type") or ""
                if htype not in HOSTPATH_TYPES:
                    raise src.fail("type", f"unknown hostPath type {htype!r}")
                path = src.get("path")
                if not isinstance(path, str) or not path.startswith("/"):
                    raise src.fail("path", "must be absolute")
                out.append(VolumePlan(name, kind, os.path.normpath(path), htype))
            elif kind == "emptyDir":
                src.refuse("medium", "a tmpfs emptyDir is not reproduced")
                src.refuse("sizeLimit", "emptyDir size limits are not enforced here")
                out.append(VolumePlan(name, kind, f"{vdir}/kubernetes.io~empty-dir/{name}"))
            elif kind == "configMap":
                out.append(self._configmap_volume(name, src,
                                                  f"{vdir}/kubernetes.io~configmap/{name}"))
            elif kind == "downwardAPI":
                out.append(self._downward_volume(name, src,
                                                 f"{vdir}/kubernetes.io~downward-api/{name}"))
            else:
                raise v.fail(kind, f"volume source {kind!r} is not supported")
        return out

    def _configmap_volume(self, name: str, src: Fields, node_path: str) -> VolumePlan:
        cm_name = src.get("name")
        mode = int(src.get("defaultMode", 0o644))
        if (self.namespace, cm_name) not in self.configmaps:
            if src.get("optional"):
                return VolumePlan(name, "configMap", node_path)
            raise src.fail("name", f"no ConfigMap {cm_name!r} in namespace "
                           f"{self.namespace} of the same kustomization")
        data = self.configmaps[(self.namespace, cm_name)][1].get("data") or {}
        files = []
        items = src.subs("items")
        for item in items or [None]:
            if item is None:
                files += [(k, str(v).encode(), mode) for k, v in sorted(data.items())]
                continue
            key = item.get("key")
            if key not in data:
                raise item.fail("key", f"ConfigMap {cm_name!r} has no key {key!r}")
            files.append((_rel(item, "path"), str(data[key]).encode(),
                          int(item.get("mode", mode))))
        return VolumePlan(name, "configMap", node_path, files=tuple(files))

    def _downward_volume(self, name: str, src: Fields, node_path: str) -> VolumePlan:
        mode = int(src.get("defaultMode", 0o644))
        items = []
        for item in src.subs("items"):
            path, imode = _rel(item, "path"), int(item.get("mode", mode))
            fref, rref = item.sub("fieldRef"), item.sub("resourceFieldRef")
            if (fref is None) == (rref is None):
                raise item.fail("path", "needs exactly one of fieldRef, resourceFieldRef")
            if fref is not None:
                fref.accept("apiVersion")
                fp = fref.get("fieldPath")
                self._field(fp, fref.at("fieldPath"), volume=True)
                items.append(DownwardItem(path, imode, field_path=fp))
            else:
                resource, container, divisor = self._resource_ref(rref, None)
                items.append(DownwardItem(path, imode, resource=resource,
                                          container=container, divisor=divisor))
        return VolumePlan(name, "downwardAPI", node_path, items=tuple(items))

    def _resource_ref(self, ref: Fields, own: str | None) -> tuple[str, str, str]:
        resource = ref.get("resource")
        container = ref.get("containerName") or own
        if not container:
            raise ref.fail("containerName", "required in a downwardAPI volume")
        if container not in self.container_names:
            raise ref.fail("containerName", f"no container {container!r} in the pod")
        if resource not in ("limits.cpu", "requests.cpu", "limits.memory",
                            "requests.memory"):
            raise ref.fail("resource", f"{resource!r} is not supported")
        divisor = str(ref.get("divisor", "1"))
        try:
            if km.milli(divisor) <= 0:
                raise ValueError
        except ValueError as e:
            raise ref.fail("divisor", f"bad divisor {divisor!r}") from e
        return resource, container, divisor

    # -- containers
    def _resources(self, c: Fields) -> km.Resources:
        res = c.sub("resources") or self.reader.root({}, c.at("resources"))
        res.refuse("claims", "dynamic resource claims are not reproduced")
        limits = res.sub("limits") or self.reader.root({}, res.at("limits"))
        requests = res.sub("requests") or self.reader.root({}, res.at("requests"))
        for section in (limits, requests):
            for key in section.data:
                if key not in ("cpu", "memory", *FUSE_RESOURCES):
                    raise section.fail(key, "only cpu, memory and "
                                       f"{', '.join(FUSE_RESOURCES)} are supported")
        try:
            cpu_l = km.milli(str(limits.get("cpu"))) if limits.has("cpu") else 0
            mem_l = km.value(str(limits.get("memory"))) if limits.has("memory") else 0
            cpu_r = km.milli(str(requests.get("cpu"))) if requests.has("cpu") else cpu_l
            mem_r = km.value(str(requests.get("memory"))) if requests.has("memory") else mem_l
        except ValueError as e:
            raise res.fail("limits", str(e)) from e
        extended = {}
        for key in FUSE_RESOURCES:
            if limits.has(key) or requests.has(key):
                lim, req = limits.get(key), requests.get(key, limits.get(key))
                if lim is None or str(lim) != str(req):
                    raise limits.fail(key, "an extended resource needs equal limit and request")
                extended[key] = km.value(str(lim))
        return km.Resources(cpu_r, cpu_l, mem_r, mem_l, extended)

    def _linux_resources(self, r: km.Resources, qos: str, sandbox_level: bool = False) -> Any:
        return linux_resources(r, qos, self.critical, self.node, sandbox_level)

    def _container(self, c: Fields, role: str, r: km.Resources, grace: int) -> ContainerPlan:
        pb = self.pb
        name = c.get("name")
        c.accept("imagePullPolicy")         # images are local: no pull either way
        c.accept("ports")                   # host network: ports are informational
        for key in ("lifecycle", "envFrom", "volumeDevices", "stdin", "stdinOnce", "tty",
                    "resizePolicy"):
            c.refuse(key, "not supported by the CRI translation")
        image = self._image(c)
        command, args = self._program(c, name)
        env = self._env(c, name, r)
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=[_expand(x, env) for x in command], args=[_expand(x, env) for x in args],
            working_dir=c.get("workingDir") or "",
            envs=[pb.KeyValue(key=k, value=v) for k, v in env],
            log_path=f"{name}/0.log",
            labels={"io.kubernetes.container.name": name, "io.kubernetes.pod.name": self.name,
                    "io.kubernetes.pod.namespace": self.namespace,
                    "io.kubernetes.pod.uid": self.uid})
        tpath = c.get("terminationMessagePath") or "/dev/termination-log"
        cfg.annotations.update({
            "io.kubernetes.container.restartCount": "0",
            "io.kubernetes.container.terminationMessagePath": tpath,
            "io.kubernetes.container.terminationMessagePolicy":
                c.get("terminationMessagePolicy") or "File",
            "io.kubernetes.pod.terminationGracePeriod": str(grace)})
        privileged = _privileged(c)
        self._mounts(c, cfg, privileged)
        tlog = self._kubelet_mounts(cfg, name, tpath)
        self._devices(c, cfg, r)
        cfg.linux.resources.CopyFrom(self._linux_resources(r, self.qos))
        self._security_context(c, cfg.linux.security_context, privileged)
        probes = {kind.removesuffix("Probe"): _probe(p)
                  for kind in ("startupProbe", "livenessProbe", "readinessProbe")
                  if (p := c.sub(kind)) is not None}
        return ContainerPlan(name, role, cfg, r, probes, tlog)

    def _kubelet_mounts(self, cfg: Any, name: str, termination_path: str) -> str:
        """The managed /etc/hosts (unless a volume is mounted there) and the
        termination-log file kubelet adds to every container; returns the latter's node
        path."""
        tlog = f"{KUBELET_ROOT}/pods/{self.uid}/containers/{name}/{secrets.token_hex(4)}"
        if not any(m.container_path == "/etc/hosts" for m in cfg.mounts):
            cfg.mounts.add(container_path="/etc/hosts",
                           host_path=f"{KUBELET_ROOT}/pods/{self.uid}/etc-hosts")
        cfg.mounts.add(container_path=termination_path, host_path=tlog)
        return tlog

    def _devices(self, c: Fields, cfg: Any, r: km.Resources) -> None:
        """A FUSE device plugin's allocation: the CRI Device it returns to the kubelet."""
        for key, count in r.extended.items():
            if count != 1:
                raise c.fail("resources", f"{key}: the FUSE device plugin allocates one")
            if not any(d.container_path == "/dev/fuse" for d in cfg.devices):
                cfg.devices.add(container_path="/dev/fuse", host_path="/dev/fuse",
                                permissions="rwm")

    def _image(self, c: Fields) -> str:
        image = c.get("image")
        chosen = self.images.get(image)
        if chosen is None:
            raise c.fail("image", f"{image!r}: no registry here; map it to a local image "
                         f"with images={{{image!r}: 'busybox'|'debian'|'guestfs'|...}}")
        return chosen if "/" in chosen else local_images.ref_of(chosen)

    def _program(self, c: Fields, name: str) -> tuple[list[str], list[str]]:
        command = [str(x) for x in c.get("command") or []]
        args = [str(x) for x in c.get("args") or []]
        program = self.programs.get(name)
        if program is None:
            return command, args
        argv = command + args
        if len(argv) > 2 and os.path.basename(argv[0]) == "guestfs" and argv[1] == "run" \
                and "--" in argv:
            cut = argv.index("--") + 1
            if cut <= len(command):
                return command[:cut] + list(program), []
            return command, args[:cut - len(command)] + list(program)
        return list(program), []

    def _env(self, c: Fields, name: str, r: km.Resources) -> list[tuple[str, str]]:
        env: list[tuple[str, str]] = []
        for e in c.subs("env"):
            key = e.get("name")
            src = e.sub("valueFrom")
            if src is None:
                env.append((key, _expand(str(e.get("value", "")), env)))
                continue
            fref, rref = src.sub("fieldRef"), src.sub("resourceFieldRef")
            cref = src.sub("configMapKeyRef")
            src.refuse("secretKeyRef", "no Secrets without an API server")
            if fref is not None:
                fref.accept("apiVersion")
                env.append((key, self._field(fref.get("fieldPath"), fref.at("fieldPath"),
                                             volume=False)))
            elif rref is not None:
                resource, container, divisor = self._resource_ref(rref, name)
                target = self.resources[container]
                env.append((key, km.downward_resource(resource, divisor, target,
                                                      self.node.cpu_milli, self.node.memory)))
            elif cref is not None:
                env.append((key, self._configmap_key(cref)))
            else:
                raise e.fail("valueFrom", "needs a supported source")
        return env

    def _configmap_key(self, ref: Fields) -> str:
        cm, key = ref.get("name"), ref.get("key")
        data = (self.configmaps.get((self.namespace, cm), (None, {}))[1].get("data")) or {}
        if key not in data:
            if ref.get("optional"):
                return ""
            raise ref.fail("key", f"no key {key!r} in a ConfigMap {cm!r} of the kustomization")
        return str(data[key])

    def _mounts(self, c: Fields, cfg: Any, privileged: bool) -> None:
        pb = self.pb
        for m in c.subs("volumeMounts"):
            vol = self.volumes.get(m.get("name"))
            if vol is None:
                raise m.fail("name", f"no volume {m.get('name')!r} in the pod")
            m.refuse("subPath", "subPath mounts are not reproduced")
            m.refuse("subPathExpr", "subPath mounts are not reproduced")
            m.refuse("recursiveReadOnly", "not supported by containerd 1.6")
            prop = m.get("mountPropagation")
            if prop not in PROPAGATION:
                raise m.fail("mountPropagation", f"unknown value {prop!r}")
            if prop == "Bidirectional" and not privileged:
                raise m.fail("mountPropagation", "Bidirectional needs a privileged container")
            readonly = bool(m.get("readOnly")) or vol.kind in ("configMap", "downwardAPI")
            cfg.mounts.add(container_path=m.get("mountPath"), host_path=vol.node_path,
                           readonly=readonly,
                           propagation=getattr(pb, PROPAGATION[prop]))

    def _security_context(self, c: Fields, out: Any, privileged: bool) -> None:
        sc = c.sub("securityContext") or self.reader.root({}, c.at("securityContext"))
        sc.get("privileged")
        sc.refuse("procMount", "only the default procMount is reproduced")
        sc.refuse("seLinuxOptions", "SELinux is off on this node")
        sc.refuse("windowsOptions", "not a Linux field")
        out.privileged = privileged
        out.namespace_options.CopyFrom(self.namespaces)
        caps = sc.sub("capabilities")
        if caps is not None:
            for key, dest in (("add", out.capabilities.add_capabilities),
                              ("drop", out.capabilities.drop_capabilities)):
                for i, cap in enumerate(caps.get(key) or []):
                    if str(cap).upper().startswith("CAP_"):
                        # The kubelet passes names through and containerd prefixes CAP_ to
                        # each: CAP_SYS_ADMIN becomes CAP_CAP_SYS_ADMIN, which runc 1.1
                        # ignores, so the container silently lacks it (measured here: CapEff
                        # 0 with drop ALL + add CAP_SYS_ADMIN, 0x200000 with SYS_ADMIN).
                        raise caps.fail(f"{key}[{i}]", f"{cap!r}: containerd would prefix "
                                        "CAP_ again and runc drop it; write it without CAP_")
                    dest.append(str(cap))
        merged = {**self.pod_sc.data, **sc.data}
        self._run_as_values(merged, out, c.at("securityContext"), verify=True)
        out.supplemental_groups.extend(int(g) for g in self.pod_sc.get("supplementalGroups")
                                       or [])
        out.readonly_rootfs = bool(sc.get("readOnlyRootFilesystem"))
        ape = sc.get("allowPrivilegeEscalation")
        out.no_new_privs = ape is False
        if ape is False and privileged:
            raise sc.fail("allowPrivilegeEscalation", "false conflicts with privileged")
        out.masked_paths.extend(MASKED_PATHS)
        out.readonly_paths.extend(READONLY_PATHS)
        out.seccomp.CopyFrom(self._seccomp(sc))
        app = sc.sub("appArmorProfile") or self.pod_sc.sub("appArmorProfile")
        if app is not None:
            self._apparmor_check(app)
            out.apparmor.profile_type = self.pb.SecurityProfile.Unconfined
        sc.get("runAsNonRoot")
        sc.get("runAsUser")
        sc.get("runAsGroup")

    def _run_as_values(self, data: dict, out: Any, path: str, verify: bool) -> None:
        if data.get("runAsUser") is not None:
            out.run_as_user.value = int(data["runAsUser"])
        if data.get("runAsGroup") is not None:
            out.run_as_group.value = int(data["runAsGroup"])
        # verifyRunAsNonRoot: every local image's user is root.
        if verify and data.get("runAsNonRoot") and int(data.get("runAsUser") or 0) == 0:
            raise Untranslatable(f"{path}.runAsNonRoot: the kubelet refuses to start it: "
                                 "the image runs as root and runAsUser is 0 or unset")

    def _seccomp(self, sc: Fields | None) -> Any:
        pb = self.pb
        prof = (sc.sub("seccompProfile") if sc is not None else None) \
            or self.pod_sc.sub("seccompProfile")
        if prof is None:                  # SeccompDefault off: unconfined
            return pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)
        kind = prof.get("type")
        if kind == "Localhost":
            ref = prof.get("localhostProfile")
            if not ref or os.path.isabs(ref) or ".." in ref.split("/"):
                raise prof.fail("localhostProfile", "a relative path under the kubelet's "
                                "seccomp root")
            return pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost,
                                      localhost_ref=f"{SECCOMP_ROOT}/{ref}")
        if kind in ("RuntimeDefault", "Unconfined"):
            prof.refuse("localhostProfile", "only for type Localhost")
            return pb.SecurityProfile(profile_type=getattr(pb.SecurityProfile, kind))
        raise prof.fail("type", f"unknown seccomp profile type {kind!r}")

    def _field(self, field_path: Any, where: str, volume: bool) -> str:
        try:
            return field_value(str(field_path), self.name, self.namespace, self.uid,
                               self.labels, self.annotations,
                               None if volume else self.node.name)
        except KeyError:
            raise Untranslatable(f"{where}: {field_path!r} is not reproduced (no API "
                                 "server status or pod network)") from None

    def _apparmor_check(self, app: Fields) -> None:
        if app.get("type") != "Unconfined":
            raise app.fail("type", "AppArmor is disabled on this node (disable_apparmor): "
                           "only Unconfined is reproduced")


# ---------------------------------------------------------------------------------- helpers

def linux_resources(r: km.Resources, qos: str, critical: bool, node: Node,
                    sandbox_level: bool = False) -> Any:
    """calculateLinuxResources, plus oom_score_adj and the swap limit as
    generateLinuxContainerConfig sets them (the sandbox's carries neither)."""
    pb = stubs.load()[0]
    out = pb.LinuxContainerResources(
        cpu_shares=km.milli_cpu_to_shares(r.cpu_request or r.cpu_limit),
        memory_limit_in_bytes=r.memory_limit)
    if r.cpu_limit:
        out.cpu_period = km.QUOTA_PERIOD
        out.cpu_quota = km.milli_cpu_to_quota(r.cpu_limit)
    if not sandbox_level:
        out.oom_score_adj = km.oom_score_adj(qos, critical, r.memory_request, node.memory)
        # kubelet with NodeSwap off on cgroup v1: swap limit = memory limit, when the memsw
        # controller exists.
        if node.swap_controller and r.memory_limit:
            out.memory_swap_limit_in_bytes = r.memory_limit
    return out


def _privileged(c: Fields) -> bool:
    sc = c.data.get("securityContext") or {}
    return bool(sc.get("privileged"))


def _rel(item: Fields, key: str) -> str:
    path = item.get(key)
    if not isinstance(path, str) or not path or path.startswith("/") \
            or ".." in path.split("/"):
        raise item.fail(key, "must be a relative path without '..'")
    return path


def _probe(p: Fields) -> Probe:
    ex = p.sub("exec")
    if ex is None:
        raise p.fail("exec", "only exec probes are reproduced (no pod network)")
    p.accept("successThreshold", "terminationGracePeriodSeconds")
    return Probe(tuple(ex.get("command") or ()), int(p.get("periodSeconds", 10)),
                 int(p.get("failureThreshold", 3)), int(p.get("initialDelaySeconds", 0)),
                 int(p.get("timeoutSeconds", 1)))


_LABEL_RE = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(field_path: str, name: str, namespace: str, uid: str,
                labels: dict[str, str], annotations: dict[str, str],
                node_name: str | None) -> str:
    """A fieldRef's value as the kubelet's fieldpath.ExtractFieldPathAsString formats it;
    KeyError for a field not reproduced (node_name None: spec.nodeName is env-only)."""
    simple = {"metadata.name": name, "metadata.namespace": namespace, "metadata.uid": uid}
    if field_path in simple:
        return simple[field_path]
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = labels if field_path == "metadata.labels" else annotations
        return "\n".join(f"{k}={_go_quote(v)}" for k, v in sorted(values.items()))
    m = _LABEL_RE.match(field_path)
    if m:
        values = labels if m.group(1) == "labels" else annotations
        return str(values.get(m.group(2), ""))
    if node_name is not None and field_path == "spec.nodeName":
        return node_name
    raise KeyError(field_path)


def _go_quote(value: str) -> str:
    """Go's %q for the label/annotation values the manifests use (printable text)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_EXPAND_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(text: str, env: list[tuple[str, str]]) -> str:
    """Kubernetes' $(VAR) expansion: $$ escapes, an undefined $(VAR) stays as written."""
    values = dict(env)

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return values.get(m.group(1), m.group(0))

    return _EXPAND_RE.sub(sub, text)


def _etc_hosts() -> str:
    """kubelet's managed hosts file for a host-network pod: the node's, under a header."""
    with open("/etc/hosts") as f:
        return "# Kubernetes-managed hosts file (host network).\n" + f.read()
