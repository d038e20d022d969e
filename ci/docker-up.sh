#!/usr/bin/env bash
# Starts a Docker engine for the image tests: dockerd with its own socket, data and exec
# roots under DIR, no iptables and no bridge (containers get no network).
# Usage: ci/docker-up.sh DIR  -> prints the DOCKER_HOST to use. Stop: ci/docker-down.sh DIR
set -euo pipefail

dir=${1:?usage: docker-up.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
socket="unix://$dir/docker.sock"
dockerd --iptables=false --ip6tables=false --bridge=none \
    --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/docker.pid" \
    --host "$socket" > "$dir/dockerd.log" 2>&1 &
for _ in $(seq 1 150); do
    if DOCKER_HOST="$socket" docker version >/dev/null 2>&1; then
        echo "$socket"
        exit 0
    fi
    sleep 0.2
done
echo "docker-up: dockerd did not answer; see $dir/dockerd.log" >&2
tail -n 20 "$dir/dockerd.log" >&2 || true
exit 1
