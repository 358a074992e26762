"""The sidecar pattern with real runc containers, laid out the way containerd 1.6 lays out a
shareProcessNamespace pod on cgroup v1: a pod cgroup made like kubelet makes it, the sidecar
and the app each in a cgroup of their own below it, the app joining the sidecar's pid
namespace through ``linux.namespaces`` (containerd points every container of such a pod at
one pid namespace), and each with runc's default ``cgroup`` mount, which shows a container
only its own cgroup. The sidecar holds the manifest's capabilities (drop ALL, add SYS_ADMIN,
SYS_PTRACE, SYS_CHROOT) and /dev/fuse, and runs the manifest's commands. The app reads its
own 512 MiB and 1 CPU: the daemon cannot see the app's cgroup through its own mounts and
finds it through the app's (/proc/<pid>/root, guestfs/sources/reader_root.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from guestfs.sources.mountinfo import parse_mountinfo
from tests.external.test_real_runc import MiB, bundle
from tests.external.test_real_runc_attach import container_pid
from tests.support.fusemount import require_fuse, wait_for
from tests.support.realcg import require_v1_root

pytestmark = pytest.mark.real
SIDECAR_CAPS = ("CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_CHROOT")
GUESTFS = str(Path(sys.prefix) / "bin" / "guestfs")
# The sidecar's command in container/k8s/sidecar/deployment.yaml.
MANIFEST = (f"{GUESTFS} mount /run/guestfs --hold --daemon --allow-other && "
            f"exec {GUESTFS} attach --watch --source /run/guestfs")
# Run as the container's init's child: when the commands fail (a capability missing), the
# pod's pid namespace lives on, as the pause container keeps it in Kubernetes.
SIDECAR_SCRIPT = f"sh -c '{MANIFEST}'; echo sidecar exited rc=$?; exec sleep 600"
APP_READS = ("grep ^MemTotal: /proc/meminfo; grep -c ^processor /proc/cpuinfo; "
             "cat /sys/devices/system/cpu/online; free -m | awk '/^Mem:/ {print $2}'")


def _v1_roots() -> list[str]:
    """Every cgroup v1 hierarchy's mount point (runc makes the container's cgroup in each)."""
    with open("/proc/self/mountinfo") as f:
        return [m.mount_point for m in parse_mountinfo(f.read()) if m.version in (1, 2)
                and m.root == "/"]


@contextlib.contextmanager
def pod_cgroup() -> Iterator[str]:
    """/guestfs-test-pod<uid> in every hierarchy, as kubelet's pod container manager makes
    it for a pod whose sidecar has no limits: no memory limit, no CFS quota on the pod.
    Removed at the end with whatever runc left below it."""
    require_v1_root()
    path = f"/guestfs-test-pod{uuid.uuid4()}"
    made: list[str] = []
    try:
        for top in _v1_roots():
            d = top + path
            os.mkdir(d)
            made.append(d)
            if os.path.exists(f"{top}/cpuset.cpus"):
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(f"{top}/{name}") as src, open(f"{d}/{name}", "w") as dst:
                        dst.write(src.read().strip())
        yield path
    finally:
        for d in reversed(made):
            for sub in sorted((p for p in Path(d).iterdir() if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
            os.rmdir(d)  # raise: a leaked cgroup must fail loudly


def sidecar_bundle(path: Path, cgroup: str, caps: tuple[str, ...]) -> str:
    b = bundle(path, None, SIDECAR_SCRIPT, 0, 0, fuse_inside=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["process"]["capabilities"] = {k: list(caps)
                                      for k in ("bounding", "effective", "permitted")}
    cfg["linux"]["resources"].pop("memory", None)   # the sidecar has no limits
    cfg["linux"]["resources"].pop("cpu", None)
    cfg["linux"]["cgroupsPath"] = cgroup
    (path / "config.json").write_text(json.dumps(cfg))
    return b


def app_bundle(path: Path, cgroup: str, sidecar_pid: int) -> str:
    b = bundle(path, None, "exec sleep 600", 512 * MiB, 100000)
    cfg = json.loads((path / "config.json").read_text())
    cfg["linux"]["namespaces"] = [
        {"type": "pid", "path": f"/proc/{sidecar_pid}/ns/pid"} if n["type"] == "pid" else n
        for n in cfg["linux"]["namespaces"]]
    cfg["linux"]["cgroupsPath"] = cgroup
    (path / "config.json").write_text(json.dumps(cfg))
    return b


def has_bind(pid: int, target: str) -> bool:
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return any(ln.split()[4] == target for ln in f)
    except OSError:
        return False


@dataclass
class Pod:
    sidecar: str
    app: str
    app_pid: int | None
    log: str


def exec_in(cid: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runc", "exec", cid, "sh", "-c", script], capture_output=True,
                          text=True, timeout=60)


@contextlib.contextmanager
def sidecar_pod(caps: tuple[str, ...] = SIDECAR_CAPS) -> Iterator[Pod]:
    """The pod running, the app's files attached (or attach given up after 20 s)."""
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    require_fuse()
    top = Path(tempfile.mkdtemp(prefix="guestfs-sidecar-"))
    os.chmod(top, 0o755)
    ids = [f"guestfs-test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    procs: list[subprocess.Popen[str]] = []
    log = top / "sidecar.log"
    try:
        with pod_cgroup() as pod, open(log, "w") as out:
            procs.append(subprocess.Popen(
                ["runc", "run", "--bundle", sidecar_bundle(top / "sidecar", f"{pod}/sidecar",
                                                           caps), ids[0]],
                stdout=out, stderr=subprocess.STDOUT, text=True))
            assert wait_for(lambda: container_pid(ids[0]) is not None, 30), log.read_text()
            sidecar_pid = container_pid(ids[0])
            assert sidecar_pid is not None
            procs.append(subprocess.Popen(
                ["runc", "run", "--bundle", app_bundle(top / "app", f"{pod}/app",
                                                       sidecar_pid), ids[1]],
                stdout=subprocess.DEVNULL, stderr=out, text=True))
            assert wait_for(lambda: container_pid(ids[1]) is not None, 30), log.read_text()
            app_pid = container_pid(ids[1])
            assert app_pid is not None
            wait_for(lambda: has_bind(app_pid, "/proc/meminfo"), 20)
            try:
                yield Pod(ids[0], ids[1], app_pid, str(log))
            finally:
                for cid in reversed(ids):
                    subprocess.run(["runc", "kill", cid, "KILL"], capture_output=True)
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=30)
                for cid in reversed(ids):
                    subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for cid in ids:
            subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def app_reads(pod: Pod) -> list[str]:
    out = exec_in(pod.app, APP_READS)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_app_reads_its_own_limits_through_the_sidecars_daemon():
    with sidecar_pod() as pod:
        assert pod.app_pid is not None and has_bind(pod.app_pid, "/proc/meminfo"), \
            Path(pod.log).read_text()
        got = app_reads(pod)
        status = exec_in(pod.sidecar, "cat /run/guestfs/.guestfs-status")
        explain = exec_in(pod.sidecar, f"{GUESTFS} explain --json --pid "
                          f"$(pgrep -o -x sleep)")   # the app's sleep, in the shared pidns
    assert got == ["MemTotal:", "524288", "kB", "1", "0", "512"], got
    assert json.loads(status.stdout)["fallbacks"] == {}, status.stdout
    doc = json.loads(explain.stdout)
    assert doc["memory"]["limit_bytes"] == 512 * MiB
    # Provenance names the file as read: through the app's root.
    assert doc["memory"]["source"]["file"].startswith("/proc/"), doc["memory"]
    assert "/root/sys/fs/cgroup/memory/" in doc["memory"]["source"]["file"], doc["memory"]
    assert doc["memory"]["source"]["cgroup"].endswith("/app")


