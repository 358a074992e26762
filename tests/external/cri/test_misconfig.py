"""What a misconfigured pattern prints, deployed through containerd's CRI: the shipped
manifest with one thing taken away (as a user who copies it and drops a line would), and
the one line guestfs then writes into the pod's log, naming the cause and the fix."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.support.cri.images import REPO
from tests.support.cri.translate import translate

pytestmark = pytest.mark.real

K8S = REPO / "container" / "k8s"
APP = ["sh", "-c", "head -n 1 /proc/meminfo; sleep 3600"]


def edited(tmp_path: Path, pattern: str, edit: Callable[[dict], None]) -> Path:
    """A copy of the pattern's kustomization with ``edit`` applied to its pod spec."""
    for src in (K8S / pattern).iterdir():
        docs = list(yaml.safe_load_all(src.read_text()))
        if src.name != "kustomization.yaml":
            for d in docs:
                if d and d.get("kind") in ("Deployment", "DaemonSet"):
                    edit(d["spec"]["template"]["spec"])
        (tmp_path / src.name).write_text(yaml.safe_dump_all(docs))
    return tmp_path


def container(spec: dict, name: str) -> dict:
    return next(c for c in spec.get("containers", []) + spec.get("initContainers", [])
                if c["name"] == name)


def wait_log(pod, name: str, pred: Callable[[str], bool], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = pod.logs(name)
        if pred(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def guestfs_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("guestfs")]


def test_wrapper_without_the_fuse_device(cri_node, tmp_path):
    """No squat.ai/fuse: the container has no /dev/fuse; run says so in one line and
    does not start the app (the node's numbers would be served as the pod's)."""
    def drop_fuse(spec: dict) -> None:
        del container(spec, "app")["resources"]["limits"]["squat.ai/fuse"]
    plan = translate(edited(tmp_path, "wrapper", drop_fuse),
                     images={"registry.example/app-with-guestfs:1.0": "guestfs"},
                     programs={"app": APP})
    with cri_node.run(plan, wait=False) as pod:
        text = wait_log(pod, "app", lambda t: bool(guestfs_lines(t)))
        lines = guestfs_lines(text)
        assert len(lines) == 1 and "/dev/fuse" in lines[0], text
        assert "MemTotal" not in text and "Traceback" not in text, text
        print(lines[0])


def test_wrapper_with_a_hostpath_dev_fuse(cri_node, tmp_path):
    """The recipe most FUSE guides give: a hostPath /dev/fuse. The node is bound, but
    containerd's CRI denies every device the request does not list: EPERM, said so."""
    def hostpath_fuse(spec: dict) -> None:
        app = container(spec, "app")
        del app["resources"]["limits"]["squat.ai/fuse"]
        app["volumeMounts"].append({"name": "fuse", "mountPath": "/dev/fuse"})
        spec["volumes"].append({"name": "fuse",
                                "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}})
    plan = translate(edited(tmp_path, "wrapper", hostpath_fuse),
                     images={"registry.example/app-with-guestfs:1.0": "guestfs"},
                     programs={"app": APP})
    with cri_node.run(plan, wait=False) as pod:
        text = wait_log(pod, "app", lambda t: bool(guestfs_lines(t)))
        lines = guestfs_lines(text)
        assert len(lines) == 1 and "Operation not permitted" in lines[0], text
        assert "squat.ai/fuse" in lines[0] and "MemTotal" not in text, text
        print(lines[0])


def test_wrapper_without_sys_admin(cri_node, tmp_path):
    def drop_admin(spec: dict) -> None:
        caps = container(spec, "app")["securityContext"]["capabilities"]
        caps["add"] = [c for c in caps["add"] if c != "SYS_ADMIN"]
    plan = translate(edited(tmp_path, "wrapper", drop_admin),
                     images={"registry.example/app-with-guestfs:1.0": "guestfs"},
                     programs={"app": APP})
    with cri_node.run(plan, wait=False) as pod:
        text = wait_log(pod, "app", lambda t: bool(guestfs_lines(t)))
        lines = guestfs_lines(text)
        assert len(lines) == 1 and "CAP_SYS_ADMIN" in lines[0], text
        assert "MemTotal" not in text and "Traceback" not in text, text
        print(lines[0])


def test_sidecar_without_sys_ptrace(cri_node, tmp_path):
    """Without SYS_PTRACE the sidecar cannot open the app's namespace (nor its root, for
    the app's cgroup): attach must say so once, not bind nothing in silence."""
    def drop_ptrace(spec: dict) -> None:
        caps = container(spec, "guestfs")["securityContext"]["capabilities"]
        caps["add"] = [c for c in caps["add"] if c != "SYS_PTRACE"]
    plan = translate(edited(tmp_path, "sidecar", drop_ptrace),
                     images={"registry.example/guestfs:0.1": "guestfs",
                             "registry.example/app:1.0": "busybox"},
                     programs={"app": ["sh", "-c", "sleep 3600"]})
    with cri_node.run(plan) as pod:
        text = wait_log(pod, "guestfs", lambda t: "SYS_PTRACE" in t, timeout=10)
        lines = [ln for ln in guestfs_lines(text) if "WARNING" in ln or "ERROR" in ln]
        assert lines and all("SYS_PTRACE" in ln for ln in lines), text
        time.sleep(5)   # two more attach rounds: still said once
        again = [ln for ln in guestfs_lines(pod.logs("guestfs")) if "SYS_PTRACE" in ln]
        assert len(again) == 1, pod.logs("guestfs")
        print(again[0])
