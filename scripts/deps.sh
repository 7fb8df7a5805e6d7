#!/usr/bin/env bash
# Debian packages Hutch and its tests need (idempotent), then a check that every command they
# provide is really there: apt can remove a package as a side effect of installing another
# (a backported qemu-utils goes when Debian's qemu-system-x86 comes in), and nothing else
# would notice until a vm create failed.
#
#   scripts/deps.sh            # the server, the tests and the benchmark baselines
#   scripts/deps.sh --check    # only check; exit 1 naming what is missing
set -euo pipefail

check_only=0
if [ "${1:-}" = --check ]; then
    check_only=1
fi

# command → the Debian package that provides it. Every command the server, the templates,
# the tests and `hutch bench` run.
declare -A provider=(
    [qemu-system-x86_64]=qemu-system-x86 # the vm backend
    [qemu-img]=qemu-utils                # vm overlays and volume images
    [mkfs.ext4]=e2fsprogs                # template images and volumes
    [e2fsck]=e2fsprogs                   # checking volumes a vm guest wrote
    [tune2fs]=e2fsprogs                  # resetting a checked volume's error behaviour
    [debugfs]=e2fsprogs                  # the crafted-volume test builds its image
    [dumpe2fs]=e2fsprogs                 # the crafted-volume test reads the superblock
    [mkfs.btrfs]=btrfs-progs             # the ns disk quota pool
    [nft]=nftables                       # the egress policy
    [ip]=iproute2
    [debootstrap]=debootstrap            # the base template
    [busybox]=busybox-static             # the minimal template (must be static)
    [bwrap]=bubblewrap                   # bench baseline
    [openssl]=openssl                    # the network tests' certificates
    [tmux]=tmux                          # the PTY tests
    [curl]=curl
    [gcc]=gcc                            # tests compile small probes
    [python3]=python3
    [shellcheck]=shellcheck              # scripts are linted in the test suite
    [systemd-analyze]=systemd            # scripts/check-deploy.sh verifies deploy/*.service
    [runsc]=runsc                        # bench baseline: gVisor
    [crun]=crun                          # bench baseline: an OCI runtime
    [runc]=runc                          # bench baseline: the OCI runtime that runs on hybrid cgroups
    [podman]=podman                      # bench baseline: a container engine
    [chromium]=chromium                  # the port proxy's browser attack tests
    [setpriv]=util-linux                 # jailed volume checks
    [docker-registry]=docker-registry    # the image-template tests' local registry
    [skopeo]=skopeo                      # the image-template tests push their images
    [htpasswd]=apache2-utils             # the local registry's basic auth
)
# Packages that provide no command we call by name, but are needed (postgresql-15: the
# cluster store's tests start a private server with its initdb, not on PATH).
extra=(libc6-dev ca-certificates python3-venv python3-pip binutils postgresql-15)
# Node.js for the TypeScript SDK: the machine's own if present, else Debian's.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    provider[node]=nodejs
    provider[npm]=npm
fi

# What is missing now: a list of "command package" lines.
missing_commands() {
    local c
    for c in "${!provider[@]}"; do
        if ! command -v "$c" >/dev/null 2>&1; then
            echo "$c ${provider[$c]}"
        fi
    done
    if command -v busybox >/dev/null 2>&1 && ! file_is_static "$(command -v busybox)"; then
        echo "busybox(static) busybox-static"
    fi
    if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        echo "python3-venv python3-venv"
    fi
    if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
        echo "initdb(postgresql) postgresql-15"
    fi
    if command -v qemu-system-x86_64 >/dev/null 2>&1 && ! qemu_new_enough; then
        echo "qemu-system-x86_64(>=7.2) qemu-system-x86"
    fi
}

file_is_static() {
    # A static binary has no program interpreter.
    ! LC_ALL=C readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'
}

