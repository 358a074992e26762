"""Reading and writing files of the node's mount namespace from the test process.

The node is containerd's private mount namespace; /proc/<pid>/root of any of its processes
walks it, mounts included (a FUSE mount a pod propagated to the node is seen there). Writes
walk one component at a time with O_NOFOLLOW, so a symlink planted in the node never sends
a root write elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


class NodeFS:
    """Files of the node, by their node path (e.g. /var/lib/guestfs/by-caller/proc/meminfo)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def path(self, node_path: str) -> Path:
        """The test process's path to a node path (read-only use: it follows symlinks)."""
        return Path(f"/proc/{self.pid}/root") / node_path.lstrip("/")

    def read_text(self, node_path: str) -> str:
        return self.path(node_path).read_text()

    @contextlib.contextmanager
    def _dir(self, node_dir: str, create: bool, mode: int = 0o755) -> Iterator[int]:
        fd = os.open(f"/proc/{self.pid}/root", os.O_PATH | os.O_DIRECTORY)
        try:
            for part in [p for p in node_dir.split("/") if p]:
                if part == "..":
                    raise ValueError(f"node path {node_dir!r} has '..'")
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, mode, dir_fd=fd)
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def makedirs(self, node_dir: str, mode: int = 0o755) -> None:
        with self._dir(node_dir, create=True, mode=mode):
            pass

    def chmod_dir(self, node_dir: str, mode: int) -> None:
        parent, name = os.path.split(node_dir.rstrip("/"))
        with self._dir(parent, create=False) as dfd:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def write_bytes(self, node_path: str, data: bytes, mode: int = 0o644) -> None:
        parent, name = os.path.split(node_path)
        with self._dir(parent, create=True) as dfd:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode, dir_fd=dfd)
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)

    def write_text(self, node_path: str, text: str, mode: int = 0o644) -> None:
        self.write_bytes(node_path, text.encode(), mode)

    def symlink(self, target: str, node_path: str) -> None:
        """node_path -> target, replacing a symlink already there (rename is atomic)."""
        parent, name = os.path.split(node_path)
        with self._dir(parent, create=True) as dfd:
            tmp = f".{name}.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            os.symlink(target, tmp, dir_fd=dfd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    def kind(self, node_path: str) -> str | None:
        """'dir', 'file', 'char', 'block', 'socket', 'link' or None if absent (no follow
        of the last component)."""
        try:
            st = os.lstat(self.path(node_path))
        except FileNotFoundError:
            return None
        for test, name in ((stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"),
                           (stat.S_ISCHR, "char"), (stat.S_ISBLK, "block"),
                           (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "link")):
            if test(st.st_mode):
                return name
        return "other"

    def remove_tree(self, node_dir: str) -> None:
        """Remove a directory tree of the node (no mount inside it is crossed: rmdir of a
        mountpoint fails with EBUSY and says so)."""
        parent, name = os.path.split(node_dir.rstrip("/"))
        with self._dir(parent, create=False) as dfd:
            _rmtree_at(dfd, name)


def _rmtree_at(dfd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
    try:
        for entry in os.listdir(fd):
            _rmtree_at(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)
