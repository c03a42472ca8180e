#!/usr/bin/env bash
# A stand-in for python:3.11-slim where no container registry can be reached: Debian
# bookworm (its python3 is 3.11) from debootstrap, imported with `podman import`, with
# `python` and `pip` on PATH and pip allowed to install into the system Python, as in the
# official image. Cached by a hash of this script: prints the image reference.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

SUITE=bookworm
MIRROR="${APPORTION_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=python3,python3-venv,python3-pip,python3-dev,ca-certificates
hash="$(sha256sum "$0" | cut -c1-12)"
ref="localhost/apportion-base:standin-$hash"

if podman image exists "$ref"; then
    echo "$ref"
    exit 0
fi

rootfs="$(mktemp -d /var/tmp/apportion-base.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
echo "base: debootstrap $SUITE ($PACKAGES) into $rootfs" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >&2
ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
printf '[global]\nbreak-system-packages = true\n' > "$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
tar -C "$rootfs" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$ref" >&2
echo "$ref"
