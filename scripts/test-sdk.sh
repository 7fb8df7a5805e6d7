#!/usr/bin/env bash
# Test the client SDKs (sdk/python, sdk/typescript) and the examples against a real
# `hutch serve`, which each test suite starts and stops itself. Run as root on Debian 12.
#
#   scripts/test-sdk.sh
#
# Environment: HUTCH_BIN (default target/debug/hutch), HUTCH_TEST_TEMPLATES (default
# /var/cache/hutch-test/templates), SDK_VENV (default target/venv, from scripts/venv.sh).
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
# run_code's tests need real kernels (a no-op when it is built and current).
"$HUTCH_BIN" template build code-interpreter --templates-dir "$HUTCH_TEST_TEMPLATES"

echo "== sdk: python"
# The tests' own virtual environment (never the system interpreter: PEP 668).
PY=$(HUTCH_VENV=${SDK_VENV:-${HUTCH_VENV:-$ROOT/target/venv}} scripts/venv.sh)
PIP_FLAGS=(--quiet --disable-pip-version-check)
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
