"""container/Dockerfile builds (from a local debootstrap base: no registry is reachable
here) and the image works: `show` as-is, and the wrapper pattern with podman on runc."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.real
IMAGE = "localhost/guestfs:test"
# Root on the test machines may lack CAP_SYS_RESOURCE: podman must not raise rlimits
# (it would fail to); runc is the runtime the tests use elsewhere.
RUN = ["podman", "run", "--rm", "--runtime", "runc", "--network", "none",
       "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]


def libpod_dirs() -> set[str]:
    return {str(p) for p in Path("/sys/fs/cgroup").glob("*/libpod_parent")}


@pytest.fixture(scope="module")
def image():
    if shutil.which("podman") is None or shutil.which("debootstrap") is None:
        pytest.fail("podman/debootstrap missing: .ci/setup installs them")
    before = libpod_dirs()
    base = subprocess.run(["bash", str(REPO / "container/build-test-base.sh")],
                          capture_output=True, text=True, timeout=900)
    assert base.returncode == 0, base.stderr[-3000:]
    build = subprocess.run(["podman", "build", "--build-arg",
                            f"BASE={base.stdout.split()[-1]}", "-f", "container/Dockerfile",
                            "-t", IMAGE, "."], cwd=REPO, capture_output=True, text=True,
                           timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    yield IMAGE
    subprocess.run(["podman", "rmi", "-f", IMAGE], capture_output=True)
    # podman (cgroupfs manager) leaves its parent cgroup behind: remove what it created.
    for d in sorted(libpod_dirs() - before, reverse=True):
        for sub in sorted(Path(d).glob("**/"), key=lambda p: -len(p.parts)):
            if sub != Path(d):
                os.rmdir(sub)
        os.rmdir(d)


def test_image_show_runs_as_is(image):
    out = subprocess.run([*RUN, image, "show", "/proc/meminfo", "--memory-limit", "512Mi"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MemTotal:         524288 kB\n")


def test_image_as_the_wrapper_entrypoint(image):
    out = subprocess.run([*RUN, "--memory", "512m", "--cpus", "1.5", "--device", "/dev/fuse",
                          "--cap-add", "SYS_ADMIN", "--security-opt", "unmask=/proc/*",
                          image, "run", "--", "sh", "-c",
                          "free -m; grep -c ^processor /proc/cpuinfo"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert next(ln.split() for ln in lines if ln.startswith("Mem:"))[1] == "512"
    assert lines[-1] == "2"
