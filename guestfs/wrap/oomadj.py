"""Whom the OOM killer picks under `guestfs run`: the app first, then the daemon and the
wrapper last, so a memory-hungry app never costs its readers their files.

Lowering oom_score_adj below the lowest value this process was given needs
CAP_SYS_RESOURCE, which containers (and root on some machines) lack; raising it never
does. So the wrapper first tries to lower itself (the daemon it starts inherits that) and
leaves the app's value as it was; where it may not, it raises the app's value instead."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("guestfs.run")
OOM_LAST = -999   # the OOM killer's last choice, yet still killable (-1000 would never be)
OOM_FIRST = 1000
_SELF = "/proc/self/oom_score_adj"


@dataclass(frozen=True)
class OomPlan:
    wrapper: int      # the value run (and any daemon it starts) now has
    app: int          # the value the app must be given before exec


def read_adj(path: str = _SELF) -> int:
    with open(path) as f:
        return int(f.read().strip())


def write_adj(value: int, path: str = _SELF) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


def shield_wrapper(path: str = _SELF) -> OomPlan | None:
    """Make this process (and daemons it will start) the OOM killer's last choice, and say
    what the app must get. None where the kernel has no oom_score_adj (nothing to do)."""
    try:
        original = read_adj(path)
    except (OSError, ValueError):
        return None
    if original <= OOM_LAST:
        return OomPlan(original, original)
    try:
        write_adj(OOM_LAST, path)
        return OomPlan(OOM_LAST, original)  # the app gets back what it would have had
    except OSError as e:
        log.debug("cannot lower oom_score_adj to %d (%s): raising the app's instead",
                  OOM_LAST, e.strerror)
    if original >= OOM_FIRST:
        log.warning("oom_score_adj is already %d: the OOM killer may pick the guestfs "
                    "daemon before the app", original)
    return OomPlan(original, OOM_FIRST)


def apply_to_app(plan: OomPlan | None, path: str = _SELF) -> None:
    """In the app's process before exec: its oom_score_adj per ``plan`` (raising, or
    restoring what the wrapper had before lowering itself, which needs no privilege)."""
    if plan is None or plan.app == plan.wrapper:
        return
    write_adj(plan.app, path)
