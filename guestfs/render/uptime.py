"""/proc/uptime: the container's age and its idle time (``%.2f %.2f``)."""

from __future__ import annotations

from guestfs.usage import CpuUsage


def render_uptime(age_seconds: float, n: int, usage: CpuUsage | None) -> str:
    busy = (usage.user_usec + usage.system_usec) / 1e6 if usage else 0.0
    idle = max(0.0, age_seconds * n - busy)
    return f"{age_seconds:.2f} {idle:.2f}\n"
