#!/usr/bin/env bash
# podman and runc, for the Kubernetes tests: `make image` builds the apportion image with
# podman, and the test kubelet (tests/k8s/kubelet) runs every pod as a podman container of it.
# debootstrap builds the stand-in base image where no container registry can be reached
# (tests/k8s/image/base.sh). Installs from Debian's packages only what is missing.
set -euo pipefail

missing=()
command -v podman >/dev/null || missing+=(podman)
# crun (podman's default runtime on Debian) fails on some cgroup layouts; runc works.
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "system-deps: installing ${missing[*]} (Kubernetes tests on containers)"
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
