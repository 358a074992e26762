"""Killing a pod's serving guestfs daemon from the node while the pod's app reads its
files, as the OOM killer or a crash would: the app's reader program, the daemons and
holders found by their process names within the pod's cgroup, and the kills.

The reader is the app's own program (under the wrapper only the app's mount namespace has
the files; an exec'd process would read the kernel's). It is standard-library Python, one
thread per file, and validates every reading itself: a read that fails or a value that is
wrong is counted, with the first few kept, and so is the longest single read, which only
the reader can time. It reports through the pod's /dev/shm (a tmpfs even under a read-only
root): its progress in ``/dev/shm/reader.json``, rewritten every 0.2 s, and, once
``/dev/shm/stop`` appears, a final ``DONE {json}`` line on its stdout (the pod's log).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import Any

import psutil

from guestfs.fuse.holder import NAME as HOLDER_NAME
from tests.support.fusemount import is_guestfs_daemon

# A hang guard only, for the longest read: one waiting for a successor that never comes
# would wait for ever. What the readers measure is printed, and docs/mount.md gives it.
HANG_S = 5.0
STOP = "/dev/shm/stop"
PROGRESS = "/dev/shm/reader.json"

READER = r"""
import json, os, re, sys, threading, time

LIMIT_KB, CPUS = int(sys.argv[1]), int(sys.argv[2])
FILES = ("/proc/meminfo", "/proc/stat", "/proc/uptime")
LINE = re.compile(r"^[A-Za-z0-9_()]+:\s+\d+( kB)?$")
STOP, PROGRESS = "/dev/shm/stop", "/dev/shm/reader.json"


def binds():
    # Mount id and device of each file's bind in this namespace: a re-bind changes them.
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] in FILES:
                out[fields[4]] = f"{fields[0]} {fields[2]}"
    return out


def check(path, text, state):
    # The reason a reading is wrong, or "" when it is right.
    lines = text.splitlines()
    if not text.endswith("\n") or not lines:
        return f"not whole: {text[-60:]!r}"
    if path == "/proc/meminfo":
        if lines[0].split() != ["MemTotal:", str(LIMIT_KB), "kB"]:
            return f"MemTotal {lines[0]!r}, limit {LIMIT_KB} kB"
        bad = [ln for ln in lines if not LINE.match(ln)]
        return f"malformed {bad[0]!r}" if bad else ""
    if path == "/proc/stat":
        cpus = [ln for ln in lines if re.match(r"cpu\d+ ", ln)]
        if not lines[0].startswith("cpu ") or len(cpus) != CPUS:
            return f"cpu lines {lines[0][:40]!r} and {len(cpus)} cpuN, {CPUS} expected"
        if not any(ln.startswith("btime ") for ln in lines):
            return "no btime"
        return ""
    up, idle = (float(x) for x in lines[0].split())
    # The container's age never runs backwards, whichever daemon answers.
    if up < state.get("up", 0.0) or idle < 0:
        return f"uptime {lines[0]!r} after {state.get('up')}"
    state["up"] = up
    return ""


stats = {p: {"reads": 0, "failed": 0, "wrong": 0, "longest": 0.0, "errors": []}
         for p in FILES}
unbound = {"reads": 0}
started = threading.Event()


def loop(path):
    s, state = stats[path], {}
    while not os.path.exists(STOP):
        began = time.monotonic()
        try:
            with open(path, "rb") as f:
                text = f.read().decode()
            failed, why = False, check(path, text, state)
        except (OSError, ValueError) as e:
            failed, why = True, f"{type(e).__name__}: {e}"
        took = time.monotonic() - began
        s["reads"] += 1
        s["longest"] = max(s["longest"], took)
        if failed or why:
            s["failed" if failed else "wrong"] += 1
            if len(s["errors"]) < 5:
                s["errors"].append(f"{time.monotonic():.3f} {why}")
        time.sleep(0.02)


