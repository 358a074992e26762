"""The shipped DaemonSet's mounts outlive their daemons, on Kubernetes' runtime path: the
guestfs pod's daemon containers are killed and restarted as the kubelet restarts them,
and the pod is replaced as a rolling update replaces it, while an app pod with the pod
snippet reads its bound files all along and checks every reading. No read fails, no value
is wrong, the longest single read is printed (`pytest -s`), and the app's binds are never
replaced (nothing re-binds them: there is nothing that could, in a pod the node's
guestfs does not own)."""

from __future__ import annotations

import time

import pytest

from tests.external.cri.test_patterns import K8S, LIMIT, daemonset_deployed, node_ready
from tests.support.cri import takeover
from tests.support.cri.translate import translate

pytestmark = pytest.mark.real


def wait_ready(cri_node, node, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not node_ready(cri_node, node):
        assert time.monotonic() < deadline, node.logs("guestfs")[-3000:]
        time.sleep(0.2)


def read_through(app, before: int, why) -> None:
    """Every file read 10 more times since ``before``: through the new daemon."""
    takeover.wait(lambda: takeover.progress(app) >= before + 10, 30, why)


def test_daemon_restarts_and_a_rolling_update_fail_no_read(cri_node_session, cri_node):
    with daemonset_deployed(cri_node_session) as node:
        # The app reads and checks its files all along (tests/support/cri/takeover.py);
        # a Debian userland, for its python3.
        plan = translate(K8S / "daemonset" / "pod-snippet.yaml",
                         images={"registry.example/app:1.0": "debian"},
                         programs={"app": takeover.reader_program(LIMIT // 1024, 1)})
        app = cri_node.run(plan)
        try:
            takeover.wait(lambda: takeover.progress(app) >= 20, 60,
                          lambda: app.logs("app")[-3000:])
            for container in ("guestfs", "guestfs-containers", "guestfs"):
                before = takeover.progress(app)
                node.restart(container)    # stopped with timeout 0 (SIGKILL), started again
                wait_ready(cri_node, node)
                read_through(app, before, lambda: node.logs("guestfs")[-3000:])
            before = takeover.progress(app)
            node.remove(grace=5)           # a rolling update: SIGTERM, then the new pod
            new = cri_node.run(translate(K8S / "daemonset",
                                         images={"registry.example/guestfs:0.1": "guestfs"},
                                         workload="guestfs"))
            try:
                wait_ready(cri_node, new)
                read_through(app, before, lambda: new.logs("guestfs")[-3000:])
                report = takeover.stop_reader(app)
            finally:
                new.remove()
        finally:
            app.remove()
    files = report["files"]
    print(f"\nDaemonSet takeover: 3 daemon containers killed, 1 pod replaced: "
          f"{sum(f['reads'] for f in files.values())} reads, "
          f"{sum(f['failed'] for f in files.values())} failed, "
          f"{sum(f['wrong'] for f in files.values())} wrong, longest read "
          f"{max(f['longest'] for f in files.values()):.3f} s")
    for p, f in files.items():
        assert f["failed"] == 0 and f["wrong"] == 0, (p, f["errors"])
        assert f["reads"] >= 20 + 10 * 4, (p, f)
        assert f["longest"] < takeover.HANG_S, (p, f)
    # Nothing re-binds a pod's hostPath binds: they are the same mounts at the end.
    assert len(report["before"]) == 3 and report["before"] == report["after"], report
    assert report["unbound"] == 0       # the binds are in place before the app starts
