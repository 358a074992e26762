"""/proc/diskstats with the cgroup's own I/O (v2 io.stat, v1 blkio recursive files).

Each host line keeps its device numbers, name and column count (14, 18 with discards since
4.18, 20 with flushes since 5.5); the counters the cgroup accounts are replaced and the
times, merges and in-flight counts, which it does not account, are 0. LXCFS serves host
numbers on v2 (its issue #653).
"""

from __future__ import annotations

from collections.abc import Mapping

from guestfs.sources.usage_parsers import IoCounters

SECTOR = 512


def render_diskstats(host_text: str, io: Mapping[tuple[int, int], IoCounters] | None) -> str:
    if io is None:
        return host_text
    out = []
    for line in host_text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        try:
            major, minor = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        ncounters = len(parts) - 3
        c = io.get((major, minor), IoCounters())
        values = [0] * ncounters
        values[0] = c.rios
        values[2] = c.rbytes // SECTOR
        if ncounters > 6:
            values[4] = c.wios
            values[6] = c.wbytes // SECTOR
        if ncounters >= 15:
            values[11] = c.dios
            values[13] = c.dbytes // SECTOR
        out.append(f"{major:>4} {minor:>7} {parts[2]} " + " ".join(map(str, values)))
    return "\n".join(out) + "\n"
