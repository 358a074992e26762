"""`guestfs attach`: bind the served files over /proc and /sys inside another process's
mount namespace (the sidecar pattern), and keep them bound across daemon restarts.

A restarted daemon is a new FUSE connection: binds made from the old one answer
"Transport endpoint is not connected" forever (LXCFS issues #193/#204, what users hit
most). attach replaces every bind that is stale or missing, so a watching sidecar heals
the app containers without restarting them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass

from guestfs import sysmount
from guestfs.view import BOUND_BY_DEFAULT

log = logging.getLogger("guestfs.attach")


@dataclass(frozen=True)
class AttachResult:
    pid: int
    bound: tuple[str, ...]     # files (re)bound this time
    healthy: tuple[str, ...]   # files already served by a live bind


def _served_by(path: str, source: str) -> bool:
    """``path`` is a live bind of ``source``: the same file, and it answers. A bind left by
    a dead daemon fails both (ENOTCONN); the kernel's own file is another inode."""
    try:
        st, src = os.stat(path), os.stat(source)
        with open(path, "rb") as f:
            f.read(1)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (src.st_dev, src.st_ino)


def _target_exists(path: str) -> bool:
    # A stale bind cannot even be stat()ed (ENOTCONN), but is there to be replaced; only a
    # file the kernel lacks (no PSI: no /proc/pressure) is skipped.
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def _rebind(source: str, target: str) -> None:
    # Peel every mount stacked on the target (stale binds of dead daemons included).
    for _ in range(8):
        try:
            sysmount.umount(target, detach=True)
        except OSError:
            break
    sysmount.bind(source, target)


def attach_here(source_root: str) -> tuple[list[str], list[str]]:
    """In the current mount namespace: bind ``source_root``+file over each served file that
    is not already served by a live bind. Returns (rebound, healthy)."""
    bound, healthy = [], []
    for f in BOUND_BY_DEFAULT:
        src = source_root.rstrip("/") + f
        if not _target_exists(f) or not os.path.exists(src):
            continue
        if _served_by(f, src):
            healthy.append(f)
            continue
        _rebind(src, f)
        bound.append(f)
    return bound, healthy


def attach(pid: int, source_root: str) -> AttachResult:
    """attach_here() inside ``pid``'s mount namespace (a forked child does the setns, since
    a process with threads cannot join a mount namespace)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            sysmount.enter_mount_namespace(pid)
            bound, healthy = attach_here(source_root)
            os.write(w, ("\n".join(bound) + "\0" + "\n".join(healthy)).encode())
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - report any failure to the parent
            with contextlib.suppress(OSError):
                os.write(w, f"\x01{type(e).__name__}: {e}".encode())
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(child, 0)
    if status != 0 or out.startswith("\x01"):
        raise OSError(f"attach to pid {pid}: {out.lstrip(chr(1)) or 'failed'}")
    bound, _, healthy = out.partition("\0")
    return AttachResult(pid, tuple(x for x in bound.split("\n") if x),
                        tuple(x for x in healthy.split("\n") if x))


def mount_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def other_namespaces() -> dict[str, int]:
    """One pid for every mount namespace other than ours (with shareProcessNamespace these
    are the pod's other containers)."""
    own = mount_ns("self")
    found: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ns = mount_ns(entry)
            if ns is not None and ns != own and ns not in found:
                found[ns] = int(entry)
    return found


def watch(pids: list[int] | None, source_root: str, interval: float = 2.0) -> None:
    """Attach to ``pids`` (or to every other mount namespace) every ``interval`` seconds:
    new app processes get binds, stale binds from a dead daemon are replaced."""
    while True:
        targets = pids if pids else list(other_namespaces().values())
        for pid in targets:
            try:
                res = attach(pid, source_root)
            except OSError as e:
                log.warning("%s", e)
                continue
            if res.bound:
                log.info("pid %d: bound %s", pid, ", ".join(res.bound))
        time.sleep(interval)
