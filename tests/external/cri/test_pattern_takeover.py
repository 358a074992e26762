"""The wrapper's and the sidecar's daemons killed inside their pods, on Kubernetes' runtime
path: each pattern deployed from its shipped manifest (container/k8s/wrapper, a held
`guestfs run`; container/k8s/sidecar, `guestfs mount --hold` in a native sidecar), its
serving daemon killed with -9 from the node several times, as the OOM killer kills it,
while the app reads /proc/meminfo, /proc/stat and /proc/uptime all along and checks every
reading. Each death is succeeded by the pod's own holder on the same connection: no read
fails, no value is wrong, and the app's binds are the same mounts at the end.

What the readers measured (reads, the longest single read) is printed (`pytest -s`)."""

from __future__ import annotations

import pytest

from guestfs.system import kernel
from tests.external.cri.test_patterns import K8S, LIMIT, finish
from tests.support.cri import takeover
from tests.support.cri.translate import translate

pytestmark = pytest.mark.real

KILLS = 10

PLANS = {
    "wrapper": (K8S / "wrapper", {"registry.example/app-with-guestfs:1.0": "guestfs"}),
    # A Debian userland: the host's /usr, so python3 too (tests/support/cri/images.py).
    "sidecar": (K8S / "sidecar", {"registry.example/guestfs:0.1": "guestfs",
                                  "registry.example/app:1.0": "debian"}),
}


@pytest.mark.parametrize("pattern", sorted(PLANS))
def test_a_daemon_killed_in_the_pod_fails_no_read(cri_node, pattern):
    if not kernel.kernel_resends():
        # Without FUSE_NOTIFY_RESEND --hold serves as without a holder: the wrapper heals
        # by re-binding and the sidecar's attach by re-attaching, with ENOTCONN between.
        pytest.skip("this kernel has no FUSE_NOTIFY_RESEND (Linux 6.9+): nothing holds")
    path, images = PLANS[pattern]
    plan = translate(path, images=images,
                     programs={"app": takeover.reader_program(LIMIT // 1024, 1)})
    pod = cri_node.run(plan)
    try:
        def logs() -> str:
            return "".join(pod.logs(c) for c in pod.ids)
        takeover.wait(lambda: takeover.progress(pod) >= 20, 60, logs)
        holders = takeover.holders(pod)
        # One holder, the pod's own: otherwise these kills would test a re-bind instead.
        assert len(holders) == 1, (holders, logs()[-3000:])
        killed = takeover.kill_in_turn(pod, KILLS, logs)
        assert takeover.holders(pod) == holders
        report = takeover.stop_reader(pod)
    finally:
        finish(pod)
    files = report["files"]
    reads = sum(f["reads"] for f in files.values())
    longest = max(f["longest"] for f in files.values())
    each = ", ".join(f"{p} {f['reads']}" for p, f in files.items())
    print(f"\n{pattern}: {len(killed)} kill -9s, {reads} reads "
          f"({each}), "
          f"{sum(f['failed'] for f in files.values())} failed, "
          f"{sum(f['wrong'] for f in files.values())} wrong, longest read {longest:.3f} s, "
          f"{report['unbound']} reads before the binds")
    for p, f in files.items():
        assert f["failed"] == 0 and f["wrong"] == 0, (p, f["errors"])
        # Each kill waited for 10 reads of every file through its successor.
        assert f["reads"] >= 20 + 10 * KILLS, (p, f)
        assert f["longest"] < takeover.HANG_S, (p, f)
    assert len(report["before"]) == 3 and report["before"] == report["after"], report
    if pattern == "wrapper":
        assert report["unbound"] == 0      # run binds before it executes the app
