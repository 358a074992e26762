"""`guestfs attach`: bind the served files over /proc and /sys inside another process's
mount namespace (the sidecar pattern), and keep them bound across daemon restarts.

A restarted daemon is a new FUSE connection: binds made from the old one answer
"Transport endpoint is not connected" forever (LXCFS issues #193/#204, what users hit
most). attach replaces every bind that is stale or missing, so a watching sidecar heals
the app containers without restarting them.

How a file gets there, least privilege first:
- move_mount: the guestfs mount is live in attach's own namespace. Each file is cloned
  there as a detached mount (open_tree(OPEN_TREE_CLONE)), carried across setns() and
  attached over the target file with move_mount(). The app's namespace never needs to see
  the mount itself, so no mount propagation (Kubernetes' Bidirectional, which only a
  privileged container may ask for) is involved.
- bind: the kernel lacks the fd-based mount API (or the sandbox refuses it), or the mount
  is visible only inside the target namespace: a bind(2) there, as before.

The target namespace belongs to the app, which may have planted symlinks: every target is
opened one component at a time with O_PATH|O_NOFOLLOW, must be a regular file on the
filesystem it should be on (procfs, sysfs, or a FUSE mount stacked there), and is then
unmounted and mounted over through that fd, never through its path.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from dataclasses import dataclass

from guestfs.inject.enter import CHILD_TIMEOUT, AttachError, run_in_child
from guestfs.render.served import BOUND_BY_DEFAULT, PRESSURE_FILES
from guestfs.sources.containerdirs import BadKey, key_of_cgroup_text
from guestfs.sources.host_root import HostRoot
from guestfs.system import sysmount
from guestfs.system.oneline import os_error_line

log = logging.getLogger("guestfs.attach")
MAX_STACKED = 8           # stale binds peeled from one target before giving up
# The filesystem each target must be on; FUSE is a bind stacked there before (ours or
# LXCFS's), which a new one may replace when stale or cover when live.
EXPECTED_FS = {"/proc/": sysmount.PROC_SUPER_MAGIC, "/sys/": sysmount.SYSFS_MAGIC}
# open_tree/move_mount refused: an old kernel or gVisor (ENOSYS), a seccomp profile that
# does not know them (EPERM), or no CAP_SYS_ADMIN over our own namespace (EPERM).
FALLBACK_ERRNOS = {errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.EOPNOTSUPP}


@dataclass(frozen=True)
class AttachResult:
    pid: int
    bound: tuple[str, ...]     # files (re)bound this time
    healthy: tuple[str, ...]   # files already served by a live bind
    method: str = "bind"       # "move_mount" or "bind"
    source: str = ""           # the directory the files came from (MP or MP/<key>)


@dataclass(frozen=True)
class SourceFile:
    fd: int                    # O_PATH fd on the served file
    ident: tuple[int, int]     # (st_dev, st_ino): what a live bind of it shows


def _ns_ident(pid: int | str) -> tuple[int, int]:
    st = os.stat(f"/proc/{pid}/ns/mnt")
    return st.st_dev, st.st_ino


def check_target(pid: int) -> None:
    """Refuse a pid whose mount namespace is attach's own: binding there would cover the
    files of every process sharing it (``--pid 1`` run on a host: the host's /proc)."""
    try:
        target = _ns_ident(pid)
    except OSError as e:
        hint = " (needs CAP_SYS_PTRACE)" if e.errno in (errno.EACCES, errno.EPERM) else ""
        raise AttachError(f"pid {pid}: cannot open its mount namespace: "
                          f"{e.strerror or e}{hint}") from e
    if target == _ns_ident("self"):
        raise AttachError(f"pid {pid} shares attach's own mount namespace: refusing to bind "
                          "over our own /proc and /sys (give the pid of an app in another "
                          "namespace)")


def container_key(pid: int | str) -> str:
    """The per-container directory name of ``pid``'s container (containerdirs.dir_key of
    its cgroup path, as /proc/<pid>/cgroup shows it to us)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            key = key_of_cgroup_text(f.read())
    except (OSError, BadKey) as e:
        why = os_error_line(e) if isinstance(e, OSError) else str(e)
        raise AttachError(f"pid {pid}: no container key from its cgroup: {why}") from e
    if key is None:
        raise AttachError(f"pid {pid}: no memory or cgroup v2 line in its cgroup file")
    return key


def _exists(path: str) -> bool:
    """Whether ``path`` is there (no symlink followed); other errors than ENOENT (a dead
    mount's ENOTCONN) are raised."""
    try:
        os.close(sysmount.open_nofollow(path))
    except FileNotFoundError:
        return False
    return True


def source_dir(mount: str, key: str | None, per_container: bool | None = None) -> str:
    """Where the files to bind are under the guestfs mount ``mount``: ``mount`` itself for
    the shared layout (``mount/proc/meminfo``), ``mount/<key>`` for a per-container one
    (``guestfs mount --per-container``). ``per_container`` None detects it: a mount with
    no ``proc`` directory but one named ``key`` is per-container."""
    base = mount.rstrip("/") or "/"
    if per_container is None:
        try:
            if key is None or _exists(base + "/proc"):
                per_container = False
            elif _exists(f"{base}/{key}"):
                per_container = True
            else:
                raise AttachError(f"source {mount} holds no served file: neither "
                                  f"{base.rstrip('/')}/proc nor the container's directory "
                                  f"{key}")
        except AttachError:
            raise
        except OSError:
            per_container = False  # a dead or unreadable mount: open_sources says which
    if not per_container:
        return base
    if key is None:
        raise AttachError(f"source {mount}: per-container layout but no container key")
    return f"{base.rstrip('/')}/{key}"


# The mode of a served pressure file that takes PSI triggers (daemon/fusefs.TRIGGER_MODE):
# bound like the others, since the container's monitors lose nothing.
TRIGGER_PERMS = 0o666


def open_sources(root: str) -> dict[str, SourceFile]:
    """The served files under ``root`` in the current namespace, each checked to be a
    regular file on a live FUSE mount; the pressure files too where they take PSI triggers
    (a per-caller mount on guestfs's engine): elsewhere the kernel's are left, whose
    triggers ours would refuse. Raises AttachError when the mount is not live."""
    found = _open_files(root, BOUND_BY_DEFAULT)
    try:
        pressure = _open_files(root, PRESSURE_FILES)
    except AttachError:
        _close_all(found)
        raise
    if len(pressure) == len(PRESSURE_FILES) and all(
            stat.S_IMODE(os.fstat(s.fd).st_mode) == TRIGGER_PERMS for s in pressure.values()):
        found.update(pressure)
    else:
        _close_all(pressure)
    if not found:
        raise AttachError(f"source {root} holds no served file (no guestfs mount there)")
    return found


def _open_files(root: str, files: tuple[str, ...]) -> dict[str, SourceFile]:
    found: dict[str, SourceFile] = {}
    for f in files:
        path = root.rstrip("/") + f
        try:
            fd = sysmount.open_nofollow(path)
        except FileNotFoundError:
            continue  # a file this kernel lacks is not served either
        except OSError as e:
            _close_all(found)
            raise AttachError(f"source {path}: {e.strerror or e}") from e
        try:
            kind = sysmount.fs_type(fd)
            st = os.fstat(fd)
            if kind != sysmount.FUSE_SUPER_MAGIC or not stat.S_ISREG(st.st_mode):
                raise AttachError(f"source {path} is not a file of a guestfs mount")
        except OSError as e:
            os.close(fd)
            _close_all(found)
            if isinstance(e, AttachError):
                raise
            raise AttachError(f"source {path}: {e.strerror or e}") from e
        found[f] = SourceFile(fd, (st.st_dev, st.st_ino))
    return found


def _close_all(sources: dict[str, SourceFile]) -> None:
    for s in sources.values():
        with contextlib.suppress(OSError):
            os.close(s.fd)


def clone_sources(sources: dict[str, SourceFile]) -> dict[str, int] | None:
    """Detached clones of every source (open_tree), or None where the kernel or the
    sandbox refuses the fd-based mount API (logged: attach falls back to bind)."""
    trees: dict[str, int] = {}
    for f, src in sources.items():
        try:
            trees[f] = sysmount.open_tree_clone(src.fd)
        except OSError as e:
            for fd in trees.values():
                os.close(fd)
            if e.errno in FALLBACK_ERRNOS:
                log.info("open_tree refused (%s): falling back to bind in the target "
                         "namespace", e.strerror)
                return None
            raise AttachError(f"open_tree {f}: {e.strerror or e}") from e
    return trees


def _open_target(f: str, root_fd: int | None = None) -> int | None:
    """An O_PATH fd on target ``f`` (below ``root_fd`` when given), or None when this
    kernel has no such file. Raises AttachError when ``f`` or a directory above it is a
    symlink, or not a regular file on the filesystem it belongs to."""
    try:
        fd = sysmount.open_nofollow(f, root_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise AttachError(f"{f}: a symlink on the way: refused") from e
        raise AttachError(f"{f}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            raise AttachError(f"{f} is a symlink: refused")
        if not stat.S_ISREG(st.st_mode):
            raise AttachError(f"{f} is not a regular file: refused")
    except AttachError:
        os.close(fd)
        raise
    except OSError:
        pass  # a stale FUSE bind may fail even fstat; _state() tells
    return fd


def _state(fd: int, f: str) -> str:
    """'stale' (a dead daemon's bind), 'fuse' (a live FUSE bind) or 'kernel'."""
    try:
        kind = sysmount.fs_type(fd)
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            return "stale"
        raise AttachError(f"{f}: {e.strerror or e}") from e
    if kind == sysmount.FUSE_SUPER_MAGIC:
        return "fuse"
    expected = next(v for k, v in EXPECTED_FS.items() if f.startswith(k))
    if kind != expected:
        raise AttachError(f"{f} is on an unexpected filesystem (0x{kind:x}): refused")
    return "kernel"


def _ident(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _attach_one(f: str, src: SourceFile, tree: int | None,
                root_fd: int | None = None) -> str | None:
    """Bind ``src`` over ``f`` (below ``root_fd`` when given) unless a live bind of it is
    already there. Returns 'bound', 'healthy', or None (no such file here)."""
    fd = _open_target(f, root_fd)
    for _ in range(MAX_STACKED):
        if fd is None:
            return None
        try:
            state = _state(fd, f)
        except AttachError:
            os.close(fd)
            raise
        if state != "stale":
            break
        # Peel the dead daemon's bind through its fd (never by path), then look again.
        try:
            sysmount.umount_fd(fd)
        finally:
            os.close(fd)
        fd = _open_target(f, root_fd)
    else:
        if fd is None:
            return None
        os.close(fd)
        raise AttachError(f"{f}: more than {MAX_STACKED} stale binds stacked")
    try:
        if _ident(fd) == src.ident:
            return "healthy"
        if tree is not None:
            sysmount.move_mount_fd(tree, fd)
        else:
            sysmount.bind_fd(src.fd, fd)
        return "bound"
    finally:
        os.close(fd)


def bind_sources(sources: dict[str, SourceFile], trees: dict[str, int] | None,
                 root_fd: int | None = None) -> dict[str, list[str]]:
    """Bind every source over its target in the current mount namespace (below
    ``root_fd`` when given); the cwd must be our own /proc. Unsafe targets are refused
    one by one, their neighbours still bound."""
    bound, healthy, refused = [], [], []
    for f, src in sources.items():
        try:
            state = _attach_one(f, src, trees.get(f) if trees else None, root_fd)
        except OSError as e:
            refused.append(str(e) if isinstance(e, AttachError) else f"{f}: {e.strerror}")
            continue
        if state == "bound":
            bound.append(f)
        elif state == "healthy":
            healthy.append(f)
    return {"bound": bound, "healthy": healthy, "refused": refused}


def open_root(root: str, refuse_ns_root: bool = False) -> int | None:
    """An O_PATH fd on the container's root as its runtime named it (a trusted path:
    symlinks there are the operator's; below it every component is walked with O_NOFOLLOW),
    or None for "/" (attach: the target's own /proc). With ``refuse_ns_root``, a root that
    resolves to the current mount namespace's own "/" (``/``, a climb out of the bundle
    with "..", a symlink to "/") is refused: binding below it would cover the /proc and /sys
    files of every process of that namespace. Compared by device and inode, not by name."""
    if not refuse_ns_root and not root.rstrip("/"):
        return None
    try:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise AttachError(f"root {root}: {e.strerror or e}") from e
    if refuse_ns_root and _ident(fd) == _ident_path("/"):
        os.close(fd)
        raise AttachError(f"root {root} is its mount namespace's own /: refusing to bind "
                          "over the /proc and /sys of every process there")
    return fd


def _ident_path(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _enter(pid: int | None, ns_fd: int | None) -> None:
    try:
        if ns_fd is not None:
            sysmount.enter_mount_namespace_fd(ns_fd)
        elif pid is not None:
            sysmount.enter_mount_namespace(pid)
    except OSError as e:
        raise AttachError(f"cannot enter its mount namespace: {os.strerror(e.errno)} "
                          "(setns needs CAP_SYS_ADMIN over it and CAP_SYS_CHROOT)") from e


def attach_in_child(pid: int | None, source_root: str, key: str | None = None,
                    per_container: bool | None = None, root: str = "/",
                    ns_fd: int | None = None,
                    refuse_ns_root: bool = False) -> dict[str, object]:
    """The body of attach(), in a single-threaded forked child: find the sources (our own
    namespace first), enter ``pid``'s mount namespace (through ``ns_fd`` when given, an fd
    on it the caller already checked; ``pid`` None: stay in ours), bind below ``root``
    there (open_root, which ``refuse_ns_root`` passes on). Returns what happened."""
    procfd = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    sources: dict[str, SourceFile] | None
    src_dir = source_root
    try:
        src_dir = source_dir(source_root, key, per_container)
        sources = open_sources(src_dir)
        trees = clone_sources(sources)
    except AttachError as e:
        if pid is None:
            raise
        log.debug("not live in our namespace (%s): using pid %d's", e, pid)
        sources, trees = None, None
    _enter(pid, ns_fd)
    os.fchdir(procfd)  # sysmount's fd helpers name fds through our own /proc
    if trees is None:
        if sources is not None:
            _close_all(sources)
        try:
            src_dir = source_dir(source_root, key, per_container)
            sources = open_sources(src_dir)
        except AttachError as e:
            raise AttachError(f"{e}, neither in attach's mount namespace nor in pid {pid}'s "
                              "(is the daemon running?)") from e
    root_fd = open_root(root, refuse_ns_root)
    res: dict[str, object] = dict(bind_sources(sources, trees, root_fd))
    res.update(method="bind" if trees is None else "move_mount", source=src_dir)
    return res


def attach(pid: int, source_root: str, timeout: float = CHILD_TIMEOUT,
           per_container: bool | None = None) -> AttachResult:
    """Bind the files under ``source_root`` inside ``pid``'s mount namespace (a forked
    child does the setns, since a process with threads cannot join a mount namespace).
    On a per-container mount (``per_container``, None: detected) the files are those of
    ``source_root/<key of pid's cgroup>``. Raises AttachError, one line, when refused,
    when the mount is live nowhere, or when a target is unsafe (its safe neighbours are
    bound all the same)."""
    check_target(pid)
    try:
        key = container_key(pid) if per_container is not False else None
    except AttachError:
        if per_container:
            raise
        key = None  # no key: only the shared layout can serve this pid
    try:
        res = run_in_child(lambda: attach_in_child(pid, source_root, key, per_container),
                           timeout)
    except AttachError as e:
        raise AttachError(f"attach to pid {pid}: {e}") from None
    if res["refused"]:
        raise AttachError(f"attach to pid {pid}: " + "; ".join(res["refused"]))
    return AttachResult(pid, tuple(res["bound"]), tuple(res["healthy"]), res["method"],
                        res["source"])


def other_namespaces() -> tuple[dict[str, int], list[int]]:
    """One pid for every mount namespace other than ours (with shareProcessNamespace these
    are the pod's other containers), and the pids whose namespace we may not see: a
    process holding capabilities we lack, or of another uid, needs CAP_SYS_PTRACE."""
    own = HostRoot().ns_link("self", "mnt")
    found: dict[str, int] = {}
    hidden: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{entry}/ns/mnt")
        except PermissionError:
            hidden.append(int(entry))
            continue
        except OSError:
            continue   # gone meanwhile, or a kernel thread
        if ns != own and ns not in found:
            found[ns] = int(entry)
    return found, hidden


def watch(pids: list[int] | None, source_root: str, interval: float = 2.0,
          per_container: bool | None = None) -> None:
    """Attach to ``pids`` (or to every other mount namespace) every ``interval`` seconds:
    new app processes get binds, stale binds from a dead daemon are replaced."""
    for pid in pids or ():
        check_target(pid)
    told_hidden = False
    while True:
        if pids:
            targets = pids
        else:
            found, hidden = other_namespaces()
            targets = list(found.values())
            if hidden and not told_hidden:
                # Said once: the same processes stay hidden on every round.
                log.warning("cannot see the mount namespace of %d process(es) (pid %d: "
                            "permission denied): attach needs CAP_SYS_PTRACE to reach "
                            "them (add SYS_PTRACE to this container's capabilities)",
                            len(hidden), hidden[0])
                told_hidden = True
        for pid in targets:
            try:
                res = attach(pid, source_root, per_container=per_container)
            except OSError as e:
                log.warning("%s", os_error_line(e))
                continue
            if res.bound:
                log.info("pid %d: bound %s (%s)", pid, ", ".join(res.bound), res.method)
        time.sleep(interval)
