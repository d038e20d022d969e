#!/usr/bin/env bash
# Real Apptainer (1.4.5) and Slurm 26.05 from Debian sid, for the apptainer tier. Apptainer
# refuses a chroot ("weak chrooted environment"), so the sid root is entered as a real root:
# a mount namespace of its own, the root bound onto itself, pivot_root, the old root
# unmounted. Apptainer runs as an ordinary user, as on the sites (as root, its start needs
# CAP_SYS_RESOURCE, which this machine's sandbox lacks): the root has the user $user with
# subuid/subgid lines, so `apptainer exec` works through user namespaces and `apptainer
# build --fakeroot` builds a .def.
#
#   ci/sid-apptainer.sh root             make (once per machine) and print the cached root
#   ci/sid-apptainer.sh up DIR [PATH..]  start a local cluster (ci/slurm-up.sh: Slurm 26.05)
#                                        in DIR inside the root, each PATH bound at the
#                                        same place; prints SLURM_CONF. DIR/bin holds the
#                                        root's client commands (run as root) and `as-user`,
#                                        which runs a command in the root as $user, in the
#                                        caller's working directory and environment (HOME,
#                                        USER, LOGNAME are the user's: DIR/home, bound at
#                                        /home/$user, fresh for each cluster)
#   ci/sid-apptainer.sh down DIR         stop it (as slurm-down.sh DIR)
#   ci/sid-apptainer.sh plain-image      make (once per machine) and print a SIF of plain
#                                        Debian bookworm with python3: no torch, no train
#
# What the namespace binds: /proc (its own), /sys, /dev, the host's /tmp (the cluster's
# folder and the tests' work; Apptainer's temporary sandboxes go there too: there is no
# squashfuse, so every start unpacks the SIF), the host's /etc/hosts (node names), and
# each PATH. Nothing stays mounted on the host: the namespace ends with its last process.
# Cached in $TRAIN_CI_CACHE (default /var/cache/train-ci). Needs root, debootstrap,
# unshare and nsenter (util-linux).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/debian-root.sh
. "$here/debian-root.sh"
user=trainuser
uid=2001
root="$cache/sid-apptainer"
packages=(apptainer squashfs-tools uidmap python3 python3-venv slurm-wlm munge procps
    iproute2 git ca-certificates)
ROOT_HOOK_VERSION="user $user $uid"

root_hook() {
    # the ordinary user, with the subordinate ids user namespaces need
    chroot "$1" useradd -m -u "$uid" -s /bin/bash "$user"
    echo "$user:100000:65536" >> "$1/etc/subuid"
    echo "$user:100000:65536" >> "$1/etc/subgid"
    # (the test Python may live under /root, as a pyenv does: bound there, it must be
    # reachable by the user)
    chmod 755 "$1/root"
}

make_root() {
    debian_root sid sid-apptainer "${packages[@]}"
}

# enter ROOT HOME PATH... -- CMD...: CMD as root inside the root, in a new mount namespace
# (HOME: bound at the user's home, or "")
# shellcheck disable=SC2016  # expanded by the inner shell
enter_script='
set -euo pipefail
root=$1 home=$2
shift 2
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount --rbind /tmp "$root/tmp"
mount --bind /etc/hosts "$root/etc/hosts"
[ -z "$home" ] || mount --bind "$home" "$root/home/'"$user"'"
paths=()
while [ "$1" != -- ]; do
    paths+=("$1")
    shift
done
bind_paths "$root" ${paths[@]+"${paths[@]}"}
shift
cd "$root"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
exec "$@"
'

up() {
    local dir=${1:?usage: sid-apptainer.sh up DIR [PATH...]}
    shift
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    make_root >/dev/null
    client_wrappers "$dir" "$root"
    mkdir -p "$dir/home"
    chown "$uid:$uid" "$dir/home"
    chmod 700 "$dir/home"
    cat > "$dir/bin/as-user" <<WRAP
#!/bin/sh
# runs its arguments as $user in the root of ci/sid-apptainer.sh, in the caller's folder
pid=\$(cat "$dir/mntns.pid") || exit 1
exec nsenter --target "\$pid" --mount --root -- /usr/bin/env -C "\$PWD" \\
    setpriv --reuid=$uid --regid=$uid --init-groups \\
    /usr/bin/env HOME=/home/$user USER=$user LOGNAME=$user "\$@"
WRAP
    chmod 755 "$dir/bin/as-user"
    # a process that sleeps holds the namespace (slurm-down.sh ends it with the daemons:
    # it works in DIR)
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private --fork -- bash -c "$(declare -f bind_paths)$enter_script" bash \
        "$root" "$dir/home" "$here/.." "$@" -- bash -c '
            dir=$1
            (cd "$dir" && exec setsid sleep infinity) </dev/null >/dev/null 2>&1 &
            echo "$!" > "$dir/mntns.pid"
            stat -L -c %i /proc/self/ns/mnt > "$dir/mntns.id"
            exec bash "$2/slurm-up.sh" "$dir"' bash "$dir" "$here"
}

plain_image() {
    # plain Debian bookworm with python3, made into a SIF by the root's apptainer as the
    # ordinary user (--fakeroot: the tree's root-owned files)
    local sif="$cache/plain-python3.sif" tree
    if [ -s "$sif" ]; then
        echo "$sif"
        return 0
    fi
    make_root >/dev/null
    exec 8>"$cache/plain-python3.lock"
    flock 8
    if [ -s "$sif" ]; then
        echo "$sif"
        return 0
    fi
    tree=$(mktemp -d /tmp/plain-python3.XXXXXX)
    # shellcheck disable=SC2064  # the folder is known now
    trap "rm -rf --one-file-system '$tree'" EXIT
    echo "sid-apptainer: debootstrap bookworm with python3 for the plain image (once)" >&2
    debootstrap --variant=minbase --include=python3 bookworm "$tree/rootfs" \
        "$(debian_mirror)" > "$tree/debootstrap.log" 2>&1 ||
        { tail -n 30 "$tree/debootstrap.log" >&2; exit 1; }
    rm -rf "${tree:?}/rootfs/dev/"*  # (device nodes cannot be packed unprivileged)
    chown -R "$uid:$uid" "$tree"
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private --fork -- bash -c "$(declare -f bind_paths)$enter_script" bash \
        "$root" "" -- setpriv --reuid="$uid" --regid="$uid" --init-groups \
        /usr/bin/env HOME="$tree" sh -c 'cd "$1" && apptainer -s build --fakeroot plain.sif \
        rootfs' sh "$tree" >&2
    mv "$tree/plain.sif" "$sif"
    chmod 644 "$sif"
    echo "$sif"
}

case "${1:-}" in
    root) make_root ;;
    up) shift; up "$@" ;;
    down) shift; exec bash "$here/slurm-down.sh" "$@" ;;
    plain-image) plain_image ;;
    *) echo "usage: sid-apptainer.sh root | up DIR [PATH...] | down DIR | plain-image" >&2
       exit 2 ;;
esac
