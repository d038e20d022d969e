#!/usr/bin/env bash
# Starts a real SLURM cluster on this machine: munged, slurmctld and two slurmd daemons
# (nodes n1, n2; 4 CPUs, 8000 MB and 2 fake GPUs each; partition "debug"), all on loopback.
# Usage: ci/slurm-up.sh DIR   (DIR short: the munge socket path must stay under 108 bytes)
# Prints the SLURM_CONF path. Stop with ci/slurm-down.sh DIR. Needs root, slurm-wlm, munge.
set -euo pipefail

dir=${1:?usage: slurm-up.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
first_job=${SLURM_FIRST_JOB_ID:-$((1000 + RANDOM % 18000))}

# The daemons' three ports (controller, n1, n2): below Linux's range for outgoing
# connections (32768-60999, where any process's connection or a data loader's listener may
# hold a port) and above the chain engine's rendezvous ports (20000-29999); free on this
# host and not those of a cluster started beside this one (its /etc/hosts line names its
# folder) that has not bound them yet. Chosen and recorded under one lock: two clusters
# started at once never share a port, a controller of another version never answers.
free_base() {
    local used base port line
    used=" $(for f in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$f" ] || continue
        while read -r _ line _; do
            [ "$line" = local_address ] || printf '%d ' "0x${line##*:}"
        done < "$f"
    done)"
    while read -r line; do
        port=$(grep -oE '^SlurmctldPort=[0-9]+' "${line#* }/slurm.conf" 2>/dev/null | cut -d= -f2)
        [ -z "$port" ] || used+="$port $((port + 1)) $((port + 2)) "
    done < <(grep -oE 'train-local-slurm /[^ ]+' /etc/hosts 2>/dev/null)
    local slot=$((RANDOM % 920))
    for _ in $(seq 1 920); do
        slot=$(((slot + 1) % 920))
        base=$((30000 + 3 * slot))
        case "$used" in
            *" $base "*|*" $((base + 1)) "*|*" $((base + 2)) "*) continue ;;
        esac
        echo "$base"
        return 0
    done
    echo "slurm-up: no three free ports in 30000-32759" >&2
    return 1
}

# node names must resolve, also inside containers on the host network (as on real clusters)
# (one line per cluster, tagged with its directory: clusters started side by side each
# remove only their own line)
# (clusters that start and stop side by side, also in the roots of ci/trixie-slurm.sh and
# ci/sid-apptainer.sh, which share /tmp and /etc/hosts, edit the file one at a time: a
# stop's rewrite read before another's append would lose that line)
{
    flock 9
    base_port=${SLURM_BASE_PORT:-$(free_base)}
    [ -n "$base_port" ] || exit 1  # (free_base said why)
    printf 'SlurmctldPort=%s\n' "$base_port" > "$dir/slurm.conf"
    if ! grep -qF "train-local-slurm $dir" /etc/hosts 2>/dev/null; then
        printf '127.0.0.1 n1 n2  # train-local-slurm %s\n' "$dir" >> /etc/hosts
    fi
} 9>> /tmp/.train-local-slurm-hosts.lock
ctld_port=$base_port
node_first=$((base_port + 1))
node_last=$((base_port + 2))

mkdir -p "$dir/state" "$dir/spool" "$dir/dev" "$dir/munge"
chmod 755 "$dir" "$dir/munge"
for i in 0 1; do
    [ -e "$dir/dev/nvidia$i" ] || mknod -m 666 "$dir/dev/nvidia$i" c 1 3
done

if [ ! -s "$dir/munge/munge.key" ]; then
    head -c 1024 /dev/urandom > "$dir/munge/munge.key"
fi
chmod 600 "$dir/munge/munge.key"
socket="$dir/munge/munge.sock"
munged --force --socket="$socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed"

# What each setting is for (the sites' values differ only in timing, not in behaviour):
# - no DependencyParameters=kill_invalid_depend: none of Gilbreth, Rivanna or Torch
#   documents it, so a job whose dependency can never be met stays pending there
#   (DependencyNeverSatisfied) unless it was submitted with --kill-on-invalid-dep=yes;
#   this cluster behaves the same, so the chain's own handling is what the tests see.
# - KillWait=5 (sites: 30-120 s): the seconds between TERM and KILL at a time limit or
#   scancel, for the batch shell too; SlurmdTimeout=10 (sites: 300 s): how long a silent
#   node may stay up before its jobs end NODE_FAIL; sched_interval/bf_interval=2 and
#   cred_expire=10: scheduling passes and requeues come within seconds. Shorter waits,
#   the same states and signals.
# - accounting storage disabled (sites have slurmdbd): `train status` must then read
#   squeue and the job completion log, and it must work both ways.
cat > "$dir/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
ReturnToService=2
MpiDefault=none
MinJobAge=600
FirstJobId=$first_job
KillWait=5
SlurmdTimeout=10
InactiveLimit=0
GresTypes=gpu
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$node_first-$node_last] CPUs=4 RealMemory=8000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=60 State=UP
CONF
echo "NodeName=n[1-2] Name=gpu File=$dir/dev/nvidia[0-1]" > "$dir/gres.conf"

# (each daemon's command line names the folder: ci/slurm-down.sh finds what is left of
# the cluster by it, and by SLURM_CONF in the environment of the jobs and their steps)
export SLURM_CONF="$dir/slurm.conf"
slurmctld -i -f "$SLURM_CONF"
slurmd -N n1 -f "$SLURM_CONF"
slurmd -N n2 -f "$SLURM_CONF"

# (a bound on a hang, counted in tries: on CI's two busy cores, beside six other clusters
# and image builds, a first controller took over 20 s to answer)
for _ in $(seq 1 600); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qx idle && \
       [ "$(sinfo -h -N -o '%N %T' | grep -c idle)" -eq 2 ]; then
        echo "$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "slurm-up: nodes did not become idle; see $dir/*.log" >&2
sinfo -N >&2 || true
exit 1
