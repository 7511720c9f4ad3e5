#!/usr/bin/env bash
# One-time set-up of a fresh machine: system packages (when root) and the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
APT_PACKAGES="iperf3 tcpdump iptables ethtool iproute2 openssl libnetfilter-queue-dev build-essential chromium"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
    fi
else
    echo "setup: not root or no apt-get: install these yourself if missing: $APT_PACKAGES" >&2
fi
python3 -m pip install -q --disable-pip-version-check -e '.[test]' -c deploy/constraints.txt
