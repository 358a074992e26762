"""`guestfs oci-hook` on input that never reaches a bind: the OCI state and config it
parses, fail-open on garbage and a missing mount, its log file and working directory,
finding the state's pid (binds inside real namespaces: tests/host/test_oci_hook.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from guestfs.inject import ocihook


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
    for sub in ("cli", "inject"):
        (planted / sub).mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "cli/__init__.py", "cli/main.py",
                 "inject/__init__.py", "inject/ocihook.py"):
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
