#!/usr/bin/env bash
# A local Debian base image for building container/Dockerfile where no container registry
# is reachable (the test machines): debootstrap (minbase + python3) from the mirror this
# machine's apt uses, imported into podman as localhost/guestfs-base. Cached: a second run
# only checks the image is there.
#   container/build-test-base.sh
set -euo pipefail
IMAGE=localhost/guestfs-base:bookworm
if podman image exists "$IMAGE"; then echo "$IMAGE"; exit 0; fi
mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
         | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1=="deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' \
                             /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || { echo "build-test-base: no Debian mirror in apt's sources" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$mirror" >/dev/null
# The build's apt-get and pip reach the same mirror and index the host does, through the
# same TLS trust (this machine's CA bundle, which pip is told to use as the host's is).
echo "deb $mirror bookworm main" > "$root/etc/apt/sources.list"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
tar -C "$root" -c . | podman import - "$IMAGE" >/dev/null
echo "$IMAGE"
