"""The least-privilege sidecar, without a cluster: a "pod" user namespace mapping uids
0-65535 to host uids 100000+, an app container (its own mount namespace, made before
guestfs mounts, so it never sees the mount), and a sidecar (another mount namespace) whose
bounding set holds only CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_SYS_CHROOT of the pod's user
namespace. The sidecar mounts guestfs privately and `attach` moves the files into the app
(open_tree + setns + move_mount): no propagation, no host privilege. Then the daemon is
killed and restarted, and attach heals the app."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from tests.support.fusemount import require_fuse
from tests.support.paths import REPO

pytestmark = pytest.mark.real
HOST_ID = 100000
SIZE = 65536
SIDECAR_CAPS = "-all,+sys_admin,+sys_ptrace,+sys_chroot"

# Enters a new user + mount namespace, waits for the parent to write the id maps, becomes
# the namespace's root (while it still holds the creator's capabilities) and runs the pod.
POD = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
print("unshared", flush=True)
sys.stdin.readline()
# Directories only host root may cross (a Python under /root): still their owner before
# setresuid, keep a handle on what lies below; as the namespace's root, cover the directory
# with a tmpfs and put that back there.
pairs = list(zip(sys.argv[2::2], sys.argv[3::2], strict=True))
held = [(top, below, os.open(below, os.O_PATH)) for top, below in pairs]
os.setresgid(0, 0, 0)
os.setresuid(0, 0, 0)
if libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) != 0:  # MS_REC | MS_PRIVATE
    sys.exit("make-rprivate failed")
for top in dict.fromkeys(top for top, _ in pairs):
    if libc.mount(b"tmpfs", top.encode(), b"tmpfs", 0, b"mode=755") != 0:
        sys.exit(f"tmpfs over {top}: {os.strerror(ctypes.get_errno())}")
for top, below, fd in held:
    os.makedirs(below, exist_ok=True)
    if libc.mount(f"/proc/self/fd/{fd}".encode(), below.encode(), None, 4096 | 16384,
                  None) != 0:  # MS_BIND | MS_REC
        sys.exit(f"bind {below}: {os.strerror(ctypes.get_errno())}")
os.execvp("sh", ["sh", "-c", sys.argv[1]])
"""

# $G: guestfs's command; $D: a scratch directory; $MP: the sidecar's private mountpoint.
POD_SCRIPT = r"""
set -u
mount --bind "$D/fuse" /dev/fuse
mount -t tmpfs -o mode=755 tmpfs /run    # the pod's own /run (guestfs keeps its locks there)
unshare --mount --propagation private sh -c 'echo $$ > "$D/app"; exec sleep 600' &
while [ ! -s "$D/app" ]; do sleep 0.05; done
app=$(cat "$D/app")
sidecar() {
  exec unshare --mount --propagation private setpriv --bounding-set "$CAPS" -- sh -c "$1"
}
free_in_app() { nsenter -t "$app" -m free -m | awk '/^Mem:/ {print $2}'; }
mount_daemon() {  # $1: memory limit; the daemon lives in the sidecar's namespace only
  sidecar "grep ^CapBnd /proc/self/status > $D/capbnd
           $G mount $MP --allow-other --memory-limit $1 2>>$D/log & echo \$! > $D/daemon
           for i in \$(seq 100); do head -c1 $MP/proc/meminfo >/dev/null 2>&1 && break
           sleep 0.1; done
           $G attach --pid $app --source $MP; echo attach rc=\$? | tee $D/rc
           nsenter -t $app -m sh -c 'test -e $MP/proc/meminfo && echo app sees the mount'
           exec sleep 600" &
  echo $! > "$D/sidecar"
  rm -f "$D/rc"
  for i in $(seq 400); do grep -qs "rc=" "$D/rc" && break; sleep 0.05; done  # attach done
  for i in $(seq 100); do
    [ "$(free_in_app)" = "$2" ] && break
    grep -qs "rc=[1-9]" "$D/rc" && break
    sleep 0.05
  done
  echo "free: $(free_in_app)"
}
mount_daemon 512Mi 512
cat "$D/capbnd"
if grep -qs "rc=[1-9]" "$D/rc"; then kill "$(cat $D/daemon)" "$(cat $D/sidecar)" "$app"; exit; fi
kill -9 "$(cat $D/daemon)"
for i in $(seq 100); do [ "$(free_in_app)" != 512 ] && break; sleep 0.05; done
echo "after kill: $(free_in_app 2>&1 | head -c 40)"
kill "$(cat $D/sidecar)"   # the kubelet restarts the sidecar container
mount_daemon 256Mi 256
kill "$(cat $D/daemon)"
kill "$(cat $D/sidecar)" "$app"
"""


