"""What the container is using, as values, and the pure parsers of the files they come
from (cpuacct.usage_all, io.stat, blkio's recursive files, PSI, /proc/<pid>/stat). No I/O: the
reads are in usage.py, and the renderers import the types from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

USER_HZ = 100  # what /proc/stat counts in on every Linux ABI, whatever CONFIG_HZ is


@dataclass(frozen=True)
class CpuUsage:
    user_usec: int
    system_usec: int
    file: str


def parse_cpuacct_usage_all(text: str) -> tuple[int, int]:
    """v1 ``cpuacct.usage_all``: ``cpu user system`` header, then ns per host CPU."""
    user = system = 0
    for line in text.splitlines()[1:]:
        parts = line.split()
        # ASCII digits only: a negative or non-ASCII counter is dropped, never served.
        if len(parts) == 3 and all(p.isascii() and p.isdigit() for p in parts):
            user += int(parts[1])
            system += int(parts[2])
    return user // 1000, system // 1000


@dataclass(frozen=True)
class TaskCounts:
    running: int     # threads in R
    blocked: int     # threads in D
    total: int       # all threads


def stat_fields(stat_text: str) -> list[str]:
    """/proc/<pid>/stat from field 3 (state) on; the command name before it may hold spaces
    and parentheses, so split after its last ')'."""
    return stat_text[stat_text.rindex(")") + 2:].split()


def task_state(stat_text: str) -> str:
    return stat_fields(stat_text)[0]


@dataclass(frozen=True)
class ContainerAge:
    start: float     # host uptime (s) at which the container began
    source: str      # what was measured

    def seconds(self, host_uptime: float) -> float:
        return max(0.0, host_uptime - self.start)


@dataclass(frozen=True)
class IoCounters:
    rbytes: int = 0
    wbytes: int = 0
    rios: int = 0
    wios: int = 0
    dbytes: int = 0
    dios: int = 0


def _uint(text: str) -> int | None:
    """A counter of ASCII digits, or None: str.isdigit() also says yes to "²", which
    int() refuses (a corrupt io.stat raised ValueError through every diskstats read)."""
    return int(text) if text.isascii() and text.isdigit() else None


def parse_io_stat(text: str) -> dict[tuple[int, int], IoCounters]:
    """v2 ``io.stat``: ``MAJ:MIN rbytes=.. wbytes=.. rios=.. wios=.. dbytes=.. dios=..``."""
    out: dict[tuple[int, int], IoCounters] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or ":" not in parts[0]:
            continue
        try:
            major, minor = (int(x) for x in parts[0].split(":", 1))
        except ValueError:
            continue
        kv: dict[str, int] = {}
        for p in parts[1:]:
            k, _, v = p.partition("=")
            n = _uint(v)
            if n is not None:
                kv[k] = n
        out[(major, minor)] = IoCounters(**{k: kv.get(k, 0) for k in
                                            ("rbytes", "wbytes", "rios", "wios", "dbytes",
                                             "dios")})
    return out


def parse_blkio_recursive(bytes_text: str, ios_text: str) -> dict[tuple[int, int], IoCounters]:
    """v1 ``blkio.throttle.io_service_bytes_recursive`` + ``io_serviced_recursive``
    (``MAJ:MIN Read N`` / ``Write`` / ``Discard`` lines, then ``Total``)."""
    acc: dict[tuple[int, int], dict[str, int]] = {}
    for text, suffix in ((bytes_text, "bytes"), (ios_text, "ios")):
        for line in text.splitlines():
            parts = line.split()
            if len(parts) != 3 or ":" not in parts[0] or _uint(parts[2]) is None:
                continue
            try:
                dev = tuple(int(x) for x in parts[0].split(":", 1))
            except ValueError:
                continue
            op = {"Read": "r", "Write": "w", "Discard": "d"}.get(parts[1])
            if op is None:
                continue
            acc.setdefault(dev, {})[op + suffix] = _uint(parts[2])  # type: ignore[index]
    return {dev: IoCounters(**kv) for dev, kv in acc.items()}  # type: ignore[misc]


_PRESSURE_LINE = re.compile(r"(some|full) avg10=\d+\.\d\d avg60=\d+\.\d\d avg300=\d+\.\d\d "
                            r"total=\d+", re.ASCII)


def valid_pressure(text: str | None) -> str | None:
    """``text`` if it has the kernel's PSI shape, else None: the cgroup's file is served
    as it is, so a corrupt one must not reach a reader (the host's is served instead)."""
    if text is None:
        return None
    lines = text.splitlines()
    if not lines or not all(_PRESSURE_LINE.fullmatch(ln) for ln in lines):
        return None
    return text if text.endswith("\n") else text + "\n"
