"""The webhook end to end: a plain Deployment's pod in a labelled namespace, as its
ReplicaSet controller creates it, is routed by the shipped MutatingWebhookConfiguration's
selectors, mutated over HTTPS by `guestfs webhook` (run with the shipped Deployment's
arguments, on 127.0.0.1, with a CA made here), the patch applied and the pod validated
against the Kubernetes schema, then started through containerd's CRI beside the DaemonSet
(container/k8s/daemonset): its app, from a busybox image and from a Debian userland, reads
its own limits in files and system calls (MemTotal = its limit, nproc = its CPUs). A pod of
a namespace without the label is left alone and reads the node's. A Job's pod and one with
init containers and a native sidecar are mutated and started alike."""

from __future__ import annotations

import secrets
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.external.cri.test_patterns import (
    APPS,
    LIMIT,
    NODE_CPUS,
    MiB,
    check_reading,
    daemonset_deployed,
    finish,
    node_memtotal_kb,
    sees,
)
from tests.support import admission, jsonpatch
from tests.support.cri import probe
from tests.support.cri.probe import wait_for_reading
from tests.support.cri.translate import translate
from tests.support.webhook_pods import APP, SHAPES
from tests.support.webhookd import issue, make_ca, running
from tests.unit.test_manifests import K8S, KUBERNETES, documents

pytestmark = pytest.mark.real

CONFIG = documents(K8S / "webhook" / "base" / "webhook.yaml")[0]


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    where = tmp_path_factory.mktemp("webhook-certs")
    ca = make_ca(where)
    with running(issue(ca, where), ca.cert) as w:
        yield w


@pytest.fixture(scope="module")
def guestfs_daemonset(cri_node_session):
    with daemonset_deployed(cri_node_session) as node:
        yield node


def created(webhook, shape: str, tmp_path: Path) -> tuple[Path, list[dict]]:
    """The pod the API server stores for ``shape``: sent to the webhook its selectors
    pick (if any), patched, validated, named from its generateName; written as a Pod
    manifest for the CRI harness."""
    s = SHAPES[shape]
    pod = s.pod()
    ops: list[dict] = []
    for hook in admission.calls(CONFIG, s.namespace, s.namespace_labels, pod):
        request = admission.review(pod, s.namespace)
        status, answer = webhook.post(hook["clientConfig"]["service"]["path"], request)
        assert status == 200, answer
        ops = admission.patch_of(answer, request)
        pod = jsonpatch.apply(pod, ops)
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    meta = dict(pod["metadata"])
    meta["name"] = meta.pop("generateName", "") + secrets.token_hex(3)[:5]
    path = tmp_path / f"{shape}.yaml"
    path.write_text(yaml.safe_dump({**pod, "metadata": meta}))
    return path, ops


@pytest.mark.parametrize(("shape", "app"), [("deployment", "busybox"),
                                           ("deployment", "debian"), ("job", "debian")])
def test_a_pod_in_a_labelled_namespace_reads_its_limits(
        cri_node, guestfs_daemonset, webhook, shape, app, tmp_path):
    """A Deployment's pod, and a Job's (restartPolicy: Never, a volume of its own)."""
    image, tools = APPS[app]
    path, ops = created(webhook, shape, tmp_path)
    print(f"{shape} pod: {len(ops)} JSONPatch ops")
    assert ops
    plan = translate(path, images={APP: image}, programs={"app": probe.program(tools)})
    assert plan.namespace == "team-a"
    pod = cri_node.run(plan)
    try:
        def logs() -> str:
            return pod.logs("app")
        busybox = app == "busybox"
        r, _ = wait_for_reading(logs, sees(LIMIT, 1, True, busybox))
        # In its very first reading: the files are bound before the app starts, and the
        # seccomp profile the webhook set sends sysinfo(2) and the CPU count to the agent.
        first = probe.parse(logs())[0]
        for reading in (first, r):
            check_reading(reading, LIMIT, 1, syscalls=True, sysinfo_free=busybox,
                          python=not busybox)
        assert r.nproc == 1 and r.memtotal_kb == LIMIT // 1024
        assert r.free_total_mib == LIMIT // MiB
    finally:
        finish(pod)


def test_init_containers_and_a_native_sidecar_get_the_files_too(
        cri_node, guestfs_daemonset, webhook, tmp_path):
    """The init container reads the served meminfo and exits 0 before the sidecar and the
    app start; the sidecar's /proc/meminfo is the node's guestfs mount, not the kernel's."""
    path, ops = created(webhook, "init-containers", tmp_path)
    print(f"init-containers pod: {len(ops)} JSONPatch ops")
    plan = translate(path, images={APP: "busybox"},
                     programs={"migrate": ["sh", "-c", "grep -q MemTotal /proc/meminfo && "
                                           "grep ' /proc/meminfo ' /proc/self/mountinfo "
                                           "| grep -q fuse"],
                               "app": probe.program("")})
    pod = cri_node.run(plan)
    try:
        r, _ = wait_for_reading(lambda: pod.logs("app"), sees(LIMIT, 1, True, True))
        check_reading(r, LIMIT, 1, syscalls=True, sysinfo_free=True, python=False)
        assert pod.status("migrate").exit_code == 0
        rc, out, _ = pod.exec("proxy", ["grep", " /proc/meminfo ", "/proc/self/mountinfo"])
        assert rc == 0 and "fuse" in out, out
    finally:
        finish(pod)


def test_a_pod_of_a_namespace_without_the_label_is_left_alone(
        cri_node, guestfs_daemonset, webhook, tmp_path):
    path, ops = created(webhook, "unlabelled-namespace", tmp_path)
    assert ops == []
    plan = translate(path, images={APP: "busybox"}, programs={"app": probe.program("")})
    pod = cri_node.run(plan)
    try:
        r, _ = wait_for_reading(lambda: pod.logs("app"), lambda r: r.memtotal_kb is not None)
        assert r.memtotal_kb == node_memtotal_kb() and r.nproc == NODE_CPUS, r
    finally:
        finish(pod)
