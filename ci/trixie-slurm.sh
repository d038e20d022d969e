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
cache=${TRAIN_CI_CACHE:-/var/cache/train-ci}
root="$cache/trixie-slurm"
# what the root holds; a change here makes a new root
packages=(slurm-wlm munge python3 git procps iproute2 ca-certificates)
stamp="trixie ${packages[*]}"

mirror() {
    # the Debian archive this machine is configured with (deb822 or one-line sources)
    local uri
    uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '{print $2}' | grep -v -- '-security' | head -n 1)
    if [ -z "$uri" ]; then
        uri=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            2>/dev/null | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i;
            exit}}' | grep -v -- '-security' | head -n 1)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

make_root() {
    mkdir -p "$cache"
    if [ -f "$root/.train-ci-ready" ] && [ "$(cat "$root/.train-ci-ready")" = "$stamp" ]; then
        echo "$root"
        return 0
    fi
    exec 9>"$cache/trixie-slurm.lock"
    flock 9  # sessions side by side build it once
    if [ -f "$root/.train-ci-ready" ] && [ "$(cat "$root/.train-ci-ready")" = "$stamp" ]; then
        echo "$root"
        return 0
    fi
    local tmp="$root.new"
    rm -rf --one-file-system "$tmp"
    echo "trixie-slurm: debootstrap trixie from $(mirror) into $root (once)" >&2
    debootstrap --variant=minbase trixie "$tmp" "$(mirror)" >&2
    # (no daemon may start inside: apt's postinst scripts ask policy-rc.d)
    printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"
    chmod 755 "$tmp/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    # /proc only in a mount namespace of this command's own: nothing stays mounted
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- sh -c 'mount --bind /proc "$1/proc" &&
        chroot "$1" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends $2 && apt-get clean"' \
        sh "$tmp" "${packages[*]}" >&2 ||
        { echo "trixie-slurm: apt-get install failed in $tmp" >&2; exit 1; }
    echo "$stamp" > "$tmp/.train-ci-ready"
    rm -rf --one-file-system "$root"
    mv "$tmp" "$root"
    echo "$root"
}

up() {
    local dir=${1:?usage: trixie-slurm.sh up DIR [PATH...]}
    shift
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    make_root >/dev/null
    # trixie's client commands for the host: each runs in the root, in the cluster's mount
    # namespace (held by the process in DIR/mntns.pid), in the caller's working directory;
    # called from inside the root (a job's step), where the cache is not, the root's own
    local cmd bin
    mkdir -p "$dir/bin"
    for cmd in sbatch squeue scontrol scancel sinfo sacct srun salloc sstat sprio slurmd; do
        bin=/usr/bin/$cmd
        [ "$cmd" = slurmd ] && bin=/usr/sbin/slurmd
        cat > "$dir/bin/$cmd" <<WRAP
#!/bin/sh
# trixie's $cmd (Slurm 24.11), from ci/trixie-slurm.sh
[ -d "$root/usr" ] || exec $bin "\$@"
pid=\$(cat "$dir/mntns.pid") || exit 1
exec nsenter --target "\$pid" --mount --root -- /usr/bin/env -C "\$PWD" $bin "\$@"
WRAP
        chmod 755 "$dir/bin/$cmd"
    done
    # the mount namespace: /proc, /sys (cgroups with it), /dev, /tmp (the cluster's folder,
    # the tests' runs), the host's /etc/hosts (its own name: 24.11's slurmctld looks up the
    # submitting host), and each PATH at the same place; a process that sleeps holds it
    # (slurm-down.sh ends it with the daemons: its PID file is in DIR, its SLURM_CONF names
    # the cluster)
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- bash -c '
        set -euo pipefail
        root=$1 dir=$2 here=$3
        shift 3
        mount --rbind /dev "$root/dev"
        mount --bind /proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount --rbind /tmp "$root/tmp"
        mount --bind /etc/hosts "$root/etc/hosts"
        bound=(/tmp)
        for path in "$@"; do
            path=$(realpath "$path")
            for b in "${bound[@]}"; do
                case "$path/" in "$b"/*) continue 2 ;; esac
            done
            if [ -d "$path" ]; then
                mkdir -p "$root$path"
            else
                mkdir -p "$root$(dirname "$path")"
                touch "$root$path"
            fi
            mount --rbind "$path" "$root$path"
            bound+=("$path")
        done
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
