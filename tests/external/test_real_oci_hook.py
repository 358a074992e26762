"""`guestfs oci-hook` as podman runs it (runtime runc, the shipped hooks.d file with
its path and --source pointed at this checkout and a test mount): a container started
with `--memory 512m` reads MemTotal 524288 kB and `free -m` 512 from its own directory of
a per-container guestfs mount; without a guestfs mount the container still starts, with
the kernel's files (fail-open), unless the hook is --strict."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.system import kernel
from tests.external.test_image import RUN, libpod_dirs
from tests.support.fusemount import mounted
from tests.support.heldmount import HeldMount, kill_in_turn
from tests.support.mounts import wait_for
from tests.support.paths import REPO

pytestmark = pytest.mark.real
BASE = "localhost/guestfs-base:bookworm"
OPT_IN = ["--annotation", "io.guestfs.enable=true"]
SCRIPT = "head -1 /proc/meminfo; free -m; grep -E '^[0-9]+:memory:' /proc/self/cgroup || true"


@pytest.fixture(scope="module")
def image() -> Iterator[list[str]]:
    """The suite's offline base image (container/build-test-base.sh: minbase, no procps)
    with the host's `free` and its libproc bound in read-only."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.fail("podman/runc missing: .ci/setup installs them")
    if os.geteuid() != 0:
        pytest.skip("podman with runc and hooks needs root here")
    before = libpod_dirs()
    base = subprocess.run(["bash", str(REPO / "container/build-test-base.sh")],
                          capture_output=True, text=True, timeout=900)
    assert base.returncode == 0, base.stderr[-3000:]
    free = shutil.which("free")
    assert free, "procps missing on the host: .ci/setup installs it"
    ldd = subprocess.run(["ldd", free], capture_output=True, text=True, check=True).stdout
    volumes = ["-v", f"{free}:/usr/bin/free:ro"]
    for line in ldd.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("libproc") and len(parts) > 2:
            volumes += ["-v", f"{parts[2]}:/usr/lib/x86_64-linux-gnu/{parts[0]}:ro"]
    yield [*volumes, base.stdout.split()[-1]]
    for d in sorted(libpod_dirs() - before, reverse=True):  # podman's parent cgroup
        with contextlib.suppress(OSError):
            os.rmdir(d)


def hooks_dir(top: str, source: str, *extra: str) -> str:
    """The shipped container/oci-hooks.d/guestfs.json, with the hook's path this
    checkout's installed `guestfs` and its --source ``source``."""
    d = os.path.join(top, "hooks")
    os.makedirs(d)
    spec = json.loads((REPO / "container/oci-hooks.d/guestfs.json").read_text())
    exe = os.path.join(os.path.dirname(sys.executable), "guestfs")
    assert os.access(exe, os.X_OK), f"{exe}: .ci/setup installs the guestfs command"
    args = spec["hook"]["args"]
    args[args.index("--source") + 1] = source
    # Through sh only to keep the hook's stderr (its one-line reasons) for the asserts.
    spec["hook"].update(path="/bin/sh", args=["sh", "-c", f'exec "$0" "$@" 2>>{top}/hook.log',
                                              exe, *args[1:], "-v", *extra])
    with open(os.path.join(d, "guestfs.json"), "w") as f:
        json.dump(spec, f)
    return d


def hook_log(top: str) -> str:
    with contextlib.suppress(OSError), open(os.path.join(top, "hook.log")) as f:
        return f.read()
    return "(no hook log)"


def memtotal_and_free(stdout: str) -> tuple[str, str]:
    lines = stdout.splitlines()
    mem = next((ln.split()[1] for ln in lines if ln.startswith("Mem:")), "none")
    return lines[0] if lines else "", mem


