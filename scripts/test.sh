#!/usr/bin/env bash
# The whole test suite, as root on Debian 12 (the README's test command; .ci/run runs it).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: the sandbox tests need root (namespaces, mounts, cgroups)" >&2
    exit 1
fi

echo "== lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
shellcheck scripts/*.sh .ci/run
# deploy/: the Kubernetes manifests against their schemas, the systemd units (offline).
scripts/check-deploy.sh

echo "== python (the tests' own virtual environment)"
HUTCH_TEST_PYTHON=$(scripts/venv.sh)
export HUTCH_TEST_PYTHON

echo "== e2b's JavaScript SDKs (npm)"
scripts/e2b-js.sh

echo "== build"
scripts/build-agent.sh
cargo build --workspace --all-targets

echo "== templates (cached in ${HUTCH_TEST_TEMPLATES:-/var/cache/hutch-test/templates})"
./target/debug/hutch template build minimal --templates-dir "${HUTCH_TEST_TEMPLATES:-/var/cache/hutch-test/templates}"
./target/debug/hutch template build base --templates-dir "${HUTCH_TEST_TEMPLATES:-/var/cache/hutch-test/templates}"
./target/debug/hutch template build code-interpreter --templates-dir "${HUTCH_TEST_TEMPLATES:-/var/cache/hutch-test/templates}"

echo "== tests"
cargo nextest run --workspace --no-fail-fast --test-threads 4

echo "== SDKs (Python, TypeScript) and examples"
scripts/test-sdk.sh
