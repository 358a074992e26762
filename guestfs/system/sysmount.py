"""mount(2), umount2(2), unshare(2), setns(2), fstatfs(2) and the fd-based mount API
(open_tree(2), move_mount(2)) through libc: Python 3.11 has none of them."""

from __future__ import annotations

import ctypes
import errno
import os

from guestfs.system import libc

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000
# The fd-based mount API (Linux >= 5.2). Its syscall numbers are the same on every
# architecture (asm-generic numbering from 5.1 on): 428 open_tree, 429 move_mount.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MOVE_MOUNT_BENEATH = 0x200
UMOUNT_NOFOLLOW = 0x8
PROC_SUPER_MAGIC = 0x9FA0
SYSFS_MAGIC = 0x62656572
FUSE_SUPER_MAGIC = 0x65735546



def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0,
          data: str | None = None) -> None:
    _check(libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           f"mount {source} {target}")


def bind(source: str, target: str, readonly: bool = False) -> None:
    mount(source, target, None, MS_BIND)
    if readonly:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def umount(target: str, detach: bool = False) -> None:
    _check(libc.umount2(_b(target), MNT_DETACH if detach else 0), f"umount {target}")


def unshare_mount_namespace() -> None:
    """A private mount namespace: later mounts here are invisible to everyone else."""
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as e:
        # gVisor has no mount propagation to change (EINVAL): its namespaces never share.
        if e.errno != errno.EINVAL:
            raise


def enter_mount_namespace(pid: int) -> None:
    """Join ``pid``'s mount namespace (the caller must be single-threaded)."""
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, CLONE_NEWNS), f"setns(mnt of pid {pid})")
    finally:
        os.close(fd)
    os.chdir("/")


def enter_mount_namespace_fd(ns_fd: int) -> None:
    """Join the mount namespace ``ns_fd`` (an fd on some /proc/PID/ns/mnt) names: the very
    namespace a caller checked through that fd, whatever became of PID since."""
    _check(libc.setns(ns_fd, CLONE_NEWNS), "setns(mnt)")
    os.chdir("/")


def is_stale_mount(path: str) -> bool:
    """A FUSE mount whose daemon died: every request says ENOTCONN. (A stat alone can be
    answered from the kernel's attribute cache for a while; listing the directory cannot.)"""
    try:
        os.listdir(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def _fd_link(fd: int) -> bytes:
    # Relative to the cwd, which the caller set to its own /proc (fchdir to an fd opened
    # before setns): the kernel resolves the magic link self/fd/N to exactly the file
    # behind fd, and our own procfs knows our pid even when the target's does not.
    return os.fsencode(f"self/fd/{fd}")


def umount_fd(fd: int) -> None:
    """Detach the mount whose root ``fd`` (an O_PATH fd) is, named by its magic link, so
    no symlink the target namespace holds is followed. The cwd must be our own /proc."""
    _check(libc.umount2(_fd_link(fd), MNT_DETACH), f"umount fd {fd}")


def bind_fd(source_fd: int, target_fd: int) -> None:
    """bind(2) of the file behind ``source_fd`` over the one behind ``target_fd`` (the
    path-based fallback of move_mount_fd). The cwd must be our own /proc."""
    _check(libc.mount(_fd_link(source_fd), _fd_link(target_fd), None, MS_BIND, None),
           f"bind fd {source_fd} over fd {target_fd}")


def _syscall(what: str, number: int, *args: object) -> int:
    rc = libc.syscall(ctypes.c_long(number), *args)
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return int(rc)


def _open_tree(what: str, dirfd: int, path: bytes, flags: int) -> int:
    return _syscall(what, SYS_OPEN_TREE, ctypes.c_int(dirfd), ctypes.c_char_p(path),
                    ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC | flags))


def _move_mount(what: str, tree_fd: int, to_dirfd: int, to_path: bytes, flags: int) -> None:
    _syscall(what, SYS_MOVE_MOUNT, ctypes.c_int(tree_fd), ctypes.c_char_p(b""),
             ctypes.c_int(to_dirfd), ctypes.c_char_p(to_path),
             ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | flags))


def open_tree_clone(fd: int) -> int:
    """A detached copy of the mount at ``fd`` (OPEN_TREE_CLONE): a mount that belongs to
    no namespace until move_mount() attaches it, so it can be carried across setns()."""
    return _open_tree("open_tree", fd, b"", AT_EMPTY_PATH)


def open_tree_clone_path(path: str) -> int:
    """open_tree_clone of the mount at ``path`` (a file bind works too); a symlink there
    is not followed."""
    return _open_tree(f"open_tree {path}", AT_FDCWD, os.fsencode(path), AT_SYMLINK_NOFOLLOW)


def move_mount_fd(tree_fd: int, target_fd: int) -> None:
    """Attach the detached mount ``tree_fd`` over the file behind ``target_fd``."""
    _move_mount("move_mount", tree_fd, target_fd, b"", MOVE_MOUNT_T_EMPTY_PATH)


def move_mount_path(tree_fd: int, target: str, beneath: bool = False) -> None:
    """Attach the detached tree ``tree_fd`` at ``target`` (a symlink there is not
    followed: move_mount follows one only with MOVE_MOUNT_T_SYMLINKS); with ``beneath``,
    under the mount on top there (Linux 6.5+)."""
    _move_mount(f"move_mount onto {target}", tree_fd, AT_FDCWD, os.fsencode(target),
                MOVE_MOUNT_BENEATH if beneath else 0)


def umount_nofollow(path: str) -> None:
    """Detach the mount at ``path`` without following a symlink there."""
    _check(libc.umount2(_b(path), MNT_DETACH | UMOUNT_NOFOLLOW), f"umount {path}")


def detach_quietly(path: str) -> None:
    """What libfuse does on a clean stop, lazily, failures left alone (a path that is no
    longer a mount point is detached already). NOFOLLOW: as root, never through a symlink
    swapped in for the mount point. gVisor refuses the flag (EINVAL, as for a path that
    is not a mount point): then without it, inside its sandbox."""
    raw = _b(path)
    if libc.umount2(raw, MNT_DETACH | UMOUNT_NOFOLLOW) != 0 \
            and ctypes.get_errno() == errno.EINVAL:
        libc.umount2(raw, MNT_DETACH)


def fs_type(fd: int) -> int:
    """The filesystem magic of the file behind ``fd`` (statfs's f_type). A FUSE mount
    whose daemon died raises ENOTCONN: statfs always asks the daemon, unlike stat, which
    the kernel may answer from its attribute cache."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit
    _check(libc.fstatfs(fd, buf), "fstatfs")
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def open_nofollow(path: str, root_fd: int | None = None) -> int:
    """An O_PATH fd on absolute ``path``, walked one component at a time with O_NOFOLLOW:
    a symlink anywhere on the way raises ELOOP/ENOTDIR instead of being followed. Used
    inside namespaces whose files the app controls. With ``root_fd`` (an O_PATH directory
    fd), ``path`` is walked from there instead of from "/": a container's root before
    its pivot_root."""
    if not path.startswith("/"):
        raise ValueError(f"not an absolute path: {path}")
    fd = (os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
          if root_fd is not None else os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    try:
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            if part in (".", ".."):
                raise OSError(errno.EINVAL, f"{path}: '{part}' in path")
            last = i == len(parts) - 1
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise
