#!/usr/bin/env bash
# `make image`: builds the apportion image from the Dockerfile with podman (docker where
# podman is absent and a Docker engine answers), cached by a hash of its inputs: the
# Dockerfile, the build context (the `!` paths of .dockerignore) and the base image.
#
#   bash tests/k8s/image/build.sh          # build unless cached; prints the image reference
#   bash tests/k8s/image/build.sh --check  # print the reference if built, else exit 3
#
# The image is tagged localhost/apportion:<version>-<hash> (what the Kubernetes tests run)
# and apportion:<version> (what the Helm chart names by default).
#
# Base image: $APPORTION_IMAGE_BASE when set, else python:3.11-slim when it is present or can
# be pulled, else (podman only) a Debian stand-in built by base.sh. On the stand-in, where
# the host has PIP_CERT set (a TLS-intercepting proxy), that CA bundle covers the image's
# system bundle during the build; nothing of it stays in the image.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
cd "$root"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

check_only=false
[ "${1:-}" = "--check" ] && check_only=true

OFFICIAL_BASE=docker.io/library/python:3.11-slim

engine="${APPORTION_CONTAINER_ENGINE:-}"
if [ -z "$engine" ]; then
    if command -v podman >/dev/null; then
        engine=podman
    elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        engine=docker
    else
        echo "image: neither podman nor a running Docker engine found;" \
            "install podman (bash tests/system-deps/podman.sh) or start Docker" >&2
        exit 2
    fi
fi

have() { "$engine" image inspect "$1" >/dev/null 2>&1; }

standin_ref() { echo "localhost/apportion-base:standin-$(sha256sum "$here/base.sh" | cut -c1-12)"; }

# The base, without touching the network: the one asked for, or the one already here.
local_base() {
    if [ -n "${APPORTION_IMAGE_BASE:-}" ]; then
        echo "$APPORTION_IMAGE_BASE"
    elif have "$OFFICIAL_BASE"; then
        echo "$OFFICIAL_BASE"
    elif [ "$engine" = podman ] && have "$(standin_ref)"; then
        standin_ref
    fi
}

base="$(local_base)"
if [ -z "$base" ] && ! $check_only; then
    if timeout 300 "$engine" pull -q "$OFFICIAL_BASE" >/dev/null 2>"${TMPDIR:-/tmp}/apportion-pull.err"; then
        base="$OFFICIAL_BASE"
    elif [ "$engine" = podman ] && command -v debootstrap >/dev/null; then
        echo "image: cannot pull $OFFICIAL_BASE ($(tail -n1 "${TMPDIR:-/tmp}/apportion-pull.err"));" \
            "building the Debian stand-in base" >&2
        start=$(date +%s)
        base="$(bash "$here/base.sh")"
        echo "image: built the stand-in base $base in $(( $(date +%s) - start )) s" >&2
    else
        echo "image: cannot pull $OFFICIAL_BASE: $(tail -n1 "${TMPDIR:-/tmp}/apportion-pull.err")" >&2
        echo "image: set APPORTION_IMAGE_BASE to a local Python 3.11 image, or install podman" \
            "and debootstrap (bash tests/system-deps/podman.sh) for the stand-in base" >&2
        exit 2
    fi
fi

# The build context: the paths .dockerignore lets through, as git sees them (tracked and
# untracked files, not what .gitignore ignores: caches and build output).
mapfile -t context < <(sed -n 's/^!//p' .dockerignore)
inputs_hash() {
    {
        echo "base=$1"
        sha256sum Dockerfile .dockerignore
        git ls-files -z --cached --others --exclude-standard -- "${context[@]}" \
            | sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-12
}

version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)"
if [ -z "$base" ]; then
    echo "image: no base image here yet: run \`make image\`" >&2
    exit 3
fi
ref="localhost/apportion:$version-$(inputs_hash "$base")"

if have "$ref"; then
    $check_only || echo "image: $ref up to date" >&2
    echo "$ref"
    exit 0
fi
if $check_only; then
    echo "image: $ref (the image of these sources) is not built: run \`make image\`" >&2
    exit 3
fi

build_args=(--build-arg "BASE_IMAGE=$base" -t "$ref" -t "apportion:$version")
if [ "$engine" = podman ] && [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ] && [ "$base" = "$(standin_ref)" ]; then
    # Over the file the base already has, so nothing of it stays in the image; Debian's pip
    # (the stand-in's) trusts the system bundle.
    build_args+=(-v "$PIP_CERT:/etc/ssl/certs/ca-certificates.crt:ro")
fi
[ "$engine" = podman ] && build_args+=(--pull=never)

echo "image: building $ref on $base" >&2
start=$(date +%s)
"$engine" build "${build_args[@]}" . >&2
echo "image: built $ref in $(( $(date +%s) - start )) s" >&2
echo "$ref"