# Wait for the binds (a sidecar's attach makes them within its round, after the app
# started): readings of the kernel's files before that are not the test's subject.
while not os.path.exists(STOP):
    with open("/proc/meminfo") as f:
        if f.readline().split()[1:2] == [str(LIMIT_KB)] and len(binds()) == len(FILES):
            break
    unbound["reads"] += 1
    time.sleep(0.05)
before = binds()
threads = [threading.Thread(target=loop, args=(p,), daemon=True) for p in FILES]
for t in threads:
    t.start()
while not os.path.exists(STOP):
    with open(PROGRESS + ".tmp", "w") as f:
        json.dump({p: s["reads"] for p, s in stats.items()}, f)
    os.replace(PROGRESS + ".tmp", PROGRESS)
    time.sleep(0.2)
for t in threads:
    t.join()
print("DONE " + json.dumps({"files": stats, "unbound": unbound["reads"],
                            "before": before, "after": binds()}), flush=True)
"""


def reader_program(limit_kb: int, cpus: int) -> list[str]:
    return ["python3", "-I", "-c", READER, str(limit_kb), str(cpus)]


def _in_pod(p: psutil.Process, cgroup: str) -> bool:
    with open(f"/proc/{p.pid}/cgroup") as f:
        return any(line.rstrip("\n").split(":", 2)[2].startswith(cgroup + "/") for line in f)


def pod_processes(pod: Any) -> list[psutil.Process]:
    """The pod's live processes, as the node sees them (every hierarchy puts a pod's
    containers under its cgroup parent)."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.status() != psutil.STATUS_ZOMBIE and _in_pod(p, pod.cgroup()):
                out.append(p)
    return out


def daemons(pod: Any) -> list[int]:
    """The pod's serving guestfs daemons: by name (`guestfs-mount`, run's forked first
    daemon) or command line (`guestfs mount`, executed), never a holder; a daemon's
    forked child (its mount probe, for its moment) shows its parent's, and is left out."""
    found: dict[int, int] = {}
    for p in pod_processes(pod):
        with contextlib.suppress(psutil.Error):
            if is_guestfs_daemon(p.cmdline(), p.name()):
                found[p.pid] = p.ppid()
    return sorted(pid for pid, ppid in found.items() if ppid not in found)


def holders(pod: Any) -> list[int]:
    out = []
    for p in pod_processes(pod):
        with contextlib.suppress(psutil.Error):
            if p.name() == HOLDER_NAME.decode():
                out.append(p.pid)
    return out


def progress(pod: Any) -> int:
    """Reads done so far, of the file read least (0 before the reader reports)."""
    rc, out, _ = pod.exec("app", ["cat", PROGRESS])
    with contextlib.suppress(ValueError):
        return min(json.loads(out).values()) if rc == 0 else 0
    return 0


def wait(pred: Any, timeout: float, why: Any) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, why()
        time.sleep(0.1)


def kill_in_turn(pod: Any, kills: int, logs: Any) -> list[int]:
    """``kills`` kill -9s of whichever daemon serves the pod, each one's successor
    waited for and read through (every file 10 more reads) before the next; the pids
    killed. Nothing restarts a daemon here but its holder."""
    killed = []
    for i in range(kills):
        [victim] = daemons(pod)
        before = progress(pod)
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)
        wait(lambda v=victim: [d for d in daemons(pod) if d != v], 30,
             lambda n=i: f"kill {n}: no successor\n{logs()[-3000:]}")
        wait(lambda b=before: progress(pod) >= b + 10, 30,
             lambda n=i: f"kill {n}: no reads through the successor\n{logs()[-3000:]}")
    return killed


def stop_reader(pod: Any) -> dict[str, Any]:
    """Tells the reader to stop and returns its final report."""
    rc, out, err = pod.exec("app", ["touch", STOP])
    assert rc == 0, (out, err)

    def done() -> str | None:
        return next((ln[5:] for ln in pod.logs("app").splitlines()
                     if ln.startswith("DONE ")), None)
    wait(lambda: done() is not None, 30, lambda: pod.logs("app")[-3000:])
    return json.loads(done() or "{}")
