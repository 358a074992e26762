"""Every way of reading × every layout: each reader gets one whole, well-formed rendering.

The readers (tests/support/readkit/reads.py runs them all and reports what each got): read() loops
with a 7-byte and a 1 MiB buffer, sendfile(2) to a pipe and to a file, splice(2), pread at
0, at offsets within the file and past its end, a private and a shared mmap of st_size
touched to its end, stdio fgets (libc through ctypes, and a C program when gcc exists),
busybox cat (sendfile), GNU cat and head, Python open().read() and pathlib.read_text,
Node's readFileSync / readFile / fs.promises.readFile (one node run), and the JVM's
Files.readAllBytes / readAllLines, BufferedReader and FileInputStream.readAllBytes (one
`java Reads.java` run). The layouts: per-caller (`guestfs mount MP`, direct_io), fixed
(`--cgroup PATH`, page cache), per-container (MP/<key>/, page cache) and `guestfs run`
(the files bound over /proc itself, read by CMD). One mount and one reader run per layout.

What "one whole rendering" means, file by file, is worked out in the checks below from the
files' own formats; every reader's result must also have the shape (lines, their first
words and field counts) of the 1 MiB read() of the same layout, so a rendering cut short
or padded fails even where its last line happens to parse.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from guestfs.sources.containerdirs import dir_key
from tests.support.fusemount import force_unmount, mounted, private_mountpoint, require_fuse
from tests.support.paths import SUPPORT
from tests.support.realcg import RealCgroup, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20
KIT = SUPPORT / "readkit"
FILES = ["/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/uptime", "/proc/loadavg",
         "/proc/swaps", "/proc/diskstats", "/sys/devices/system/cpu/online"]
LAYOUTS = ["per-caller", "fixed", "per-container", "run"]
# A shared mapping of a direct_io file is refused by the kernel (ENODEV: libfuse 3.14 does
# not negotiate FUSE_DIRECT_IO_ALLOW_MMAP); page-cached files map like regular files.
REFUSED = {("per-caller", "mmap-shared"): "!ENODEV"}


def decoded(value: str) -> bytes | str:
    return value if value.startswith("!") else base64.b64decode(value)


def shape(data: bytes) -> list[tuple[str, int]]:
    """Each line's first word (numbers as #) and field count, and the final newline."""
    out = []
    for line in data.decode(errors="replace").split("\n"):
        words = line.split()
        first = words[0] if words else ""
        out.append(("#" if re.fullmatch(r"[\d.]+", first) else first, len(words)))
    return out


def cpus_of(online: bytes) -> int:
    n = 0
    for part in online.decode().strip().split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def host_keys(path: str) -> list[str]:
    with open(path) as f:
        return [ln.split(":")[0] for ln in f if ln.strip()]


# ---------------------------------------------------------------- whole renderings
# Each returns what is wrong with ``data`` as a rendering of its file ("" when nothing);
# ``ncpu`` is the layout's CPU count as its own cpu/online says.

def bad_meminfo(data: bytes, ncpu: int) -> str:
    lines = data.decode().splitlines()
    if not data.endswith(b"\n") or [ln.split(":")[0] for ln in lines] != \
            host_keys("/proc/meminfo"):
        return "not the host's meminfo lines, up to its last one and a newline"
    if not all(re.fullmatch(r"[\w()]+:\s+\d+( kB)?", ln) for ln in lines):
        return "a line that does not parse as 'Key: number [kB]'"
    return ""


def bad_cpuinfo(data: bytes, ncpu: int) -> str:
    text = data.decode()
    blocks = [b for b in text.split("\n\n") if b.strip()]
    if not text.endswith("\n") or len(blocks) != ncpu:
        return f"{len(blocks)} processor blocks, not {ncpu}, or no final newline"
    keys = [[ln.split(":")[0].strip() for ln in b.splitlines()] for b in blocks]
    if any(k != keys[0] or k[0] != "processor" for k in keys):
        return "a processor block that is not whole"
    return ""


