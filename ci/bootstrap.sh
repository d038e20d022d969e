#!/usr/bin/env bash
# Sets up a fresh Debian machine (or a developer's) for the nox sessions: the system
# packages the integration tiers use (a real SLURM cluster: slurm-wlm and munge; a real
# Docker engine and a Debian base for image builds: docker.io and debootstrap) when run as
# root with apt, and nox for the current python3. Idempotent; safe to run again.
set -euo pipefail

python=${PYTHON:-python3}
packages=(slurm-wlm munge docker.io debootstrap)

missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    else
        echo "bootstrap: ${missing[*]} not installed and not root with apt:" \
            "the slurm and docker test tiers will be skipped" >&2
    fi
fi
# the packaged daemons are not used: tests start their own on loopback
for unit in slurmctld slurmd munge docker containerd; do
    if command -v systemctl >/dev/null 2>&1; then
        systemctl stop "$unit" >/dev/null 2>&1 || true
    fi
done

if ! "$python" -m nox --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet --disable-pip-version-check "nox>=2024.3"
fi
"$python" -m nox --version
