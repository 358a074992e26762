"""All host file access goes through a HostRoot, so tests can point it at a fake tree.

Under a root, ``/proc/self`` means the directory ``ROOT/proc/self`` literally: on the
real root that is the reading process itself, on a fixture it is whatever the fixture
laid out there.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

MAX_HOST_FILE = 64 << 20  # far above any /proc, /sys or cgroup file a kernel writes


def pread_all(fd: int) -> bytes:
    """Everything in ``fd`` from offset 0, leaving its file offset alone (procfs seq files
    regenerate at offset 0, so an fd opened once can be read again this way)."""
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def pread_path(path: str) -> bytes:
    """Everything in the file at ``path``, read with pread (what every FUSE client
    forwards, gVisor's included)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return pread_all(fd)
    finally:
        os.close(fd)


class HostReadError(OSError):
    """A host file could not be read; carries the host path for the message."""

    def __str__(self) -> str:
        # "/proc/meminfo: No such file or directory", not "[Errno 2] /proc/meminfo: ...".
        return str(self.strerror if self.strerror is not None else self.args[0])


@dataclass(frozen=True)
class HostRoot:
    root: str = "/"

    def ns_link(self, pid: int | str, kind: str) -> str | None:
        """The target of /proc/PID/ns/KIND (``pid:[4026531836]``): equal targets, one
        namespace. None when the process is gone or the link unreadable."""
        try:
            return os.readlink(self.path(f"/proc/{pid}/ns/{kind}"))
        except OSError:
            return None

    def path(self, host_path: str) -> str:
        """The real path of ``host_path`` (absolute, as the host sees it) under this root."""
        if not host_path.startswith("/"):
            raise ValueError(f"host path must be absolute: {host_path!r}")
        if self.root in ("", "/"):
            return host_path
        return os.path.join(self.root, host_path.lstrip("/"))

    def read_text(self, host_path: str) -> str:
        """The file's text (undecodable bytes replaced). Only regular files, as procfs,
        sysfs and cgroupfs files are, and at most MAX_HOST_FILE bytes: under a --root, a
        FIFO would block the open for ever and a link to /dev/zero read without end."""
        try:
            fd = os.open(self.path(host_path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise HostReadError(e.errno, f"{host_path}: {e.strerror}") from e
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise HostReadError(errno.EINVAL, f"{host_path}: not a regular file")
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_HOST_FILE:
                    raise HostReadError(errno.EFBIG, f"{host_path}: larger than "
                                                     f"{MAX_HOST_FILE >> 20} MiB")
            return b"".join(chunks).decode("utf-8", "replace")
        except HostReadError:
            raise
        except OSError as e:
            raise HostReadError(e.errno, f"{host_path}: {e.strerror}") from e
        finally:
            os.close(fd)

    def try_read_text(self, host_path: str) -> str | None:
        """The file's text, or None if it does not exist or cannot be read."""
        try:
            return self.read_text(host_path)
        except HostReadError:
            return None

    def try_read_small(self, host_path: str) -> str | None:
        """Like try_read_text for a small file (one read of at most 64 KiB), without the
        text-file machinery: /proc/<pid>/cgroup on every new reader's first read."""
        try:
            # O_NONBLOCK: a FIFO under a --root must not block the open.
            fd = os.open(self.path(host_path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return os.read(fd, 65536).decode("utf-8", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    def isdir(self, host_path: str) -> bool:
        return os.path.isdir(self.path(host_path))

    def listdir(self, host_path: str) -> list[str]:
        try:
            return os.listdir(self.path(host_path))
        except OSError:
            return []

    @staticmethod
    def proc_path(pid: int | str, name: str) -> str:
        return f"/proc/{pid}/{name}"
