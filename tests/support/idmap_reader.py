"""Run as a script inside a private mount namespace (``unshare --mount --propagation
private``): bind a file idmapped by a user namespace, as kubelet binds a volume into a
pod with ``hostUsers: false``, and read it through that bind from inside the namespace.

    python idmap_reader.py SOURCE USERNS_PID UID [--again]

SOURCE is cloned (open_tree, OPEN_TREE_CLONE), given the idmapping of USERNS_PID's user
namespace (mount_setattr, MOUNT_ATTR_IDMAP) and moved over an empty file of a private
tmpfs; then a child joins the user namespace, becomes UID there, and reads the bind to
EOF. One JSON line on stdout: ``{"idmap_error": errno name or null, "uid_inside": ...,
"host_uid": ..., "stat_uid": ..., "text": ...}``; with ``--again``, one more read and
line for every line on stdin, until its end (a pod reading across a daemon's restart).
The bind dies with this process's mount namespace, so nothing is left behind however it
ends.

The standard library and ctypes only: util-linux's X-mount.idmap= needs 2.39, and
Python 3.11 wraps none of these calls.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys
import tempfile

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # asm-generic, all arches
OPEN_TREE_CLONE = 1
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
CLONE_NEWUSER = 0x10000000

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class MountAttr(ctypes.Structure):
    # struct mount_attr (MOUNT_ATTR_SIZE_VER0, 32 bytes)
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _sys(what: str, *args: object) -> int:
    rc = libc.syscall(*args)
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return int(rc)


def idmapped_clone(source: str, userns_fd: int) -> int:
    """A detached clone of the mount at ``source`` carrying ``userns_fd``'s idmapping."""
    tree = _sys("open_tree", ctypes.c_long(SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD),
                ctypes.c_char_p(os.fsencode(source)),
                ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC))
    attr = MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns_fd)
    try:
        _sys("mount_setattr", ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(tree),
             ctypes.c_char_p(b""), ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE),
             ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    except OSError:
        os.close(tree)
        raise
    return tree


def move_onto(tree: int, target: str) -> None:
    _sys("move_mount", ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_int(tree), ctypes.c_char_p(b""),
         ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(target)),
         ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))


def read_inside(userns_fd: int, uid: int, path: str) -> dict[str, object]:
    """``path`` read by a child that joined the user namespace as ``uid`` (a pod's process:
    its kernel uid is the namespace's mapping of ``uid``)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            if libc.setns(userns_fd, CLONE_NEWUSER) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            out: dict[str, object] = {"uid_inside": os.getuid(),
                                      "stat_uid": os.stat(path).st_uid}
            with open(path, "rb") as f:
                out["text"] = f.read().decode()
        except OSError as e:
            out = {"read_error": errno.errorcode.get(e.errno or 0, str(e.errno)),
                   "why": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    out = json.loads(b"".join(chunks) or b"{}")
    # Its uid as the host sees it, the one FUSE requests would carry without idmapping:
    # read here, outside the namespace, from the exited child before it is reaped.
    with open(f"/proc/{pid}/status") as f:
        out["host_uid"] = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    os.waitpid(pid, 0)
    return out


def main(source: str, userns_pid: int, uid: int, again: bool) -> None:
    userns_fd = os.open(f"/proc/{userns_pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        tree = idmapped_clone(source, userns_fd)
    except OSError as e:
        report({"idmap_error": errno.errorcode.get(e.errno or 0, str(e.errno))})
        return
    scratch = tempfile.mkdtemp(prefix="guestfs-idmap-")
    # A tmpfs of this namespace only: the bind's target, gone with the namespace.
    if libc.mount(b"tmpfs", os.fsencode(scratch), b"tmpfs", 0, b"mode=0755") != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs")
    target = os.path.join(scratch, "meminfo")
    open(target, "w").close()
    os.chmod(target, 0o444)
    move_onto(tree, target)
    os.close(tree)
    report({"idmap_error": None, **read_inside(userns_fd, uid, target)})
    while again and sys.stdin.readline():
        report({"idmap_error": None, **read_inside(userns_fd, uid, target)})


def report(out: dict[str, object]) -> None:
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "--again" in sys.argv[4:])
