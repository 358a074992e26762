"""Kubelet's resource arithmetic (pkg/kubelet/cm helpers_linux.go, qos/policy.go,
kuberuntime_container_linux.go, pkg/api/v1/resource), as pure functions over quantities."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from guestfs.engine.quantity import parse_quantity

MIN_SHARES, MAX_SHARES, SHARES_PER_CPU = 2, 262144, 1024
QUOTA_PERIOD = 100000          # kubelet's cpu-cfs-quota-period default, in µs
MIN_QUOTA = 1000               # cm.MinQuotaPeriod
GUARANTEED_OOM, BESTEFFORT_OOM, CRITICAL_OOM = -997, 1000, -997


def milli(text: str) -> int:
    """Quantity.MilliValue(): rounded up."""
    return math.ceil(parse_quantity(text) * 1000)


def value(text: str) -> int:
    """Quantity.Value(): rounded up."""
    return math.ceil(parse_quantity(text))


def milli_cpu_to_shares(m: int) -> int:
    if m == 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, m * SHARES_PER_CPU // 1000))


def milli_cpu_to_quota(m: int, period: int = QUOTA_PERIOD) -> int:
    if m == 0:
        return 0
    return max(MIN_QUOTA, m * period // 1000)


@dataclass(frozen=True)
class Resources:
    """One container's cpu (millicores) and memory (bytes) requests and limits, after the
    API server's defaulting (a request left out is the limit); 0 means not set."""

    cpu_request: int = 0
    cpu_limit: int = 0
    memory_request: int = 0
    memory_limit: int = 0
    extended: dict[str, int] = field(default_factory=dict)


def qos_class(all_containers: list[Resources]) -> str:
    """v1qos.GetPodQOS over init and regular containers: cpu and memory only."""
    if not any(r.cpu_request or r.cpu_limit or r.memory_request or r.memory_limit
               for r in all_containers):
        return "BestEffort"
    for r in all_containers:
        if not (r.cpu_limit and r.memory_limit and r.cpu_request == r.cpu_limit
                and r.memory_request == r.memory_limit):
            return "Burstable"
    return "Guaranteed"


def oom_score_adj(qos: str, critical: bool, memory_request: int, capacity: int) -> int:
    """qos.GetContainerOOMScoreAdjust."""
    if critical:
        return CRITICAL_OOM
    if qos == "Guaranteed":
        return GUARANTEED_OOM
    if qos == "BestEffort":
        return BESTEFFORT_OOM
    adj = 1000 - (1000 * memory_request) // capacity
    if adj < 2:
        return 2
    return 999 if adj == 1000 else adj


def pod_totals(inits: list[tuple[Resources, bool]], mains: list[Resources],
               attr: str) -> int:
    """resource.PodRequests/PodLimits for one attribute, sidecar-aware: the larger of what
    runs at the end (main containers plus native sidecars) and the peak of each regular init
    container running beside the sidecars started before it."""
    sidecars = 0
    peak = 0
    for r, is_sidecar in inits:
        if is_sidecar:
            sidecars += getattr(r, attr)
        else:
            peak = max(peak, getattr(r, attr) + sidecars)
    return max(peak, sum(getattr(r, attr) for r in mains) + sidecars)


def downward_resource(resource: str, divisor: str, r: Resources, node_cpu_milli: int,
                      node_memory: int) -> str:
    """fieldpath.ExtractContainerResourceValue with limits merged from node allocatable
    (a container without a limit sees the node's capacity), as the kubelet formats it."""
    if resource in ("limits.cpu", "requests.cpu"):
        amount = r.cpu_limit or node_cpu_milli if resource == "limits.cpu" else r.cpu_request
        return str(math.ceil(Fraction(amount, milli(divisor))))
    if resource in ("limits.memory", "requests.memory"):
        amount = (r.memory_limit or node_memory if resource == "limits.memory"
                  else r.memory_request)
        return str(math.ceil(Fraction(amount) / parse_quantity(divisor)))
    raise ValueError(f"unsupported resource {resource!r}")
