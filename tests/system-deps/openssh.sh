#!/usr/bin/env bash
# Debian's openssh-server, for the SSH deployment tests (tests/integration/test_ssh_cluster.py):
# each test starts its own sshd on a free loopback port with keys it makes, and SSHCluster
# and `apportion ssh` connect to it. Installs only when sshd is missing.
set -euo pipefail

[ -x /usr/sbin/sshd ] && exit 0

echo "system-deps: installing openssh-server (SSH deployment tests)"
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
