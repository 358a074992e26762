"""`guestfs oci-hook` without a runtime: a fake container (a private mount namespace with
procfs and sysfs mounted below a root directory, before any pivot_root) and the OCI state
on stdin. Covers what runc never does here: a hook run from the runtime's namespace
(bound through setns into the state's pid), a root whose /sys is a planted symlink, and
the state and config parsing."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from guestfs.commands import ocihook
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
            assert "bound 10, already live 0 (move_mount)" in out.stderr, out.stderr
            assert inside(pid, "head", "-1", f"{root}/proc/meminfo").split() == \
                ["MemTotal:", "307200", "kB"]
            assert "fuse" in inside(pid, "stat", "-f", "-c", "%T", f"{root}/proc/cpuinfo")
            assert os.listdir(os.path.join(root, "proc")) == []  # ours: untouched
            again = hook(state, "--source", os.path.join(mp, "mnt"), "--strict", "-v")
            assert "bound 0, already live 10" in again.stderr, again.stderr
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


def test_state_and_config_parsing(tmp_path):
    with pytest.raises(ocihook.HookError, match="no bundle"):
        ocihook.read_state(io.StringIO('{"pid": 1}'))
    with pytest.raises(ocihook.HookError, match="valid pid"):
        ocihook.read_state(io.StringIO('{"pid": true, "bundle": "/b"}'))
    (tmp_path / "config.json").write_text(json.dumps(
        {"root": {"path": "rootfs"}, "linux": {"cgroupsPath": "/a/b"}}))
    assert ocihook.bundle_config(str(tmp_path)) == (str(tmp_path / "rootfs"), "/a/b")
    (tmp_path / "config.json").write_text(json.dumps({"root": {"path": "/abs/root"}}))
    assert ocihook.bundle_config(str(tmp_path)) == ("/abs/root", None)
    assert ocihook.cgroup_of_config("/libpod_parent/libpod-x") == "/libpod_parent/libpod-x"
    assert ocihook.cgroup_of_config(
        "kubepods-burstable-pod12.slice:crio:abc") == \
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/crio-abc.scope"
    assert ocihook.cgroup_of_config("machine.slice:libpod:f00") == \
        "/machine.slice/libpod-f00.scope"
    assert ocihook.cgroup_of_config("relative/path") is None
    assert ocihook.cgroup_of_config(None) is None


def test_fail_open_on_garbage_and_a_missing_mount(tmp_path, capsys):
    assert ocihook.main(str(tmp_path), stdin=io.StringIO("not json")) == 0
    assert ocihook.main(str(tmp_path), strict=True, stdin=io.StringIO("not json")) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(ln.startswith("guestfs oci-hook: container ?:") for ln in err)
    log = tmp_path / "hook.log"
    state = {"id": "c1", "pid": os.getpid(), "bundle": str(tmp_path / "nope")}
    assert ocihook.main(str(tmp_path), stdin=io.StringIO(json.dumps(state)),
                        log_file=str(log)) == 0
    assert log.read_text().startswith("guestfs oci-hook: container c1: ")


def test_the_installed_command_never_imports_from_its_working_directory(tmp_path):
    """The runtime starts the hook with the image's root as its working directory: a
    `guestfs` package planted there must not be what runs as root."""
    exe = os.path.join(os.path.dirname(sys.executable), "guestfs")
    planted = tmp_path / "guestfs"
    (planted / "commands").mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "commands/__init__.py", "commands/cli.py",
                 "commands/ocihook.py"):
        (planted / name).write_text("raise SystemExit(99)\n")
    out = subprocess.run([exe, "oci-hook", "--source", str(tmp_path)], input="{}",
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("guestfs oci-hook: container ?: ")


def test_the_log_file_is_never_written_through_a_symlink(tmp_path):
    """The hook runs as root: a --log-file path that is a symlink (planted in a directory
    others can write) must not make it append to the file it points to."""
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    link = tmp_path / "hook.log"
    link.symlink_to(victim)
    rc = ocihook.main(source=str(tmp_path / "none"), stdin=io.StringIO("{}"),
                      log_file=str(link))
    assert rc == 0                      # fail-open still
    assert victim.read_text() == "root's\n"
    plain = tmp_path / "plain.log"
    ocihook.main(source=str(tmp_path / "none"), stdin=io.StringIO("{}"), log_file=str(plain))
    assert "not an OCI state" in plain.read_text()


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
    assert "bound 10, already live 0" in out.stderr, out.stderr
    assert out.stdout.split() == ["rc=0", "MemTotal:", "307200", "kB", "proc"], out


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "no pidfd (ENOSYS)"])
def test_the_states_pid_is_found_in_proc_with_and_without_pidfds(monkeypatch, pidfds):
    """Our parent (runc: the container's init) and ourselves, as /proc names them; where
    the kernel has no pidfd_open, through /proc/self/status's PPid for the parent."""
    import errno

    if not pidfds:
        def enosys(pid):
            raise OSError(errno.ENOSYS, "Function not implemented")
        monkeypatch.setattr(ocihook.os, "pidfd_open", enosys)
    for pid in (os.getppid(), os.getpid()):
        found, ns_fd = ocihook.container_namespace(pid)
        try:
            assert found == pid
            assert ocihook._same_file(ns_fd, f"/proc/{pid}/ns/mnt")
        finally:
            os.close(ns_fd)
    with pytest.raises(ocihook.HookError, match="state pid|mount namespace"):
        ocihook.container_namespace(2 ** 22 + 12345)       # above any pid_max: no such pid
