"""The FUSE operations: a thin layer from paths and file handles to ViewServer.render.

Layout under the mount point is LXCFS's, so its recipes work with the path changed:
proc/{meminfo,...}, proc/pressure/{cpu,memory,io}, sys/devices/system/cpu/{online,...}.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import threading
import time
from types import ModuleType
from typing import Any

from guestfs.daemon_status import STATUS_PATH
from guestfs.hostroot import HostRoot
from guestfs.server import UNCACHED, UnseenReader, ViewServer
from guestfs.view import SERVED_FILES

DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
SIZED_ENTRIES = 4096
PAGE = 4096
# A /proc file whose host original is longer than this may outgrow one page once rendered
# (digits differ from the host's): it keeps procfs's size 0.
PAGE_MARGIN = 1024

log = logging.getLogger("guestfs.fusefs")


def page_sized_files(host: HostRoot) -> set[str]:
    """The served files reported as one page long (sysfs's convention) rather than 0.

    Why: a file's size is what the kernel's mmap of it checks. A private mmap of a FUSE file
    opened with direct_io goes through the page cache, and with a size of 0 its first access
    is SIGBUS — FUSE gives the server no way to refuse the mmap itself. With a size of one
    page the fault reads page 0 through our read() for the mapping's own open, so the
    mapping holds that reader's bytes (then zeros, as sysfs files do). Only files that
    always fit in a page can say so: a larger size would make readers that trust st_size
    (Node's readFile) stop early or mmap pages past the end, and a size of one page for a
    longer file would cut them short."""
    paged = set()
    for f in SERVED_FILES:
        if f in UNCACHED:
            # Rendered afresh on every read (stat, uptime): the kernel may fill a mapped
            # page with more than one read, and two renderings would tear it (seen under
            # load: a /proc/stat page cut before its last newline). Size 0: mmap() fails
            # cleanly with EINVAL, as for an empty file.
            continue
        if f.startswith("/sys/"):
            paged.add(f)
            continue
        text = host.try_read_text(f)
        if text is None or len(text.encode()) <= PAGE - PAGE_MARGIN:
            paged.add(f)  # absent on the host (no PSI): ours is a few fixed lines
    return paged


def _tree() -> tuple[dict[str, list[str]], set[str]]:
    dirs: dict[str, list[str]] = {"/": []}
    for f in SERVED_FILES:
        parts = f.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[: depth - 1]) if depth > 1 else "/"
            child = "/" + "/".join(parts[:depth])
            if parts[depth - 1] not in dirs[parent]:
                dirs[parent].append(parts[depth - 1])
            if depth < len(parts):
                dirs.setdefault(child, [])
    # The daemon's own status (fallback counts) sits at the root, beside LXCFS's layout.
    dirs["/"].append(STATUS_PATH.lstrip("/"))
    return dirs, {*SERVED_FILES, STATUS_PATH}


class OpenSnapshots:
    """The rendering each open file handle was given, kept without a RELEASE callback.

    mfusepy leaves callbacks we do not define to libfuse's C defaults, and a Python
    release() costs every open/read/close about 100 us here (it runs while the reader's
    next open waits for the GIL). So nothing tells us when a handle closes: renderings are
    dropped oldest first once there are more than ``max_entries`` of them or they pass
    ``max_bytes`` (each counted with its dict and object overhead, so a million opens of a
    4-byte file are bounded too). A handle held open past that many newer renderings gets a
    fresh rendering at its next read.
    """

    ENTRY_OVERHEAD = 200  # bytes per entry beside the data: dict slot, int, bytes header

    def __init__(self, max_entries: int = 8192, max_bytes: int = 32 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: dict[int, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, fh: int) -> bytes | None:
        return self._data.get(fh)

    def put(self, fh: int, data: bytes) -> None:
        with self._lock:
            old = self._data.pop(fh, None)
            if old is not None:
                self._bytes -= len(old) + self.ENTRY_OVERHEAD
            self._data[fh] = data
            self._bytes += len(data) + self.ENTRY_OVERHEAD
            while len(self._data) > 1 and (len(self._data) > self.max_entries
                                           or self._bytes > self.max_bytes):
                gone = self._data.pop(next(iter(self._data)))
                self._bytes -= len(gone) + self.ENTRY_OVERHEAD


def make_operations(fuse: ModuleType, server: ViewServer) -> Any:
    """An Operations instance for the binding module ``fuse`` (fusepy or mfusepy)."""
    dirs, files = _tree()
    paged = page_sized_files(server.host)
    t = time.time_ns()  # every file and directory carries the mount's start time
    erofs = fuse.FuseOSError(errno.EROFS)

    def render(path: str) -> bytes:
        try:
            return server.render(path, fuse.fuse_get_context()[2])
        except UnseenReader:
            # The server counted and logged it; the reader gets a plain permission error.
            raise fuse.FuseOSError(errno.EACCES) from None

    class GuestFS(fuse.Operations):  # type: ignore[misc, name-defined]
        use_ns = True

        def __init__(self) -> None:
            self._snapshots = OpenSnapshots()
            self._next = itertools.count(1)  # next() on a count is atomic in CPython
            # Sized mode, for FUSE implementations that stop reading at st_size even with
            # direct_io (gVisor): getattr renders the file for the asking pid and reports
            # its length; that same rendering is what the next open of it serves.
            self.sized = False
            self._sized: dict[tuple[object, str], bytes] = {}

        @property
        def kept_renderings(self) -> OpenSnapshots:
            return self._snapshots

        @property
        def size_probe(self) -> str | None:
            """A served file whose reported size is 0, to find out whether the FUSE client
            reads past st_size (docs/mount.md); None when every file reports its size."""
            return next((f for f in sorted(SERVED_FILES) if f not in paged), None)

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            if path in dirs:
                return {"st_mode": DIR_MODE, "st_nlink": 2, "st_mtime": t, "st_ctime": t,
                        "st_atime": t}
            if path in files:
                if self.sized:
                    who = server.reader(fuse.fuse_get_context()[2])
                    data = render(path)
                    if len(self._sized) > SIZED_ENTRIES:  # stat()s never followed by open()
                        self._sized.clear()
                    self._sized[(who, path)] = data
                    size = len(data)
                else:
                    # One page for files that always fit in one (so mmap works), else
                    # procfs's 0; direct_io makes reads ignore it either way.
                    size = PAGE if path in paged else 0
                return {"st_mode": FILE_MODE, "st_nlink": 1, "st_size": size,
                        "st_mtime": t, "st_ctime": t, "st_atime": t}
            raise fuse.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: Any) -> list[Any]:
            if path not in dirs:
                raise fuse.FuseOSError(errno.ENOTDIR if path in files else errno.ENOENT)
            base = path.rstrip("/")
            out: list[Any] = [(".", {"st_mode": DIR_MODE}, 0), ("..", {"st_mode": DIR_MODE}, 0)]
            for name in dirs[path]:
                mode = DIR_MODE if f"{base}/{name}" in dirs else FILE_MODE
                out.append((name, {"st_mode": mode}, 0))
            return out

        def open(self, path: str, fi: Any) -> int:
            if path not in files:
                raise fuse.FuseOSError(errno.EISDIR if path in dirs else errno.ENOENT)
            if fi.flags & os.O_ACCMODE != os.O_RDONLY or fi.flags & os.O_TRUNC:
                raise erofs
            # direct_io: every read reaches us, so a size of 0 neither truncates nor
            # empties the file, and nothing stale is served from the page cache.
            fi.direct_io = 1
            fi.fh = next(self._next)
            if self.sized:
                who = server.reader(fuse.fuse_get_context()[2])
                data = self._sized.pop((who, path), None)
                if data is not None:
                    self._snapshots.put(fi.fh, data)
            return 0

        def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
            # One rendering per open, made at offset 0: later offsets of the same open
            # come from it, so a reader never sees a file torn between two renderings.
            fh = fi.fh
            data = None if offset == 0 and not self.sized else self._snapshots.get(fh)
            if data is None:
                data = render(path)
                self._snapshots.put(fh, data)
                if len(data) > PAGE and path in paged:
                    # Longer than the size we report: report 0 from now on (a reader that
                    # trusts st_size would stop at the page).
                    paged.discard(path)
                    log.warning("%s rendered %d bytes, more than one page: reporting size 0",
                                path, len(data))
            return data[offset:offset + size]

        def statfs(self, path: str) -> dict[str, int]:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

        def access(self, path: str, amode: int) -> int:
            if path not in dirs and path not in files:
                raise fuse.FuseOSError(errno.ENOENT)
            if amode & os.W_OK:
                raise erofs
            return 0

        # Read-only filesystem: everything that would change it.
        def _refuse(self, *args: Any, **kwargs: Any) -> Any:
            raise erofs

        write = create = mkdir = rmdir = unlink = rename = link = symlink = mknod = _refuse
        chmod = chown = truncate = utimens = setxattr = removexattr = _refuse

        # Left out of the FUSE callback table (the bindings skip None): without a flush
        # handler the kernel learns ENOSYS once and stops sending FLUSH on every close,
        # which saves a full round trip per open/read/close.
        # No release either (see OpenSnapshots).
        flush = fsync = fsyncdir = opendir = releasedir = getxattr = listxattr = None
        readlink = lock = bmap = ioctl = release = None

    return GuestFS()
