"""/proc/meminfo and /proc/swaps for a memory limit.

Formats are the kernel's: meminfo's ``show_val_kb`` pads ``Name:`` to 16 columns and the
value to 8; swaps is ``swap_show``'s tab layout. free(1) and psutil take MemAvailable,
Buffers, Cached, SReclaimable, Shmem and the Swap lines from here.
"""

from __future__ import annotations

from collections.abc import Mapping

from guestfs.engine.limits import EffectiveLimits

# meminfo line -> memory.stat key(s) (exact matches; LXCFS's prefix matching lets
# "file" swallow "file_mapped" and "total_rss" swallow "total_rss_huge").
_V2_KEYS: dict[str, tuple[str, ...]] = {
    "Cached": ("file",), "SwapCached": ("swapcached",),
    "Active": ("active_anon", "active_file"), "Inactive": ("inactive_anon", "inactive_file"),
    "Active(anon)": ("active_anon",), "Inactive(anon)": ("inactive_anon",),
    "Active(file)": ("active_file",), "Inactive(file)": ("inactive_file",),
    "Unevictable": ("unevictable",), "Dirty": ("file_dirty",),
    "Writeback": ("file_writeback",), "AnonPages": ("anon",), "Mapped": ("file_mapped",),
    "Shmem": ("shmem",), "KReclaimable": ("slab_reclaimable",), "Slab": ("slab",),
    "SReclaimable": ("slab_reclaimable",), "SUnreclaim": ("slab_unreclaimable",),
    "KernelStack": ("kernel_stack",), "PageTables": ("pagetables",),
    "SecPageTables": ("sec_pagetables",), "Percpu": ("percpu",),
    "AnonHugePages": ("anon_thp",), "ShmemHugePages": ("shmem_thp",),
    "FileHugePages": ("file_thp",), "Zswap": ("zswap",), "Zswapped": ("zswapped",),
}
_V1_KEYS: dict[str, tuple[str, ...]] = {
    "Cached": ("total_cache",), "SwapCached": ("total_swapcached",),
    "Active": ("total_active_anon", "total_active_file"),
    "Inactive": ("total_inactive_anon", "total_inactive_file"),
    "Active(anon)": ("total_active_anon",), "Inactive(anon)": ("total_inactive_anon",),
    "Active(file)": ("total_active_file",), "Inactive(file)": ("total_inactive_file",),
    "Unevictable": ("total_unevictable",), "Dirty": ("total_dirty",),
    "Writeback": ("total_writeback",), "AnonPages": ("total_rss",),
    "Mapped": ("total_mapped_file",), "Shmem": ("total_shmem",),
    "AnonHugePages": ("total_rss_huge",),
}


def kb_line(name: str, kb: int) -> str:
    return f"{name + ':':<16}{kb:>8} kB"


def meminfo_values(lim: EffectiveLimits) -> dict[str, int]:
    """kB values guestfs computes; every other host line is served as the host has it."""
    total = max(1, lim.memory.value // 1024)
    usage = lim.memory_usage.usage if lim.memory_usage else 0
    stat: Mapping[str, int] = lim.memory_usage.stat if lim.memory_usage else {}
    # v1 memory.stat names only for a v1 cgroup; without a cgroup the usage comes from the
    # host's meminfo under v2 names.
    v2 = lim.cgroup_versions.get("memory") != 1
    keys = _V2_KEYS if v2 else _V1_KEYS
    free = max(0, total - usage // 1024)
    out: dict[str, int] = {"MemTotal": total, "MemFree": free, "Buffers": 0}
    for line, ks in keys.items():
        # A key memory.stat does not give (an empty or truncated file, an older kernel)
        # is 0, never the host's value beside the container's MemTotal.
        out[line] = min(total, sum(stat.get(k, 0) for k in ks) // 1024)
    if "SwapCached" not in out:
        out["SwapCached"] = 0
    if not v2:
        # v1 memory.stat has no slab counters. The host's would inflate free's buff/cache
        # (Buffers + Cached + SReclaimable) past the container's total, so say 0.
        out.update({"Slab": 0, "SReclaimable": 0, "SUnreclaim": 0, "KReclaimable": 0})
    pf = "" if v2 else "total_"
    reclaimable = (stat.get(pf + "active_file", 0) + stat.get(pf + "inactive_file", 0)
                   + stat.get("slab_reclaimable", 0)) // 1024
    out["MemAvailable"] = min(total, free + reclaimable)
    swap_total = lim.swap.value // 1024
    out["SwapTotal"] = swap_total
    out["SwapFree"] = min(swap_total, max(0, swap_total - lim.swap_usage.value // 1024))
    return out


def render_meminfo(host_text: str, lim: EffectiveLimits) -> str:
    if not lim.memory_limited:
        return host_text
    values = meminfo_values(lim)
    out = []
    for line in host_text.splitlines():
        name = line.split(":", 1)[0]
        out.append(kb_line(name, values[name]) if name in values and line.endswith(" kB")
                   else line)
    return "\n".join(out) + "\n"


SWAPS_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


def render_swaps(host_text: str, lim: EffectiveLimits) -> str:
    if not lim.memory_limited:
        return host_text
    values = meminfo_values(lim)
    size, used = values["SwapTotal"], values["SwapTotal"] - values["SwapFree"]
    if size <= 0:
        return SWAPS_HEADER
    # swap_show(): the path padded to 40 columns, a tab after the type, an extra tab
    # after numbers below 10000000 so the columns line up.
    name = "none"
    size_pad = "\t" if size < 10000000 else ""
    used_pad = "\t" if used < 10000000 else ""
    return (SWAPS_HEADER + f"{name}{' ' * (40 - len(name))}virtual\t{size}\t{size_pad}"
            f"{used}\t{used_pad}-2\n")
