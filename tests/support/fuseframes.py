"""FUSE request frames built by hand and replies read back, for tests of guestfs/fuse/
without a kernel: a Session writes its replies into a pipe instead of /dev/fuse."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from guestfs.fuse import abi
from guestfs.fuse.session import Negotiated, Opened, Options, Session, StatFs, current

# What Linux 6.18 offered here (the debug line of an INIT): flags | flags2 << 32.
KERNEL_FLAGS_6_18 = 0x5FD73FFFFFB


def frame(opcode: int, body: bytes = b"", nodeid: int = abi.ROOT_ID, unique: int = 7,
          pid: int = 4242, uid: int = 1000, gid: int = 1000, length: int | None = None,
          extlen: int = 0) -> bytes:
    size = abi.IN_HEADER.size + len(body) if length is None else length
    return abi.IN_HEADER.pack(size, opcode, unique, nodeid, uid, gid, pid, extlen, 0) + body


def init_frame(minor: int = 44, flags: int = KERNEL_FLAGS_6_18, readahead: int = 131072,
               unique: int = 1) -> bytes:
    body = abi.INIT_IN_COMPAT.pack(7, minor, readahead, flags & 0xFFFFFFFF)
    if minor >= 36:
        body += abi.INIT_IN_FLAGS2.pack(flags >> 32) + b"\0" * 44
    return frame(abi.INIT, body, nodeid=0, unique=unique)


@dataclass(frozen=True)
class Reply:
    error: int
    unique: int
    body: bytes


def replies(r: int) -> Iterator[Reply]:
    """Every reply written so far into the pipe read end ``r`` (non-blocking)."""
    data = b""
    while True:
        try:
            chunk = os.read(r, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    while data:
        length, error, unique = abi.OUT_HEADER.unpack_from(data)
        yield Reply(error, unique, data[abi.OUT_HEADER.size:length])
        data = data[length:]


DIR = stat.S_IFDIR | 0o555
FILE = stat.S_IFREG | 0o444


@dataclass
class TinyFs:
    """A Filesystem of a few files, recording who asked (session.current())."""
    files: dict[str, bytes] = field(default_factory=lambda: {"/a": b"alpha\n",
                                                             "/d/b": b"bravo\n"})
    entry_timeout: float = 0.5
    attr_timeout: float = 0.0
    no_open: bool = False
    pids: list[int] = field(default_factory=list)
    negotiated: Negotiated | None = None
    written: list[tuple[int, int, bytes]] = field(default_factory=list)
    polled: list[tuple[int, int | None, int]] = field(default_factory=list)

    def _dirs(self) -> set[str]:
        out = {"/"}
        for p in self.files:
            parts = p.split("/")[1:-1]
            out.update("/" + "/".join(parts[:i + 1]) for i in range(len(parts)))
        return out

    def init(self, negotiated: Negotiated) -> None:
        self.negotiated = negotiated

    def getattr(self, path: str, fh: int | None) -> tuple[abi.Attr, float]:
        req = current()
        self.pids.append(req.pid if req else -1)
        if path in self._dirs():
            return abi.Attr(DIR, nlink=2), self.attr_timeout
        if path in self.files:
            return abi.Attr(FILE, size=len(self.files[path])), self.attr_timeout
        raise OSError(2, "no such file")

    def open(self, path: str, flags: int) -> Opened:
        if self.no_open:
            raise OSError(38, "no open")
        return Opened(11, abi.FOPEN_DIRECT_IO)

    def read(self, path: str, fh: int, offset: int, size: int, lock_owner: int,
             flags: int) -> bytes:
        return self.files[path][offset:offset + size]

    def release(self, path: str, fh: int, flags: int) -> None:
        pass

    def opendir(self, path: str, flags: int) -> Opened:
        return Opened(0, 0)

    def readdir(self, path: str, fh: int) -> Sequence[tuple[str, int]]:
        base = path.rstrip("/") + "/"
        names = {p[len(base):].split("/")[0] for p in [*self.files, *self._dirs()]
                 if p.startswith(base) and p != base}
        return [(".", DIR), ("..", DIR)] + [
            (n, DIR if base + n in self._dirs() else FILE) for n in sorted(names)]

    def releasedir(self, path: str, fh: int) -> None:
        pass

    def statfs(self, path: str) -> StatFs:
        return StatFs()

    def access(self, path: str, mask: int) -> None:
        self.getattr(path, None)

    def flush(self, path: str, fh: int, lock_owner: int) -> None:
        raise OSError(38, "no flush")

    def write(self, path: str, fh: int, offset: int, data: bytes) -> int:
        if path != "/a":
            raise OSError(30, "read-only")
        self.written.append((fh, offset, data))
        return len(data)

    def poll(self, path: str, fh: int, kh: int | None, events: int) -> int:
        self.polled.append((fh, kh, events))
        return abi.DEFAULT_POLLMASK | abi.POLLPRI

    def destroy(self) -> None:
        pass


class PipeSession:
    """A Session whose replies land in a pipe, and helpers to talk to it."""

    def __init__(self, fs: object, options: Options | None = None, init: bool = True,
                 negotiated: Negotiated | None = None) -> None:
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(self.w, True)
        self.session = Session(self.w, fs, options or Options(),  # type: ignore[arg-type]
                               negotiated)
        self.init_reply: Reply | None = None
        if init:
            self.init_reply = self.ask(init_frame())[0]

    def ask(self, raw: bytes) -> list[Reply]:
        self.session.handle(raw)
        return list(replies(self.r))

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)
