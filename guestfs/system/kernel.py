"""The running kernel's release, and what it says of the FUSE features guestfs needs.

A release is all there is to go on before a connection exists: the protocol minor the
kernel speaks arrives only with its INIT, after the mount, too late to choose how to
mount. gVisor reports 4.4.0, which is what its FUSE offers too.
"""

from __future__ import annotations

import os

RESEND_KERNEL = (6, 9)       # FUSE_NOTIFY_RESEND, protocol 7.40


def kernel_release(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``release`` (default: this kernel's); (0, 0) if unreadable."""
    text = release if release is not None else os.uname().release
    parts = (text.split("-", 1)[0].split(".") + ["0"])[:2]
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def kernel_resends(release: str | None = None) -> bool:
    """The kernel can be asked to send again what a dead FUSE server had read and never
    answered, so a successor may serve its connection (daemon/held.py)."""
    return kernel_release(release) >= RESEND_KERNEL
