#!/bin/sh
# /init of the cgroup v2 test VM (busybox). Mounts a pure cgroup v2 hierarchy with every
# controller enabled at the root, the host's root read-only over 9p (tag hostroot) as the new
# root, writable tmpfs on /run and /dev/shm, the results share (tag results) on /mnt, and a
# 128 MiB RAM-disk swap; then runs the command from the kernel command line (guestcmd=...,
# base64) and powers off.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do
  case $m in brd) args="rd_nr=1 rd_size=131072" ;; *) args="" ;; esac
  insmod /lib/modules/$m.ko $args 2>/dev/null
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot /host || {
  echo "GUEST: no host root"; reboot -f; }
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t cgroup2 -o nsdelegate cgroup2 /host/sys/fs/cgroup
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/shm 2>/dev/null
mount -t tmpfs shm /host/dev/shm
mount -t tmpfs run /host/run
mount -t 9p -o trans=virtio,version=9p2000.L results /host/mnt
ctrl=$(cat /host/sys/fs/cgroup/cgroup.controllers)
for c in $ctrl; do echo "+$c" > /host/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; done
if [ -b /dev/ram0 ]; then
  mkswap /dev/ram0 >/dev/null && swapon /dev/ram0 && echo "GUEST: swap on /dev/ram0"
fi
echo "GUEST: kernel $(uname -r), cgroup2 controllers: $ctrl, $(nproc) cpus"
CMD=$(sed -n 's/.*guestcmd=\([^ ]*\).*/\1/p' /proc/cmdline | base64 -d)
exec switch_root /host /bin/sh -c "$CMD; echo \"GUEST: done rc=\$?\"; sync; echo o > /proc/sysrq-trigger; sleep 30"
