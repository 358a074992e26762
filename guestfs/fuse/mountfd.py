"""A FUSE mount and its /dev/fuse descriptor, made the way libfuse makes them.

With CAP_SYS_ADMIN: /dev/fuse opened here and mount(2)ed read-only, nosuid, nodev with
``fd=N,rootmode=40000,user_id=U,group_id=G[,allow_other][,default_permissions]``, type
``fuse.<subtype>`` (plain ``fuse`` where subtypes are refused: gVisor). Without it:
the setuid ``fusermount3`` mounts and sends the descriptor back over the socket named in
``_FUSE_COMMFD`` (SCM_RIGHTS), as libfuse's fuse_mount_fusermount does. Unmounting goes
the same way back: umount2(MNT_DETACH|UMOUNT_NOFOLLOW), or ``fusermount3 -u -z``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from dataclasses import dataclass

from guestfs.system import sysmount

MS_NOSUID, MS_NODEV = 2, 4
# Only these directories are searched for fusermount3, never the working directory or a
# PATH the caller controls: it is run as a setuid helper with our mount point.
HELPER_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
HELPER_TIMEOUT = 30.0


class MountFailed(OSError):
    pass


@dataclass(frozen=True)
class MountSpec:
    mountpoint: str
    fsname: str = "guestfs"
    subtype: str = "guestfs"
    allow_other: bool = False
    default_permissions: bool = True
    readonly: bool = True


@dataclass(frozen=True)
class Mounted:
    fd: int              # the connection (close-on-exec)
    mountpoint: str
    via: str             # "mount(2)" or the helper's path


def mount(spec: MountSpec) -> Mounted:
    """Mount ``spec`` by mount(2) where this process may, else through fusermount3."""
    try:
        return mount_direct(spec)
    except PermissionError:
        return mount_fusermount(spec)


def _options(spec: MountSpec, fd: int) -> str:
    opts = [f"fd={fd}", "rootmode=40000", f"user_id={os.getuid()}", f"group_id={os.getgid()}"]
    if spec.allow_other:
        opts.append("allow_other")
    if spec.default_permissions:
        opts.append("default_permissions")
    return ",".join(opts)


def mount_direct(spec: MountSpec) -> Mounted:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    flags = (sysmount.MS_RDONLY if spec.readonly else 0) | MS_NOSUID | MS_NODEV
    try:
        try:
            sysmount.mount(spec.fsname, spec.mountpoint, f"fuse.{spec.subtype}", flags,
                           _options(spec, fd))
        except OSError as e:
            if e.errno != errno.ENODEV:
                raise
            sysmount.mount(spec.fsname, spec.mountpoint, "fuse", flags, _options(spec, fd))
    except OSError as e:
        os.close(fd)
        if e.errno == errno.EPERM:
            raise PermissionError(e.errno, e.strerror) from None
        raise
    return Mounted(fd, spec.mountpoint, "mount(2)")


def fusermount() -> str:
    import shutil  # only without CAP_SYS_ADMIN: shutil pulls zlib, bz2 and lzma in
    helper = shutil.which("fusermount3", path=HELPER_PATH)
    if helper is None:
        raise MountFailed(errno.ENOENT, "no fusermount3 (package fuse3) to mount without "
                          "CAP_SYS_ADMIN")
    return helper


def mount_fusermount(spec: MountSpec) -> Mounted:
    import socket
    helper = fusermount()
    opts = ["ro" if spec.readonly else "rw", f"fsname={spec.fsname}",
            f"subtype={spec.subtype}"]
    if spec.allow_other:
        opts.append("allow_other")
    if spec.default_permissions:
        opts.append("default_permissions")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        try:
            done = subprocess.run(
                [helper, "-o", ",".join(opts), "--", spec.mountpoint],
                env={"PATH": HELPER_PATH, "_FUSE_COMMFD": str(theirs.fileno())},
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                timeout=HELPER_TIMEOUT, check=False)
        finally:
            theirs.close()
        why = done.stderr.decode(errors="replace").strip().splitlines()
        ours.settimeout(1.0)
        fds: list[int] = []
        with contextlib.suppress(OSError):
            _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if done.returncode != 0 or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise MountFailed(errno.EPERM, f"{helper} failed (exit {done.returncode})"
                          + (f": {why[-1]}" if why else ""))
    os.set_inheritable(fds[0], False)
    return Mounted(fds[0], spec.mountpoint, helper)


def unmount(m: Mounted) -> None:
    """Detach ``m`` lazily, as libfuse does on a clean stop, never through a symlink
    planted at the mount point."""
    if m.via == "mount(2)":
        try:
            sysmount.umount_nofollow(m.mountpoint)
        except OSError as e:
            if e.errno != errno.EINVAL:   # no longer a mount point: already gone
                raise
        return
    subprocess.run([m.via, "-u", "-z", "--", m.mountpoint], env={"PATH": HELPER_PATH},
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=HELPER_TIMEOUT, check=False)
