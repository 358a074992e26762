from __future__ import annotations

from pathlib import Path

from guestfs.daemon.file_table import SERVED_FILES, ViewState, render_file
from guestfs.sources.host_root import HostRoot
from guestfs.sources.snapshot import read_snapshot
from tests.conftest import limits_of


def render_all(root: str | Path, pid: str = "self", **explicit: object) -> dict[str, str]:
    host = HostRoot(str(root))
    snap = read_snapshot(host, pid)
    lim = limits_of(root, pid, **explicit)
    state = ViewState()
    return {p: render_file(p, host, snap, lim, state) for p in SERVED_FILES}


def meminfo_kb(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        out[name] = int(rest.split()[0])
    return out
