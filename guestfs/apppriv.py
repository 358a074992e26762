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
"""

from __future__ import annotations

from dataclasses import dataclass

from guestfs.caps import CAP_SYS_ADMIN, drop_capability
from guestfs.oomadj import OomPlan, apply_to_app


class AppSetupError(OSError):
    pass


@dataclass(frozen=True)
class AppSetup:
    keep_caps: bool = False        # --keep-caps: the app keeps CAP_SYS_ADMIN
    oom: OomPlan | None = None


def prepare_app(setup: AppSetup) -> None:
    """In the forked child, after the binds, right before exec."""
    try:
        apply_to_app(setup.oom)
    except OSError as e:
        raise AppSetupError(f"cannot set the app's oom_score_adj: {e.strerror}") from e
    if setup.keep_caps:
        return
    try:
        drop_capability(CAP_SYS_ADMIN)
    except OSError as e:
        raise AppSetupError(f"cannot drop CAP_SYS_ADMIN before starting the app: {e.strerror} "
                            "(give guestfs CAP_SETPCAP too, or run the app with it: "
                            "--keep-caps)") from e
