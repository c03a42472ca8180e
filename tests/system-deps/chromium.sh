#!/usr/bin/env bash
# Debian's chromium and chromium-driver, for the dashboard's browser test
# (tests/integration/test_dashboard_browser.py). A browser downloaded by a pip package
# cannot run here; Debian's can.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "chromium.sh: chromium and chromium-driver are missing; as root run:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromium && command -v chromedriver
