#!/usr/bin/env bash
# Debian packages Hutch and its tests need (idempotent).
set -euo pipefail
pkgs=(busybox-static debootstrap bubblewrap gcc libc6-dev curl ca-certificates iproute2 nftables openssl e2fsprogs python3 python3-pip python3-venv tmux)
# Node.js for the TypeScript SDK: the machine's own if present, else Debian's.
command -v node >/dev/null || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# Python packages the tests use: the MCP client that drives `hutch mcp`.
if ! python3 -c 'import mcp' 2>/dev/null; then
    python3 -m pip install -q "mcp>=2,<3"
fi
