"""`guestfs run` as a real runc container's process, under the capability sets Kubernetes
hands a container (containerd for a root process with ``drop: [ALL]`` + ``add``:
bounding = effective = permitted = the added set, inheritable and ambient empty;
``allowPrivilegeEscalation: false`` sets NoNewPrivs), under containerd's default set and
privileged. The daemon and the app must end with exactly the sets docs/deploy.md and
docs/run.md give, with nothing but INFO lines on stderr; and run must work in an image
with no /run, /tmp or /var on a read-only root."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from guestfs.system import kernel
from tests.external.test_real_runc import REPO, bundle

pytestmark = pytest.mark.real
MiB = 1 << 20
PROBE = str(REPO / "tests" / "support" / "caps_probe.py")
# linux/capability.h
CAP = {name: bit for bit, name in enumerate((
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
    "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
    "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO",
    "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE",
    "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
    "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"))}
WRAPPER = ["SYS_ADMIN", "SETPCAP"]   # container/k8s/wrapper/deployment.yaml
# A daemon run cannot hold (libfuse), whose death run heals by re-binding: the path of
# kernels before 6.9.
REBIND = "--fuse-binding mfusepy3"
# containerd's default set for a container (oci.defaultUnixCaps), plus what run needs.
CONTAINERD_DEFAULT = ["CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW",
                      "SETGID", "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE",
                      "SYS_CHROOT", "KILL", "AUDIT_WRITE"]
LOG_LINE = re.compile(r"^guestfs\[\d+\] (INFO|DEBUG) ")


def host_bounding() -> list[str]:
    """Every capability this machine's root may hand a container (a privileged one
    gets them all; here root lacks CAP_SYS_RESOURCE)."""
    with open("/proc/self/status") as f:
        mask = int(next(ln.split()[1] for ln in f if ln.startswith("CapBnd:")), 16)
    return [name for name, bit in CAP.items() if mask >> bit & 1]


def mask(names) -> str:
    return f"{sum(1 << CAP[n] for n in set(names)):016x}"


def run_in_container(tmp_path, caps: list[str], run_args: str = "",
                     no_new_privs: bool = True, privileged: bool = False,
                     minimal: bool = False, app: str = f"python3 {PROBE}",
                     mem: int = 256 * MiB, prepare=None) -> subprocess.CompletedProcess[str]:
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    script = f"exec {sys.executable} -m guestfs run {run_args} -- {app}"
    b = bundle(tmp_path / "bundle", None, script, mem, 100000, fuse_inside=True,
               caps=[f"CAP_{c}" for c in caps], no_new_privs=no_new_privs,
               minimal=minimal, privileged=privileged)
    if prepare is not None:
        prepare(Path(b) / "rootfs")
    cid = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run(["runc", "run", "--bundle", b, cid], capture_output=True,
                              text=True, timeout=120)
    finally:
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)


def probe(out: subprocess.CompletedProcess[str]) -> dict:
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def no_warning(stderr: str) -> None:
    """Nothing but guestfs's INFO/DEBUG lines: no warning, no stray library output."""
    bad = [ln for ln in stderr.splitlines() if not LOG_LINE.match(ln)]
    assert not bad, stderr


def expected(caps: list[str], nnp: bool) -> tuple[dict[str, str], dict[str, str]]:
    """(app, daemon) as docs/deploy.md gives them: the app keeps the container's set
    but CAP_SYS_ADMIN; the daemon keeps CAP_SYS_PTRACE if it was given, else nothing."""
    app = mask(c for c in caps if c != "SYS_ADMIN")
    daemon = mask(c for c in caps if c == "SYS_PTRACE")
    zero = "0" * 16
    return ({"CapInh": zero, "CapPrm": app, "CapEff": app, "CapBnd": app, "CapAmb": zero,
             "NoNewPrivs": "1" if nnp else "0"},
            {"CapInh": zero, "CapPrm": daemon, "CapEff": daemon, "CapBnd": daemon,
             "CapAmb": zero, "NoNewPrivs": "1"})


