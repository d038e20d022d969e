#!/usr/bin/env bash
# Makes the CI stand-in for the CUDA base image (no registry is reachable): a minimal
# Debian bookworm with Python, the InfiniBand user libraries and curl/unzip (what the CUDA
# base plus apt would give the derived images), from the Debian mirror
# this machine uses, imported into the running Docker engine as TAG.
# Usage: ci/base-rootfs.sh TAG   (needs root, debootstrap, DOCKER_HOST set)
set -euo pipefail

tag=${1:?usage: base-rootfs.sh TAG}
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base-rootfs: $tag already present"
    exit 0
fi
mirror=$( (grep -rhoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list.d/ \
    /etc/apt/sources.list 2>/dev/null || true) | head -n 1 | tr -d ' ')
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,rdma-core,libibverbs1,ibverbs-providers,curl,unzip \
    bookworm "$root" "$mirror" > "$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; exit 1; }
rm -f "$root.log"
tar -C "$root" -c . | docker import - "$tag" > /dev/null
echo "base-rootfs: imported $tag"
