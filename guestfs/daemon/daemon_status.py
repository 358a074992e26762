"""What a running daemon reports about itself: the fallbacks it took (a bad cgroup file, a
vanished cgroup, a render that failed), served as a JSON file at the mount's root and read
by `guestfs explain --mount MOUNTPOINT`, so "why does free say this?" also covers "is the
daemon degrading?"."""

from __future__ import annotations

import os
from typing import Any

# The status file sits at the root of every layout; mountpoint's liveness probe reads it.
from guestfs.daemon.mountpoint import STATUS_PATH, probe_mount

__all__ = ["STATUS_PATH", "StatusError", "format_status", "read_status"]


class StatusError(OSError):
    """No daemon's status at a mountpoint: one line saying why."""

    def __str__(self) -> str:
        return str(self.strerror if self.strerror is not None else self.args[0])


def read_status(mountpoint: str, timeout: float = 5.0) -> dict[str, Any]:
    """The status of the daemon serving ``mountpoint``. Read by a child process with a
    timeout (mountpoint.probe_mount): a stopped daemon blocks every reader of its mount, and
    explain must not hang with it. Raises OSError with a one-line reason."""
    path = mountpoint.rstrip("/") + STATUS_PATH
    err, data = probe_mount(mountpoint.rstrip("/") or "/", STATUS_PATH, timeout, 1 << 20)
    if err:
        raise StatusError(err, f"no guestfs daemon serves it ({path}: {os.strerror(err)}); "
                               "give the mount point of a running guestfs mount (a daemon "
                               "older than this guestfs has no status file)")
    import json  # explain's: the daemon itself never reads a status

    try:
        status = json.loads(data)
    except ValueError as e:
        raise StatusError(f"{path}: not JSON ({getattr(e, 'msg', e)})") from e
    if not isinstance(status, dict):
        raise StatusError(f"{path}: not a JSON object")
    return status


def format_status(mountpoint: str, status: dict[str, Any]) -> str:
    fallbacks = status.get("fallbacks") or {}
    lines = [f"daemon serving {mountpoint}: pid {status.get('pid')}, view "
             f"{status.get('view')}, cache ttl {status.get('cache_ttl')}s, "
             f"{status.get('fallback_total', 0)} fallbacks"]
    for cause, count in sorted(fallbacks.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:>6} x {cause}")
    refusals = status.get("refusals") or {}
    if refusals:
        lines.append(f"reads refused (EACCES): {sum(refusals.values())}")
        for cause, count in sorted(refusals.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {count:>6} x {cause}")
    return "\n".join(lines) + "\n"
