#!/usr/bin/env bash
# E2B's published JavaScript SDKs for tests/e2b_js.rs, installed from npm (the versions
# pinned in crates/hutch/tests/e2b/js/package-lock.json) into that directory.
set -euo pipefail
cd "$(dirname "$0")/../crates/hutch/tests/e2b/js"
if ! [ -d node_modules/e2b ] || ! [ -d node_modules/@e2b/code-interpreter ]; then
    npm ci --no-audit --no-fund --loglevel=error >&2
fi
