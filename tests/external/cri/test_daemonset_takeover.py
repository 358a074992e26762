"""The shipped DaemonSet's mounts outlive their daemons, on Kubernetes' runtime path: the
guestfs pod's daemon containers are killed and restarted as the kubelet restarts them,
and the pod is replaced as a rolling update replaces it, while an app pod with the pod
snippet reads its bound files all along. No read fails, and the app's binds are never
replaced (nothing re-binds them: there is nothing that could, in a pod the node's
guestfs does not own)."""

from __future__ import annotations

import time

import pytest

from tests.external.cri.test_patterns import K8S, daemonset_deployed, node_ready
from tests.support.cri.translate import translate

pytestmark = pytest.mark.real

# The app: reads two bound files in a loop, one line per failure, a count at the end.
READER = r"""
n=0; f=0
while [ ! -e /tmp/stop ]; do
  if head -c 64 /proc/meminfo | grep -q '^MemTotal:' && head -c 4 /proc/stat | grep -q '^cpu'
  then n=$((n+1)); else f=$((f+1)); echo "FAIL at $(cat /proc/uptime)"; fi
  sleep 0.05
done
echo "DONE $n $f $(grep -c ' /proc/meminfo ' /proc/self/mountinfo)"
"""


def bind_identity(pod) -> str:
    """The mount id and device of the app's /proc/meminfo bind, from its own mountinfo."""
    rc, out, _ = pod.exec("app", ["grep", " /proc/meminfo ", "/proc/self/mountinfo"])
    assert rc == 0, out
    fields = out.split()
    return f"{fields[0]} {fields[2]}"


def wait_ready(cri_node, node, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not node_ready(cri_node, node):
        assert time.monotonic() < deadline, node.logs("guestfs")[-3000:]
        time.sleep(0.2)


def test_daemon_restarts_and_a_rolling_update_fail_no_read(cri_node_session, cri_node):
    with daemonset_deployed(cri_node_session) as node:
        plan = translate(K8S / "daemonset" / "pod-snippet.yaml",
                         images={"registry.example/app:1.0": "busybox"},
                         programs={"app": ["sh", "-c", READER]})
        app = cri_node.run(plan)
        before = bind_identity(app)
        time.sleep(1.0)
        for container in ("guestfs", "guestfs-containers", "guestfs"):
            node.restart(container)        # stopped with timeout 0 (SIGKILL), started again
            wait_ready(cri_node, node)
            time.sleep(1.0)
        node.remove(grace=5)               # a rolling update: SIGTERM, then the new pod
        new = cri_node.run(translate(K8S / "daemonset",
                                     images={"registry.example/guestfs:0.1": "guestfs"},
                                     workload="guestfs"))
        try:
            wait_ready(cri_node, new)
            time.sleep(1.0)
            assert bind_identity(app) == before
            app.exec("app", ["touch", "/tmp/stop"])
            deadline = time.monotonic() + 20
            while "DONE" not in app.logs("app"):
                assert time.monotonic() < deadline, app.logs("app")[-2000:]
                time.sleep(0.2)
        finally:
            new.remove()
        log = app.logs("app")
        done = next(ln for ln in log.splitlines() if ln.startswith("DONE"))
        _, reads, failed, binds = done.split()
        print(f"\nDaemonSet takeover: {reads} reads, {failed} failed, {binds} meminfo bind")
        assert int(failed) == 0, log[-2000:]
        assert int(reads) > 50 and int(binds) == 1
        app.remove()
