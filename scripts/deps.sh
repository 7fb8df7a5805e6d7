#!/usr/bin/env bash
# Debian packages Hutch and its tests need (idempotent).
set -euo pipefail
pkgs=(busybox-static debootstrap bubblewrap gcc libc6-dev curl ca-certificates iproute2 python3 python3-pip python3-venv tmux)
# Networking: nftables for the egress policy, openssl for the network tests' certificates.
pkgs+=(nftables openssl)
# The vm backend: QEMU microvm, qemu-img for overlays; mkfs.ext4 for template images and volumes.
pkgs+=(qemu-system-x86 qemu-utils e2fsprogs)
# The ns disk quota: mkfs.btrfs for the image holding sandboxes' upper layers.
pkgs+=(btrfs-progs)
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

# The vm backend fetches Debian's cloud kernel with `apt-get download`: it needs package lists.
if ! apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1; then
    apt-get update -qq
fi

# Python packages the tests use: the MCP client that drives `hutch mcp`.
if ! python3 -c 'import mcp' 2>/dev/null; then
    python3 -m pip install -q "mcp>=2,<3"
fi
