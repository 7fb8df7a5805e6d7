#!/usr/bin/env bash
# Test the client SDKs (sdk/python, sdk/typescript) and the examples against a real
# `hutch serve`, which each test suite starts and stops itself. Run as root on Debian 12.
#
#   scripts/test-sdk.sh
#
# Environment: HUTCH_BIN (default target/debug/hutch), HUTCH_TEST_TEMPLATES (default
# /var/cache/hutch-test/templates), SDK_VENV (default target/sdk-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test-sdk.sh: the sandbox server needs root (namespaces, mounts, cgroups)" >&2
    exit 1
fi

export HUTCH_BIN=${HUTCH_BIN:-$ROOT/target/debug/hutch}
export HUTCH_TEST_TEMPLATES=${HUTCH_TEST_TEMPLATES:-/var/cache/hutch-test/templates}
# The suites start their own server; never let a caller's settings leak into them.
unset HUTCH_URL HUTCH_API_KEY HUTCH_STATE_DIR HUTCH_TEMPLATE

echo "== sdk: server binary and template"
if [ ! -x "$HUTCH_BIN" ]; then
    scripts/build-agent.sh >/dev/null
    cargo build -p hutch
fi
"$HUTCH_BIN" template build minimal --templates-dir "$HUTCH_TEST_TEMPLATES"

echo "== sdk: python"
VENV=${SDK_VENV:-$ROOT/target/sdk-venv}
PY=""
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    PY="$VENV/bin/python"
elif python3 -m venv "$VENV" 2>/dev/null && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    PY="$VENV/bin/python"
else
    rm -rf "$VENV"
    if command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1 \
        && python3 -m venv "$VENV"; then
        PY="$VENV/bin/python"
    else
        echo "python3 -m venv is unavailable; installing into the user site instead"
        rm -rf "$VENV"
        PY=python3
    fi
fi
PIP_FLAGS=(--quiet --disable-pip-version-check)
if [ "$PY" = python3 ]; then
    PIP_FLAGS+=(--user)
    if python3 -m pip install --help | grep -q -- --break-system-packages; then
        PIP_FLAGS+=(--break-system-packages)
    fi
fi
# A regular (non-editable) install, so the tests use the package as users get it.
"$PY" -m pip install "${PIP_FLAGS[@]}" "$ROOT/sdk/python[test]"
(cd sdk/python && "$PY" -m pytest -p no:cacheprovider -q tests)

echo "== sdk: typescript"
cd "$ROOT/sdk/typescript"
if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
else
    npm install --no-audit --no-fund --loglevel=error
fi
npm test
