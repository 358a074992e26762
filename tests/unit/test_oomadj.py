"""The OOM order `guestfs run` sets up (on a file standing in for /proc/self/oom_score_adj), and
what keeps the daemon small."""

from __future__ import annotations

import errno
import re
import subprocess
import sys

import pytest

from guestfs.wrap import oomadj
from guestfs.wrap.oomadj import OOM_FIRST, OOM_LAST, OomPlan, apply_to_app, shield_wrapper


@pytest.fixture
def adj(tmp_path):
    path = tmp_path / "oom_score_adj"

    def make(value: str) -> str:
        path.write_text(value)
        return str(path)

    return make


def test_a_wrapper_that_may_lower_itself_gives_the_app_its_old_value(adj):
    path = adj("200\n")
    plan = shield_wrapper(path)
    assert plan == OomPlan(OOM_LAST, 200)
    assert oomadj.read_adj(path) == OOM_LAST  # run (and the daemon it starts) go last
    apply_to_app(plan, path)
    assert oomadj.read_adj(path) == 200


def test_without_cap_sys_resource_the_app_is_raised_instead(adj, monkeypatch):
    path = adj("0\n")

    def refuse(value: int, p: str = "") -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(oomadj, "write_adj", refuse)
    plan = shield_wrapper(path)
    assert plan == OomPlan(0, OOM_FIRST)
    monkeypatch.undo()
    apply_to_app(plan, path)
    assert oomadj.read_adj(path) == OOM_FIRST


def test_a_wrapper_already_last_changes_nothing(adj):
    path = adj("-1000\n")
    plan = shield_wrapper(path)
    assert plan == OomPlan(-1000, -1000)
    apply_to_app(plan, path)
    assert oomadj.read_adj(path) == -1000


@pytest.mark.parametrize("content", ["", "lots\n"])
def test_no_or_bad_oom_score_adj_means_nothing_to_do(adj, content):
    assert shield_wrapper(adj(content)) is None
    assert shield_wrapper("/nonexistent/oom_score_adj") is None
    apply_to_app(None, "/nonexistent/oom_score_adj")  # no write attempted


def test_the_daemon_does_not_load_importlib_metadata():
    """What the daemon imports is resident in the app's cgroup for its whole life; the
    binding's version for the startup log is read without importlib.metadata (~2 MiB)."""
    code = ("import sys, guestfs.cli.main, guestfs.daemon.mount, guestfs.wrap.run; "
            "from guestfs.daemon.fuse_binding import load_binding, _version; "
            "b = load_binding('mfusepy3'); "     # a libfuse binding: its version is looked up
            "assert 'importlib.metadata' not in sys.modules, 'importlib.metadata loaded'; "
            "print(b.name, _version('no-such-dist'))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=60)
    if "no usable FUSE binding" in out.stderr:
        pytest.skip("no FUSE library installed")
    assert out.returncode == 0, out.stderr
    name, missing = out.stdout.rsplit(" ", 1)
    assert re.fullmatch(r"m?fusepy \d+(\.\d+)+", name), name
    assert missing.strip() == "?"
