"""/proc/uptime: the container's age and the idle time of its CPU clock (``%.2f %.2f``).

The idle field is the sum over the view's CPUs, as the kernel's is over all CPUs, and it
comes from the same CpuClock as /proc/stat so the two files agree.
"""

from __future__ import annotations


def render_uptime(age_seconds: float, idle_seconds: float) -> str:
    return f"{age_seconds:.2f} {max(0.0, idle_seconds):.2f}\n"
