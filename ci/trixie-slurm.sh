#!/usr/bin/env bash
# A second local SLURM cluster on Debian trixie's Slurm 24.11 (the sites run 23.x-25.x; our
# machines run bookworm's 22.05). The same ci/slurm-up.sh runs inside a trixie root file
# system under chroot, in a mount namespace of its own: the binds the jobs need (/proc,
# /sys, /dev, /tmp, the repository, the test Python) exist only for the cluster's processes
# and vanish with them, so nothing on the host is left mounted.
#
#   ci/trixie-slurm.sh root             make (once per machine) and print the cached root
#   ci/trixie-slurm.sh up DIR [PATH..]  start the cluster in DIR (as slurm-up.sh DIR), with
#                                       each PATH bound at the same place in the root;
#                                       prints SLURM_CONF; DIR/bin holds trixie's client
#                                       commands (sbatch, squeue, ...): put it first on PATH
#   ci/trixie-slurm.sh down DIR         stop it (as slurm-down.sh DIR)
#
# The root is cached in $TRAIN_CI_CACHE (default /var/cache/train-ci): a fresh machine pays
# the debootstrap once. Needs root, debootstrap, unshare and nsenter (util-linux).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/debian-root.sh
. "$here/debian-root.sh"
root="$cache/trixie-slurm"
# what the root holds; a change here makes a new root
packages=(slurm-wlm munge python3 git procps iproute2 ca-certificates)

make_root() {
    debian_root trixie trixie-slurm "${packages[@]}"
}

up() {
    local dir=${1:?usage: trixie-slurm.sh up DIR [PATH...]}
    shift
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    make_root >/dev/null
    # trixie's client commands for the host
    client_wrappers "$dir" "$root"
    # the mount namespace: /proc, /sys (cgroups with it), /dev, /tmp (the cluster's folder,
    # the tests' runs), the host's /etc/hosts (its own name: 24.11's slurmctld looks up the
    # submitting host), and each PATH at the same place; a process that sleeps holds it
    # (slurm-down.sh ends it with the daemons: its PID file is in DIR, its SLURM_CONF names
    # the cluster)
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- bash -c "$(declare -f bind_paths)"'
        set -euo pipefail
        root=$1 dir=$2 here=$3
        shift 3
        mount --rbind /dev "$root/dev"
        mount --bind /proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount --rbind /tmp "$root/tmp"
        mount --bind /etc/hosts "$root/etc/hosts"
        bind_paths "$root" "$@"
        SLURM_CONF="$dir/slurm.conf" setsid chroot "$root" sleep infinity \
            </dev/null >/dev/null 2>&1 &
        echo "$!" > "$dir/mntns.pid"
        stat -L -c %i /proc/self/ns/mnt > "$dir/mntns.id"
        exec chroot "$root" bash "$here/slurm-up.sh" "$dir"
    ' bash "$root" "$dir" "$here" "$@"
}

case "${1:-}" in
    root) make_root ;;
    up) shift; up "$@" ;;
    down) shift; exec bash "$here/slurm-down.sh" "$@" ;;
    *) echo "usage: trixie-slurm.sh root | up DIR [PATH...] | down DIR" >&2; exit 2 ;;
esac
