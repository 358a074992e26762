"""`guestfs oci-hook` without a runtime: a fake container (a private mount namespace with
procfs and sysfs mounted below a root directory, before any pivot_root) and the OCI state
on stdin. Covers what runc never does here: a hook run from the runtime's namespace
(bound through setns into the state's pid) and a root whose /sys is a planted symlink
(the state and config parsing: tests/cli/test_oci_hook_input.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.support.fusemount import mounted, wait_for


def _ns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def hook(state: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "guestfs", "oci-hook", *args],
                          input=json.dumps(state), capture_output=True, text=True, timeout=60)


@pytest.fixture
def fake_container():
    """(state, root, pid): ``root/proc`` and ``root/sys`` are procfs and sysfs inside the
    container's mount namespace only; with ``sys_link`` root/sys is a symlink to /sys."""
    top = tempfile.mkdtemp(prefix="guestfs-oci-fake-")
    procs = []

    def make(sys_link: bool = False):
        bundle = tempfile.mkdtemp(dir=top)
        root = os.path.join(bundle, "rootfs")
        os.makedirs(os.path.join(root, "proc"))
        if sys_link:
            os.symlink("/sys", os.path.join(root, "sys"))
            script = f"mount -t proc proc {root}/proc && echo up && exec sleep 600"
        else:
            os.makedirs(os.path.join(root, "sys"))
            script = (f"mount -t proc proc {root}/proc && mount -t sysfs sysfs {root}/sys "
                      "&& echo up && exec sleep 600")
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}, f)
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                              "sh", "-c", script], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "up"
        assert wait_for(lambda: _ns(p.pid) != _ns("self"), 5)
        state = {"ociVersion": "1.0.2", "id": "fake", "status": "creating", "pid": p.pid,
                 "bundle": bundle}
        return state, root, p.pid

    try:
        yield make
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(top, ignore_errors=True)


def inside(pid: int, *cmd: str) -> str:
    return subprocess.run(["nsenter", "-t", str(pid), "-m", *cmd], capture_output=True,
                          text=True, timeout=30).stdout


@pytest.mark.real
def test_hook_from_the_runtimes_namespace_binds_through_setns(fake_container):
    state, root, pid = fake_container()
    mp = tempfile.mkdtemp(prefix="guestfs-oci-src-")
    try:
        with mounted(os.path.join(mp, "mnt"), "--memory-limit", "300Mi", "--allow-other"):
            out = hook(state, "--source", os.path.join(mp, "mnt"), "--strict", "-v")
            assert out.returncode == 0, out.stderr
            # 10 files and the 3 pressure files (the per-caller engine's take triggers)
            assert "bound 13, already live 0 (move_mount)" in out.stderr, out.stderr
            assert inside(pid, "head", "-1", f"{root}/proc/meminfo").split() == \
                ["MemTotal:", "307200", "kB"]
            assert "fuse" in inside(pid, "stat", "-f", "-c", "%T", f"{root}/proc/cpuinfo")
            assert os.listdir(os.path.join(root, "proc")) == []  # ours: untouched
            again = hook(state, "--source", os.path.join(mp, "mnt"), "--strict", "-v")
            assert "bound 0, already live 13" in again.stderr, again.stderr
    finally:
        shutil.rmtree(mp, ignore_errors=True)


@pytest.mark.real
def test_a_planted_sys_symlink_is_refused_and_the_rest_bound(fake_container):
    state, root, pid = fake_container(sys_link=True)
    mp = tempfile.mkdtemp(prefix="guestfs-oci-src-")
    try:
        with mounted(os.path.join(mp, "mnt"), "--memory-limit", "300Mi", "--allow-other"):
            strict = hook(state, "--source", os.path.join(mp, "mnt"), "--strict")
            assert strict.returncode == 1
            assert "/sys/devices/system/cpu/online: a symlink on the way: refused" \
                in strict.stderr
            assert len(strict.stderr.splitlines()) == 1, strict.stderr
            # The namespace's own /sys (what the symlink points to) is left alone ...
            assert inside(pid, "stat", "-f", "-c", "%T",
                          "/sys/devices/system/cpu/online").strip() == "sysfs"
            # ... and the /proc files beside it are served.
            assert inside(pid, "head", "-1", f"{root}/proc/meminfo").split()[1] == "307200"
            lenient = hook(state, "--source", os.path.join(mp, "mnt"))
            assert lenient.returncode == 0
            assert "the container starts with the kernel's files" in lenient.stderr
    finally:
        shutil.rmtree(mp, ignore_errors=True)


