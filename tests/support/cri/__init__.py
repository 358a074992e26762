"""Kubernetes' runtime path in tests: a private containerd driven over CRI v1 as kubelet
drives it, fed by a translator of the shipped manifests (container/k8s).

Usage (the cri_node fixture is defined in tests/conftest.py; one containerd per session):

    from tests.support.cri.translate import translate

    def test_something(cri_node):
        plan = translate(Path("container/k8s/sidecar"),
                         images={"registry.example/guestfs:0.1": "guestfs",
                                 "registry.example/app:1.0": "busybox"},
                         programs={"app": ["sleep", "3600"]})
        with cri_node.run(plan) as pod:           # removed at the end of the block
            rc, out, err = pod.exec("app", ["cat", "/proc/meminfo"])

Modules: translate (manifests -> PodPlan of CRI messages; refuses what it cannot
reproduce), kubelet (runs a PodPlan: pod cgroup, volumes, containers in kubelet's order;
the Pod handle), node (the containerd node, its mount namespace and cgroup root), images
(the local images: pause, busybox, debian, guestfs and the variants busybox-norun-tmp-ro,
guestfs-norun-tmp-ro without /run and with a read-only /tmp), nodefs (node paths from the
test process), cgroups, kubemath (kubelet's resource arithmetic), stubs (CRI stubs made
from api.proto at test time), fields (strict YAML reading).

Node paths: everything under /var/lib, /run and /var/log is the node's own (cri_node.fs
reads and writes it; cri_node.fs.path(p) is the test process's path to it); /dev, /sys,
/usr, /etc and /tmp are the host's.
"""
