#!/usr/bin/env bash
# Fresh Debian 12 → a running Hutch server: install what is missing, build, build the
# `base` template, start `hutch serve` in the background (log: /var/log/hutch.log).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/install.sh: run as root (sudo scripts/install.sh)" >&2
    exit 1
fi

scripts/deps.sh

if ! command -v cargo >/dev/null; then
    echo "Rust is required (1.85 or newer): install it with rustup, then run this again." >&2
    exit 1
fi

scripts/build-agent.sh
cargo build --release -p hutch
install -D -m 0755 target/release/hutch /usr/local/bin/hutch
install -D -m 0755 target/x86_64-unknown-linux-gnu/release-agent/hutch-agent /usr/local/lib/hutch/hutch-agent

if curl -fsS http://127.0.0.1:7700/healthz >/dev/null 2>&1; then
    echo "a Hutch server already answers on 127.0.0.1:7700"
    exit 0
fi
# Build templates in the foreground so progress is visible, then start the server.
hutch template build minimal
hutch template build base
nohup hutch serve >/var/log/hutch.log 2>&1 &
for _ in $(seq 1 100); do
    if curl -fsS http://127.0.0.1:7700/healthz >/dev/null 2>&1; then
        echo "Hutch is running on http://127.0.0.1:7700 (log: /var/log/hutch.log)."
        echo "Try: hutch run -- python3 -c 'print(6*7)'"
        exit 0
    fi
    sleep 0.1
done
echo "the server did not come up; see /var/log/hutch.log" >&2
exit 1
