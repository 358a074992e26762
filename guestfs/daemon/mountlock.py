"""Locks keyed by a mountpoint's path: one guestfs mount per mountpoint, and a count of the
`guestfs run` processes that use a mount.

Both are flock(2) locks on files in a root-only directory (``LOCK_DIR``), so the kernel keeps
the count: a lock dies with the last descriptor of its holder, kill -9 included, and no
stale state is ever left to clean up.

- ``<key>.mount``: held exclusively by the serving daemon for its whole life. A second
  `guestfs mount` on the same mountpoint cannot take it and fails instead of stacking a
  second FUSE mount on the first. While it is free, no daemon serves that mountpoint.
- ``<key>.users``: every `guestfs run` using the mount holds it shared. A daemon started
  with ``--exit-when-unused`` stops once it can take it exclusively: no run is left.

The directory and files are created and opened without following symlinks, and the
directory must be a real directory owned by us that no one else can write to: a file
planted there by another user could otherwise be made to lock (or, with O_CREAT, create)
something else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time

# SHA-256 without hashlib: hashlib loads OpenSSL's libcrypto, 3.7 MiB of the daemon's RSS
# (benchmarks/bench_rss_imports.py) for this one digest. CPython's own implementation
# gives the same digest (the lock names stay what they were).
try:
    from _sha2 import sha256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.11
    except ImportError:  # a build without them
        from hashlib import sha256

def default_lock_dir() -> str:
    """root's locks are the node's (/run/guestfs-locks, shared by a DaemonSet's pods); a
    user's are its own: its runtime directory, else a directory of its uid under /tmp
    (open_lock_dir refuses one that another user made first)."""
    if os.geteuid() == 0:
        return "/run/guestfs-locks"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, "guestfs-locks")
    return f"/tmp/guestfs-locks-{os.geteuid()}"


LOCK_DIR = default_lock_dir()
_FILE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class LockError(OSError):
    """The lock directory or a lock file is unsafe or unusable (one-line message)."""

    def __str__(self) -> str:
        return str(self.strerror if self.strerror is not None else self.args[0])


def use_lock_dir(path: str) -> None:
    """Keep this process's locks in ``path`` (`mount --lock-dir`, run's private space)."""
    global LOCK_DIR
    LOCK_DIR = path


def mount_key(mountpoint: str) -> str:
    """A file-name key for ``mountpoint``: its parent's real path plus its name. The
    mountpoint itself is never resolved, since stat() of a FUSE mount whose daemon is
    stopped blocks; its parent is an ordinary directory."""
    path = os.path.abspath(mountpoint)
    parent, name = os.path.split(path)
    canonical = os.path.join(os.path.realpath(parent), name)
    return sha256(os.fsencode(canonical)).hexdigest()[:32]


def open_lock_dir(lock_dir: str) -> int:
    """The lock directory, made if missing and checked to be safe, as an open descriptor."""
    try:
        os.mkdir(lock_dir, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise LockError(e.errno, f"lock directory {lock_dir}: cannot create it "
                                 f"({e.strerror}); mount a writable volume there or at "
                                 f"{os.path.dirname(lock_dir)} (an emptyDir)") from None
    try:
        fd = os.open(lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise LockError(e.errno, f"lock directory {lock_dir}: {e.strerror}"
                        + (" (a symlink?)" if e.errno in (errno.ELOOP, errno.ENOTDIR) else "")
                        ) from None
    st = os.fstat(fd)
    # Ours and writable by no one else: nobody can plant a file or a symlink in it. (Read
    # access is harmless; a kubelet hostPath made with DirectoryOrCreate is 0755.)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise LockError(f"lock directory {lock_dir}: owned by uid {st.st_uid} "
                                     f"with mode {stat.filemode(st.st_mode)}; it must be ours "
                                     "and writable by no one else (0700 or 0755)")
    return fd


def _path(mountpoint: str, kind: str, lock_dir: str | None) -> tuple[str, str]:
    return lock_dir or LOCK_DIR, f"{mount_key(mountpoint)}.{kind}"


def open_lock(mountpoint: str, kind: str, lock_dir: str | None = None,
              create: bool = True) -> int:
    """An open descriptor (close-on-exec) of the ``kind`` ('mount' or 'users') lock file of
    ``mountpoint``. Lock it with acquire(), which also checks it was not removed meanwhile."""
    where, name = _path(mountpoint, kind, lock_dir)
    dir_fd = open_lock_dir(where)
    flags = _FILE_FLAGS if create else _FILE_FLAGS & ~os.O_CREAT
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT and not create:
            raise
        raise LockError(f"lock file {where}/{name}: {e.strerror}"
                        + (" (a symlink?)" if e.errno == errno.ELOOP else "")) from None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockError(f"lock file {where}/{name}: not a regular file")
    return fd


def _is_current(fd: int, mountpoint: str, kind: str, lock_dir: str | None) -> bool:
    """``fd`` is still the file at its path: not removed (or replaced) by a holder that
    was done with it between our open and our flock."""
    try:
        st = os.stat(os.path.join(*_path(mountpoint, kind, lock_dir)), follow_symlinks=False)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def try_flock(fd: int, operation: int) -> bool:
    """flock without blocking: True once taken, False while another holder conflicts."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def acquire(mountpoint: str, kind: str, operation: int, timeout: float = 0.0,
            lock_dir: str | None = None, interval: float = 0.05) -> int | None:
    """``mountpoint``'s ``kind`` lock taken with ``operation`` (LOCK_SH or LOCK_EX), as an
    open descriptor that holds it until closed; None if others still hold it after
    ``timeout`` seconds. Polled: a blocking flock would hang forever behind a holder that
    is SIGSTOPped. A file its last holder removed (release_removing) is opened afresh."""
    deadline = time.monotonic() + timeout
    while True:
        fd = open_lock(mountpoint, kind, lock_dir)
        if try_flock(fd, operation):
            if _is_current(fd, mountpoint, kind, lock_dir):
                return fd
            os.close(fd)
            continue
        os.close(fd)
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def release_removing(fd: int, mountpoint: str, kind: str,
                     lock_dir: str | None = None) -> bool:
    """Close ``fd``, first removing its lock file if nobody else holds it (we can hold it
    exclusively), so that lock files do not pile up, one per mountpoint ever used. Safe
    because every acquire() checks, once locked, that its file is still the one at the
    path. Returns whether the file was removed."""
    removed = False
    try:
        if try_flock(fd, fcntl.LOCK_EX) and _is_current(fd, mountpoint, kind, lock_dir):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(*_path(mountpoint, kind, lock_dir)))
                removed = True
    finally:
        os.close(fd)
    return removed


def write_owner(fd: int, text: str) -> None:
    """Record who holds the lock (for error messages), replacing what was there."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def read_owner(mountpoint: str, kind: str = "mount", lock_dir: str | None = None,
               limit: int = 256) -> str:
    """What the holder of the lock recorded with write_owner ("" if nothing)."""
    with contextlib.suppress(OSError):
        fd = open_lock(mountpoint, kind, lock_dir, create=False)
        try:
            return os.pread(fd, limit, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
    return ""


def served_by_other(mountpoint: str, lock_dir: str | None = None) -> bool:
    """A daemon holds ``mountpoint``'s mount lock (alive, or stopped: a SIGSTOPped daemon
    still holds it). Answered without touching the mount, so it never blocks."""
    try:
        fd = open_lock(mountpoint, "mount", lock_dir, create=False)
    except FileNotFoundError:
        return False  # removed by the last daemon when it stopped
    try:
        return not try_flock(fd, fcntl.LOCK_SH) and _is_current(fd, mountpoint, "mount",
                                                                  lock_dir)
    finally:
        os.close(fd)  # also drops the probe's own shared lock