def test_wrapper_manifest_set_by_hand(tmp_path):
    """drop ALL + add SYS_ADMIN, SETPCAP: the app has CAP_SETPCAP only (bit 8), the daemon
    nothing, both NoNewPrivs; before, the daemon kept SYS_ADMIN + SETPCAP (0x200100) and
    warned `capabilities kept: capset: Operation not permitted`."""
    got = probe(out := run_in_container(tmp_path, WRAPPER))
    no_warning(out.stderr)
    assert {k: got["app"][k] for k in ("CapPrm", "CapEff", "CapBnd")} == \
        dict.fromkeys(("CapPrm", "CapEff", "CapBnd"), "0000000000000100")
    assert len(got["daemons"]) == 1
    assert {k: got["daemons"][0][k] for k in ("CapPrm", "CapEff", "CapBnd", "NoNewPrivs")} \
        == {"CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16, "NoNewPrivs": "1"}


CASES = {
    "wrapper": (WRAPPER, True, False),
    "wrapper+SYS_TIME": ([*WRAPPER, "SYS_TIME"], True, False),
    "wrapper+SYS_PTRACE": ([*WRAPPER, "SYS_PTRACE"], True, False),
    "containerd-default+SYS_ADMIN": ([*CONTAINERD_DEFAULT, "SYS_ADMIN"], False, False),
    "privileged": (None, False, True),
}


@pytest.mark.parametrize("case", CASES)
def test_capability_sets_and_clock(tmp_path, case):
    caps, nnp, privileged = CASES[case]
    caps = caps if caps is not None else host_bounding()
    out = run_in_container(tmp_path, caps, no_new_privs=nnp, privileged=privileged)
    got = probe(out)
    no_warning(out.stderr)
    app, daemon = expected(caps, nnp)
    assert got["app"] == app
    assert got["daemons"] == [daemon]
    assert got["memtotal_kb"] == 256 * 1024
    offset = next(int(ln.split()[1]) for ln in got["offsets"].splitlines()
                  if ln.split()[0] in ("boottime", "7"))
    if "SYS_TIME" in caps:
        # The container's own boot clock: ps ELAPSED (boot clock minus start times)
        # agrees with the served uptime, both counted from the container's start.
        assert offset < 0
        assert abs(got["boottime"] - got["uptime"]) < 2.0
    else:
        assert offset == 0      # the host's clock, said only at -v
        assert got["boottime"] > got["uptime"]


def test_missing_sys_time_is_one_line_at_verbose(tmp_path):
    out = run_in_container(tmp_path, WRAPPER, run_args="-v")
    probe(out)
    assert not re.search(r"^guestfs\[\d+\] (WARNING|ERROR) ", out.stderr, re.M), out.stderr
    # mfusepy's DEBUG line (and traceback) for every errno it returns is not guestfs's -v:
    # the ENOSYS that selects the page cache is by design.
    assert "Traceback" not in out.stderr and " fuse: " not in out.stderr, out.stderr
    clock = [ln for ln in out.stderr.splitlines() if "boot clock" in ln]
    assert len(clock) == 1 and "CAP_SYS_TIME" in clock[0] and " DEBUG " in clock[0], \
        out.stderr


def test_minimal_image_read_only_without_run_tmp_var(tmp_path):
    """No /run, /tmp or /var, a read-only root, Kubernetes' wrapper set and NoNewPrivs:
    run mounts in a private tmpfs over /dev/mqueue (the first candidate this image has)
    that the app never sees, and the app sees its limit."""
    out = run_in_container(tmp_path, WRAPPER, minimal=True,
                           app="sh -c 'cat /proc/meminfo; cat /proc/self/mountinfo'")
    assert out.returncode == 0, out.stdout + out.stderr
    no_warning(out.stderr)
    memtotal = next(int(ln.split()[1]) for ln in out.stdout.splitlines()
                    if ln.startswith("MemTotal:"))
    assert memtotal == 256 * 1024
    mounts = [ln.split() for ln in out.stdout.splitlines() if " - " in ln]
    tops = {m[4]: m[m.index("-") + 1] for m in mounts}
    assert tops["/dev/mqueue"] == "mqueue"      # the app's own, not run's tmpfs
    # The app sees only the served files of run's FUSE mount, never the mount itself (its
    # name cannot tell: a checkout bound in may be called guestfs too, as CI's is).
    fuse = [m[4] for m in mounts if m[m.index("-") + 1].startswith("fuse")]
    assert fuse and all(p.startswith(("/proc/", "/sys/")) for p in fuse), fuse


def test_read_only_run_stays_the_images_for_the_app(tmp_path):
    """/run exists but is read-only (readOnlyRootFilesystem): the private tmpfs covers
    it for run and its daemon only; the app reads the image's /run/secrets and the
    volume mounted beneath /run (Kubernetes' service account token, /var/run/secrets
    through the /var/run -> /run link of most images)."""
    volume = tmp_path / "serviceaccount"
    volume.mkdir()
    (volume / "token").write_text("volume's token\n")

    def prepare(rootfs: Path) -> None:
        (rootfs / "run/secrets").mkdir(parents=True)
        (rootfs / "run/secrets/token").write_text("image's secret\n")
        config = rootfs.parent / "config.json"
        cfg = json.loads(config.read_text())
        cfg["mounts"].append({"destination": "/run/secrets/kubernetes.io/serviceaccount",
                              "type": "bind", "source": str(volume),
                              "options": ["rbind", "ro"]})
        config.write_text(json.dumps(cfg))

    app = ("sh -c 'cat /run/secrets/token /run/secrets/kubernetes.io/serviceaccount/token; "
           "grep MemTotal /proc/meminfo'")
    out = run_in_container(tmp_path, WRAPPER, minimal=True, prepare=prepare, app=app)
    assert out.returncode == 0, out.stdout + out.stderr
    no_warning(out.stderr)
    assert out.stdout.splitlines()[:2] == ["image's secret", "volume's token"]
    assert out.stdout.split()[-2] == str(256 * 1024)


def test_explicit_unwritable_mountpoint_is_one_line(tmp_path):
    out = run_in_container(tmp_path, WRAPPER, minimal=True,
                           run_args="--mountpoint /usr/guestfs", app="true")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "/usr/guestfs" in lines[0] and "Read-only file system" in lines[0] \
        and "writable" in lines[0]


RESTART_APP = r"""
import os, signal, sys, time
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from caps_probe import daemons
def memtotal():
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("MemTotal:"))
    except OSError as e:
        return e.errno
first = memtotal()
old = daemons()
os.kill(int(old[0]), signal.SIGKILL)
deadline = time.monotonic() + float(sys.argv[2])
new = []
while time.monotonic() < deadline:
    new = [p for p in daemons() if p not in old]
    if new and memtotal() == first:
        break
    time.sleep(0.2)
print(first, memtotal(), len(new))
"""


def test_daemon_restart_rebinds_in_minimal_image(tmp_path):
    """In the private space the app has no mountpoint to re-bind: a killed daemon is
    restarted (in run's namespace) and only the files are bound again. Joining the
    app's mount namespace needs CAP_SYS_CHROOT."""
    app = f"python3 -c '{RESTART_APP}' {PROBE} 60"
    out = run_in_container(tmp_path, [*WRAPPER, "SYS_CHROOT"], minimal=True, app=app,
                           run_args=REBIND)
    assert out.returncode == 0, out.stdout + out.stderr
    first, again, restarted = out.stdout.split()
    assert first == again == str(256 * 1024) and restarted == "1", out.stderr
    assert "files re-bound" in out.stderr and "ERROR" not in out.stderr, out.stderr


def test_daemon_restart_without_sys_chroot_is_one_error_line(tmp_path):
    """Kubernetes' wrapper set has no SYS_CHROOT: the new daemon serves, but its files
    cannot reach the app (ENOTCONN), said once with the fix, however often it retries."""
    app = f"python3 -c '{RESTART_APP}' {PROBE} 8"
    out = run_in_container(tmp_path, WRAPPER, app=app, run_args=REBIND)
    assert out.returncode == 0, out.stdout + out.stderr
    first, again, restarted = out.stdout.split()
    assert first == str(256 * 1024) and again == "107" and restarted == "1"  # ENOTCONN
    errors = [ln for ln in out.stderr.splitlines() if " ERROR " in ln]
    assert len(errors) == 1 and "add SYS_CHROOT" in errors[0], out.stderr


@pytest.mark.parametrize("minimal", [False, True], ids=["debian", "minimal-read-only"])
def test_a_held_daemon_killed_under_the_wrapper_set_is_succeeded(tmp_path, minimal):
    """Linux 6.9+: run holds its connection, so Kubernetes' own wrapper set (no SYS_CHROOT)
    survives a kill -9 of the daemon too: the holder's successor serves the same
    connection and the app reads its limit again, with nothing re-bound and no error."""
    if not kernel.kernel_resends():
        pytest.skip(f"Linux {os.uname().release} has no FUSE_NOTIFY_RESEND (6.9+): run "
                    "re-binds (the tests above)")
    app = f"python3 -c '{RESTART_APP}' {PROBE} 20"
    out = run_in_container(tmp_path, WRAPPER, app=app, minimal=minimal)
    assert out.returncode == 0, out.stdout + out.stderr
    first, again, restarted = out.stdout.split()
    assert first == again == str(256 * 1024) and restarted == "1", out.stderr
    assert "re-bound" not in out.stderr and "ERROR" not in out.stderr, out.stderr


def test_without_setpcap_run_refuses_in_one_line_or_keeps_caps_when_asked(tmp_path):
    """drop ALL + add SYS_ADMIN only: the app would keep SYS_ADMIN, so run refuses;
    with --keep-caps the app has it by request, and the daemon, unable to lower its
    bounding set, keeps nothing effective or permitted (NoNewPrivs bars any regain)."""
    out = run_in_container(tmp_path / "a", ["SYS_ADMIN"])
    assert out.returncode == 127
    refusal = [ln for ln in out.stderr.splitlines() if not LOG_LINE.match(ln)]
    assert len(refusal) == 1 and "CAP_SETPCAP" in refusal[0] \
        and "--keep-caps" in refusal[0], out.stderr
    got = probe(out := run_in_container(tmp_path / "b", ["SYS_ADMIN"], run_args="--keep-caps"))
    no_warning(out.stderr)
    sys_admin = "0000000000200000"
    assert [got["app"][k] for k in ("CapEff", "CapPrm", "CapBnd")] == [sys_admin] * 3
    assert [got["daemons"][0][k] for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs")] \
        == ["0" * 16, "0" * 16, sys_admin, "1"]
