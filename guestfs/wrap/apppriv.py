"""What the app under `guestfs run` starts with: none of the privilege guestfs needed.

guestfs needs CAP_SYS_ADMIN (mount(2) for FUSE and the binds); the app must not keep it,
or it could `umount /proc/meminfo` and read the host's, or mount anything. It is dropped
from all five capability sets after the binds and before exec. Why not lock the binds
with a user namespace instead: an app in a new user namespace loses every capability
over the host's resources (network, sysctls, devices), not only CAP_SYS_ADMIN, and on a
runtime that forbids nested user namespaces it would not start at all. The bounding set
stops the capability from coming back through setuid-root or file-capability binaries,
so NoNewPrivs is not needed for that, and it is not set: it would break the setuid
helpers (su, sudo, ping) an app may rely on, which is the app's business, not ours.
The bounding set is also cut down to the permitted set, so that the app's exec (root's
refills the permitted set from the bounding set) never gains a capability `run` lacked.

The container's own boot clock (timens.py) needs two capabilities: unshare(CLONE_NEWTIME)
and entering the namespace are CAP_SYS_ADMIN's, but writing its offsets is
CAP_SYS_TIME's (measured on Linux 6.18; kernel/time/namespace.c). Kubernetes' drop ALL +
add SYS_ADMIN, SETPCAP has no SYS_TIME: the app then keeps the host's clock, said once
at -v, as with a kernel that has no time namespaces.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

from guestfs.sources.timens import enter_container_boottime
from guestfs.system.caps import (
    CAP_SETPCAP,
    CAP_SYS_ADMIN,
    CAP_SYS_TIME,
    drop_capability,
    effective_caps,
    limit_bounding_to,
    permitted_caps,
)
from guestfs.system.oneline import os_error_line
from guestfs.wrap.oomadj import OomPlan, apply_to_app

log = logging.getLogger("guestfs.run")


class AppSetupError(OSError):
    pass


@dataclass(frozen=True)
class AppSetup:
    keep_caps: bool = False        # --keep-caps: the app keeps CAP_SYS_ADMIN
    oom: OomPlan | None = None
    # The served /proc/uptime whose age becomes the app's boot clock (timens.py); None
    # with --host-clock.
    uptime_source: str | None = None


def container_clock_source(uptime: str, host_clock: bool) -> str | None:
    """``uptime`` (the served /proc/uptime) if the app can get the container's boot clock
    from it, else None, with the reason once at -v."""
    if host_clock:
        return None
    if not os.path.exists("/proc/self/ns/time"):
        log.debug("the app keeps the host's boot clock: this kernel has no time "
                  "namespaces (Linux >= 5.6)")
        return None
    missing = {CAP_SYS_ADMIN, CAP_SYS_TIME} - effective_caps()
    if missing:
        log.debug("the app keeps the host's boot clock (ps ELAPSED is counted from the "
                  "host's boot): a time namespace's offsets need CAP_SYS_TIME, which this "
                  "container lacks; add SYS_TIME to its capabilities for the container's "
                  "own clock, or pass --host-clock")
        return None
    return uptime


def _enter_container_clock(uptime_source: str) -> None:
    """Give the app the container's boot clock, so that ps's ELAPSED (served uptime minus
    the kernel's start times) is right. A kernel or sandbox without time namespaces keeps
    the host's clock, with a warning: everything else works."""
    try:
        with open(uptime_source, "rb") as f:
            age = float(f.read().split()[0])
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        if age < now - 1:                # the view's uptime is not the host's
            enter_container_boottime(age, now)
    except (OSError, ValueError, IndexError) as e:
        why = os_error_line(e) if isinstance(e, OSError) else str(e)
        print(f"guestfs run: warning: the app keeps the host's boot clock ({why}); "
              "ps ELAPSED will not match its uptime", file=sys.stderr)


def prepare_app(setup: AppSetup) -> None:
    """In the forked child, after the binds, right before exec."""
    if setup.uptime_source is not None:
        _enter_container_clock(setup.uptime_source)   # needs CAP_SYS_ADMIN: first
    try:
        apply_to_app(setup.oom)
    except OSError as e:
        raise AppSetupError(f"cannot set the app's oom_score_adj: {e.strerror}") from e
    if not setup.keep_caps:
        try:
            drop_capability(CAP_SYS_ADMIN)
        except OSError as e:
            raise AppSetupError(f"cannot drop CAP_SYS_ADMIN before starting the app: "
                                f"{e.strerror} (give guestfs CAP_SETPCAP too, or run the "
                                "app with it: --keep-caps)") from e
    if CAP_SETPCAP in effective_caps():   # without it the bounding set cannot shrink
        try:
            limit_bounding_to(permitted_caps())
        except OSError as e:
            raise AppSetupError(f"cannot limit the app's bounding set to its permitted "
                                f"set: {e.strerror}") from e
