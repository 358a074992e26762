"""`guestfs attach` into a real runc container that has its own pid, mount and user
namespaces: attach's pid is not in the container's procfs, and the container never sees
the guestfs mount; the files are moved in, and the container's reader gets its own
cgroup's limit (the view is per caller)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.external.test_real_runc import MiB, bundle
from tests.external.test_real_runc_userns import with_user_namespace
from tests.support.fusemount import mounted, wait_for

pytestmark = pytest.mark.real


def container_pid(cid: str) -> int | None:
    out = subprocess.run(["runc", "state", cid], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    state = json.loads(out.stdout)
    return state["pid"] if state.get("status") == "running" else None


def test_attach_moves_the_files_into_a_user_namespaced_runc_container():
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    top = tempfile.mkdtemp(prefix="guestfs-runc-attach-")
    os.chmod(top, 0o755)
    mp = os.path.join(top, "mnt")
    cid = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    b = bundle(Path(top) / "bundle", None, "exec sleep 600", 256 * MiB, 50000)
    with_user_namespace(b)
    ctr = subprocess.Popen(["runc", "run", "--bundle", b, cid], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        with mounted(mp, "--allow-other"):
            assert wait_for(lambda: container_pid(cid) is not None, 30), ctr.stderr
            pid = container_pid(cid)
            out = subprocess.run([sys.executable, "-m", "guestfs", "attach", "--pid", str(pid),
                                  "--source", mp], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert "(move_mount)" in out.stdout
            inside = subprocess.run(
                ["runc", "exec", cid, "sh", "-c",
                 f"free -m; grep -c ^processor /proc/cpuinfo; test -e {mp} || echo no-mount"],
                capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["runc", "kill", cid, "KILL"], capture_output=True)
        ctr.wait(timeout=30)
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
    assert inside.returncode == 0, inside.stderr
    lines = inside.stdout.splitlines()
    assert next(ln.split() for ln in lines if ln.startswith("Mem:"))[1] == "256"
    assert lines[-2:] == ["1", "no-mount"]
