"""`explain --mount` of a real daemon whose pinned cgroup is removed under it: the fallback
it takes is counted and named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.fusemount import mounted
from tests.support.realcg import v1_cgroup
from tests.support.render_helpers import meminfo_kb


@pytest.mark.real
def test_explain_shows_the_daemons_fallbacks(tmp_path):
    """A pinned cgroup removed under a serving daemon: readers keep the 512 MiB view, and
    `explain --mount` says why, with the count."""
    mp = tmp_path / "mnt"
    with v1_cgroup(512 << 20, 100000, 100000) as cg, \
            mounted(str(mp), "--cgroup", cg.paths["memory"], "--cache-ttl", "0.1"):
        assert meminfo_kb((mp / "proc/meminfo").read_text())["MemTotal"] == 512 * 1024
        for d in cg.dirs.values():
            os.rmdir(d)
        time.sleep(0.3)
        assert meminfo_kb((mp / "proc/meminfo").read_text())["MemTotal"] == 512 * 1024
        out = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--json",
                              "--mount", str(mp)], capture_output=True, text=True)
        text = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--mount",
                               str(mp)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    daemon = json.loads(out.stdout)["daemon"]
    assert daemon["fallback_total"] >= 1
    assert any(c.startswith("cgroup data lost") for c in daemon["fallbacks"]), daemon
    assert "cgroup data lost" in text.stdout and "fallbacks" in text.stdout, text.stdout
