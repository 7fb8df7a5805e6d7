#!/usr/bin/env bash
# Fresh Debian 12 → a running Hutch server: install what is missing, build, build the
# `minimal` and `base` templates, start `hutch serve` (a systemd unit where systemd is PID 1,
# else in the background with its log in /var/log/hutch.log). Run it again to upgrade in
# place: it rebuilds, restarts the server and keeps /var/lib/hutch and its sandboxes (the
# server re-adopts them).
#
#   scripts/install.sh        # as root (or: sudo scripts/install.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/install.sh: run as root (or with sudo)" >&2
    exit 1
fi

STATE=/var/lib/hutch
PIDFILE=$STATE/serve.pid
LOG=/var/log/hutch.log
URL=http://127.0.0.1:7700

scripts/deps.sh

if ! command -v cargo >/dev/null; then
    echo "Rust is required (1.85 or newer): install it with rustup, then run this again." >&2
    exit 1
fi

scripts/build-agent.sh
cargo build --release -p hutch
install -D -m 0755 target/release/hutch /usr/local/bin/hutch
install -D -m 0755 target/x86_64-unknown-linux-gnu/release-agent/hutch-agent /usr/local/lib/hutch/hutch-agent
install -D -m 0644 README.md /usr/local/share/doc/hutch/README.md

# Build templates in the foreground so progress is visible (already built: nothing to do).
hutch template build minimal
hutch template build base

wait_healthy() {
    for _ in $(seq 1 150); do
        if curl -fsS "$URL/healthz" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}

# The pid of the server an earlier run of this script started, if it still runs.
our_server_pid() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'hutch serve'; then
        echo "$pid"
    fi
}

if [ -d /run/systemd/system ]; then
    # A server started by an earlier run without systemd hands over to the unit.
    old=$(our_server_pid)
    if [ -n "$old" ]; then
        kill -TERM "$old"
        while kill -0 "$old" 2>/dev/null; do sleep 0.1; done
        rm -f "$PIDFILE"
    fi
    install -D -m 0644 deploy/hutch.service /etc/systemd/system/hutch.service
    systemctl daemon-reload
    systemctl enable --quiet hutch.service
    systemctl restart hutch.service
    if ! wait_healthy; then
        echo "the server did not come up: journalctl -u hutch" >&2
        exit 1
    fi
    echo "Hutch is running on $URL as the systemd unit hutch.service."
    echo "Log: journalctl -u hutch -f. Stop: systemctl stop hutch (sandboxes keep running)."
else
    old=$(our_server_pid)
    if [ -n "$old" ]; then
        echo "stopping the running server (pid $old) to upgrade it; its sandboxes keep running"
        kill -TERM "$old"
        for _ in $(seq 1 300); do
            kill -0 "$old" 2>/dev/null || break
            sleep 0.1
        done
    elif curl -fsS "$URL/healthz" >/dev/null 2>&1; then
        echo "a Hutch server this script did not start answers on $URL: stop it, then run this again" >&2
        exit 1
    fi
    mkdir -p "$STATE"
    HUTCH_AGENT=/usr/local/lib/hutch/hutch-agent nohup /usr/local/bin/hutch serve --state-dir "$STATE" >>"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
    if ! wait_healthy; then
        echo "the server did not come up; see $LOG" >&2
        exit 1
    fi
    echo "Hutch is running on $URL (pid $(cat "$PIDFILE"); no systemd here, so it runs in the background)."
    echo "Log: $LOG. Stop: kill \$(cat $PIDFILE) (sandboxes keep running)."
fi
echo "Try: hutch run -- python3 -c 'print(6*7)'"