def closed_to_others(path: str) -> list[str]:
    """(directory, path below it) for the outermost ancestor of ``path`` that others
    cannot cross, or nothing: what the pod's mapped root could not reach."""
    parts = os.path.realpath(path).split("/")[1:]
    for i in range(1, len(parts)):
        top = "/" + "/".join(parts[:i])
        if not os.stat(top).st_mode & stat.S_IXOTH:
            return [top, "/" + "/".join(parts[:i + 1])]
    return []


def run_pod(caps: str) -> tuple[list[str], str]:
    """POD_SCRIPT in a fresh pod user namespace, the sidecar bounded to ``caps``."""
    require_fuse()
    if not os.path.exists("/proc/self/ns/user"):
        pytest.skip("this kernel has no user namespaces")
    d = tempfile.mkdtemp(prefix="guestfs-attach-userns-")
    os.chmod(d, 0o755)
    # runc-style: the host's /dev/fuse is 0600 root here, so the pod gets a node owned by
    # its mapped root, bound over /dev/fuse inside its own mount namespace.
    os.mknod(f"{d}/fuse", 0o600 | stat.S_IFCHR, os.stat("/dev/fuse").st_rdev)
    os.chown(f"{d}/fuse", HOST_ID, HOST_ID)
    os.chown(d, HOST_ID, HOST_ID)
    mp = f"{d}/mnt"
    env = {**os.environ, "D": d, "MP": mp, "CAPS": caps,
           "G": f"{sys.executable} -m guestfs"}
    # Python, the venv and guestfs's source (an editable install) must be reachable.
    needed = (sys.base_prefix, sys.prefix, str(REPO / "guestfs"))
    reach = [p for pair in dict.fromkeys(tuple(closed_to_others(n)) for n in needed)
             for p in pair]
    pod = subprocess.Popen([sys.executable, "-I", "-c", POD, POD_SCRIPT, *reach], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert pod.stdout is not None and pod.stdin is not None
        assert pod.stdout.readline().strip() == "unshared"
        for kind in ("uid_map", "gid_map"):
            with open(f"/proc/{pod.pid}/{kind}", "w") as f:
                f.write(f"0 {HOST_ID} {SIZE}\n")
        pod.stdin.write("go\n")
        pod.stdin.flush()
        out, err = pod.communicate(timeout=120)
    finally:
        if pod.poll() is None:
            os.killpg(pod.pid, 9)
            pod.wait()
        shutil.rmtree(d, ignore_errors=True)
    return out.splitlines(), out + err


def test_sidecar_attaches_with_only_namespaced_caps_and_heals():
    lines, out = run_pod(SIDECAR_CAPS)
    assert lines.count("attach rc=0") == 2, out
    assert "app sees the mount" not in lines    # moved in, not propagated
    # CAP_SYS_CHROOT (18), CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21) and nothing else
    assert "CapBnd:\t00000000002c0000" in lines, out
    # 10 files, and the 3 pressure files: a per-caller mount on guestfs's engine takes
    # PSI triggers (tests/host/test_psi_triggers.py)
    assert any("(move_mount)" in ln and "bound 13," in ln for ln in lines), out
    assert "free: 512" in lines and "free: 256" in lines, out
    after_kill = next(ln for ln in lines if ln.startswith("after kill:"))
    assert "512" not in after_kill              # stale until the sidecar is back


@pytest.mark.parametrize("caps,error", [
    # the app holds capabilities the sidecar lacks: reading its namespace is a ptrace check
    ("-all,+sys_admin,+sys_chroot", "cannot open its mount namespace: Permission denied"),
    # setns() into a mount namespace asks for CAP_SYS_CHROOT as well as CAP_SYS_ADMIN
    ("-all,+sys_admin,+sys_ptrace", "cannot enter its mount namespace: Operation not "
                                    "permitted"),
], ids=["without-SYS_PTRACE", "without-SYS_CHROOT"])
def test_each_sidecar_capability_is_needed(caps, error):
    lines, out = run_pod(caps)
    assert "attach rc=1" in lines and error in out, out
    assert "Traceback" not in out
