"""Files the daemon writes as root at paths a user named (``--pid-file``, ``--log-file``).

Such a path often sits in a directory others can write to (/tmp, an app's own run
directory), where anyone may plant a symlink or a hard link to a root-only file before the
daemon starts. So the last component is opened without following a symlink, relative to
a descriptor of its directory, without blocking on a FIFO, and what was opened is checked
on its descriptor (no race between the check and the write):

- a directory on the way reached through a symlink owned by another user is refused;
- absent: created exclusively (``O_CREAT|O_EXCL``), mode 0644;
- present: reused only if it is a regular file owned by the daemon's user with a single
  link (a pid file or log left by an earlier daemon); anything else is refused, never
  overwritten or appended to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass


class UnsafeFileError(OSError):
    """The path cannot be written safely; the message names it and says why."""

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(frozen=True)
class OpenedFile:
    fd: int
    path: str
    dev: int
    ino: int


def make_private_dir(prefix: str) -> str:
    """A new directory of mode 0700 under $TMPDIR (else /tmp), named ``prefix`` and 12
    random characters, as tempfile.mkdtemp makes it: without tempfile, which brings
    shutil, random and three compressors (about 5 ms of CPU at every daemon's start)."""
    parent = os.environ.get("TMPDIR") or "/tmp"
    if not os.path.isabs(parent):
        parent = "/tmp"    # never relative to the working directory
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(9).hex()[:12])
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"no unused name for {prefix}* in {parent}")


def _check_dir_links(parent: str, what: str, path: str) -> None:
    """Refuse a directory reached through a symlink that another user owns (a link planted
    in /tmp could point the daemon at /etc): the rule fs.protected_symlinks applies to
    sticky directories, here for every component and whatever the sysctl says."""
    allowed = {0, os.geteuid()}
    prefix = "/"
    for part in parent.strip("/").split("/"):
        prefix = os.path.join(prefix, part)
        try:
            st = os.lstat(prefix)
        except OSError:
            return   # missing: reported when the directory is opened
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in allowed:
            raise UnsafeFileError(errno.EPERM, f"{what} {path}: {prefix} is a symbolic link "
                                               f"owned by uid {st.st_uid}; refused")


def _open_dir(path: str, what: str) -> int:
    parent = os.path.dirname(os.path.abspath(path))
    _check_dir_links(parent, what, path)
    try:
        return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafeFileError(errno.ENOENT,
                              f"{what} {path}: directory {parent} does not exist") from None
    except OSError as e:
        raise UnsafeFileError(e.errno, f"{what} {path}: cannot open directory {parent}: "
                                       f"{e.strerror}") from None


def _check_ours(fd: int, path: str, what: str) -> os.stat_result:
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not by uid {os.geteuid()}"
    elif st.st_nlink != 1:
        why = f"it has {st.st_nlink} hard links"
    if why is not None:
        raise UnsafeFileError(errno.EPERM, f"{what} {path}: refusing to write to it ({why})")
    return st


def open_private(path: str, what: str, append: bool) -> OpenedFile:
    """Open ``path`` for writing under the rules above; UnsafeFileError (one line naming
    ``what`` and ``path``) when it cannot be done safely. ``append`` keeps the content (a
    log), else it is truncated once checked (a pid file)."""
    dir_fd = _open_dir(path, what)
    name = os.path.basename(path)
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if append:
        flags |= os.O_APPEND
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        except FileExistsError:
            # O_NOFOLLOW: a symlink fails here (ELOOP); O_NONBLOCK: a FIFO without a
            # reader fails (ENXIO) instead of blocking, one with a reader is refused below.
            fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        reason = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise UnsafeFileError(e.errno, f"{what} {path}: cannot open it safely: "
                                       f"{reason}") from None
    finally:
        os.close(dir_fd)
    try:
        st = _check_ours(fd, path, what)
        os.set_blocking(fd, True)
        if not append:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return OpenedFile(fd, path, st.st_dev, st.st_ino)


def write_pid(f: OpenedFile, pid: int) -> None:
    os.pwrite(f.fd, f"{pid}\n".encode(), 0)


def remove_if_same(f: OpenedFile) -> None:
    """Unlink ``f.path`` only if it is still the file we opened (not one put there since)."""
    with contextlib.suppress(OSError):
        st = os.lstat(f.path)
        if (st.st_dev, st.st_ino) == (f.dev, f.ino):
            os.unlink(f.path)
