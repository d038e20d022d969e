#!/usr/bin/env bash
# Stops the cluster in DIR (ci/slurm-down.sh, or ci/trixie-slurm.sh down) when the process
# that started this guard ends, however it ends: SIGKILL, a crash, the TERM of a timeout.
# The guard reads its standard input, a pipe only that process can write to, until a line
# "done" (the owner stopped the cluster itself: nothing to do) or the end of the pipe (the
# owner is gone). Start it in a session of its own, so that signals to the owner's process
# group (Ctrl-C, `timeout`) leave it be.
# Usage: ci/slurm-guard.sh DIR [down command...] < pipe
set -uo pipefail

dir=${1:?usage: slurm-guard.sh DIR [down command...] < pipe}
shift
line=
read -r line || true
[ "$line" = "done" ] && exit 0
if [ "$#" -eq 0 ]; then
    set -- bash "$(dirname "$0")/slurm-down.sh"
fi
exec "$@" "$dir" >/dev/null 2>&1