@pytest.mark.parametrize("cgroupns", ["host", "private"])
def test_hook_binds_the_containers_own_files(image, cgroupns):
    """private: a cgroup namespace shows the hook its cgroup as "/", the key comes from
    the spec's cgroupsPath instead."""
    top = tempfile.mkdtemp(prefix="guestfs-oci-hook-")
    os.chmod(top, 0o755)
    mp = os.path.join(top, "mnt")
    try:
        with mounted(mp, "--per-container", "--allow-other"):
            hooks = hooks_dir(top, mp)
            out = subprocess.run(
                ["podman", "--hooks-dir", hooks, "run", "--rm", *RUN[3:], "--memory", "512m",
                 f"--cgroupns={cgroupns}", *OPT_IN, *image, "sh", "-c", SCRIPT],
                capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            log = hook_log(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert memtotal_and_free(out.stdout) == ("MemTotal:         524288 kB", "512"), \
        (out.stdout, log)


# A reader inside the container: every read of its meminfo counted as its limit or not
# (an error, the host's numbers), a read every 0.02 s.
LOOP = ("echo started; ok=0; bad=0; i=0; while [ $i -lt 200 ]; do "
        "if head -1 /proc/meminfo 2>&1 | grep -q ' 524288 kB'; then ok=$((ok+1)); "
        "else bad=$((bad+1)); fi; i=$((i+1)); sleep 0.02; done; echo ok=$ok bad=$bad")


def test_a_held_mounts_daemon_killed_under_a_hooked_container_fails_no_read(image):
    """The hook's binds come from a `guestfs mount --per-container --hold`: kill -9s of its
    serving daemon while the container reads, each followed by the holder's successor or a
    new `guestfs mount --hold` (a restarted unit), fail not one read in the container,
    and nothing is bound again (the hook ran once, at create)."""
    if not kernel.kernel_resends():
        pytest.skip(f"Linux {os.uname().release} has no FUSE_NOTIFY_RESEND (6.9+)")
    top = Path(tempfile.mkdtemp(prefix="guestfs-oci-hook-"))
    os.chmod(top, 0o755)
    m = HeldMount(top)
    m.args = ["--per-container", "--allow-other"]
    try:
        m.start()
        assert wait_for(lambda: m.serving_pid() is not None and is_guestfs_mount(m.mp), 30)
        hooks = hooks_dir(str(top), m.mp)
        app = subprocess.Popen(["podman", "--hooks-dir", hooks, "run", "--rm", *RUN[3:],
                                "--memory", "512m", *OPT_IN, *image, "sh", "-c", LOOP],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert app.stdout is not None and app.stdout.readline() == "started\n", \
                hook_log(str(top))
            kill_in_turn(m, 4)
            out, err = app.communicate(timeout=120)
        finally:
            if app.poll() is None:
                app.kill()
                app.wait()
        log = hook_log(str(top))
    finally:
        m.cleanup()
        shutil.rmtree(top, ignore_errors=True)
    assert app.returncode == 0, err
    assert out.strip() == "ok=200 bad=0", (out, log)
    assert log.count("bound") == 1, log


def test_without_a_guestfs_mount_the_container_starts_with_the_kernels_files(image):
    top = tempfile.mkdtemp(prefix="guestfs-oci-hook-")
    os.chmod(top, 0o755)
    empty = os.path.join(top, "no-mount")
    os.makedirs(empty)
    try:
        hooks = hooks_dir(top, empty)
        out = subprocess.run(["podman", "--hooks-dir", hooks, "run", "--rm", *RUN[3:],
                              "--memory", "512m", *OPT_IN, *image, "sh", "-c", SCRIPT],
                             capture_output=True, text=True, timeout=120)
        log = hook_log(top)
        os.makedirs(os.path.join(top, "strict"))
        strict_hooks = hooks_dir(os.path.join(top, "strict"), empty, "--strict")
        strict = subprocess.run(["podman", "--hooks-dir", strict_hooks, "run", "--rm",
                                 *RUN[3:], *OPT_IN, *image, "true"],
                                capture_output=True, text=True, timeout=120)
        strict_log = hook_log(os.path.join(top, "strict"))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    with open("/proc/meminfo") as f:
        host_total = f.readline().strip()
    assert memtotal_and_free(out.stdout)[0].split() == host_total.split()
    assert "holds no served file" in log and "the container starts with the kernel's" in log
    assert len(log.splitlines()) == 1, log
    assert strict.returncode != 0
    assert "error running hook" in strict.stderr, strict.stderr
    assert "holds no served file" in strict_log and "(failed)" in strict_log, strict_log


def test_the_hook_runs_only_for_containers_that_opt_in(image):
    top = tempfile.mkdtemp(prefix="guestfs-oci-hook-")
    os.chmod(top, 0o755)
    empty = os.path.join(top, "no-mount")
    os.makedirs(empty)
    try:
        hooks = hooks_dir(top, empty, "--strict")  # would fail any container it ran for
        out = subprocess.run(["podman", "--hooks-dir", hooks, "run", "--rm", *RUN[3:],
                              *image, "true"], capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert out.returncode == 0, out.stderr
