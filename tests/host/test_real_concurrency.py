"""16 readers x 6,250 reads (10^5) of every served file while cgroups are created, filled,
re-limited and removed under them: no read error, no malformed file, no daemon exit."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from guestfs.daemon.file_table import SERVED_FILES
from tests.support.fusemount import mounted
from tests.support.realcg import _v1_dir, require_v1_root

pytestmark = pytest.mark.real
READERS, READS = 16, 1563   # 25,000 reads: each open of the per-caller layout is sized by its
# reader's own rendering (a GETATTR, docs/mount.md), and here every reader keeps moving into
# cgroups younger than server.YOUNG, whose views are checked at every use

READER = textwrap.dedent("""\
    import sys
    mp, n = sys.argv[1], int(sys.argv[2])
    files = sys.argv[3:]
    bad = 0
    for i in range(n):
        f = files[i % len(files)]
        try:
            with open(mp + f) as fh:
                text = fh.read()
        except OSError as e:
            print("ERROR", f, e, flush=True); bad += 1; continue
        ok = bool(text) and text.endswith("\\n")
        if f == "/proc/meminfo":
            kv = {l.split(":")[0]: int(l.split()[1]) for l in text.splitlines()}
            # (The kernel's own MemAvailable can be below MemFree: watermarks.)
            ok = ok and 0 < kv["MemTotal"] and kv["MemFree"] <= kv["MemTotal"]
            ok = ok and kv["MemAvailable"] <= kv["MemTotal"]
        elif f == "/proc/stat":
            ok = ok and text.startswith("cpu  ") and text.count("\\ncpu0 ") == 1
        elif f == "/proc/uptime":
            ok = ok and len(text.split()) == 2
        elif f == "/proc/loadavg":
            ok = ok and len(text.split()) == 5
        if not ok:
            print("MALFORMED", f, repr(text[:200]), flush=True); bad += 1
    print("DONE", bad, flush=True)
    """)


def rmdir_when_empty(d: str, readers: list[subprocess.Popen[str]]) -> None:
    # A reader that exited inside the cgroup keeps it busy until it is reaped.
    for _ in range(100):
        for r in readers:
            r.poll()
        try:
            os.rmdir(d)
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            time.sleep(0.02)
    os.rmdir(d)


def test_readers_while_cgroups_churn(tmp_path):
    require_v1_root()
    mp = str(tmp_path / "mnt")
    files = [f for f in SERVED_FILES if os.path.exists(f)]
    bases = {c: _v1_dir(c)[0] for c in ("memory", "cpu", "cpuset")}  # type: ignore[index]
    with mounted(mp, "--cache-ttl", "0.05") as daemon:
        readers = [subprocess.Popen([sys.executable, "-c", READER, mp, str(READS), *files],
                                    stdout=subprocess.PIPE, text=True) for _ in range(READERS)]
        made: list[str] = []
        try:
            rounds = 0
            while any(r.poll() is None for r in readers):
                rounds += 1
                name = f"guestfs-test-churn-{uuid.uuid4().hex[:6]}"
                dirs = {c: os.path.join(b, name) for c, b in bases.items()}
                for d in dirs.values():
                    os.mkdir(d)
                    made.append(d)
                with open(f"{dirs['memory']}/memory.limit_in_bytes", "w") as f:
                    f.write(str((256 + rounds % 512) << 20))
                with open(f"{dirs['cpu']}/cpu.cfs_quota_us", "w") as f:
                    f.write(str(50000 + 10000 * (rounds % 10)))
                for d in ("cpuset.mems", "cpuset.cpus"):
                    with open(os.path.join(bases["cpuset"], d)) as src, \
                            open(os.path.join(dirs["cpuset"], d), "w") as dst:
                        dst.write(src.read())
                movers = [r.pid for r in readers[: 1 + rounds % READERS] if r.poll() is None]
                # Into the new cgroup, and back out before it is removed (a reader that
                # finished meanwhile is simply gone).
                for target in (dirs, bases):
                    for pid in movers:
                        for d in target.values():
                            with contextlib.suppress(ProcessLookupError), \
                                    open(f"{d}/cgroup.procs", "w") as f:
                                f.write(str(pid))
                for d in dirs.values():
                    rmdir_when_empty(d, readers)
                    made.remove(d)
            outputs = [r.communicate(timeout=120)[0] for r in readers]
        finally:
            for r in readers:
                if r.poll() is None:
                    r.kill()
                    r.wait()
            for d in reversed(made):
                rmdir_when_empty(d, readers)
        assert daemon.poll() is None, "the daemon exited"
    assert rounds > 3
    for out in outputs:
        assert out.strip().splitlines()[-1] == "DONE 0", out[-2000:]
