"""Idmapped binds of served files, as kubelet makes them for a pod with hostUsers: false
(Kubernetes >= 1.33's default for user-namespaced pods): every hostPath volume is bound
with the pod's user namespace as its idmapping (mount_setattr, MOUNT_ATTR_IDMAP).

The kernel accepts that on a FUSE mount only if its server negotiated FUSE_ALLOW_IDMAP
(Linux >= 6.12), which needs default_permissions: guestfs's own engine does both, libfuse
3.14 cannot. Here a real mount is bound so from a private mount namespace into a "pod"
user namespace (0-65535 -> host 100000+), and read there by a process of uid 1000 of the
namespace that sits in a real cgroup limited to 512 MiB: it must read a well-formed
meminfo of its own limit. With mfusepy on libfuse3 the same bind is refused with EINVAL,
as a pod's start fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.sources.containerdirs import dir_key
from guestfs.system.kernel import kernel_release
from tests.support.fusemount import mounted, private_mountpoint
from tests.support.heldmount import HeldMount, kill_in_turn
from tests.support.mounts import wait_for
from tests.support.paths import REPO
from tests.support.realcg import in_cgroup, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20
IDMAP_KERNEL = (6, 12)     # FUSE_ALLOW_IDMAP, protocol 7.41
LIMIT = 512 * MiB
HOST_ID, SIZE = 100000, 65536
READER_UID = 1000
READER = REPO / "tests" / "support" / "idmap_reader.py"
# "Name:   123 kB" or "Name:   123" (HugePages_*), as the kernel's own file.
MEMINFO_LINE = re.compile(r"^[A-Za-z][A-Za-z0-9_()]*:\s+\d+( kB)?$")


def require_idmap_kernel() -> None:
    if kernel_release() < IDMAP_KERNEL:
        pytest.skip(f"FUSE_ALLOW_IDMAP needs Linux 6.12; this is {os.uname().release}")


@contextlib.contextmanager
def pod_user_namespace() -> Iterator[int]:
    """The pid of a process alone in a new user namespace mapping 0-65535 to host
    100000-165535, as kubelet maps a pod's; killed at the end (the namespace with it)."""
    ours = os.readlink("/proc/self/ns/user")
    proc = subprocess.Popen(["unshare", "--user", "sleep", "600"])
    try:
        assert wait_for(lambda: os.readlink(f"/proc/{proc.pid}/ns/user") != ours, 10), \
            "unshare --user did not make a user namespace"
        for kind in ("uid_map", "gid_map"):
            Path(f"/proc/{proc.pid}/{kind}").write_text(f"0 {HOST_ID} {SIZE}\n")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def reader_argv(source: str, userns_pid: int, *more: str) -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", sys.executable, str(READER),
            source, str(userns_pid), str(READER_UID), *more]


