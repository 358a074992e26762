"""A reader of one served file bound in a mount namespace of its own, as a container's
/proc/meminfo is: run under ``unshare -m --propagation private``, it binds SOURCE over a
file of its own, reads it in a loop, checks every reading, and when STOPFILE appears
writes what it saw to OUT as JSON (reads, failures, the longest read, and the bind's
mount identity at the start and at the end: a re-bind would change it).

Usage: python held_reader.py SOURCE KIND STOPFILE OUT (KIND: meminfo, stat, uptime,
loadavg). Standard library only: it runs in another namespace, as another program.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

MEMINFO_LINE = re.compile(r"^[A-Za-z0-9_()]+:\s+\d+( kB)?$")


def valid(kind: str, text: str) -> bool:
    lines = text.splitlines()
    if not text.endswith("\n") or not lines:
        return False
    if kind == "meminfo":
        return lines[0].startswith("MemTotal:") and all(map(MEMINFO_LINE.match, lines))
    if kind == "stat":
        return lines[0].startswith("cpu ") and any(ln.startswith("btime ") for ln in lines)
    if kind == "uptime":
        parts = lines[0].split()
        return len(parts) == 2 and all(float(p) >= 0 for p in parts)
    if kind == "loadavg":
        return len(lines[0].split()) == 5
    raise SystemExit(f"unknown kind {kind}")


def identity(target: str) -> str | None:
    """Mount id and device of the bind at ``target``, from this namespace's mountinfo."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == target:
                found = f"{fields[0]} {fields[2]}"
    return found


def main(source: str, kind: str, stopfile: str, out: str) -> int:
    here = tempfile.mkdtemp(prefix="held-reader-")
    target = os.path.join(here, kind)
    open(target, "w").close()
    subprocess.run(["mount", "--bind", source, target], check=True)
    before = identity(target)
    reads = failed = 0
    longest = 0.0
    errors: list[str] = []
    while not os.path.exists(stopfile):
        began = time.monotonic()
        try:
            with open(target, "rb") as f:
                text = f.read().decode()
            ok = valid(kind, text)
            why = "" if ok else f"invalid: {text[:80]!r}"
        except (OSError, ValueError) as e:
            ok, why = False, f"{type(e).__name__}: {e}"
        took = time.monotonic() - began
        longest = max(longest, took)
        reads += 1
        if not ok:
            failed += 1
            if len(errors) < 5:
                errors.append(why)
        time.sleep(0.002)
    after = identity(target)
    with open(out, "w") as f:
        json.dump({"reads": reads, "failed": failed, "longest": longest, "errors": errors,
                   "before": before, "after": after}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:5]))
