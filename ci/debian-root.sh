#!/usr/bin/env bash
# Sourced by ci/trixie-slurm.sh and ci/sid-apptainer.sh: a Debian root file system made
# once per machine with debootstrap and cached, and the root's client commands for the host.
#   debian_root SUITE NAME PACKAGES...   make (once) $cache/NAME and print its path; a root
#                                        whose stamp differs (suite, packages, hook) is made
#                                        anew; run `root_hook ROOT` (if defined) before the
#                                        stamp is written
#   client_wrappers DIR ROOT             DIR/bin/{sbatch,squeue,...}: each runs the root's
#                                        command in the cluster's mount namespace (held by
#                                        the process in DIR/mntns.pid), in the caller's
#                                        working directory; called from inside the root
#                                        (a job's step), where the cache is not, the root's
#                                        own command
#   bind_paths ROOT PATH...              each PATH (its real path) bound at the same place
#                                        in ROOT, in the caller's mount namespace; a path
#                                        below /tmp or below one bound already is skipped.
#                                        For a namespace's set-up shell: pass it there as
#                                        "$(declare -f bind_paths)"
# The cache is $TRAIN_CI_CACHE (default /var/cache/train-ci). Needs root, debootstrap,
# unshare and nsenter (util-linux).

cache=${TRAIN_CI_CACHE:-/var/cache/train-ci}

debian_mirror() {
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

debian_root() {
    local suite=$1 name=$2
    shift 2
    local root="$cache/$name" stamp
    stamp="$suite $*${ROOT_HOOK_VERSION:+ $ROOT_HOOK_VERSION}"
    mkdir -p "$cache"
    if [ -f "$root/.train-ci-ready" ] && [ "$(cat "$root/.train-ci-ready")" = "$stamp" ]; then
        echo "$root"
        return 0
    fi
    exec 9>"$cache/$name.lock"
    flock 9  # sessions side by side build it once
    if [ -f "$root/.train-ci-ready" ] && [ "$(cat "$root/.train-ci-ready")" = "$stamp" ]; then
        echo "$root"
        return 0
    fi
    local tmp="$root.new"
    rm -rf --one-file-system "$tmp"
    echo "$name: debootstrap $suite from $(debian_mirror) into $root (once)" >&2
    debootstrap --variant=minbase "$suite" "$tmp" "$(debian_mirror)" >&2
    # (no daemon may start inside: apt's postinst scripts ask policy-rc.d)
    printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"
    chmod 755 "$tmp/usr/sbin/policy-rc.d"
    # (the mirror's Release file of a moving suite can be older than its Valid-Until)
    echo 'Acquire::Check-Valid-Until "false";' > "$tmp/etc/apt/apt.conf.d/99train-ci"
    cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    # /proc only in a mount namespace of this command's own: nothing stays mounted
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- sh -c 'mount --bind /proc "$1/proc" &&
        chroot "$1" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends $2 && apt-get clean"' \
        sh "$tmp" "$*" >&2 ||
        { echo "$name: apt-get install failed in $tmp" >&2; exit 1; }
    if declare -F root_hook >/dev/null; then
        root_hook "$tmp" >&2
    fi
    echo "$stamp" > "$tmp/.train-ci-ready"
    rm -rf --one-file-system "$root"
    mv "$tmp" "$root"
    echo "$root"
}

client_wrappers() {
    local dir=$1 root=$2 cmd bin
    mkdir -p "$dir/bin"
    for cmd in sbatch squeue scontrol scancel sinfo sacct sacctmgr srun salloc sstat sprio \
            slurmd; do
        bin=/usr/bin/$cmd
        [ "$cmd" = slurmd ] && bin=/usr/sbin/slurmd
        cat > "$dir/bin/$cmd" <<WRAP
#!/bin/sh
# the root's $cmd ($root), from ci/debian-root.sh
[ -d "$root/usr" ] || exec $bin "\$@"
pid=\$(cat "$dir/mntns.pid") || exit 1
exec nsenter --target "\$pid" --mount --root -- /usr/bin/env -C "\$PWD" $bin "\$@"
WRAP
        chmod 755 "$dir/bin/$cmd"
    done
}

bind_paths() {
    local root=$1 path b
    local -a bound=(/tmp)
    shift
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
}
