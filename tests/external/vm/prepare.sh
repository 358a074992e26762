#!/usr/bin/env bash
# Build (or reuse) what the cgroup v2 test VM boots: a Debian kernel with its modules and a
# busybox initramfs whose /init is tests/external/vm/init.sh. Everything is cached in
# $GUESTFS_VM_CACHE (default /var/cache/guestfs-vm); a change to init.sh or the module list
# rebuilds the initramfs. Prints two lines: the kernel image and the initramfs.
#   tests/external/vm/prepare.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${GUESTFS_VM_CACHE:-/var/cache/guestfs-vm}
mkdir -p "$CACHE"

# The kernel Debian's linux-image-amd64 points at today (6.1 LTS: cgroup v2 with every
# controller, virtio, 9p and fuse as modules).
kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null \
    | sed -n 's/.*Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1
}
pkg=${GUESTFS_VM_KERNEL:-$(kernel_pkg)}
if [ -z "$pkg" ]; then   # a fresh machine: apt has no package lists yet
  apt-get update -qq >&2
  pkg=$(kernel_pkg)
fi
[ -n "$pkg" ] || { echo "prepare: apt knows no linux-image-amd64 kernel" >&2; exit 1; }
kroot="$CACHE/$pkg"
if [ ! -d "$kroot/boot" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "$pkg" >/dev/null)
  dpkg-deb -x "$tmp"/*.deb "$kroot.partial"
  mv "$kroot.partial" "$kroot"
  rm -rf "$tmp"
fi
kernel=$(ls "$kroot"/boot/vmlinuz-* | head -1)
kver=$(ls "$kroot/lib/modules" | head -1)

# Load order, dependencies first (from the modules' depends= fields).
MODULES="drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_modern_dev
 drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci net/9p/9pnet net/9p/9pnet_virtio
 fs/netfs/netfs fs/fscache/fscache fs/9p/9p fs/fuse/fuse drivers/block/brd"
key=$(cat "$HERE/init.sh" <(echo "$MODULES $kver") /bin/busybox | sha256sum | cut -c1-16)
initrd="$CACHE/initrd-$key.gz"
if [ ! -f "$initrd" ]; then
  w=$(mktemp -d)
  mkdir -p "$w"/{bin,proc,sys,dev,host,tmp,lib/modules}
  cp /bin/busybox "$w/bin/busybox"
  for a in $("$w/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$w/bin/$a"; done
  for m in $MODULES; do
    f=$(ls "$kroot/lib/modules/$kver/kernel/$m".ko* 2>/dev/null | head -1) || true
    [ -n "$f" ] || continue   # built into this kernel
    name=$(basename "$m")
    case "$f" in
      *.xz) xz -dc "$f" > "$w/lib/modules/$name.ko" ;;
      *.zst) zstd -dc "$f" > "$w/lib/modules/$name.ko" ;;
      *) cp "$f" "$w/lib/modules/$name.ko" ;;
    esac
    echo "$name" >> "$w/lib/modules/order"
  done
  install -m 755 "$HERE/init.sh" "$w/init"
  (cd "$w" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$initrd.partial"
  mv "$initrd.partial" "$initrd"
  rm -rf "$w"
fi
echo "$kernel"
echo "$initrd"
