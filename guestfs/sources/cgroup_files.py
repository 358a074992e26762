"""Pure parsers for cgroup interface files (v1 and v2).

Every parser raises ValueError on text it cannot make sense of; the engine turns that
into a warning for that level and carries on.
"""

from __future__ import annotations

from fractions import Fraction

# PAGE_COUNTER_MAX * PAGE_SIZE on 64-bit with 4 KiB pages: what v1 prints for "no limit".
V1_UNLIMITED = 9223372036854771712
# The kernel's NR_CPUS is at most 8192 on every architecture; a larger cpu id is a corrupt
# file, and building "0-99999999999" as a set would never finish.
MAX_CPU_ID = 8191


def parse_limit_bytes(text: str) -> int | None:
    """``memory.max`` / ``memory.swap.max`` / ``memory.limit_in_bytes``: bytes, None for ``max``."""
    # v1 accepts writing -1 and reports it back as the unlimited value; a negative number
    # read back means a corrupt file, not a limit (parse_counter rejects it).
    return None if text.strip() == "max" else parse_counter(text)


def parse_counter(text: str) -> int:
    """A single non-negative number (``memory.current``, ``memory.usage_in_bytes``)."""
    value = text.strip()
    if not value:
        raise ValueError("empty file")
    n = int(value)
    if n < 0:
        raise ValueError(f"negative value {n}")
    return n


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.stat, cpu.stat, cpuacct.stat). Keys are matched exactly."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            value = int(parts[1])
        except ValueError:
            continue
        # Every counter in these files is unsigned in the kernel; a negative one is a
        # corrupt file, and serving it would give "MemAvailable: -4424061 kB".
        if value >= 0:
            out[parts[0]] = value
    return out


def parse_cpu_max(text: str) -> Fraction | None:
    """v2 ``cpu.max`` (``$MAX $PERIOD``): CPUs as a fraction, None for ``max``."""
    parts = text.split()
    if not parts:
        raise ValueError("empty file")
    if parts[0] == "max":
        return None
    quota = int(parts[0])
    period = int(parts[1]) if len(parts) > 1 else 100000
    if quota <= 0 or period <= 0:
        raise ValueError(f"bad cpu.max {text.strip()!r}")
    return Fraction(quota, period)


def parse_cfs(quota_text: str, period_text: str) -> Fraction | None:
    """v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: CPUs as a fraction, None for -1."""
    quota = int(quota_text.strip())
    if quota < 0:
        return None
    period = int(period_text.strip())
    if quota == 0 or period <= 0:
        raise ValueError(f"bad cfs quota/period {quota}/{period}")
    return Fraction(quota, period)


def _cpu_id(text: str, chunk: str) -> int:
    # ASCII digits only: int() also takes "٣", "+3", " 3" and "1_0".
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_CPU_ID:
        raise ValueError(f"bad cpu {chunk!r}")
    return int(text)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Kernel cpu list format (``0-3,8,10-11``), sorted and unique. Empty text gives ()."""
    cpus: set[int] = set()
    for chunk in text.strip().split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        if "-" in chunk:
            lo_s, hi_s = chunk.split("-", 1)
            lo, hi = _cpu_id(lo_s, chunk), _cpu_id(hi_s, chunk)
            if hi < lo:
                raise ValueError(f"bad cpu range {chunk!r}")
            cpus.update(range(lo, hi + 1))
        else:
            cpus.add(_cpu_id(chunk, chunk))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """Inverse of parse_cpu_list, with ranges collapsed the way the kernel prints them."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
