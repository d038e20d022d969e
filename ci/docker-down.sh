#!/usr/bin/env bash
# Stops the engine started by ci/docker-up.sh DIR: TERM by the PID in its PID file, wait.
set -uo pipefail

dir=${1:?usage: docker-down.sh DIR}
pidfile="$dir/docker.pid"
[ -s "$pidfile" ] || exit 0
pid=$(cat "$pidfile")
kill -TERM "$pid" 2>/dev/null || exit 0
for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || exit 0
    sleep 0.2
done
kill -KILL "$pid" 2>/dev/null || true
exit 0