def bad_stat(data: bytes, ncpu: int) -> str:
    lines = data.decode().splitlines()
    cpus = [ln for ln in lines if ln.startswith("cpu")]
    if [ln.split()[0] for ln in cpus] != ["cpu", *(f"cpu{i}" for i in range(ncpu))] and \
            len(cpus) != ncpu + 1:
        return f"cpu lines {[ln.split()[0] for ln in cpus]} for {ncpu} CPUs"
    if any(len(ln.split()) < 9 or not all(w.isdigit() for w in ln.split()[1:])
           for ln in cpus):
        return "a cpu line that is cut or does not parse"
    tail = [ln.split()[0] for ln in lines[len(cpus):]]
    want = ["intr", "ctxt", "btime", "processes", "procs_running", "procs_blocked"]
    if tail[:len(want)] != want or not data.endswith(b"\n"):
        return f"after the cpu lines {tail}, not {want}... and a newline"
    if not all(w.isdigit() for ln in lines[len(cpus):] for w in ln.split()[1:]):
        return "a counter that is not a number"
    return ""


def bad_uptime(data: bytes, ncpu: int) -> str:
    return "" if re.fullmatch(rb"\d+\.\d\d \d+\.\d\d\n", data) else "not two numbers"


def bad_loadavg(data: bytes, ncpu: int) -> str:
    return "" if re.fullmatch(rb"(\d+\.\d\d ){3}\d+/\d+ \d+\n", data) else "not a loadavg"


def bad_swaps(data: bytes, ncpu: int) -> str:
    lines = data.decode().splitlines()
    if not data.endswith(b"\n") or not lines or not lines[0].startswith("Filename"):
        return "no header line, or no final newline"
    return "" if all(len(ln.split()) == 5 for ln in lines[1:]) else "a swap line cut"


def bad_diskstats(data: bytes, ncpu: int) -> str:
    lines = data.decode().splitlines()
    if not data.endswith(b"\n") or not lines:
        return "empty, or no final newline"
    ok = all(len(ln.split()) >= 14 and all(w.isdigit() for w in ln.split()[3:])
             for ln in lines)
    return "" if ok else "a disk line cut or not numbers"


def bad_online(data: bytes, ncpu: int) -> str:
    return "" if re.fullmatch(rb"\d+(-\d+)?(,\d+(-\d+)?)*\n", data) else "not a cpu list"


CHECKS: dict[str, Callable[[bytes, int], str]] = {
    "/proc/meminfo": bad_meminfo, "/proc/cpuinfo": bad_cpuinfo, "/proc/stat": bad_stat,
    "/proc/uptime": bad_uptime, "/proc/loadavg": bad_loadavg, "/proc/swaps": bad_swaps,
    "/proc/diskstats": bad_diskstats, "/sys/devices/system/cpu/online": bad_online}


# ---------------------------------------------------------------- running the readers