@pytest.mark.parametrize("dropped,error", [
    # mount(2) of FUSE needs it: the daemon never comes up
    ("CAP_SYS_ADMIN", "the daemon did not come up on /run/guestfs"),
    # /proc/<app>/ns/mnt cannot even be read (the app holds capabilities the sidecar
    # lacks: a ptrace-read check), so `attach --watch` never sees the app's namespace
    ("CAP_SYS_PTRACE", None),
    # setns() into a mount namespace asks for CAP_SYS_CHROOT as well as CAP_SYS_ADMIN
    ("CAP_SYS_CHROOT", "cannot enter its mount namespace: Operation not permitted"),
])
def test_each_of_the_sidecars_capabilities_is_needed(dropped, error):
    caps = tuple(c for c in SIDECAR_CAPS if c != dropped)
    with sidecar_pod(caps) as pod:
        assert pod.app_pid is not None
        attached = has_bind(pod.app_pid, "/proc/meminfo")
        got = app_reads(pod)
        log = Path(pod.log).read_text()
    assert not attached and got[1] != "524288", got   # the app keeps the kernel's files
    assert error is None or error in log, log
    assert "Traceback" not in log, log


def test_without_ptrace_the_daemon_cannot_read_the_apps_root_and_says_so():
    """The lookup itself, apart from attach: `explain --pid` in the sidecar with the
    sidecar's capabilities but SYS_PTRACE reads the app's mounts, not its root."""
    with sidecar_pod(("CAP_SYS_ADMIN", "CAP_SYS_CHROOT")) as pod:
        out = exec_in(pod.sidecar, f"{GUESTFS} explain --json --pid $(pgrep -o -x sleep)")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["memory"]["source"]["kind"] == "host", doc["memory"]
    assert any(w.startswith("memory:") and "cannot be opened safely: Permission denied" in w
               and "CAP_SYS_PTRACE" in w for w in doc["warnings"]), doc["warnings"]


def test_a_tenant_faking_its_cgroup_mount_never_gets_the_fake_limit():
    """A process of the app with CAP_SYS_ADMIN (in a mount namespace of its own, copied
    from the app's, so it keeps the attached files) mounts a tmpfs over
    /sys/fs/cgroup/memory with memory.limit_in_bytes 64 MiB: the daemon refuses that mount
    (another mount over the cgroup mount), serves no 65536 kB, and counts the fallback."""
    fake = ("unshare -m sh -c 'mount -t tmpfs tmpfs /sys/fs/cgroup/memory && "
            "echo 67108864 > /sys/fs/cgroup/memory/memory.limit_in_bytes && "
            "printf \"hierarchical_memory_limit 67108864\\n\" > /sys/fs/cgroup/memory/memory.stat"
            " && grep ^MemTotal: /proc/meminfo'")
    with sidecar_pod() as pod:
        assert pod.app_pid is not None and has_bind(pod.app_pid, "/proc/meminfo")
        out = subprocess.run(["runc", "exec", "--cap", "CAP_SYS_ADMIN", pod.app, "sh", "-c",
                              fake], capture_output=True, text=True, timeout=60)
        status = json.loads(exec_in(pod.sidecar, "cat /run/guestfs/.guestfs-status").stdout)
        # The app's own processes still get their limits once the tenant's view expires.
        honest = wait_for(lambda: app_reads(pod)[1] == "524288", 10)
    assert out.returncode == 0, out.stderr
    total = out.stdout.split()[1]
    assert total != "65536", out.stdout
    with open("/proc/meminfo") as f:
        assert total == f.readline().split()[1]    # the node's, as a counted fallback
    assert status["fallbacks"].get("memory cgroup of a reader not visible", 0) >= 1, status
    assert honest
