"""What a running daemon reports about itself: the fallbacks it took (a bad cgroup file, a
vanished cgroup, a render that failed), served as a JSON file at the mount's root and read
by `guestfs explain --mount MOUNTPOINT`, so "why does free say this?" also covers "is the
daemon degrading?"."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

STATUS_PATH = "/.guestfs-status"


def read_status(mountpoint: str, timeout: float = 5.0) -> dict[str, Any]:
    """The status of the daemon serving ``mountpoint``. Read by a child process with a
    timeout: a stopped daemon blocks every reader of its mount, and explain must not hang
    with it. Raises OSError with a one-line reason."""
    reader = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
    path = mountpoint.rstrip("/") + STATUS_PATH
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", reader, path],
                             capture_output=True, timeout=timeout, close_fds=True, check=False)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"{path}: no answer within {timeout:g}s (daemon stopped?)") from e
    if out.returncode != 0:
        last = out.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(f"{path}: {last[-1] if last else 'unreadable'} "
                      "(not a guestfs mount, or an older daemon)")
    try:
        data = json.loads(out.stdout)
    except ValueError as e:
        raise OSError(f"{path}: not JSON: {e}") from e
    if not isinstance(data, dict):
        raise OSError(f"{path}: not a JSON object")
    return data


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