@pytest.fixture(scope="module")
def fgets_program(tmp_path_factory) -> str | None:
    """tests/support/readkit/fgets.c built with gcc (.ci/setup installs it)."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is missing: .ci/setup installs it")
    out = tmp_path_factory.mktemp("readkit") / "fgets"
    subprocess.run(["gcc", "-O", "-o", str(out), str(KIT / "fgets.c")], check=True)
    os.chmod(out.parent, 0o755)
    return str(out)


def kit(files: list[str], fgets: str | None) -> list[str]:
    return [sys.executable, str(KIT / "reads.py"), *(["--fgets", fgets] if fgets else []),
            *files]


def in_cgroup(cg: RealCgroup, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """argv run from inside ``cg`` (and everything it starts)."""
    dirs = " ".join(cg.dirs.values())
    shell = f'for d in {dirs}; do echo $$ > $d/cgroup.procs; done; exec "$@"'
    return subprocess.run(["sh", "-c", shell, "_", *argv], capture_output=True, text=True,
                          timeout=600)


def parse(out: subprocess.CompletedProcess[str], prefix: str) -> dict[str, dict[str, object]]:
    assert out.returncode == 0, out.stderr[-2000:]
    raw = json.loads(out.stdout)
    return {m: {f[len(prefix):]: decoded(v) for f, v in got.items()} for m, got in raw.items()}


@pytest.fixture(scope="module")
def cgroup() -> Iterator[RealCgroup]:
    # One CPU of the cpuset and a quota of 1.5: the fixed views show 1 CPU, not the host's.
    with v1_cgroup(512 * MiB, 150000, 100000, cpus="0") as cg:
        yield cg


@pytest.fixture(scope="module")
def results(cgroup, fgets_program) -> Iterator[Callable[[str], dict[str, dict[str, object]]]]:
    """layout -> {method: {file: bytes or "!error"}}, one mount and one run per layout,
    made when first asked for."""
    done: dict[str, dict[str, dict[str, object]]] = {}

    def get(layout: str) -> dict[str, dict[str, object]]:
        if layout not in done:
            done[layout] = read_in(layout, cgroup, fgets_program)
        return done[layout]
    yield get


def read_in(layout: str, cg: RealCgroup, fgets: str | None) -> dict[str, dict[str, object]]:
    with private_mountpoint() as mpp:
        mp = str(mpp)
        if layout == "run":
            require_fuse()
            try:
                out = in_cgroup(cg, [sys.executable, "-m", "guestfs", "run", "--mountpoint",
                                     mp, "--", *kit(FILES, fgets)])
            finally:
                force_unmount(mp)
            return parse(out, "")
        args = {"per-caller": [], "fixed": ["--cgroup", cg.paths["memory"]],
                "per-container": ["--per-container"]}[layout]
        base = f"{mp}/{dir_key(cg.paths['memory'])}" if layout == "per-container" else mp
        with mounted(mp, *args):
            return parse(subprocess.run(kit([base + f for f in FILES], fgets),
                                        capture_output=True, text=True, timeout=600), base)


def problems(layout: str, got: dict[str, dict[str, object]]) -> list[str]:
    ref = got["read-1MiB"]
    online = ref["/sys/devices/system/cpu/online"]
    assert isinstance(online, bytes), online
    ncpu = cpus_of(online)
    bad = []
    for f in FILES:
        want = ref[f]
        assert isinstance(want, bytes), (f, want)
        why = CHECKS[f](want, ncpu)
        assert not why, (layout, f, why, want[-300:])
        for method, per_file in got.items():
            data = per_file.get(f, "!not run")
            refused = REFUSED.get((layout, method))
            if refused is not None:
                if not (isinstance(data, str) and data.startswith(refused)):
                    bad.append(f"{method} {f}: {str(data)[:80]!r}, not {refused}")
                continue
            if isinstance(data, str):
                bad.append(f"{method} {f}: {data[:200]}")
            elif CHECKS[f](data, ncpu) or shape(data) != shape(want):
                bad.append(f"{method} {f}: {len(data)} bytes, {CHECKS[f](data, ncpu) or 'shape'}"
                           f" ...{data[-80:]!r}")
    return bad


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_reader_gets_one_whole_rendering(results, layout):
    got = results(layout)
    methods = set(got)
    # Every reader ran (a runtime that failed to start shows up as one error entry).
    assert {"busybox-cat", "sendfile-pipe", "splice", "mmap-private", "c-fgets",
            "node-readFileSync", "java-readAllBytes", "java-BufferedReader"} <= methods, \
        methods
    bad = problems(layout, got)
    assert not bad, f"{layout}: {len(bad)} of {len(FILES) * len(methods)}:\n" + "\n".join(bad)


def test_the_fixed_views_are_the_cgroups(results):
    """What busybox cat got in the fixed layouts is the cgroup's view (its 512 MiB), and
    under `guestfs run` its one CPU too: the matrix read guestfs's files, not the host's."""
    for layout in ("fixed", "per-container", "run"):
        got = results(layout)["busybox-cat"]
        mem = got["/proc/meminfo"]
        assert isinstance(mem, bytes) and re.search(rb"MemTotal:\s+524288 kB", mem), layout
    assert results("run")["busybox-cat"]["/sys/devices/system/cpu/online"] == b"0\n"


def test_mappings_of_renderings_made_per_read_never_tear(tmp_path):
    """Per-caller layout, /proc/stat and /proc/uptime (rendered afresh on every open):
    four processes map them (private, st_size, touched to the end) 1500 times each while
    a sendfile reader and a read() reader go on beside them, so renderings change between
    every two opens and short page-cache fills keep lowering the shared inode's size while
    other opens raise it again. Each of the 12,000 mappings must hold one whole rendering
    and zeros, never two renderings, a cut one, or a SIGBUS; each read() too. (The sendfile
    reader here only loads the inode: a sendfile racing other readers' page-cache reads of
    the same file can be cut or padded, docs/mount.md.)"""
    files = ["/proc/stat", "/proc/uptime"]
    with private_mountpoint() as mpp:
        mp = str(mpp)
        with mounted(mp, log=str(tmp_path / "log")):
            shapes = {}
            for f in files:
                with open(mp + f, "rb") as fh:
                    shapes[mp + f] = shape(fh.read())
            assert not bad_stat(Path(mp, "proc/stat").read_bytes(), cpus_of(
                Path(mp, "sys/devices/system/cpu/online").read_bytes()))

            def start(mode: str, rounds: int) -> subprocess.Popen[str]:
                return subprocess.Popen(
                    [sys.executable, str(KIT / "mapper.py"), mode, str(rounds),
                     json.dumps(shapes), *(mp + f for f in files)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            modes = ["mmap"] * 4 + ["sendfile", "read"]
            procs = [start(m, 1500) for m in modes]
            outs = {}
            for i, p in enumerate(procs):
                out, err = p.communicate(timeout=600)
                assert p.returncode == 0, (modes[i], p.returncode, err[-1000:])
                outs[f"{modes[i]}-{i}"] = json.loads(out)
    assert [o["reads"] for o in outs.values()] == [3000] * 6
    checked = {k: o for k, o in outs.items() if not k.startswith("sendfile")}
    assert all(o["not_whole"] == 0 for o in checked.values()), outs


SENDFILE = """
import os, sys
fd, (r, w) = os.open(sys.argv[1], os.O_RDONLY), os.pipe()
out = b""
while os.sendfile(w, fd, None, 65536):
    out += os.read(r, 1 << 20)
sys.stdout.buffer.write(out)
"""


def test_a_longer_view_read_after_a_shorter_one_is_whole(cgroup, tmp_path):
    """Per-caller layout, two views of one file: a reader in the test's cgroup (created a
    moment ago, so its uptime is short) reads /proc/uptime with sendfile, which lowers the
    shared inode's size to its rendering's end; right after it (well within the 0.5 s
    attributes were once cached for) busybox cat in the host's view, whose uptime has
    more digits, must still get its whole rendering: each open sets the size from its own
    reader's rendering."""
    with private_mountpoint() as mpp:
        mp = str(mpp)
        with mounted(mp, log=str(tmp_path / "log")):
            uptime = f"{mp}/proc/uptime"
            host_view = Path(uptime).read_bytes()
            for _ in range(20):
                small = in_cgroup(cgroup, [sys.executable, "-c", SENDFILE, uptime])
                assert small.returncode == 0, small.stderr
                big = subprocess.run(["busybox", "cat", uptime], capture_output=True)
                assert len(small.stdout) < len(host_view), (small.stdout, host_view)
                assert not bad_uptime(small.stdout.encode(), 0), small.stdout
                assert not bad_uptime(big.stdout, 0), big.stdout
