"""Small facts about processes and descriptors that tests of several tiers check."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def open_fds() -> int:
    """How many descriptors this process holds (a leak shows as a difference)."""
    return len(os.listdir("/proc/self/fd"))
