"""The wrapper pattern in a user-namespaced container (Kubernetes `hostUsers: false`): runc
maps the container's uids 0-65535 to unprivileged host uids, so its CAP_SYS_ADMIN holds
only inside its own user namespace. guestfs still mounts FUSE on /dev/fuse there and binds
its files for the app: no host privilege is needed."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.external.test_real_runc import MiB, bundle
from tests.support.fusemount import require_fuse
from tests.support.realcg import SEP

pytestmark = pytest.mark.real
HOST_ID = 100000   # where the container's uid/gid 0 lands on the host
SIZE = 65536


def fuse_node_for_mapped_root(b: str) -> str:
    """A /dev/fuse node the container's root may open. runc cannot create device nodes in
    a user namespace, so it binds the host's, and this host's is 0600 root (udev usually
    makes it 0666): a node of our own, owned by the mapped root, stands for what a device
    plugin or a 0666 /dev/fuse gives a user-namespaced pod."""
    st = os.stat("/dev/fuse")
    node = os.path.join(b, "fuse")
    os.mknod(node, 0o600 | stat.S_IFCHR, st.st_rdev)
    os.chown(node, HOST_ID, HOST_ID)
    return node


def with_user_namespace(b: str) -> None:
    """Add a user namespace with uid/gid mappings to bundle ``b``, hand its rootfs to the
    container's root (the mapped root cannot create mount points in a host root's
    directory), and give it a /dev/fuse it may open."""
    cfg_path = Path(b) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    linux = cfg["linux"]
    # What containerd and CRI-O make read-only under /proc by default (the shared bundle
    # clears the list): the binds over /proc files must work beside them.
    linux["readonlyPaths"] = ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq",
                              "/proc/sys", "/proc/sysrq-trigger"]
    linux["devices"] = [d for d in linux.get("devices", []) if d["path"] != "/dev/fuse"]
    cfg["mounts"].append({"destination": "/dev/fuse", "type": "bind",
                          "source": fuse_node_for_mapped_root(b), "options": ["bind"]})
    if not any(ns["type"] == "user" for ns in linux["namespaces"]):
        linux["namespaces"].append({"type": "user"})
    linux["uidMappings"] = [{"containerID": 0, "hostID": HOST_ID, "size": SIZE}]
    linux["gidMappings"] = [{"containerID": 0, "hostID": HOST_ID, "size": SIZE}]
    cfg_path.write_text(json.dumps(cfg))
    for dirpath, dirnames, filenames in os.walk(Path(b) / "rootfs"):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, HOST_ID, HOST_ID)


def test_wrapper_runs_in_a_user_namespaced_container():
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    require_fuse()
    if not os.path.exists("/proc/self/ns/user"):
        pytest.skip("this kernel has no user namespaces")
    # The bundle's directories must be reachable by the mapped root (pytest's tmp_path
    # sits under a 0700 directory).
    top = tempfile.mkdtemp(prefix="guestfs-userns-")
    os.chmod(top, 0o755)
    cid = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    inner = f"free -m; echo {SEP}; cat /proc/self/uid_map"
    script = (f"cat /proc/self/uid_map; echo {SEP}; "
              f"{sys.executable} -m guestfs run -- sh -c \"{inner}\"")
    try:
        b = bundle(Path(top) / "bundle", None, script, 512 * MiB, 150000, fuse_inside=True)
        with_user_namespace(b)
        out = subprocess.run(["runc", "run", "--bundle", b, cid], capture_output=True,
                             text=True, timeout=120)
    finally:
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
    assert out.returncode == 0, out.stdout + out.stderr
    uid_map, free, app_uid_map = out.stdout.split(SEP + "\n")
    # guestfs ran as root of a user namespace whose root is host uid 100000, not 0.
    assert uid_map.split() == ["0", str(HOST_ID), str(SIZE)]
    assert app_uid_map.split() == ["0", str(HOST_ID), str(SIZE)]
    assert next(ln.split() for ln in free.splitlines() if ln.startswith("Mem:"))[1] == "512"
