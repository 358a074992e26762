"""What `guestfs run` does first, before its app side (run.py) is even loaded: where it
mounts, its OOM shield, its share of the mount, and the daemon started. The daemon then
loads and mounts on one CPU while run loads the rest on the other (rundaemon.py)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from guestfs.daemon import mountlock
from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.wrap import runspace, supervise
from guestfs.wrap.daemon_process import Entry, ForkedDaemon, fork_daemon
from guestfs.wrap.oomadj import OomPlan, shield_wrapper
from guestfs.wrap.runspace import RunSpace


@dataclass(frozen=True)
class RunStart:
    space: RunSpace
    oom: OomPlan | None
    mount_args: list[str]        # every daemon of this run is started with these
    users_fd: int                # this run's share of the mount (supervise.join_users)
    # The daemon forked for a mount that was not there, and the pipe it tells on once it
    # serves (rundaemon.wait_ready); None where a live mount is reused.
    pending: tuple[ForkedDaemon, int] | None

    @property
    def mountpoint(self) -> str:
        return self.space.mountpoint


def begin(mp: str, mount_args: list[str], explicit_mountpoint: bool,
          entry: Entry) -> RunStart:
    """Everything the daemon needs before it starts, then the daemon itself, forked to
    run `guestfs mount` through ``entry`` (cli.mount.alone)."""
    # First, while single-threaded: a private space is a mount namespace of our own.
    space = runspace.choose(os.path.abspath(mp), explicit_mountpoint)
    if space.lock_dir is not None:
        mountlock.use_lock_dir(space.lock_dir)
    oom = shield_wrapper()   # before the daemon: it inherits the shield
    # A daemon run starts lives while any run uses it (docs/run.md, "Shared mounts").
    mount_args = [*mount_args, *space.daemon_args, "--exit-when-unused"]
    users = supervise.join_users(space.mountpoint)
    try:
        _load_shared()
        pending = None if is_guestfs_mount(space.mountpoint) else \
            fork_daemon(space.mountpoint, mount_args, entry, space.daemon_env())
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(users)
        raise
    return RunStart(space, oom, mount_args, users, pending)


def _load_shared() -> None:
    """What run's app side and its daemon both load: loaded once here, before the fork,
    rather than by each after it (a pod with a CPU limit pays for both)."""
    import socket  # noqa: F401

    from guestfs.sources import cgroup_files, host_proc, timens  # noqa: F401
