#!/usr/bin/env bash
# Stops the cluster started by ci/slurm-up.sh DIR: cancels jobs, then TERMs every daemon by
# the PID in its PID file, all at once, and waits for them to exit.
set -uo pipefail

dir=${1:?usage: slurm-down.sh DIR}
dir=$(cd "$dir" 2>/dev/null && pwd) || dir=${1}
export SLURM_CONF="$dir/slurm.conf"
if [ -f "$SLURM_CONF" ]; then
    scancel --full --quiet --user=root 2>/dev/null || true
fi
pids=()
for pidfile in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    fi
done
for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
done
# rewrite in place: /etc/hosts is often a bind mount that cannot be replaced
if grep -qF "train-local-slurm $dir" /etc/hosts 2>/dev/null; then
    kept=$(grep -vF "train-local-slurm $dir" /etc/hosts)
    printf '%s\n' "$kept" > /etc/hosts
fi
exit 0
