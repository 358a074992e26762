"""Run as the app under `guestfs run` inside a container: prints, as JSON, the
capability sets of this process and of the guestfs daemon, the served uptime, this
process's boot clock and time-namespace offsets, MemTotal and the mount table's view of
the private-mount candidates. Only the standard library: it runs with the image's
python3."""

import json
import os
import time

FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")


def status(pid: str) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = value.strip()
    return out


def daemons() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/comm", "rb") as f:
                comm = f.read().strip()
        except OSError:
            continue
        # run's first daemon is forked from it and named so; a restarted one is executed.
        if comm == b"guestfs-mount" or \
                len(argv) > 3 and argv[2].endswith(b"/_boot.py") and argv[3] == b"mount":
            found.append(pid)
    # A daemon's forked child (its mount probe) shows the daemon's command line for the
    # moment it lives: not a daemon of its own.
    parents = {pid: parent_of(pid) for pid in found}
    return [pid for pid, ppid in parents.items() if ppid is not None and ppid not in parents]


def parent_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(ln.split()[1] for ln in f if ln.startswith("PPid:"))
    except (OSError, StopIteration):
        return None   # gone meanwhile: a probe that has finished


def mounts() -> dict[str, str]:
    """mount point -> fstype of the topmost mount there."""
    top = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            top[fields[4]] = fields[fields.index("-") + 1]
    return top


def main() -> None:
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    with open("/proc/self/timens_offsets") as f:
        offsets = f.read()
    with open("/proc/meminfo") as f:
        memtotal = next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:"))
    print(json.dumps({"app": status("self"), "daemons": [status(p) for p in daemons()],
                      "uptime": uptime, "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
                      "offsets": offsets, "memtotal_kb": memtotal, "mounts": mounts()}))


if __name__ == "__main__":
    main()