qemu_new_enough() {
    local v major minor
    v=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
    read -r major minor <<<"$v"
    [ -n "${major:-}" ] && { [ "$major" -gt 7 ] || { [ "$major" -eq 7 ] && [ "$minor" -ge 2 ]; }; }
}

installed_version() {
    dpkg-query -W -f='${Status} ${Version}' "$1" 2>/dev/null | sed -n 's/^install ok installed //p'
}

candidate_version() {
    apt-cache policy "$1" | sed -n 's/^ *Candidate: //p'
}

apt_install() {
    echo "installing: $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades "$@"
}

# qemu-system-x86 and qemu-utils must come from the same QEMU release: installing Debian's
# qemu-system-x86 next to a newer qemu-utils (a backport) makes apt remove qemu-utils. Pin
# qemu-utils to the system QEMU's version (the installed one, else apt's candidate).
qemu_packages() {
    local sys utils want
    sys=$(installed_version qemu-system-x86)
    utils=$(installed_version qemu-utils)
    if [ -n "$sys" ] && [ "$sys" = "$utils" ]; then
        return
    fi
    want=${sys:-$(candidate_version qemu-system-x86)}
    if [ -z "$want" ] || [ "$want" = "(none)" ]; then
        echo "qemu-system-x86 qemu-utils"
        return
    fi
    if [ -z "$sys" ]; then
        echo "qemu-system-x86=$want qemu-utils=$want"
    elif apt-cache madison qemu-utils | awk -F'|' '{gsub(/ /,"",$2); print $2}' | grep -qxF "$want"; then
        echo "qemu-utils=$want"
    else
        # No qemu-utils of the installed QEMU's version: move both to apt's candidate.
        want=$(candidate_version qemu-system-x86)
        echo "qemu-system-x86=$want qemu-utils=$want"
    fi
}

report_missing() {
    local lines=$1
    echo "scripts/deps.sh: still missing after installing:" >&2
    while read -r c p; do
        [ -n "$c" ] && echo "  $c (Debian package $p)" >&2
    done <<<"$lines"
}

if [ "$check_only" = 1 ]; then
    m=$(missing_commands)
    if [ -n "$m" ]; then
        report_missing "$m"
        exit 1
    fi
    echo "deps: every command Hutch and its tests need is installed"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "scripts/deps.sh: run as root to install packages (or pass --check)" >&2
    exit 1
fi

apt-get update -qq

# Pass 1: every package that is not installed, QEMU pinned as one release.
pkgs=()
for p in $(printf '%s\n' "${provider[@]}" "${extra[@]}" | sort -u); do
    case "$p" in qemu-system-x86 | qemu-utils) continue ;; esac
    [ -n "$(installed_version "$p")" ] || pkgs+=("$p")
done
read -r -a qemu <<<"$(qemu_packages)"
pkgs+=("${qemu[@]}")
if [ ${#pkgs[@]} -gt 0 ]; then
    apt_install "${pkgs[@]}"
fi

# Pass 2: a command still missing (its package removed by pass 1, or installed without the
# command) gets its package installed again; QEMU re-pinned.
m=$(missing_commands)
if [ -n "$m" ]; then
    echo "after the first pass, missing: $(echo "$m" | awk '{print $1}' | xargs)"
    pkgs=()
    while read -r c p; do
        case "$p" in qemu-system-x86 | qemu-utils) ;; *) pkgs+=("$p") ;; esac
    done <<<"$m"
    read -r -a qemu <<<"$(qemu_packages)"
    pkgs+=("${qemu[@]}")
    if [ ${#pkgs[@]} -gt 0 ]; then
        apt_install --reinstall "${pkgs[@]}"
    fi
    m=$(missing_commands)
    if [ -n "$m" ]; then
        report_missing "$m"
        exit 1
    fi
fi

# The vm backend fetches Debian's cloud kernel with `apt-get download`: it needs package lists
# (fetched above).
echo "deps: every command Hutch and its tests need is installed"
