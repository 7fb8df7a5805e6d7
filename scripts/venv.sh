#!/usr/bin/env bash
# The Python environment the tests use, apart from the system interpreter (Debian 12's
# /usr/bin/python3 is externally managed, PEP 668: pip may not install into it). Creates
# the virtual environment if needed, installs what the tests need into it, and prints the
# path of its interpreter.
#
#   PY=$(scripts/venv.sh)          # target/venv, or $HUTCH_VENV
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HUTCH_VENV:-$PWD/target/venv}

if ! [ -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >&2; then
        echo "scripts/venv.sh: python3 -m venv failed: install Debian's python3-venv (scripts/deps.sh does)" >&2
        exit 1
    fi
fi
# The MCP client that drives `hutch mcp`; the SDK's own test dependencies come with it in
# scripts/test-sdk.sh.
if ! "$VENV/bin/python" -c 'import mcp' 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "mcp>=2,<3" >&2
fi
# The OpenAI Agents SDK, whose strict-schema conversion tests/mcp.rs runs on every tool.
if ! "$VENV/bin/python" -c 'import agents.strict_schema' 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai-agents>=0.24,<1" >&2
fi
# E2B's published SDKs, unmodified, that tests/e2b_python.rs drives against the E2B-compatible
# API (the newest releases when this was written; docs/e2b.md says which versions are tested).
# `h2` lets the h2c scenario's httpx client speak HTTP/2 (e2b pulls it in today; named here
# so the test does not depend on that).
if ! "$VENV/bin/python" -c 'import e2b, e2b_code_interpreter, h2' 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "e2b==2.63.0" "e2b-code-interpreter==2.11.5" "h2>=4,<5" >&2
fi
# moto's S3 server, the real S3 API that crates/hutch-object-store/tests/ run against
# (hutch_testkit::S3Server starts `python -m moto.server`); `[server]` brings its HTTP
# server (flask, werkzeug) and boto3.
if ! "$VENV/bin/python" -c 'import moto, moto.server, flask' 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]==5.2.5" >&2
fi
# kubernetes-validate and the Kubernetes schemas it ships, that scripts/check-deploy.sh
# checks deploy/k8s/ against offline.
if ! "$VENV/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==1.37.0" >&2
fi
# The oldest e2b the E2B API supports (2.7.0, the first release that reads E2B_SANDBOX_URL),
# in a virtual environment of its own beside this one: tests/e2b_python.rs runs its
# `basics` scenario with it.
OLDEST="$VENV-e2b-oldest"
if ! [ -x "$OLDEST/bin/python" ] || ! "$OLDEST/bin/python" -c 'import e2b' 2>/dev/null; then
    rm -rf "$OLDEST"
    python3 -m venv "$OLDEST" >&2
    "$OLDEST/bin/python" -m pip install --quiet --disable-pip-version-check "e2b==2.7.0" >&2
fi
# schemathesis, that tests/openapi_fuzz.rs runs over the served OpenAPI document, in a
# virtual environment of its own (its pins of jsonschema, hypothesis and werkzeug are not
# the other tools').
FUZZ="$VENV-schemathesis"
if ! [ -x "$FUZZ/bin/schemathesis" ] || ! "$FUZZ/bin/schemathesis" --version 2>/dev/null | grep -q "4.32.5"; then
    rm -rf "$FUZZ"
    python3 -m venv "$FUZZ" >&2
    "$FUZZ/bin/python" -m pip install --quiet --disable-pip-version-check "schemathesis==4.32.5" >&2
fi
echo "$VENV/bin/python"
