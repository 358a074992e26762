"""Writing cgroup files and removing cgroup directories, shared by the tests' cgroups
(tests/support/realcg.py) and the benchmarks' (benchmarks/benchsupport.py): the standard
library only, so a benchmark imports it without pytest."""

from __future__ import annotations

import contextlib
import os
import signal
import time


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def empty_and_remove(d: str) -> None:
    """Kill every process left in cgroup ``d`` (never ourselves) and remove it; a cgroup
    still there after 5 s raises: a leaked cgroup must fail loudly."""
    for _ in range(100):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return
        for pid in pids:
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(d)
