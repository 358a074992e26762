"""/proc/loadavg for the container: the kernel's fixed-point EWMA over its own tasks.

The kernel samples every 5 s (LOAD_FREQ) the runnable + uninterruptible tasks and folds
them into three averages with FSHIFT=11 fixed point (kernel/sched/loadavg.c).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FSHIFT = 11
FIXED_1 = 1 << FSHIFT
EXP_1, EXP_5, EXP_15 = 1884, 2014, 2037
SAMPLE_SECONDS = 5.0


def calc_load(load: int, exp: int, active: int) -> int:
    newload = load * exp + active * (FIXED_1 - exp)
    if active >= load:
        newload += FIXED_1 - 1
    return newload // FIXED_1


@dataclass
class LoadAverage:
    """avenrun[] of one container: fed by a sampler every SAMPLE_SECONDS."""

    avenrun: list[int] = field(default_factory=lambda: [0, 0, 0])

    def sample(self, nr_active: int) -> None:
        active = nr_active * FIXED_1
        self.avenrun = [calc_load(a, e, active)
                        for a, e in zip(self.avenrun, (EXP_1, EXP_5, EXP_15), strict=True)]

    @classmethod
    def single_sample(cls, nr_active: int) -> LoadAverage:
        """What a one-shot reader (guestfs show) serves: the load had it been constant."""
        return cls([nr_active * FIXED_1] * 3)


def _fmt(x: int) -> str:
    x += FIXED_1 // 200  # get_avenrun(..., FIXED_1/200, 0): round to 2 decimals
    return f"{x >> FSHIFT}.{((x & (FIXED_1 - 1)) * 100) >> FSHIFT:02d}"


def render_loadavg(host_text: str, load: LoadAverage, running: int, total: int,
                   last_pid: int | None = None) -> str:
    # The last field is the last pid allocated in the container's pid namespace; without
    # it, the host file's (the daemon's namespace, right when they share one).
    parts = host_text.split()
    if last_pid is None:
        last_pid = int(parts[4]) if len(parts) >= 5 and parts[4].isdigit() else 0
    a, b, c = (_fmt(x) for x in load.avenrun)
    return f"{a} {b} {c} {max(1, running)}/{max(1, total)} {last_pid}\n"
