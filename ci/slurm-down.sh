#!/usr/bin/env bash
# Stops the cluster started by ci/slurm-up.sh DIR, and everything of it, by PID:
# 1. cancels its jobs, and waits (at most KillWait + 10 s) for their processes to end while
#    the daemons are still there to hear of it: a slurmstepd whose job ended after its
#    slurmd and slurmctld were gone keeps retrying to report it, and ignores TERM;
# 2. TERMs every daemon by the PID in its PID file, all at once, and waits for them
#    (KILL after 10 s);
# 3. KILLs whatever of the cluster is left: every process whose command line names DIR/ or
#    whose environment says SLURM_CONF=DIR/slurm.conf with a SLURM_JOB_ID (the jobs'
#    programs), working in DIR or in its mount namespace (the daemons, slurmstepd), except
#    this script and its callers.
# Safe to run twice, or beside a run of itself; never fails.
set -uo pipefail

dir=${1:?usage: slurm-down.sh DIR}
dir=$(cd "$dir" 2>/dev/null && pwd) || dir=${1%/}
conf="$dir/slurm.conf"
# a cluster of ci/trixie-slurm.sh: its own client commands
[ -x "$dir/bin/scancel" ] && PATH="$dir/bin:$PATH"

# this script and the processes above it (a guard, the test session) are never swept
keep=" $$ "
pid=$$
while [ "$pid" -gt 1 ]; do
    pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || break
    [ -n "$pid" ] || break
    keep+="$pid "
done
# the patterns are read from files outside DIR, so grep's own command line never names it
patterns=$(mktemp -d "${TMPDIR:-/tmp}/slurm-down.XXXXXX")
trap 'rm -rf "$patterns"' EXIT
printf 'SLURM_CONF=%s\n' "$conf" > "$patterns/env"
printf '%s/\n' "$dir" > "$patterns/cmd"

mntns=
cd / || exit 0  # (no helper of this script may work in DIR)

cluster_pids() {
    # PIDs of the cluster's processes (its daemons with them): command line, environment,
    # working directory (slurmd's, which its slurmstepd keep: 24.11 starts them with an
    # empty environment) or, for a cluster in a root of its own, its mount namespace
    local p
    # (by environment only the jobs' own processes, which Slurm gives a SLURM_JOB_ID: a
    # shell of the user's that exported SLURM_CONF, and what it runs, is no part of it)
    { grep -lszxF -f "$patterns/env" /proc/[0-9]*/environ |
          while read -r env; do grep -qsz '^SLURM_JOB_ID=' "$env" && echo "$env"; done
      grep -lszF -f "$patterns/cmd" /proc/[0-9]*/cmdline
      stat -c '%N' /proc/[0-9]*/cwd | awk -v d="$dir" '{
          pid = $0; sub(/^.\/proc\//, "", pid); sub(/\/.*/, "", pid)
          cwd = $0; if (!sub(/^[^>]*-> ./, "", cwd)) next; sub(/.( \(deleted\))?$/, "", cwd)
          if (cwd == d || index(cwd, d "/") == 1) print "/proc/" pid "/cwd" }'
      if [ -n "$mntns" ]; then
          stat -L -c '%i %n' /proc/[0-9]*/ns/mnt | awk -v i="$mntns" '$1 == i {print $2}'
      fi
    } 2>/dev/null | awk -F/ '{print $3}' | sort -un | while read -r p; do
            case "$keep" in *" $p "*) ;; *) echo "$p" ;; esac
        done
}

# A mount namespace's number is given to the next `unshare` as soon as its last process is
# gone: a cluster found by a stale number is somebody else's (a guard that ran late once
# stopped another tier's new cluster so). So sweep by it only when a process of this
# cluster (its holder in mntns.pid, or one found by name) is in it, and keep the namespace
# open for this run: an open namespace lives on, and keeps its number.
if id=$(cat "$dir/mntns.id" 2>/dev/null); then
    for pid in $(cat "$dir/mntns.pid" 2>/dev/null) $(cluster_pids); do
        [ "$(stat -L -c %i "/proc/$pid/ns/mnt" 2>/dev/null)" = "$id" ] || continue
        exec {ns}< "/proc/$pid/ns/mnt" 2>/dev/null || continue
        [ "$(stat -L -c %i "/proc/self/fd/$ns")" = "$id" ] && { mntns=$id; break; }
        exec {ns}<&-
    done
fi

daemons=()
for pidfile in "$dir"/*.pid "$dir/munge/munged.pid"; do
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -0 "$pid" 2>/dev/null && daemons+=("$pid")
done

if [ -f "$conf" ] && [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" \
        2>/dev/null; then
    SLURM_CONF="$conf" timeout -s KILL 30 scancel --full --quiet --user=root 2>/dev/null
    kill_wait=$(sed -n 's/^KillWait=\([0-9]*\)$/\1/p' "$conf")
    bound=$(( $(date +%s) + ${kill_wait:-30} + 10 ))
    while [ "$(date +%s)" -lt "$bound" ]; do
        # (the daemons' own children, slurmctld's slurmscriptd, are not the jobs')
        left=$(for pid in $(cluster_pids); do
                   parent=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
                   case " ${daemons[*]} " in
                       *" $pid "* | *" $parent "*) ;;
                       *) echo "$pid" ;;
                   esac
               done)
        [ -n "$left" ] || break
        sleep 0.2
    done
fi

pids=()
for pid in "${daemons[@]}"; do
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
done
for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
done

# what is left has nobody to report to: KILL it (a killed process's children may appear
# once it is gone, so look again until nothing is found)
for _ in $(seq 1 50); do
    left=$(cluster_pids)
    [ -n "$left" ] || break
    # shellcheck disable=SC2086  # one PID a word
    kill -KILL $left 2>/dev/null
    sleep 0.1
done

# rewrite in place: /etc/hosts is often a bind mount that cannot be replaced; one edit at
# a time (ci/slurm-up.sh: clusters side by side)
(
    flock 9
    if grep -qF "train-local-slurm $dir" /etc/hosts 2>/dev/null; then
        kept=$(grep -vF "train-local-slurm $dir" /etc/hosts)
        printf '%s\n' "$kept" > /etc/hosts
    fi
) 9>> /tmp/.train-local-slurm-hosts.lock
exit 0
