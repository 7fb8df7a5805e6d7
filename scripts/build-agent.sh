#!/usr/bin/env bash
# Build hutch-agent as a static binary (glibc static-pie) for its own target, so the rest of
# the workspace stays dynamic. Prints the path of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RUSTFLAGS='-C target-feature=+crt-static' cargo build --profile release-agent -p hutch-agent --target x86_64-unknown-linux-gnu

echo "target/x86_64-unknown-linux-gnu/release-agent/hutch-agent"
