"""The kernel's FUSE ABI, as include/uapi/linux/fuse.h defines it: the opcodes, flags and
struct layouts this engine speaks, packed with ``struct`` in native byte order (the
kernel and the server share a machine; "=" also means no implicit padding: every
struct of the header is padded to 64 bits by explicit fields).

Protocol minors are cited where a field or flag appeared; the engine speaks up to
``MINOR`` (7.41: FUSE_ALLOW_IDMAP) and follows a kernel that offers less.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

MAJOR = 7
# 7.41 (Linux 6.12): FUSE_ALLOW_IDMAP. 7.40 (Linux 6.9): FUSE_HAS_RESEND and
# FUSE_NOTIFY_RESEND. 7.36 (Linux 5.17): FUSE_INIT_EXT and flags2.
MINOR = 41
ROOT_ID = 1
# The kernel refuses a read of /dev/fuse into a smaller buffer (FUSE_MIN_READ_BUFFER).
MIN_READ_BUFFER = 8192

# enum fuse_opcode
LOOKUP = 1
FORGET = 2            # no reply
GETATTR = 3
SETATTR = 4
READLINK = 5
SYMLINK = 6
MKNOD = 8
MKDIR = 9
UNLINK = 10
RMDIR = 11
RENAME = 12
LINK = 13
OPEN = 14
READ = 15
WRITE = 16
STATFS = 17
RELEASE = 18
FSYNC = 20
SETXATTR = 21
GETXATTR = 22
LISTXATTR = 23
REMOVEXATTR = 24
FLUSH = 25
INIT = 26
OPENDIR = 27
READDIR = 28
RELEASEDIR = 29
FSYNCDIR = 30
GETLK = 31
SETLK = 32
SETLKW = 33
ACCESS = 34
CREATE = 35
INTERRUPT = 36        # no reply (EAGAIN only, to ask for a resend)
BMAP = 37
DESTROY = 38
IOCTL = 39
POLL = 40
NOTIFY_REPLY = 41
BATCH_FORGET = 42     # 7.16, no reply
FALLOCATE = 43
READDIRPLUS = 44
RENAME2 = 45
LSEEK = 46
COPY_FILE_RANGE = 47
SETUPMAPPING = 48
REMOVEMAPPING = 49
SYNCFS = 50
TMPFILE = 51
STATX = 52            # 7.39
COPY_FILE_RANGE_64 = 53

# Everything that would change the filesystem: answered EROFS (the files are read-only;
# the kernel's VFS refuses most of these before asking, this is for the rest). WRITE is
# the filesystem's to answer: a PSI trigger written to a pressure file is taken.
MUTATING = frozenset({SETATTR, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK,
                      SETXATTR, REMOVEXATTR, CREATE, FALLOCATE, RENAME2, COPY_FILE_RANGE,
                      TMPFILE, COPY_FILE_RANGE_64, SETLK, SETLKW})
NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})

# enum fuse_notify_code (the out header's error field of a notification, unique 0)
NOTIFY_POLL = 1
NOTIFY_INVAL_INODE = 2    # 7.12
NOTIFY_INVAL_ENTRY = 3    # 7.12
NOTIFY_DELETE = 6         # 7.18
NOTIFY_RESEND = 7         # 7.40: requeue every request read but not answered

# INIT flags (fuse_init_in/out.flags; bits 32..63 travel in flags2, 7.36)
ASYNC_READ = 1 << 0
POSIX_LOCKS = 1 << 1
ATOMIC_O_TRUNC = 1 << 3
EXPORT_SUPPORT = 1 << 4
BIG_WRITES = 1 << 5
DONT_MASK = 1 << 6
SPLICE_WRITE = 1 << 7
SPLICE_MOVE = 1 << 8
SPLICE_READ = 1 << 9
FLOCK_LOCKS = 1 << 10
HAS_IOCTL_DIR = 1 << 11
AUTO_INVAL_DATA = 1 << 12       # 7.20
DO_READDIRPLUS = 1 << 13        # 7.21
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
WRITEBACK_CACHE = 1 << 16
NO_OPEN_SUPPORT = 1 << 17       # 7.23: an OPEN answered ENOSYS turns OPEN off
PARALLEL_DIROPS = 1 << 18       # 7.25
HANDLE_KILLPRIV = 1 << 19
POSIX_ACL = 1 << 20
ABORT_ERROR = 1 << 21
MAX_PAGES = 1 << 22             # 7.28
CACHE_SYMLINKS = 1 << 23
NO_OPENDIR_SUPPORT = 1 << 24    # 7.29
EXPLICIT_INVAL_DATA = 1 << 25   # 7.30
MAP_ALIGNMENT = 1 << 26
SUBMOUNTS = 1 << 27
HANDLE_KILLPRIV_V2 = 1 << 28
SETXATTR_EXT = 1 << 29
INIT_EXT = 1 << 30              # 7.36: fuse_init_in has flags2 and room to grow
SECURITY_CTX = 1 << 32
HAS_INODE_DAX = 1 << 33
CREATE_SUPP_GROUP = 1 << 34
HAS_EXPIRE_ONLY = 1 << 35
DIRECT_IO_ALLOW_MMAP = 1 << 36  # 7.39
PASSTHROUGH = 1 << 37           # 7.40
NO_EXPORT_SUPPORT = 1 << 38     # 7.40
HAS_RESEND = 1 << 39            # 7.40: the kernel understands FUSE_NOTIFY_RESEND
ALLOW_IDMAP = 1 << 40           # 7.41: idmapped mounts (needs default_permissions)
OVER_IO_URING = 1 << 41
REQUEST_TIMEOUT = 1 << 42

# FOPEN_* (fuse_open_out.open_flags)
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NONSEEKABLE = 1 << 2
FOPEN_CACHE_DIR = 1 << 3
FOPEN_STREAM = 1 << 4
FOPEN_NOFLUSH = 1 << 5

# fuse_poll_in.flags: the kernel will sleep on this file and wants a NOTIFY_POLL (7.11)
POLL_SCHEDULE_NOTIFY = 1 << 0
# The poll bits a file without poll support reports (DEFAULT_POLLMASK: EPOLLIN | EPOLLOUT
# | EPOLLRDNORM | EPOLLWRNORM), and the two a PSI file adds (linux/eventpoll.h values).
POLLIN, POLLPRI, POLLOUT, POLLERR = 0x1, 0x2, 0x4, 0x8
POLLRDNORM, POLLWRNORM = 0x40, 0x100
DEFAULT_POLLMASK = POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM
GETATTR_FH = 1 << 0             # fuse_getattr_in.getattr_flags: fh is valid
READ_LOCKOWNER = 1 << 1         # fuse_read_in.read_flags: lock_owner is valid
UNIQUE_RESEND = 1 << 63         # 7.40: the unique of a request the kernel resent
# 7.41: in_header uid/gid of a request through an idmapped mount that has none to send.
INVALID_UIDGID = 0xFFFFFFFF

# struct fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen (7.36,
# in 8-byte units), padding
IN_HEADER = struct.Struct("=IIQQIIIHH")
# struct fuse_out_header: len, error (negative errno), unique
OUT_HEADER = struct.Struct("=IiQ")
# struct fuse_init_in. Before 7.36 only major, minor, max_readahead, flags (16 bytes).
INIT_IN_COMPAT = struct.Struct("=IIII")
INIT_IN_FLAGS2 = struct.Struct("=I")   # right after the compat part, with INIT_EXT
# struct fuse_init_out (7.40 max_stack_depth, 7.43 request_timeout; 64 bytes since 7.36)
INIT_OUT = struct.Struct("=IIIIHHIIHHIIH22x")
# struct fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec,
# ctimensec, mode, nlink, uid, gid, rdev, blksize (7.9), flags (7.32)
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")
# struct fuse_entry_out: nodeid, generation, entry_valid, attr_valid, entry_valid_nsec,
# attr_valid_nsec, then the attr
ENTRY_OUT_HEAD = struct.Struct("=QQQQII")
# struct fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then the attr
ATTR_OUT_HEAD = struct.Struct("=QII")
GETATTR_IN = struct.Struct("=IIQ")          # getattr_flags, dummy, fh (7.9)
OPEN_IN = struct.Struct("=II")              # flags, open_flags
OPEN_OUT = struct.Struct("=QIi")            # fh, open_flags, backing_id (7.40)
READ_IN = struct.Struct("=QQIIQII")         # fh, offset, size, read_flags, lock_owner, flags
RELEASE_IN = struct.Struct("=QIIQ")         # fh, flags, release_flags, lock_owner
FLUSH_IN = struct.Struct("=QIIQ")           # fh, unused, padding, lock_owner
ACCESS_IN = struct.Struct("=II")            # mask, padding
FORGET_IN = struct.Struct("=Q")             # nlookup
BATCH_FORGET_IN = struct.Struct("=II")      # count, dummy
FORGET_ONE = struct.Struct("=QQ")           # nodeid, nlookup
INTERRUPT_IN = struct.Struct("=Q")          # unique of the interrupted request
# struct fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize,
# padding, spare[6]
KSTATFS = struct.Struct("=QQQQQIIII24x")
DIRENT_HEAD = struct.Struct("=QQII")        # ino, off, namelen, type; then the name
# struct fuse_write_in (7.9): fh, offset, size, write_flags, lock_owner, flags, padding;
# then the data
WRITE_IN = struct.Struct("=QQIIQII")
WRITE_OUT = struct.Struct("=II")            # size, padding
POLL_IN = struct.Struct("=QQII")            # fh, kh, flags, events (7.21)
POLL_OUT = struct.Struct("=II")             # revents, padding
NOTIFY_POLL_OUT = struct.Struct("=Q")       # kh
NOTIFY_INVAL_INODE_OUT = struct.Struct("=Qqq")  # ino, off, len
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("=QII")  # parent, namelen, flags; name and NUL

_OPCODES = ("LOOKUP FORGET GETATTR SETATTR READLINK SYMLINK MKNOD MKDIR UNLINK RMDIR RENAME "
            "LINK OPEN READ WRITE STATFS RELEASE FSYNC SETXATTR GETXATTR LISTXATTR REMOVEXATTR "
            "FLUSH INIT OPENDIR READDIR RELEASEDIR FSYNCDIR GETLK SETLK SETLKW ACCESS CREATE "
            "INTERRUPT BMAP DESTROY IOCTL POLL NOTIFY_REPLY BATCH_FORGET FALLOCATE READDIRPLUS "
            "RENAME2 LSEEK COPY_FILE_RANGE SETUPMAPPING REMOVEMAPPING SYNCFS TMPFILE STATX "
            "COPY_FILE_RANGE_64")
OPCODE_NAMES = {globals()[n]: n for n in _OPCODES.split()}


def opcode_name(opcode: int) -> str:
    return OPCODE_NAMES.get(opcode, f"opcode {opcode}")


class Attr(NamedTuple):
    """What the kernel is told of an inode (struct fuse_attr), times in nanoseconds."""
    mode: int
    size: int = 0
    nlink: int = 1
    mtime_ns: int = 0
    ctime_ns: int = 0
    atime_ns: int = 0
    uid: int = 0
    gid: int = 0
    blocks: int = 0
    blksize: int = 4096


def pack_attr(attr: Attr, ino: int) -> bytes:
    mode, size, nlink, mtime, ctime, atime, uid, gid, blocks, blksize = attr
    a, m, c = max(0, atime), max(0, mtime), max(0, ctime)
    return ATTR.pack(ino, size, blocks, a // 10**9, m // 10**9, c // 10**9, a % 10**9,
                     m % 10**9, c % 10**9, mode, nlink, uid, gid, 0, blksize, 0)


def unpack_attr(raw: bytes) -> tuple[int, Attr]:
    """(ino, attr) of a packed fuse_attr: the inverse of pack_attr, for tests and tools."""
    (ino, size, blocks, at, mt, ct, atn, mtn, ctn, mode, nlink, uid, gid, _rdev, blksize,
     _flags) = ATTR.unpack(raw)
    return ino, Attr(mode, size, nlink, mt * 10**9 + mtn, ct * 10**9 + ctn, at * 10**9 + atn,
                     uid, gid, blocks, blksize)


def split_timeout(seconds: float) -> tuple[int, int]:
    """A timeout as the (seconds, nanoseconds) pair the entry and attr replies carry."""
    ns = max(0, round(seconds * 10**9))
    return ns // 10**9, ns % 10**9


def entry_out(nodeid: int, attr: Attr, entry_valid: float, attr_valid: float,
              generation: int = 0) -> bytes:
    es, ens = split_timeout(entry_valid)
    as_, ans = split_timeout(attr_valid)
    return ENTRY_OUT_HEAD.pack(nodeid, generation, es, as_, ens, ans) + pack_attr(attr, nodeid)


def attr_out(nodeid: int, attr: Attr, attr_valid: float) -> bytes:
    s, ns = split_timeout(attr_valid)
    return ATTR_OUT_HEAD.pack(s, ns, 0) + pack_attr(attr, nodeid)


def dirent(ino: int, off: int, name: bytes, dtype: int) -> bytes:
    """One struct fuse_dirent, padded to 8 bytes (FUSE_DIRENT_ALIGN)."""
    rec = DIRENT_HEAD.pack(ino, off, len(name), dtype) + name
    return rec + b"\0" * (-len(rec) % 8)


def out_header(size: int, error: int, unique: int) -> bytes:
    return OUT_HEADER.pack(OUT_HEADER.size + size, error, unique)
