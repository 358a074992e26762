"""Where `guestfs run` mounts: the shared default (/run/guestfs, locks in
/run/guestfs-locks) where it can be made, else a private tmpfs no one else sees.

Minimal images have no /run; Kubernetes' readOnlyRootFilesystem makes / (and the /run
and /tmp beneath it) read-only; many images have no writable /tmp. Then `run` gives
itself and its daemon a mount namespace of their own, mounts a small tmpfs there over an
existing directory whose contents neither needs, and mounts and locks inside it. The
container's other processes never see it. The app's namespace starts as a copy of
run's: the child detaches that tmpfs again after binding the files, so the app finds the
directory as the image has it (/run/secrets, /tmp and the rest are never hidden from
it). Such a mount is private to one run: runs cannot share it, and the app has no
MOUNTPOINT to look at (`guestfs explain --mount`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from dataclasses import dataclass

from guestfs.daemon import mountlock
from guestfs.daemon.mountpoint import mount_entry
from guestfs.system import sysmount

log = logging.getLogger("guestfs.run")

# Tried in order: directories of every OCI runtime's default spec come last (runc and
# containerd mount an mqueue at /dev/mqueue and a tmpfs at /dev/shm). None of them
# holds anything run or its daemon reads; what they hold stays the app's.
PRIVATE_PARENTS = ("/run", "/tmp", "/var/tmp", "/mnt", "/dev/mqueue", "/dev/shm")
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
# The mountpoint and lock files only (a gVisor run's refreshed copies are a few KiB).
TMPFS_OPTIONS = "mode=0755,size=1m,nr_inodes=256"
# What a failure to create the default means: nothing can be written there.
_UNWRITABLE = (errno.EROFS, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC,
               errno.ENOTDIR)


class RunSpaceError(OSError):
    """One line: what could not be made, and how to give run a place."""

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(frozen=True)
class RunSpace:
    mountpoint: str
    lock_dir: str | None = None     # None: mountlock's shared default
    private_dir: str | None = None  # the tmpfs the app's namespace must not keep

    @property
    def daemon_args(self) -> list[str]:
        return ["--lock-dir", self.lock_dir] if self.lock_dir else []

    def daemon_env(self) -> dict[str, str] | None:
        """The daemon's environment: where the image has no writable /tmp, its private
        procfs and sysfs (host_pin.py) are mounted on a directory of the tmpfs."""
        if self.private_dir is None:
            return None
        return {**os.environ, "TMPDIR": self.private_dir}


def _make_dir(path: str) -> None:
    """``path`` as a directory, made if missing. A mount point (a live or stopped
    daemon's) is never stat()ed: a stopped daemon's would block."""
    if mount_entry(path) is not None:
        return
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        if os.path.lexists(parent):   # makedirs would say EEXIST
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), parent)
        os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)


def _shared_default_usable(mp: str) -> OSError | None:
    """None if ``mp`` and the shared lock directory exist or could be made; else why not."""
    try:
        _make_dir(mp)
        os.close(mountlock.open_lock_dir(mountlock.LOCK_DIR))
    except mountlock.LockError as e:
        if e.errno in _UNWRITABLE:
            return e
        raise
    except OSError as e:
        if e.errno in _UNWRITABLE:
            return e
        raise
    return None


def _needed_paths() -> list[str]:
    """Where run and its daemon are loaded from: no tmpfs may cover these."""
    import guestfs

    return [os.path.realpath(p) for p in (sys.executable, sys.prefix, sys.base_prefix,
                                           os.path.dirname(guestfs.__file__))]


def _covers(parent: str, paths: list[str]) -> bool:
    return any(p == parent or p.startswith(parent.rstrip("/") + "/") for p in paths)


def pick_parent(candidates: tuple[str, ...] = PRIVATE_PARENTS) -> str | None:
    needed = _needed_paths()
    for d in candidates:
        # A real directory, not a symlink (/var/run -> /run) and not one run needs.
        if os.path.isdir(d) and not os.path.islink(d) \
                and not _covers(os.path.realpath(d), needed):
            return d
    return None


def private_space(why: OSError, default: str) -> RunSpace:
    """Enter a mount namespace of our own (call it single-threaded, before the daemon
    starts) with a tmpfs holding the mountpoint and the locks."""
    parent = pick_parent()
    cause = f"{default}: {why.strerror or why}"
    if parent is None:
        raise RunSpaceError(errno.ENOENT, f"{cause}, and none of {', '.join(PRIVATE_PARENTS)} "
                                          "exists to hold a private mount; give run "
                                          "--mountpoint on a writable volume (an emptyDir)")
    try:
        sysmount.unshare_mount_namespace()
        sysmount.mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       TMPFS_OPTIONS)
    except OSError as e:
        raise RunSpaceError(e.errno or errno.EPERM,
                            f"{cause}; a private tmpfs at {parent} failed too "
                            f"({e.strerror or e}); give run --mountpoint on a writable "
                            "volume (an emptyDir)") from None
    mp, locks = os.path.join(parent, "guestfs"), os.path.join(parent, "guestfs-locks")
    os.mkdir(mp, 0o755)
    os.mkdir(locks, 0o700)
    log.debug("%s; mounting in a private tmpfs at %s that only this run and its daemon "
              "see", cause, parent)
    return RunSpace(mp, locks, parent)


def choose(mp: str, explicit: bool) -> RunSpace:
    """The shared ``mp`` if it can be used; for the default one, a private space
    otherwise; for one given with --mountpoint, a one-line error."""
    why = _shared_default_usable(mp)
    if why is None:
        return RunSpace(mp)
    if explicit:
        raise RunSpaceError(why.errno, f"cannot use --mountpoint {mp}: "
                                       f"{why.strerror or why}; give a writable directory "
                                       "(an emptyDir volume), or omit --mountpoint for a "
                                       "private one")
    return private_space(why, mp)


def hide_from_app(space: RunSpace) -> None:
    """In the app's child, after the binds: give the app the directory the private tmpfs
    covers back. The binds are mounts of their own and stay."""
    if space.private_dir is not None:
        sysmount.umount(space.private_dir, detach=True)
