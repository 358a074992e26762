"""The files the webhook may inject: the DaemonSet's per-caller files, each as the
hostPath volume and the read-only mount of the pod snippet
(container/k8s/daemonset/pod-snippet.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

# The DaemonSet's per-caller mount (its `guestfs` container), below a hostPath of its
# parent: what the pod snippet binds from.
DEFAULT_SOURCE = "/var/lib/guestfs/by-caller"
VOLUME_PREFIX = "guestfs-"
# The seccomp profile container/k8s/daemonset/seccomp-profile.yaml installs on every node
# (kubelet's Localhost profiles are relative to /var/lib/kubelet/seccomp).
DEFAULT_SECCOMP_PROFILE = "guestfs-notify.json"

# Under /proc, runc (1.1 to 1.4) accepts a bind mount only over these files (its
# checkProcMount allowlist); any other /proc target, /proc/pressure/* included, makes it
# refuse the container, so a webhook injecting one would stop every selected pod from
# starting. /sys targets are not restricted.
RUNC_PROC_ALLOWED = ("cpuinfo", "diskstats", "meminfo", "stat", "swaps", "uptime",
                     "loadavg", "slabinfo")


@dataclass(frozen=True)
class InjectedFile:
    """One served file: its short name (the --files word), where the container sees it,
    and the volume that brings it."""

    name: str
    container_path: str

    @property
    def volume(self) -> str:
        return VOLUME_PREFIX + self.name

    def host_path(self, source: str) -> str:
        return source.rstrip("/") + self.container_path


# Every served file that runc lets a pod bind, by short name, in the snippet's order.
INJECTABLE = {f.name: f for f in (
    InjectedFile("meminfo", "/proc/meminfo"),
    InjectedFile("cpuinfo", "/proc/cpuinfo"),
    InjectedFile("stat", "/proc/stat"),
    InjectedFile("uptime", "/proc/uptime"),
    InjectedFile("loadavg", "/proc/loadavg"),
    InjectedFile("swaps", "/proc/swaps"),
    InjectedFile("diskstats", "/proc/diskstats"),
    InjectedFile("online", "/sys/devices/system/cpu/online"),
    InjectedFile("possible", "/sys/devices/system/cpu/possible"),
    InjectedFile("present", "/sys/devices/system/cpu/present"),
)}
# The pod snippet's set. possible and present are left out by default as in the snippet:
# runtimes size per-CPU arrays by them, and the node's count is the safe answer there.
DEFAULT_FILES = ("meminfo", "cpuinfo", "stat", "uptime", "loadavg", "swaps", "diskstats",
                 "online")
# Served by the DaemonSet but never injectable: runc refuses binds over them.
REFUSED = {"pressure/cpu": "/proc/pressure/cpu", "pressure/memory": "/proc/pressure/memory",
           "pressure/io": "/proc/pressure/io"}


def choose(names: list[str] | tuple[str, ...]) -> tuple[InjectedFile, ...]:
    """The files of the --files list, in the order given; ValueError naming a word that
    is not injectable, and why."""
    out: list[InjectedFile] = []
    for name in names:
        if name in REFUSED:
            raise ValueError(f"{name}: runc refuses a bind over {REFUSED[name]} (only "
                             f"/proc/{{{','.join(RUNC_PROC_ALLOWED)}}} may be bound), so "
                             "every selected pod would fail to start")
        if name not in INJECTABLE:
            raise ValueError(f"{name}: not a served file (one of {', '.join(INJECTABLE)})")
        if INJECTABLE[name] not in out:
            out.append(INJECTABLE[name])
    if not out:
        raise ValueError("no file to inject")
    return tuple(out)