def read_through_idmapped_bind(source: str, cg, userns_pid: int) -> dict:
    """What idmap_reader.py reports of ``source`` bound idmapped and read by uid
    READER_UID of the namespace, every process of it inside ``cg``."""
    done = in_cgroup(cg, reader_argv(source, userns_pid), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def next_report(proc: subprocess.Popen[bytes], timeout: float = 30) -> dict:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no report from idmap_reader.py within {timeout} s"
    line = proc.stdout.readline()
    assert line, f"idmap_reader.py exited with {proc.wait()}"
    return json.loads(line)


def check_meminfo(got: dict, served_directly: str) -> None:
    assert got.get("idmap_error") is None and "read_error" not in got, got
    # A pod's process: uid 1000 inside, host uid 101000; the file owned by root inside
    # (host uid 0 through the mount's idmapping), not by the overflow uid 65534.
    assert got["uid_inside"] == READER_UID and got["host_uid"] == HOST_ID + READER_UID, got
    assert got["stat_uid"] == 0, got
    lines = got["text"].splitlines()
    assert lines and all(MEMINFO_LINE.match(line) for line in lines), got["text"]
    kb = {line.split(":")[0]: int(line.split()[1]) for line in lines}
    assert kb["MemTotal"] == LIMIT // 1024, got["text"]   # the reader's own cgroup's limit
    assert 0 < kb["MemFree"] <= kb["MemAvailable"] <= kb["MemTotal"], got["text"]
    assert [line.split(":")[0] for line in lines] == \
        [line.split(":")[0] for line in served_directly.splitlines()]


@pytest.fixture
def pod():
    require_idmap_kernel()
    with v1_cgroup(LIMIT, 100000, 100000) as cg, pod_user_namespace() as userns_pid:
        yield cg, userns_pid


def status(mp: Path) -> dict:
    return json.loads((mp / ".guestfs-status").read_text())


# The DaemonSet's guestfs container (held: its connection in the FUSE holder), and the
# engine named without a holder.
@pytest.mark.parametrize("args", [["--hold"], ["--fuse-binding", "guestfs"]],
                         ids=["held", "engine"])
def test_an_idmapped_bind_of_a_per_caller_file_reads_the_readers_meminfo(pod, args):
    cg, userns_pid = pod
    with private_mountpoint() as mp, mounted(str(mp), "--allow-other", *args):
        assert status(mp)["idmapped_binds"] is True
        got = read_through_idmapped_bind(str(mp / "proc" / "meminfo"), cg, userns_pid)
        check_meminfo(got, (mp / "proc" / "meminfo").read_text())


def test_an_idmapped_bind_of_a_per_container_file(pod):
    """The DaemonSet's other mount (page-cached, per container) bound the same way."""
    cg, userns_pid = pod
    with private_mountpoint() as mp, \
            mounted(str(mp), "--per-container", "--allow-other", "--hold"):
        src = mp / dir_key(cg.paths["memory"]) / "proc" / "meminfo"
        got = read_through_idmapped_bind(str(src), cg, userns_pid)
        check_meminfo(got, src.read_text())


def test_libfuse_cannot_negotiate_it_and_the_bind_is_refused(pod):
    """What makes the tests above able to fail: the same bind of mfusepy on libfuse3's
    mount, which cannot ask for FUSE_ALLOW_IDMAP, is refused by the kernel."""
    cg, userns_pid = pod
    pytest.importorskip("mfusepy")
    with private_mountpoint() as mp, \
            mounted(str(mp), "--allow-other", "--fuse-binding", "mfusepy3"):
        assert status(mp)["idmapped_binds"] is False
        got = read_through_idmapped_bind(str(mp / "proc" / "meminfo"), cg, userns_pid)
        assert got == {"idmap_error": "EINVAL"}


def test_without_allow_other_the_pods_uid_is_refused(pod):
    """An idmapped bind does not change who may use the mount: FUSE's allow_other check
    looks at the caller's own uid (host 101000), so the DaemonSet's --allow-other stays
    needed."""
    cg, userns_pid = pod
    with private_mountpoint() as mp, mounted(str(mp), "--fuse-binding", "guestfs"):
        got = read_through_idmapped_bind(str(mp / "proc" / "meminfo"), cg, userns_pid)
        assert got.get("idmap_error") is None and got.get("read_error") == "EACCES", got


def test_a_pods_idmapped_bind_reads_on_across_its_daemons_deaths(pod):
    """The DaemonSet's daemon restarts under a user-namespaced pod: a held mount's daemon
    killed (-9) twice, once succeeded by a new `guestfs mount --hold` (a restarted
    container), once by the holder's successor. The bind made before reads right after,
    and the successor, which took INIT's parameters over, says idmapped binds are
    accepted."""
    cg, userns_pid = pod
    root = Path(tempfile.mkdtemp(prefix="guestfs-idmap-held-"))
    m = HeldMount(root)
    m.args = ["--allow-other"]
    reader = None
    try:
        m.start()
        assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
        source = os.path.join(m.mp, "proc", "meminfo")
        shell = f'for d in {" ".join(cg.dirs.values())}; do echo $$ > $d/cgroup.procs; ' \
                'done; exec "$@"'
        reader = subprocess.Popen(["sh", "-c", shell, "_",
                                   *reader_argv(source, userns_pid, "--again")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        check_meminfo(next_report(reader), Path(source).read_text())
        first_daemon = m.serving_pid()
        kill_in_turn(m, 2)
        assert m.serving_pid() != first_daemon
        assert reader.stdin is not None
        reader.stdin.write(b"\n")
        reader.stdin.flush()
        check_meminfo(next_report(reader), Path(source).read_text())
        assert status(Path(m.mp))["idmapped_binds"] is True
    finally:
        if reader is not None:
            reader.kill()
            reader.wait()
        m.cleanup()
        shutil.rmtree(root, ignore_errors=True)
