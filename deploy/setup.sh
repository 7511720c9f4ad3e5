#!/usr/bin/env bash
# One-time set-up of a fresh machine: system packages (when root), then the project's virtual
# environment .venv, made by uv from uv.lock (exact pins; the system Python is left alone).
#
#   bash deploy/setup.sh [EXTRA...]     # these extras (default: test, which holds every other
#                                       # but bench; make demo and make test use it)
#   PATHMASTER_VENV=.venv-bench bash deploy/setup.sh bench    # what make bench uses
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

# uv: the one on PATH, else one bootstrapped (once per user) into a small venv of its own.
BASE_PYTHON=${PATHMASTER_PYTHON:-python3}   # the interpreter .venv is made from
UV_BOOTSTRAP=${XDG_CACHE_HOME:-$HOME/.cache}/pathmaster/uv-bootstrap
MIN_UV=0.13   # pyproject.toml's [tool.uv] required-version
uv_ok() { [ -x "$1" ] && printf '%s\n%s\n' "$MIN_UV" "$("$1" --version | cut -d' ' -f2)" | sort -VC; }
UV=$(command -v uv || true)
if ! uv_ok "$UV"; then
    UV=$UV_BOOTSTRAP/bin/uv
    if ! uv_ok "$UV"; then
        echo "setup: no uv >= $MIN_UV on PATH; installing one into $UV_BOOTSTRAP" >&2
        rm -rf "$UV_BOOTSTRAP"
        "$BASE_PYTHON" -m venv "$UV_BOOTSTRAP"
        "$UV_BOOTSTRAP/bin/python" -m pip install -q --disable-pip-version-check "uv>=$MIN_UV"
    fi
fi

# The environment from the lock, on this machine's Python (no interpreter downloads). --frozen:
# install exactly what uv.lock says, never re-resolve (refresh the lock with `uv lock`). Exact
# sync: packages that the lock and these extras do not name are removed from it.
# --compile-bytecode: the packages' modules compiled once here (~26 s of CPU), so that no process
# compiles them again on every import where PYTHONDONTWRITEBYTECODE is set (this machine, the container):
# each Ray worker, command and pytest process did, 2-3 times their import's CPU.
VENV=${PATHMASTER_VENV:-.venv}
[ $# -gt 0 ] || set -- test
extras=()
for e in "$@"; do extras+=(--extra "$e"); done
# UV_NATIVE_TLS: the machine's own certificate store, as pip uses it (uv's bundled roots refuse
# a registry reached through a proxy whose authority only the machine trusts).
UV_NATIVE_TLS=${UV_NATIVE_TLS:-1} UV_PROJECT_ENVIRONMENT=$VENV UV_PYTHON_DOWNLOADS=never "$UV" sync --quiet --frozen --compile-bytecode "${extras[@]}" \
    --python "$("$BASE_PYTHON" -c 'import sys; print(sys.executable)')"
echo "setup: $VENV ready (extras: $*), $("$VENV/bin/python" --version)"
