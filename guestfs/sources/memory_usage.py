"""What a memory cgroup level is charged: memory and swap usage, with the file behind each.

Pure, like the pressure and I/O lookups in usage.py: parsed from the files the snapshot
read (memory.current / memory.usage_in_bytes and memory.stat, the swap counters). With no
memory cgroup in sight, the host's own meminfo stands in. The engine names the level (the
one whose limit applies, and the leaf) and keeps the warnings in EffectiveLimits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from guestfs.sources.cgroup_files import parse_counter, parse_flat_keyed
from guestfs.sources.host_proc import HostInfo
from guestfs.sources.provenance import HOST, Source
from guestfs.sources.snapshot import Hierarchy, Level


@dataclass(frozen=True)
class MemoryUsage:
    """Charge of one cgroup level: memory.current/usage_in_bytes plus its memory.stat."""

    usage: int
    stat: Mapping[str, int]
    source: Source


def memory_usage_at(h: Hierarchy, level: Level, warnings: list[str]) -> MemoryUsage | None:
    """The charge of ``level`` of the memory hierarchy ``h``; None (and why, appended to
    ``warnings``) when its usage file is missing or unparseable."""
    name = "memory.current" if h.version == 2 else "memory.usage_in_bytes"
    text = level.files.get(name)
    if text is None:
        warnings.append(f"{level.file_path(name)}: missing; no usage at this level")
        return None
    try:
        usage = parse_counter(text)
    except ValueError as e:
        warnings.append(level.unparseable(name, e))
        return None
    stat = parse_flat_keyed(level.files.get("memory.stat") or "")
    return MemoryUsage(usage, MappingProxyType(stat), level.source(name))


# memory.stat (v2 names) from the host's own meminfo lines.
_HOST_STAT_LINES = {"file": "Cached", "active_file": "Active(file)",
                    "inactive_file": "Inactive(file)", "active_anon": "Active(anon)",
                    "inactive_anon": "Inactive(anon)", "anon": "AnonPages", "shmem": "Shmem",
                    "file_mapped": "Mapped", "slab_reclaimable": "SReclaimable"}


def host_memory_usage(host: HostInfo) -> MemoryUsage | None:
    """With no memory cgroup in sight (gVisor's sandbox, a host without the controller),
    the best usage there is: the (sandbox's) own meminfo."""
    mi = host.meminfo
    if "MemTotal" not in mi or "MemFree" not in mi:
        return None
    stat = {k: mi[line] * 1024 for k, line in _HOST_STAT_LINES.items() if line in mi}
    return MemoryUsage((mi["MemTotal"] - mi["MemFree"]) * 1024, MappingProxyType(stat),
                       Source(HOST, "/proc/meminfo", note="MemTotal - MemFree: no memory cgroup"))


def swap_usage_name(h: Hierarchy) -> str:
    """The file that counts swap usage in ``h``: without it there is no swap accounting."""
    return "memory.swap.current" if h.version == 2 else "memory.memsw.usage_in_bytes"


def swap_usage_at(h: Hierarchy, level: Level, warnings: list[str]
                  ) -> tuple[int, Source] | None:
    """Bytes of swap ``level`` uses, with their file; None (and why, appended to
    ``warnings``) when its counters are missing or unparseable. v1 counts memory+swap
    together (memsw), so its memory usage is taken off."""
    name = swap_usage_name(h)
    try:
        used = parse_counter(level.files.get(name) or "")
        if h.version == 1:
            used -= parse_counter(level.files.get("memory.usage_in_bytes") or "")
    except ValueError as e:
        warnings.append(level.unparseable(name, e))
        return None
    return max(0, used), level.source(name)
