"""`guestfs oci-hook`: an OCI runtime hook (stage createContainer) that binds guestfs's
files over a new container's /proc and /sys files before the container's process starts,
so every container a runtime starts (podman, CRI-O: `hooks.d`) sees its own limits
without any change to its image or its spec.

The runtime runs the hook with the container's state (ociVersion, id, status, pid,
bundle) on stdin. At createContainer the container's mount namespace exists and its root
is prepared (its /proc and /sys mounted) but not yet pivoted into, so inside that
namespace the targets are ``<rootfs>/proc/meminfo``, ... where ``<rootfs>`` is the
bundle's ``root.path``. The OCI spec runs the hook inside that namespace (runc does: the
hook is a child of the container's init, in its cgroup, its working directory the root);
a runtime that runs it from its own namespace instead gets the same binds made through
setns() into the namespace of the state's ``pid``. Which of the two is told by the
namespace itself (that of the state's pid against ours), never by what the root holds,
and a root that resolves to that namespace's own "/" is refused: binding there would
cover the files of every process of the namespace. The files are bound with attach's
machinery: every target walked with O_PATH|O_NOFOLLOW below the root, checked to be a
regular file of procfs or sysfs, mounted over through its fd (open_tree/move_mount, else
bind), in a forked child that a stopped daemon cannot hang for longer than --timeout.

Fail-open: a node-wide hook that fails blocks every container. When the guestfs mount is
missing or dead, the container's directory is absent, or a target is refused, the hook
logs one line to stderr and exits 0: the container starts with the kernel's files, as it
would without guestfs. ``--strict`` makes those failures fail the container's start.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
from typing import Any, TextIO

from guestfs import DEFAULT_HOOK_SOURCE
from guestfs.inject.attach import attach_in_child
from guestfs.inject.enter import run_in_child
from guestfs.sources.containerdirs import BadKey, container_cgroup, dir_key
from guestfs.sources.proc_cgroup import parse_proc_cgroup
from guestfs.system.oneline import one_line, os_error_line

DEFAULT_SOURCE = DEFAULT_HOOK_SOURCE
DEFAULT_TIMEOUT = 5.0
MAX_STATE = 1 << 20


class HookError(Exception):
    """A one-line reason the hook did not bind (logged; fatal only with --strict)."""


def read_state(stream: TextIO) -> dict[str, Any]:
    """The OCI state the runtime writes on stdin."""
    try:
        text = stream.read(MAX_STATE)
    except UnicodeDecodeError:
        raise HookError("stdin is not an OCI state: not UTF-8 text") from None
    if not text.strip():
        raise HookError("stdin is empty: the OCI runtime writes the container's state there "
                        "(run guestfs oci-hook as a createContainer hook, "
                        "container/oci-hooks.d/guestfs.json)")
    try:
        state = json.loads(text)
    except json.JSONDecodeError as e:
        raise HookError(f"stdin is not an OCI state: not JSON at line {e.lineno} column "
                        f"{e.colno} ({e.msg})") from None
    if not isinstance(state, dict) or not isinstance(state.get("bundle"), str):
        raise HookError("stdin is not an OCI state: no bundle")
    pid = state.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise HookError(f"OCI state without a valid pid: {pid!r}")
    return state


def bundle_config(bundle: str) -> tuple[str, str | None]:
    """The container's root (``root.path``, relative to the bundle unless absolute) and
    its ``linux.cgroupsPath`` from ``bundle/config.json``."""
    if not os.path.isabs(bundle):
        raise HookError(f"bundle {bundle!r} is not an absolute path")
    path = os.path.join(bundle, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise HookError(f"{path}: not JSON at line {e.lineno} column {e.colno} "
                        f"({e.msg})") from e
    except (OSError, ValueError) as e:
        raise HookError(f"{path}: {getattr(e, 'strerror', None) or e}") from e
    root = (cfg.get("root") or {}).get("path") if isinstance(cfg, dict) else None
    if not isinstance(root, str) or not root:
        raise HookError(f"{path}: no root.path")
    cgroups_path = (cfg.get("linux") or {}).get("cgroupsPath")
    return (os.path.join(bundle, root),
            cgroups_path if isinstance(cgroups_path, str) else None)


def _systemd_slice_path(slice_name: str) -> str:
    """systemd's nesting of a slice: "a-b-c.slice" -> "/a.slice/a-b.slice/a-b-c.slice"."""
    if slice_name in ("", "-.slice"):
        return ""
    parts = slice_name.removesuffix(".slice").split("-")
    return "".join("/" + "-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))


def cgroup_of_config(cgroups_path: str | None) -> str | None:
    """The container's cgroup path from the spec's ``linux.cgroupsPath``: an absolute path
    (cgroupfs drivers) as is, ``slice:prefix:name`` (systemd drivers) expanded the way
    systemd nests it; None for a relative path (below the runtime's own cgroup)."""
    if not cgroups_path:
        return None
    if cgroups_path.count(":") == 2:
        slice_name, prefix, name = cgroups_path.split(":")
        unit = name if name.endswith((".slice", ".scope")) else f"{prefix}-{name}.scope"
        return f"{_systemd_slice_path(slice_name or 'system.slice')}/{unit}"
    if cgroups_path.startswith("/") and ":" not in cgroups_path:
        return cgroups_path
    return None


def _cgroup_of_pid(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return container_cgroup(parse_proc_cgroup(f.read()))
    except OSError as e:
        raise HookError(f"/proc/{pid}/cgroup: {e.strerror or e}") from e


def container_key(pid: int | str, cgroups_path: str | None) -> str:
    """The container's directory name: from /proc/<pid>/cgroup (memory controller's path on
    v1, else v2's), or, where a cgroup namespace shows the container's cgroup as "/", from
    the spec's cgroupsPath."""
    path = _cgroup_of_pid(pid)
    if path in (None, "/"):
        path = cgroup_of_config(cgroups_path)
        if path is None:
            raise HookError("cannot tell the container's cgroup (a cgroup namespace hides it "
                            f"and cgroupsPath {cgroups_path!r} is not absolute)")
    try:
        return dir_key(path)
    except BadKey as e:
        raise HookError(str(e)) from e


def _pid_in_proc(pidfd: int) -> int | None:
    """The pid /proc knows the process of ``pidfd`` by: its fdinfo's "Pid:", which the
    kernel gives in the pid namespace of the procfs it is read through (0: not visible
    there, -1: exited); None where fdinfo has no such line (before Linux 5.5)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    return None


def _pid_without_pidfd(pid: int) -> int:
    """Kernels without pidfds (or their fdinfo): the state's pid naming our parent (runc)
    is our parent as /proc/self/status's PPid names it, in /proc's pid namespace; any
    other is taken as the node's."""
    if os.getppid() != pid:
        return pid
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    raise HookError("no PPid in /proc/self/status")


def _open_ns(pid: int) -> int:
    try:
        return os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise HookError(f"pid {pid}: its mount namespace: {e.strerror or e}") from e


def container_namespace(pid: int) -> tuple[int, int]:
    """(pid as /proc names it, an fd on its mount namespace) of the container process the
    state's ``pid`` names. That pid is read in the hook's own pid namespace: runc runs the
    hook as a child of the container's init, inside its pid namespace, and gives the
    init's pid there (1); a runtime that runs the hook from its own namespaces gives the
    node's. pidfd_open(pid) means the right process in both. /proc may be another pid
    namespace's (under runc, the node's procfs: the container's own is not over it yet),
    so the pid to look up there comes from the pidfd, and the pidfd still naming a live
    process once the namespace is open proves that pid was not reused meanwhile."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno != errno.ENOSYS:
            raise HookError(f"state pid {pid}: {e.strerror or e}") from e
        proc_pid = _pid_without_pidfd(pid)
        return proc_pid, _open_ns(proc_pid)
    try:
        proc_pid = _pid_in_proc(pidfd)
        if proc_pid is None:
            proc_pid = _pid_without_pidfd(pid)
        elif proc_pid <= 0:
            raise HookError(f"state pid {pid}: not visible in /proc (Pid {proc_pid})")
        ns_fd = _open_ns(proc_pid)
        try:
            signal.pidfd_send_signal(pidfd, 0)
        except OSError as e:
            os.close(ns_fd)
            raise HookError(f"state pid {pid}: {e.strerror or e}") from e
        return proc_pid, ns_fd
    finally:
        os.close(pidfd)


def _same_file(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def hook(state: dict[str, Any], source: str, per_container: bool | None = None,
         timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Bind the container's files inside the container's own mount namespace: ours when
    the runtime runs us there (runc), else entered through the namespace of the state's
    pid; a root that is that namespace's own "/" is refused (attach.open_root). Returns
    attach's result (bound, healthy, refused, method, source). Raises HookError or
    AttachError, one line."""
    rootfs, cgroups_path = bundle_config(state["bundle"])
    pid, ns_fd = container_namespace(state["pid"])
    try:
        ours = _same_file(ns_fd, "/proc/self/ns/mnt")
        key = None
        if per_container is not False:
            try:
                key = container_key(pid, cgroups_path)
            except HookError:
                if per_container:
                    raise
                # Unknown is fine for a shared (per-caller) source, which needs no key;
                # for a per-container one attach then says the directory is missing.
        return run_in_child(
            lambda: attach_in_child(None if ours else pid, source, key, per_container,
                                    rootfs, None if ours else ns_fd, refuse_ns_root=True),
            timeout)
    finally:
        os.close(ns_fd)


def main(source: str = DEFAULT_SOURCE, strict: bool = False,
         per_container: bool | None = None, timeout: float = DEFAULT_TIMEOUT,
         stdin: TextIO | None = None, verbose: bool = False,
         log_file: str | None = None) -> int:
    """The command: 0 when bound, or (not strict) when it could not bind, after one line
    on stderr (and appended to ``log_file``) saying why; 1 on failure with ``strict``."""
    cid = "?"

    def say(line: str) -> None:
        print(line, file=sys.stderr)
        if log_file:
            # Root writing a path: never through a symlink or into a file not ours.
            from guestfs.system.safefile import UnsafeFileError, open_private

            try:
                opened = open_private(log_file, "--log-file", append=True)
                try:
                    os.write(opened.fd, (line + "\n").encode())
                finally:
                    os.close(opened.fd)
            except UnsafeFileError as e:    # names --log-file and the path already
                print(f"guestfs oci-hook: {one_line(str(e))}", file=sys.stderr)
            except OSError as e:
                print(f"guestfs oci-hook: --log-file {one_line(log_file)}: "
                      f"{os_error_line(e)}", file=sys.stderr)

    try:
        state = read_state(stdin or sys.stdin)
        cid = re.sub(r"[^\w.-]", "?", str(state.get("id", "?")))[:64]
        res = hook(state, source, per_container, timeout)
        if res["refused"]:
            raise HookError("refused " + "; ".join(res["refused"]))
    except Exception as e:  # noqa: BLE001 - fail-open: nothing may stop the container
        why = str(e) if isinstance(e, HookError) else os_error_line(e) \
            if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
        what = "failed" if strict else "not bound, the container starts with the kernel's files"
        say(f"guestfs oci-hook: container {cid}: {one_line(why)} ({what})")
        return 1 if strict else 0
    if not res["bound"] and not res["healthy"]:
        # Nothing to bind (a root without /proc files): not an error, but say so.
        say(f"guestfs oci-hook: container {cid}: no target file under its root")
    elif verbose:
        say(f"guestfs oci-hook: container {cid}: bound {len(res['bound'])}, already live "
            f"{len(res['healthy'])} ({res['method']}) from {res['source']}")
    return 0

