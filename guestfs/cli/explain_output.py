"""`guestfs explain`'s output: every effective number with the file and cgroup level behind
it, as text or JSON (docs/explain-json.md)."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from guestfs.engine.limits import EffectiveLimits
from guestfs.engine.provenance import Candidate, Resolved
from guestfs.sources.cgroup_files import format_cpu_list
from guestfs.sources.memory_usage import MemoryUsage

JSON_SCHEMA_VERSION = 1


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _cpus(q: Fraction | None) -> str:
    if q is None:
        return "none"
    return f"{float(q):g} CPUs"


def _usage_json(u: MemoryUsage | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {"bytes": u.usage, "source": u.source.to_json()}


def _considered(r: Resolved[Any], encode: Any = lambda v: v) -> list[dict[str, Any]]:
    return [{"value": None if c.value is None else encode(c.value),
             "source": c.source.to_json()} for c in r.considered]


def _fraction(q: Fraction | None) -> dict[str, Any] | None:
    if q is None:
        return None
    return {"cpus": float(q), "numerator": q.numerator, "denominator": q.denominator}


def to_json(lim: EffectiveLimits) -> dict[str, Any]:
    """Stable keys, documented in docs/explain-json.md."""
    return {
        "schema": JSON_SCHEMA_VERSION,
        "pid": lim.pid,
        "cgroup_versions": dict(lim.cgroup_versions),
        "host": {
            "mem_total_bytes": lim.host.mem_total,
            "swap_total_bytes": lim.host.swap_total,
            "online_cpus": list(lim.host.online_cpus),
        },
        "memory": {
            "limit_bytes": lim.memory.value,
            "limited": lim.memory.limited,
            "source": lim.memory.source.to_json(),
            "considered": _considered(lim.memory),
            "usage": _usage_json(lim.memory_usage),
            "leaf_usage": _usage_json(lim.leaf_memory_usage),
        },
        "swap": {
            "limit_bytes": lim.swap.value,
            "limited": lim.swap.limited,
            "source": lim.swap.source.to_json(),
            "considered": _considered(lim.swap),
            "usage_bytes": lim.swap_usage.value,
            "usage_source": lim.swap_usage.source.to_json(),
        },
        "cpu": {
            "count": lim.cpu_count.value,
            "limited": lim.cpu_count.limited,
            "source": lim.cpu_count.source.to_json(),
            "rounding": lim.cpu_rounding,
            "visible_cpus": list(lim.visible_cpus),
            "quota": _fraction(lim.cpu_quota.value),
            "quota_source": lim.cpu_quota.source.to_json(),
            "quota_considered": _considered(lim.cpu_quota, _fraction),
            "cpuset": list(lim.cpuset.value),
            "cpuset_source": lim.cpuset.source.to_json(),
        },
        "warnings": list(lim.warnings),
    }


def json_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def _candidate_line(c: Candidate[Any], fmt: Any) -> str:
    value = "no limit" if c.value is None else fmt(c.value)
    return f"    {value:<14} {c.source.describe()}"


def to_text(lim: EffectiveLimits) -> str:
    rows: list[tuple[str, str, str]] = []
    mem = lim.memory
    rows.append(("memory limit", human_bytes(mem.value) + ("" if mem.limited else " (host)"),
                 mem.source.describe()))
    if lim.memory_usage is not None:
        rows.append(("memory usage", human_bytes(lim.memory_usage.usage),
                     lim.memory_usage.source.describe()))
    if lim.leaf_memory_usage is not None and lim.leaf_memory_usage is not lim.memory_usage:
        rows.append(("  leaf usage", human_bytes(lim.leaf_memory_usage.usage),
                     lim.leaf_memory_usage.source.describe()))
    rows.append(("swap limit", human_bytes(lim.swap.value), lim.swap.source.describe()))
    rows.append(("swap usage", human_bytes(lim.swap_usage.value),
                 lim.swap_usage.source.describe()))
    rows.append(("cpu count", f"{lim.cpu_count.value} ({lim.cpu_rounding})",
                 lim.cpu_count.source.describe()))
    rows.append(("visible cpus", format_cpu_list(lim.visible_cpus) or "-", "first N of cpuset"))
    rows.append(("cpu quota", _cpus(lim.cpu_quota.value), lim.cpu_quota.source.describe()))
    rows.append(("cpuset", format_cpu_list(lim.cpuset.value), lim.cpuset.source.describe()))
    width = max(len(r[1]) for r in rows)
    out = [f"guestfs explain: pid {lim.pid} (cgroup "
           + ", ".join(f"{c} v{v}" if v else f"{c} none"
                       for c, v in lim.cgroup_versions.items()) + ")",
           f"{'resource':<14} {'value':<{width}}  source"]
    out += [f"{name:<14} {value:<{width}}  {src}" for name, value, src in rows]
    for title, resolved, fmt in (("memory", lim.memory, human_bytes),
                                 ("cpu quota", lim.cpu_quota, _cpus)):
        if resolved.considered:
            out.append(f"{title}: every source considered (smallest wins):")
            out += [_candidate_line(c, fmt) for c in resolved.considered]
    if lim.warnings:
        out.append("warnings:")
        out += [f"  - {w}" for w in lim.warnings]
    return "\n".join(out) + "\n"
