"""Host-wide facts from the host's own /proc and /sys (psutil-style plain parsers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from guestfs.sources.cgroup_files import parse_cpu_list
from guestfs.sources.host_root import HostRoot


def parse_uptime(text: str) -> float:
    """/proc/uptime's first field (seconds since boot); ValueError on a malformed file."""
    parts = text.split()
    if not parts:
        raise ValueError("empty /proc/uptime")
    return float(parts[0])


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as ``{name: value}``; values in kB as printed (HugePages_* are counts)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            out[name.strip()] = int(parts[0])
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class HostInfo:
    mem_total: int        # bytes
    swap_total: int       # bytes
    online_cpus: tuple[int, ...]
    meminfo: Mapping[str, int] = field(default_factory=dict)  # kB, as /proc/meminfo says


class HostInfoError(RuntimeError):
    pass


def read_host_info(host: HostRoot) -> HostInfo:
    meminfo = parse_meminfo(host.read_text("/proc/meminfo"))
    if meminfo.get("MemTotal", 0) <= 0:
        raise HostInfoError("/proc/meminfo has no usable MemTotal")
    text = host.try_read_text("/sys/devices/system/cpu/online")
    online: tuple[int, ...] = ()
    if text is not None:
        try:
            online = parse_cpu_list(text)
        except ValueError:
            online = ()
    if not online:
        # No sysfs under this root: count the processors the host /proc/stat lists.
        stat = host.try_read_text("/proc/stat") or ""
        online = tuple(
            int(line.split()[0][3:])
            for line in stat.splitlines()
            if line.startswith("cpu") and line[3:4].isdigit()
        )
    if not online:
        online = (0,)
    return HostInfo(
        mem_total=meminfo["MemTotal"] * 1024,
        swap_total=meminfo.get("SwapTotal", 0) * 1024,
        online_cpus=online,
        meminfo=MappingProxyType(meminfo),
    )
