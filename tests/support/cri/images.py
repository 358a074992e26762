"""Local OCI images for the CRI node, written in pure Python (no registry is reachable).

write_archive() lays out an OCI image archive (oci-layout, index.json, one manifest, config
and a single gzip layer per image) that `ctr images import` reads; every image of a session
goes into one archive, so one ctr call imports them all.

The images:
- pause: a static C pause (reaps children when the pod shares its pid namespace, exits on
  SIGINT/SIGTERM), built with `gcc -static`;
- busybox: busybox-static with every applet symlinked to /bin/busybox, as Alpine does; no
  /run;
- debian: the skeleton of the host's root (/bin -> usr/bin, lib64 ..., empty dirs) and a
  copy of its /etc. The rest of its content is the host's userland: every container of the
  image gets read-only binds of the host's /usr and real /lib* directories
  (LocalImage.binds), added by the kubelet stand-in as the stand-in for the image's layers;
- guestfs: debian plus this checkout (with its .venv, and the venv's interpreter when it
  lives outside /usr) bound read-only at the same paths, .venv/bin first on PATH, so
  `guestfs` runs inside; ENTRYPOINT ["guestfs"], CMD ["explain"] as container/Dockerfile.
Variants (with_run=False, tmp="absent" or "ro") drop /run and a writable /tmp.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import REPO

REGISTRY = "guestfs.test"
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, quit);
    signal(SIGTERM, quit);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


@dataclass(frozen=True)
class Bind:
    """A read-only bind that stands in for image content: node path -> container path."""

    host_path: str
    container_path: str


@dataclass(frozen=True)
class LocalImage:
    """An image imported into the node: its reference and the binds its containers get."""

    key: str
    ref: str
    binds: tuple[Bind, ...] = ()


@dataclass
class _Layer:
    tar: tarfile.TarFile
    buf: io.BytesIO = field(default_factory=io.BytesIO)

    def add_dir(self, path: str, mode: int = 0o755) -> None:
        info = tarfile.TarInfo(path)
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(info)

    def add_symlink(self, path: str, target: str) -> None:
        info = tarfile.TarInfo(path)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self.tar.addfile(info)

    def add_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(path)
        info.size, info.mode = len(data), mode
        self.tar.addfile(info, io.BytesIO(data))


def _new_layer() -> _Layer:
    buf = io.BytesIO()
    return _Layer(tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT), buf)


def _finish(layer: _Layer) -> bytes:
    layer.tar.close()
    return layer.buf.getvalue()


def _base_dirs(layer: _Layer, with_run: bool, tmp: str) -> None:
    for d in ("dev", "proc", "sys", "etc", "root", "var", "var/tmp"):
        layer.add_dir(d, 0o700 if d == "root" else 0o755)
    if with_run:
        layer.add_dir("run")
    if tmp != "absent":
        layer.add_dir("tmp", 0o1777)


def pause_layer(workdir: Path) -> bytes:
    src, binary = workdir / "pause.c", workdir / "pause"
    src.write_text(PAUSE_C)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(binary), str(src)], check=True,
                   capture_output=True)
    layer = _new_layer()
    layer.add_file("pause", binary.read_bytes(), 0o755)
    return _finish(layer)


def busybox_layer(with_run: bool = False, tmp: str = "rw") -> bytes:
    busybox = shutil.which("busybox") or "/bin/busybox"
    applets = subprocess.run([busybox, "--list-full"], check=True, capture_output=True,
                             text=True).stdout.split()
    layer = _new_layer()
    for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin"):
        layer.add_dir(d)
    _base_dirs(layer, with_run, tmp)
    layer.add_file("bin/busybox", Path(busybox).read_bytes(), 0o755)
    layer.add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                                 b"nobody:x:65534:65534:nobody:/:/sbin/nologin\n")
    layer.add_file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    for applet in applets:
        if applet != "bin/busybox":
            layer.add_symlink(applet, "/bin/busybox")
    return _finish(layer)


def host_skeleton_layer(with_run: bool = True, tmp: str = "rw") -> tuple[bytes, tuple[Bind, ...]]:
    """The host root's symlinks (merged /usr) and empty dirs; binds of its real /usr and
    /lib* dirs. It goes above etc_layer()."""
    layer = _new_layer()
    binds = [Bind("/usr", "/usr")]
    layer.add_dir("usr")
    for d in ("home", "mnt", "opt", "srv"):
        layer.add_dir(d)
    _base_dirs(layer, with_run, tmp)
    for name in sorted(os.listdir("/")):
        if not name.startswith(("bin", "sbin", "lib")):
            continue
        path = f"/{name}"
        if os.path.islink(path):
            layer.add_symlink(name, os.readlink(path))
        elif os.path.isdir(path):
            layer.add_dir(name)
            binds.append(Bind(path, path))
    return _finish(layer), tuple(binds)


def etc_layer() -> bytes:
    """The host's /etc as an image layer, as in a real image: a read-only bind of the
    host's would leave runc unable to make mountpoints in it (a volume at
    /etc/guestfs-limits failed with EROFS). Only world-readable files are copied (no
    /etc/shadow), never through a symlink. One layer shared by every debian-based image,
    so containerd unpacks it once."""
    layer = _new_layer()
    layer.add_dir("etc")
    for root, dirs, files in os.walk("/etc"):
        rel = root.lstrip("/")
        for name in sorted(dirs + files):
            path, member = os.path.join(root, name), f"{rel}/{name}"
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                layer.add_symlink(member, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                layer.add_dir(member, stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IROTH:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    layer.add_file(member, f.read(), stat.S_IMODE(st.st_mode))
    return _finish(layer)


def image_config(layers: list[bytes], entrypoint: list[str], cmd: list[str],
                 env: list[str]) -> dict:
    return {
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": env, "WorkingDir": "/"},
        "rootfs": {"type": "layers",
                   "diff_ids": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in layers]},
    }


def write_archive(dest: Path, images: dict[str, tuple[list[bytes], dict]]) -> None:
    """An OCI archive at dest holding every image: ref -> (uncompressed layer tars, bottom
    first, and config). A layer shared by several images is stored once."""
    blobs: dict[str, bytes] = {}
    manifests = []
    gzipped: dict[bytes, bytes] = {}

    def blob(data: bytes) -> dict:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    for ref, (layer_tars, config) in images.items():
        layers = []
        for tar in layer_tars:
            if tar not in gzipped:
                gzipped[tar] = gzip.compress(tar, compresslevel=1, mtime=0)
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                           **blob(gzipped[tar])})
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       **blob(json.dumps(config).encode())},
            "layers": layers,
        }
        manifests.append({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            **blob(json.dumps(manifest).encode()),
            "platform": {"architecture": "amd64", "os": "linux"},
            # ctr names the image after io.containerd.image.name (the full reference).
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        })
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": manifests}
    with tarfile.open(dest, "w") as out:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest.split(':', 1)[1]}", data)


def _variant_name(base: str, with_run: bool, tmp: str) -> str:
    parts = [base] + ([] if with_run else ["norun"]) + ([] if tmp == "rw" else [f"tmp-{tmp}"])
    return "-".join(parts)


def build(workdir: Path, ro_tmp_dir: Path,
          variants: tuple[tuple[str, bool, str], ...] = ()
          ) -> tuple[dict[str, LocalImage], dict[str, tuple[list[bytes], dict]]]:
    """Every image of a session: key -> LocalImage, and ref -> (layer, config) to import.

    The keys are pause, busybox, debian, guestfs and, per (base, with_run, tmp) variant,
    e.g. guestfs-norun-tmp-ro. tmp="ro" binds the empty ro_tmp_dir read-only over /tmp.
    """
    env = [f"PATH={PATH_ENV}"]
    venv_env = [f"PATH={REPO}/.venv/bin:{PATH_ENV}"]
    images: dict[str, LocalImage] = {}
    content: dict[str, tuple[list[bytes], dict]] = {}

    def add(key: str, layers: list[bytes], config: dict, binds: tuple[Bind, ...] = ()) -> None:
        ref = ref_of(key)
        images[key] = LocalImage(key, ref, binds)
        content[ref] = (layers, config)

    pause = [pause_layer(workdir)]
    add("pause", pause, image_config(pause, ["/pause"], [], env))
    etc = etc_layer()
    for base, with_run, tmp in (("busybox", False, "rw"), ("debian", True, "rw"),
                                ("guestfs", True, "rw"), *variants):
        key = "busybox" if (base, with_run, tmp) == ("busybox", False, "rw") \
            else _variant_name(base, with_run, tmp)
        tmp_bind = (Bind(str(ro_tmp_dir), "/tmp"),) if tmp == "ro" else ()
        if base == "busybox":
            layers = [busybox_layer(with_run, "absent" if tmp == "ro" else tmp)]
            add(key, layers, image_config(layers, [], ["sh"], env), tmp_bind)
            continue
        skeleton, binds = host_skeleton_layer(with_run, "absent" if tmp == "ro" else tmp)
        layers = [etc, skeleton]
        if base == "guestfs":
            venv = venv_binds()
            binds += venv
            if tmp == "ro":
                # A checkout under /tmp (CI's may be) is bound below the read-only /tmp:
                # its mountpoint must already be there, as nothing can be made in it.
                for b in venv:
                    rel = os.path.relpath(b.container_path, "/tmp")
                    if not rel.startswith(".."):
                        os.makedirs(ro_tmp_dir / rel, exist_ok=True)
        # guestfs: container/Dockerfile's ENTRYPOINT and CMD, which the DaemonSet's
        # args-only containers rely on.
        entry, cmd = (["guestfs"], ["explain"]) if base == "guestfs" else ([], ["bash"])
        add(key, layers, image_config(layers, entry, cmd,
                                      venv_env if base == "guestfs" else env), binds + tmp_bind)
    return images, content


def venv_binds() -> tuple[Bind, ...]:
    """This checkout (its .venv inside) and, when the venv's interpreter lives outside
    /usr (pyenv), that interpreter's prefix: the venv's python is a symlink to it."""
    binds = [Bind(str(REPO), str(REPO))]
    cfg = REPO / ".venv" / "pyvenv.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "home":
                prefix = os.path.dirname(os.path.realpath(val.strip()))
                if not prefix.startswith("/usr/") and prefix != "/usr":
                    binds.append(Bind(prefix, prefix))
    return tuple(binds)


def ref_of(key: str) -> str:
    """The reference a local image key is imported under."""
    return f"{REGISTRY}/{key}:1"