# The hook runs here only inside a private mount namespace of its own (unshare -m), so that
# a hook that binds over its own namespace's files covers that namespace's, never this
# machine's. The wrapper prints the hook's exit status and stderr, then the filesystem
# type of the files the hook must leave alone, as seen in that namespace.
WRAPPED = r"""
import json, os, subprocess, sys
state = json.loads(sys.argv[1])
state["pid"] = state["pid"] or os.getpid()          # 0: a process of this namespace
out = subprocess.run([sys.executable, "-m", "guestfs", "oci-hook", *sys.argv[2:]],
                     input=json.dumps(state), capture_output=True, text=True)
kinds = subprocess.run(["stat", "-f", "-c", "%T", "/proc/meminfo",
                        "/sys/devices/system/cpu/online"], capture_output=True, text=True)
print(json.dumps({"rc": out.returncode, "err": out.stderr, "kinds": kinds.stdout.split()}))
"""


def hook_in_private_namespace(state: dict, *args: str) -> dict:
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                          "-c", WRAPPED, json.dumps(state), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def root_bundle(top: str, how: str) -> str:
    """A bundle whose root resolves to "/": named so, climbed to with "..", or a symlink."""
    bundle = tempfile.mkdtemp(dir=top)
    root = {"slash": "/", "climb": "/".join([".."] * 40), "symlink": "rootfs"}[how]
    if how == "symlink":
        os.symlink("/", os.path.join(bundle, "rootfs"))
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump({"ociVersion": "1.0.2", "root": {"path": root}}, f)
    return bundle


@pytest.mark.real
@pytest.mark.parametrize("how", ["slash", "climb", "symlink"])
@pytest.mark.parametrize("whose", ["the hook's own namespace", "another namespace"])
def test_a_root_that_is_the_namespaces_own_slash_is_refused(fake_container, how, whose):
    """Whether the state's pid shares the hook's namespace or not, a root resolving to that
    namespace's "/" gets nothing bound: not over the hook's own /proc, not over the
    container namespace's (entered through the state's pid), in one line."""
    _, _, pid = fake_container()
    top = tempfile.mkdtemp(prefix="guestfs-oci-root-")
    mp = os.path.join(top, "mnt")
    try:
        with mounted(mp, "--memory-limit", "300Mi", "--allow-other"):
            state = {"ociVersion": "1.0.2", "id": "c", "status": "creating",
                     "pid": 0 if whose.startswith("the hook") else pid,
                     "bundle": root_bundle(top, how)}
            strict = hook_in_private_namespace(state, "--source", mp, "--strict")
            assert strict["kinds"] == ["proc", "sysfs"], strict
            assert strict["rc"] == 1
            assert "is its mount namespace's own /: refusing" in strict["err"], strict
            assert len(strict["err"].splitlines()) == 1, strict
            lenient = hook_in_private_namespace(state, "--source", mp)
            assert lenient["rc"] == 0 and lenient["kinds"] == ["proc", "sysfs"], lenient
            assert "the container starts with the kernel's files" in lenient["err"]
            # The container's namespace (entered through the state's pid) is untouched too.
            assert inside(pid, "stat", "-f", "-c", "%T", "/proc/meminfo").strip() == "proc"
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.real
def test_runc_style_hook_inside_the_containers_pid_and_mount_namespaces(tmp_path):
    """As runc runs it: a child of the container's init, in its new pid and mount
    namespaces, the state's pid the init's pid there (1), /proc still the node's procfs
    (where 1 names another process). The hook finds its namespace through a pidfd and binds
    below the root in place."""
    bundle = tmp_path / "b"
    root = bundle / "rootfs"
    (root / "proc").mkdir(parents=True)
    (root / "sys").mkdir()
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c", "status": "creating", "pid": 1,
                        "bundle": str(bundle)})
    mp = str(tmp_path / "mnt")
    with mounted(mp, "--memory-limit", "300Mi", "--allow-other"):
        script = (f"mount -t proc proc {root}/proc && mount -t sysfs sysfs {root}/sys && "
                  f"echo '{state}' | {sys.executable} -m guestfs oci-hook --source {mp} "
                  f"--strict -v; echo rc=$?; head -1 {root}/proc/meminfo; "
                  "stat -f -c %T /proc/meminfo")
        out = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--propagation",
                              "private", "sh", "-c", script], capture_output=True,
                             text=True, timeout=60)
    assert "bound 13, already live 0" in out.stderr, out.stderr
    assert out.stdout.split() == ["rc=0", "MemTotal:", "307200", "kB", "proc"], out
