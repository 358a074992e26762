"""The kubelet stand-in: runs a translate.PodPlan on a CriNode the way kubelet's SyncPod does.

Order: the QoS-level cgroups (kubepods, burstable, besteffort) and the pod cgroup with its
limits (pod container manager), volumes on the node (hostPath
type checks, emptyDir, configMap and downwardAPI through the atomic writer's layout), the
managed /etc/hosts and termination-log files, the pod log directory, RunPodSandbox, then
CreateContainer + StartContainer per container: a regular init container runs to completion
before the next starts, a native sidecar is started (and its startupProbe awaited) and kept
running, then the main containers start. The image's content binds (images.LocalImage) are
added to each container's mounts here, as the stand-in for the image's layers.

A Pod handle offers exec, logs, pid, cgroup paths, probe, restart, update_resources (an
in-place resize as kubelet does it) and remove; timings["up"] and ["teardown"] are seconds.
Not reproduced: restarts of exited containers and periodic liveness/readiness probing
(Pod.restart and Pod.probe do them on demand).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from dataclasses import replace
from typing import Any

from tests.support.cri import cgroups
from tests.support.cri import kubemath as km
from tests.support.cri.node import CriNode, NodeError, container_info
from tests.support.cri.translate import (
    ContainerPlan,
    Node,
    PodPlan,
    VolumePlan,
    field_value,
    linux_resources,
)

INIT_TIMEOUT = 120.0
STOP_TRIES = 4


class PodFailed(RuntimeError):
    pass


def write_qos_cgroups(node: CriNode, info: Node) -> None:
    """kubelet's QoS container manager with no reservations: kubepods gets the node's
    capacity (cpu.shares of every cpu, memory.limit_in_bytes of MemTotal), besteffort the
    minimum shares, burstable the shares of its pods' cpu requests; rewritten whenever a pod
    comes or goes."""
    hs, root = node.hierarchies, f"{node.cgroup_root}/kubepods"
    for qos in ("burstable", "besteffort"):
        cgroups.ensure(hs, f"{root}/{qos}")
    cpu, mem = cgroups.find(hs, "cpu"), cgroups.find(hs, "memory")
    burstable = sum(p._pod_totals()[0] for p in node.pods
                    if p.plan.qos == "Burstable" and not p.removed)
    if cpu is not None:
        cgroups.write(cpu, root, "cpu.shares", km.milli_cpu_to_shares(info.cpu_milli))
        cgroups.write(cpu, f"{root}/besteffort", "cpu.shares", km.MIN_SHARES)
        cgroups.write(cpu, f"{root}/burstable", "cpu.shares",
                      km.milli_cpu_to_shares(burstable))
    if mem is not None:
        cgroups.write(mem, root, "memory.limit_in_bytes", info.memory)


def run_pod(node: CriNode, plan: PodPlan, wait: bool = True) -> Pod:
    """Start every container of plan (wait=False: do not await init containers' exit or
    sidecars' startup probes)."""
    pod = Pod(node, plan)
    t = time.monotonic()
    node.pods.append(pod)
    try:
        pod._start(wait)
    except BaseException:
        with contextlib.suppress(Exception):
            pod.remove()
        raise
    pod.timings["up"] = time.monotonic() - t
    return pod


class Pod:
    """A running pod. Container names are the manifest's."""

    def __init__(self, node: CriNode, plan: PodPlan) -> None:
        self.node, self.plan, self.pb = node, plan, node.pb
        self.sandbox_id = ""
        self.ids: dict[str, str] = {}
        self.attempts: dict[str, int] = {}
        self.resources: dict[str, km.Resources] = {c.name: c.resources for c in plan.containers}
        self.timings: dict[str, float] = {}
        self.removed = False
        self.cgroup_parent = node.cgroup_root + plan.sandbox.linux.cgroup_parent
        self.sandbox_config = self.pb.PodSandboxConfig()
        self.sandbox_config.CopyFrom(plan.sandbox)
        self.sandbox_config.linux.cgroup_parent = self.cgroup_parent

    # -- start
    def _start(self, wait: bool) -> None:
        self._pod_cgroup()
        self._volumes()
        fs = self.node.fs
        fs.write_text(f"{self.plan.volume_dir()}/etc-hosts", self.plan.etc_hosts)
        for c in self.plan.containers:
            fs.write_bytes(c.termination_log, b"", 0o666)
            fs.makedirs(f"{self.plan.sandbox.log_directory}/{c.name}")
        self.sandbox_id = self.node.runtime.RunPodSandbox(self.pb.RunPodSandboxRequest(
            config=self.sandbox_config), timeout=120).pod_sandbox_id
        for c in self.plan.containers:
            self._create_and_start(c, 0)
            if not wait:
                continue
            if c.role == "init":
                self._await_exit(c.name)
            elif c.role == "sidecar" and "startup" in c.probes:
                self._await_startup(c)

    def _create_and_start(self, c: ContainerPlan, attempt: int) -> None:
        cfg = self.pb.ContainerConfig()
        cfg.CopyFrom(c.config)
        cfg.metadata.attempt = attempt
        cfg.log_path = f"{c.name}/{attempt}.log"
        cfg.annotations["io.kubernetes.container.restartCount"] = str(attempt)
        cfg.linux.resources.CopyFrom(linux_resources(self.resources[c.name], self.plan.qos,
                                                     self.plan.critical, self.plan.node))
        # The image's content first: containerd orders mounts by depth, stably, so a pod
        # volume at or under the same path is mounted over it, as over an image's dir.
        pod_mounts = list(cfg.mounts)
        taken = {m.container_path.rstrip("/") for m in pod_mounts}
        del cfg.mounts[:]
        for b in self.node.image_of(cfg.image.image).binds:
            if b.container_path not in taken:
                cfg.mounts.add(container_path=b.container_path, host_path=b.host_path,
                               readonly=True)
        cfg.mounts.extend(pod_mounts)
        cid = self.node.runtime.CreateContainer(self.pb.CreateContainerRequest(
            pod_sandbox_id=self.sandbox_id, config=cfg, sandbox_config=self.sandbox_config),
            timeout=120).container_id
        self.ids[c.name], self.attempts[c.name] = cid, attempt
        self.node.runtime.StartContainer(self.pb.StartContainerRequest(container_id=cid),
                                         timeout=120)

    def _await_exit(self, name: str) -> None:
        deadline = time.monotonic() + INIT_TIMEOUT
        while True:
            st = self.status(name)
            if st.state == self.pb.CONTAINER_EXITED:
                if st.exit_code != 0:
                    raise PodFailed(f"init container {name} exited {st.exit_code}: "
                                    f"{self.logs(name)[-2000:]}")
                return
            if time.monotonic() > deadline:
                raise PodFailed(f"init container {name} still runs after {INIT_TIMEOUT}s")
            time.sleep(0.05)

    def _await_startup(self, c: ContainerPlan) -> None:
        probe = c.probes["startup"]
        time.sleep(probe.initial_delay)
        for _ in range(probe.failure_threshold):
            if self.probe(c.name, "startup"):
                return
            time.sleep(probe.period)
        raise PodFailed(f"startup probe of {c.name} failed {probe.failure_threshold} times: "
                        f"{self.logs(c.name)[-2000:]}")

    # -- the pod cgroup (kubelet's pod container manager, cgroupfs driver)
    def _pod_cgroup(self) -> None:
        hs = self.node.hierarchies
        cgroups.ensure(hs, self.cgroup_parent)
        write_qos_cgroups(self.node, self.plan.node)
        self._write_pod_limits()

    def _write_pod_limits(self) -> None:
        """ResourceConfigForPod on cgroup v1 (and v2 files where the unified tree has the
        controller): cpu.shares from requests; cfs quota and memory limit only when every
        regular container declares one (or the pod is Guaranteed)."""
        hs, path, plan = self.node.hierarchies, self.cgroup_parent, self.plan
        cpu_req, cpu_lim, mem_lim = self._pod_totals()
        cpu, mem = cgroups.find(hs, "cpu"), cgroups.find(hs, "memory")
        shares = km.MIN_SHARES if plan.qos == "BestEffort" else km.milli_cpu_to_shares(cpu_req)
        if cpu is not None:
            cgroups.write(cpu, path, "cpu.shares", shares)
            if cpu_lim:
                cgroups.write(cpu, path, "cpu.cfs_period_us", km.QUOTA_PERIOD)
                cgroups.write(cpu, path, "cpu.cfs_quota_us", km.milli_cpu_to_quota(cpu_lim))
        if mem is not None and mem_lim:
            cgroups.write(mem, path, "memory.limit_in_bytes", mem_lim)
        for h in hs:
            if h.version == 2 and os.path.exists(h.dir(path) + "/memory.max") and mem_lim:
                cgroups.write(h, path, "memory.max", mem_lim)
            if h.version == 2 and os.path.exists(h.dir(path) + "/cpu.max") and cpu_lim:
                cgroups.write(h, path, "cpu.max",
                              f"{km.milli_cpu_to_quota(cpu_lim)} {km.QUOTA_PERIOD}")

    def _pod_totals(self) -> tuple[int, int, int]:
        inits = [(self.resources[c.name], c.role == "sidecar") for c in self.plan.containers
                 if c.role != "main"]
        mains = [self.resources[c.name] for c in self.plan.containers if c.role == "main"]
        cpu_req = km.pod_totals(inits, mains, "cpu_request")
        declared_cpu = all(r.cpu_limit for r in mains)
        declared_mem = all(r.memory_limit for r in mains)
        return (cpu_req, km.pod_totals(inits, mains, "cpu_limit") if declared_cpu else 0,
                km.pod_totals(inits, mains, "memory_limit") if declared_mem else 0)

    # -- volumes
    def _volumes(self) -> None:
        for v in self.plan.volumes:
            if v.kind == "hostPath":
                self._host_path(v)
            elif v.kind == "emptyDir":
                self.node.fs.makedirs(v.node_path)
                self.node.fs.chmod_dir(v.node_path, 0o777)
            elif v.kind == "configMap":
                self._atomic_write(v.node_path, list(v.files))
            elif v.kind == "downwardAPI":
                self._atomic_write(v.node_path, self._downward_files(v))

    def _host_path(self, v: VolumePlan) -> None:
        """hostPath type checks, in the node (pkg/volume/hostpath checkType)."""
        fs, kind = self.node.fs, self.node.fs.kind(v.node_path)
        if v.host_type == "DirectoryOrCreate" and kind is None:
            fs.makedirs(v.node_path)
            return
        if v.host_type == "FileOrCreate" and kind is None:
            fs.write_bytes(v.node_path, b"")
            return
        want = {"Directory": "dir", "DirectoryOrCreate": "dir", "File": "file",
                "FileOrCreate": "file", "Socket": "socket", "CharDevice": "char",
                "BlockDevice": "block"}.get(v.host_type)
        if kind == "link":      # the kubelet stats through symlinks
            mode = os.stat(fs.path(v.node_path)).st_mode
            kind = "dir" if stat.S_ISDIR(mode) else ("file" if stat.S_ISREG(mode) else "other")
        if want is not None and kind != want:
            raise PodFailed(f"hostPath volume {v.name}: {v.node_path} is "
                            f"{kind or 'missing'}, type {v.host_type} needs a {want}")

    def _downward_files(self, v: VolumePlan) -> list[tuple[str, bytes, int]]:
        plan, out = self.plan, []
        for item in v.items:
            if item.field_path:
                text = field_value(item.field_path, plan.name, plan.namespace, plan.uid,
                                   plan.labels, plan.annotations, None)
            else:
                text = km.downward_resource(item.resource, item.divisor,
                                            self.resources[item.container],
                                            plan.node.cpu_milli, plan.node.memory)
            out.append((item.path, text.encode(), item.mode))
        return out

    def _atomic_write(self, vol: str, files: list[tuple[str, bytes, int]]) -> None:
        """kubelet's AtomicWriter: files in a fresh ..<timestamp> dir, ..data switched to it
        by rename, each top-level name a symlink into ..data; the old dir removed."""
        fs = self.node.fs
        fs.makedirs(vol)
        stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
        ts = f"..{stamp}.{secrets.randbelow(10**9):09d}"
        fs.makedirs(f"{vol}/{ts}")
        for rel, data, mode in files:
            fs.write_bytes(f"{vol}/{ts}/{rel}", data, mode)
        old = None
        with contextlib.suppress(OSError):
            old = os.readlink(fs.path(f"{vol}/..data"))
        fs.symlink(ts, f"{vol}/..data")
        for top in sorted({rel.split("/", 1)[0] for rel, _, _ in files}):
            if fs.kind(f"{vol}/{top}") is None:
                fs.symlink(f"..data/{top}", f"{vol}/{top}")
        if old and old != ts:
            fs.remove_tree(f"{vol}/{old}")

    # -- use
    def cid(self, container: str) -> str:
        if container not in self.ids:
            raise KeyError(f"pod {self.plan.name} has no started container {container!r}")
        return self.ids[container]

    def exec(self, container: str, argv: list[str], timeout: int = 30) -> tuple[int, str, str]:
        """ExecSync: (exit code, stdout, stderr)."""
        resp = self.node.runtime.ExecSync(self.pb.ExecSyncRequest(
            container_id=self.cid(container), cmd=argv, timeout=timeout), timeout=timeout + 10)
        return (resp.exit_code, resp.stdout.decode(errors="replace"),
                resp.stderr.decode(errors="replace"))

    def sandbox_status(self) -> Any:
        """PodSandboxStatus: state SANDBOX_READY while the pod runs."""
        return self.node.runtime.PodSandboxStatus(self.pb.PodSandboxStatusRequest(
            pod_sandbox_id=self.sandbox_id), timeout=30).status

    def status(self, container: str) -> Any:
        return self.node.runtime.ContainerStatus(self.pb.ContainerStatusRequest(
            container_id=self.cid(container)), timeout=30).status

    def logs(self, container: str) -> str:
        """The container's log (this attempt's file), the CRI prefix stripped: each line is
        `<RFC3339Nano> <stream> <P|F> <text>`; P marks a partial line continued next."""
        path = (f"{self.plan.sandbox.log_directory}/{container}/"
                f"{self.attempts[container]}.log")
        try:
            raw = self.node.fs.read_text(path)
        except FileNotFoundError:
            return ""
        out = []
        for line in raw.splitlines():
            parts = line.split(" ", 3)
            if len(parts) < 3:
                continue
            text = parts[3] if len(parts) == 4 else ""
            out.append(text if parts[2] == "P" else text + "\n")
        return "".join(out)

    def pid(self, container: str) -> int:
        """The container's init process, as the host sees it."""
        return int(container_info(self.node, self.cid(container))["pid"])

    def cgroup(self, container: str | None = None) -> str:
        """The cgroup path (as /proc/PID/cgroup prints it) of a container, or of the pod."""
        if container is None:
            return self.cgroup_parent
        return f"{self.cgroup_parent}/{self.cid(container)}"

    def cgroup_dir(self, controller: str, container: str | None = None) -> str:
        """The directory of that cgroup in the hierarchy of controller ("" = unified)."""
        hs = self.node.hierarchies
        h = next(h for h in hs if h.version == 2) if controller == "" else \
            cgroups.find(hs, controller)
        if h is None:
            raise NodeError(f"no {controller} hierarchy")
        return h.dir(self.cgroup(container))

    def probe(self, container: str, kind: str) -> bool:
        """Run the container's startup/liveness/readiness exec probe once."""
        p = self.plan.container(container).probes[kind]
        rc, _, _ = self.exec(container, list(p.command), timeout=max(p.timeout, 1))
        return rc == 0

    def restart(self, container: str) -> None:
        """What the kubelet does when a container dies: the next attempt, same config."""
        c = self.plan.container(container)
        old = self.ids[container]
        rt = self.node.runtime
        rt.StopContainer(self.pb.StopContainerRequest(container_id=old, timeout=0), timeout=60)
        rt.RemoveContainer(self.pb.RemoveContainerRequest(container_id=old), timeout=60)
        self.node.fs.makedirs(f"{self.plan.sandbox.log_directory}/{container}")
        self._create_and_start(c, self.attempts[container] + 1)

    def update_resources(self, container: str, memory: int | None = None,
                         cpu_milli: int | None = None, memory_request: int | None = None,
                         cpu_request_milli: int | None = None) -> None:
        """An in-place resize as the kubelet performs it: the pod cgroup first when it
        grows and last when it shrinks, the container's UpdateContainerResources, then the
        downward-API volume files. Requests are kept unless given, except in a Guaranteed
        pod, where they follow the limits (a resize may not change the QoS class); a
        request above its limit is refused as the API server would."""
        old = self.resources[container]
        memory = old.memory_limit if memory is None else memory
        cpu_milli = old.cpu_limit if cpu_milli is None else cpu_milli
        guaranteed = self.plan.qos == "Guaranteed"
        new = replace(old, memory_limit=memory, cpu_limit=cpu_milli,
                      memory_request=memory if guaranteed else (
                          old.memory_request if memory_request is None else memory_request),
                      cpu_request=cpu_milli if guaranteed else (
                          old.cpu_request if cpu_request_milli is None else cpu_request_milli))
        if km.qos_class([new]) != "Guaranteed" and guaranteed or (
                new.memory_limit and new.memory_request > new.memory_limit) or (
                new.cpu_limit and new.cpu_request > new.cpu_limit):
            raise ValueError(f"resize of {container} to {new} is not allowed "
                             f"(QoS {self.plan.qos}; a request may not exceed its limit)")
        grows = (new.memory_limit or 1 << 62) >= (old.memory_limit or 1 << 62)
        self.resources[container] = new
        if grows:
            self._write_pod_limits()
            write_qos_cgroups(self.node, self.plan.node)
        res = linux_resources(new, self.plan.qos, self.plan.critical, self.plan.node)
        self.node.runtime.UpdateContainerResources(self.pb.UpdateContainerResourcesRequest(
            container_id=self.cid(container), linux=res), timeout=60)
        if not grows:
            self._write_pod_limits()
            write_qos_cgroups(self.node, self.plan.node)
        for v in self.plan.volumes:
            if v.kind == "downwardAPI":
                self._atomic_write(v.node_path, self._downward_files(v))

    # -- teardown
    def stop(self, grace: int = 0) -> None:
        """Stop every container (last started first) and the sandbox; keep them for
        status and logs. grace: StopContainer's timeout, seconds of SIGTERM before SIGKILL
        (the kubelet uses plan.grace_period; 0 kills at once, the tests' default)."""
        rt, pb = self.node.runtime, self.pb
        for c in reversed(self.plan.containers):
            cid = self.ids.get(c.name)
            if cid:
                self._stop_container(cid, grace)
        if self.sandbox_id:
            rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=self.sandbox_id),
                              timeout=60)

    def _stop_container(self, cid: str, grace: int) -> None:
        """StopContainer, tried again as kubelet's pod sync tries a failed kill again: the
        shim's ttrpc connection can close under a kill racing the task's own exit ("failed
        to kill container: ttrpc: closed"), and the container is then exited or stoppable
        on the next try. Still failing after STOP_TRIES, it raises with containerd's log."""
        import grpc  # as node.py: loaded with the node, not at collection

        rt, pb = self.node.runtime, self.pb
        for attempt in range(STOP_TRIES):
            try:
                rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=grace),
                                 timeout=grace + 60)
                return
            except grpc.RpcError as e:
                with contextlib.suppress(grpc.RpcError):
                    st = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                            timeout=30).status
                    if st.state == pb.CONTAINER_EXITED:
                        return
                if attempt == STOP_TRIES - 1:
                    raise NodeError(f"StopContainer {cid[:12]}: {e.details()}\n"
                                    f"{self.node.log_tail(40)}") from e
                time.sleep(1.0)

    def remove(self, grace: int = 0) -> None:
        """Stop and remove every container and the sandbox, then the pod's cgroup and its
        directories on the node (idempotent)."""
        if self.removed:
            return
        t = time.monotonic()
        rt, pb = self.node.runtime, self.pb
        try:
            self.stop(grace)
            for c in reversed(self.plan.containers):
                cid = self.ids.get(c.name)
                if cid:
                    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid),
                                       timeout=60)
            if self.sandbox_id:
                rt.RemovePodSandbox(pb.RemovePodSandboxRequest(
                    pod_sandbox_id=self.sandbox_id), timeout=60)
            cgroups.remove_tree(self.node.hierarchies, self.cgroup_parent)
            for d in (self.plan.volume_dir(), self.plan.sandbox.log_directory):
                self.node.fs.remove_tree(d)
        finally:
            self.removed = True
            with contextlib.suppress(ValueError):
                self.node.pods.remove(self)
        write_qos_cgroups(self.node, self.plan.node)
        self.timings["teardown"] = time.monotonic() - t

    def __enter__(self) -> Pod:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
