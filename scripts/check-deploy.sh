#!/usr/bin/env bash
# Check the deployment files offline, without a Kubernetes cluster or a running systemd
# (docs/cluster.md, "Deployment files"):
# - deploy/k8s/*.yaml against Kubernetes' own schemas with kubernetes-validate (its schemas
#   ship in the package: nothing is fetched), strict: an unknown or misspelt field fails;
# - deploy/*.service with `systemd-analyze verify`, on a copy whose /usr/local/bin/hutch is
#   a stub (verify wants the executable to exist); any warning it prints fails too.
#
#   scripts/check-deploy.sh [DIR]     # DIR: the deploy directory (default: deploy)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPLOY=${1:-deploy}

PY=$(scripts/venv.sh)
manifests=("$DEPLOY"/k8s/*.yaml)
if ! [ -e "${manifests[0]}" ]; then
    echo "scripts/check-deploy.sh: no manifests in $DEPLOY/k8s" >&2
    exit 1
fi
"$PY" -m kubernetes_validate --strict --quiet "${manifests[@]}"

if ! command -v systemd-analyze >/dev/null; then
    echo "scripts/check-deploy.sh: systemd-analyze is missing: install Debian's systemd (scripts/deps.sh does)" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#!/bin/sh\nexit 0\n' >"$work/hutch"
chmod 0755 "$work/hutch"
status=0
for unit in "$DEPLOY"/*.service; do
    copy="$work/$(basename "$unit")"
    sed "s#/usr/local/bin/hutch#$work/hutch#g" "$unit" >"$copy"
    if ! out=$(systemd-analyze verify "$copy" 2>&1) || [ -n "$out" ]; then
        echo "$unit: systemd-analyze verify:" >&2
        echo "${out//$work/\$STUB_DIR}" >&2
        status=1
    fi
done
if [ "$status" = 0 ]; then
    echo "deploy: ${#manifests[@]} manifests and the systemd units are valid"
fi
exit "$status"
