"""Argv prefixes for the container runtimes: apptainer, docker, or none (host Python).

The renderer puts this prefix before `python -m train ...` in the job step. Host
PYTHONPATH, CONDA_* and friends never reach the training process inside a container:
apptainer runs with --cleanenv and gets exactly the variables listed here (what the
submitting shell's APPTAINER_* and SINGULARITY_* settings would add is dropped by the
batch script), with PYTHONNOUSERSITE=1: the bound home's ~/.local site-packages is not
imported unless the job sets PYTHONNOUSERSITE= (empty); docker gets only what is passed
with -e. Docker's prefix is a per-task wrapper (DOCKER_TASK) that ties
the container's life to the Slurm task's and runs it as the task's user.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from train.batch.contract import (
    DOCKER_JOB_LABEL,
    READY_RANK_SUFFIX,
    SIGNAL_READY_VAR,
    STALE_TMP_VAR,
    TASK_EXITS_VAR,
    TMP_PREFIX,
)
from train.common.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF

# Variables the training process reads; passed by name so their host values carry over.
PASS_THROUGH = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID",
                "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE",
                "SLURM_JOB_NODELIST", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE",
                "CUDA_VISIBLE_DEVICES", "TRAIN_MASTER_ADDR", SIGNAL_READY_VAR)
# Each task's wrapper gives the task a signal-readiness file of its own (the batch shell
# counts them; `train launch` and torchrun's workers make it per rank the same way).
READY_PER_TASK = (f'[ -z "${{{SIGNAL_READY_VAR}:-}}" ] || export {SIGNAL_READY_VAR}='
                  f'"${SIGNAL_READY_VAR}{READY_RANK_SUFFIX}${{SLURM_PROCID:-0}}"')
# The job's own pass-through names and patterns (NAME, PREFIX_*), space-separated: the
# batch shell exports it and each task's wrapper passes what matches into the container.
ENV_NAMES_VAR = "TRAIN_ENV_NAMES"

# `docker run` hands the container to dockerd, outside the step's process tree and cgroup:
# Slurm's TERM and KILL never reach it. Each task therefore runs this wrapper (bash -c,
# arguments: docker run's options, the image and the command). It names the container
# after the task, labels it with the job id (the batch shell removes what a SIGKILLed step
# left, by label) and runs it as the task's user. USR1 and INT are forwarded by name. TERM
# and INT start `docker stop -t KillWait` at once: TERM now, KILL when Slurm kills the
# step, then --rm removes the container; dockerd carries the stop out even when a KILL
# ends this wrapper first. KillWait is read from slurm.conf up front (30 s, Slurm's
# default, where it is not set or not found): no controller RPC in the trap. Traps run
# only between commands, so docker runs in the background, under a waiter without traps
# that writes its exit status to a file: bash's own `wait` loses a child's status when a
# trapped signal interrupts it as the child exits (the same race as in job-lib.sh). The
# waiter and the docker CLI ignore Slurm's signals (the CLI would die of TERM before
# docker 23); the container gets them by name from the traps.
DOCKER_TASK = "\n".join((
    "# shellcheck disable=SC2329  # the functions are called by traps",
    "name=train-${SLURM_JOB_ID:?}-${SLURM_RESTART_COUNT:-0}-${SLURM_STEP_ID:?}"
    "-${SLURM_PROCID:?}",
    "user=$(id -un 2>/dev/null) || user=$(id -u)",
    'ids=(--user "$(id -u):$(id -g)" -e "USER=$user")',
    'for g in $(id -G); do ids+=(--group-add "$g"); done',
    'kill_wait=$(sed -n "s/^[[:space:]]*killwait[[:space:]]*=[[:space:]]*\\([0-9][0-9]*\\).*/'
    '\\1/Ip" "${SLURM_CONF:-/etc/slurm/slurm.conf}" 2>/dev/null | tail -n 1)',
    # the job's pass-through names: those set here go in by name (values never written)
    READY_PER_TASK,
    "set -f",
    "for v in $(compgen -v); do for p in ${" + ENV_NAMES_VAR + ":-}; do",
    '    # shellcheck disable=SC2053  # $p is a pattern on purpose',
    '    if [[ $v == $p ]]; then ids+=(-e "$v"); break; fi',
    "done; done",
    "set +f",
    "stopping=0",
    "on_signal() {",
    "    # USR1 is how the batch shell says stop: the container gets the job's stop signal",
    '    if [ "$1" = USR1 ]; then',
    '        docker kill --signal "${TRAIN_STOP_SIGNAL:-USR1}" "$name" >/dev/null 2>&1',
    "        return 0",
    "    fi",
    '    if [ "$1" != TERM ]; then docker kill --signal "$1" "$name" >/dev/null 2>&1; fi',
    '    if [ "$stopping" = 0 ]; then',
    "        stopping=1",
    '        docker stop -t "${kill_wait:-30}" "$name" >/dev/null 2>&1 &',
    "    fi",
    "}",
    'remove() { docker rm -f "$name" >/dev/null 2>&1; }',
    'trap "on_signal USR1" USR1',
    'trap "on_signal TERM" TERM',
    'trap "on_signal INT" INT',
    'status=$(mktemp "${TMPDIR:-/tmp}/train-task.XXXXXX")',
    'trap \'remove; rm -f "$status"\' EXIT',
    "{",
    "    trap '' USR1 TERM INT",
    "    docker run --name \"$name\" --label "
    + shlex.quote(DOCKER_JOB_LABEL + "=") + '"$SLURM_JOB_ID" "${ids[@]}" "$@"',
    '    echo "$?" > "$status"',
    "} &",
    "pid=$!",
    'while :; do wait "$pid" 2>/dev/null; kill -0 "$pid" 2>/dev/null || break; done',
    'read -r rc < "$status" 2>/dev/null || rc=255',
    'exit "${rc:-255}"',
))


# Every task of the step runs under this wrapper (bash -c, arguments: the task's command,
# the runtime's included), on its node: it removes the temporary folders this chain's
# killed jobs left there, gives the task a temporary folder of its own (TMPDIR: the
# program's and torch's launcher's files, removed when the task ends) and records the
# program's exit code, the time and the node for the batch shell, which reports the first
# failing task's own code rather than the TERM Slurm sent the others. The command runs in
# the foreground: Slurm signals every process of the task, and a trap (here a no-op, reset
# to the default in the command) waits for the command to end. A command killed by a
# signal ends the wrapper by the same signal, as srun would have seen it.
TASK_WRAPPER = "\n".join((
    "set -f",
    f"for p in ${{{STALE_TMP_VAR}:-}}; do",
    "    set +f",
    "    # shellcheck disable=SC2086  # a pattern on purpose",
    f'    rm -rf "${{TMPDIR:-/tmp}}"/{TMP_PREFIX}$p.* 2>/dev/null',
    "done",
    "set +f",
    f'if tmp=$(mktemp -d "${{TMPDIR:-/tmp}}/{TMP_PREFIX}${{SLURM_JOB_ID:-0}}-'
    '${SLURM_RESTART_COUNT:-0}.XXXXXX" 2>/dev/null); then',
    '    export TMPDIR="$tmp"',
    "fi",
    "trap : TERM INT USR1 USR2",
    '"$@"',
    "rc=$?",
    'rm -rf "${tmp:-/nonexistent}"',
    f'if [ -d "${{{TASK_EXITS_VAR}:-/nonexistent}}" ]; then',
    "    printf '%s %s %s\\n' \"$rc\" \"${EPOCHREALTIME:-$(date +%s.%N)}\" "
    '"${SLURMD_NODENAME:-$(hostname)}" \\',
    f'        > "${TASK_EXITS_VAR}/task-${{SLURM_PROCID:-0}}" 2>/dev/null',
    "fi",
    'if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then',
    '    trap - "$((rc - 128))"',
    '    kill "-$((rc - 128))" "$$"',
    "fi",
    'exit "$rc"',
))


# Apptainer binds the user's home: a `pip install --user` there (UVA's how-to advises it
# inside a container) would shadow the image's packages. Off unless the job sets the
# variable itself (`--env PYTHONNOUSERSITE=`: empty turns the user site back on).
APPTAINER_ENV = {"PYTHONNOUSERSITE": "1"}

# Each apptainer task's wrapper (bash -c, arguments: the apptainer command line). Its
# pass-through variables go in as APPTAINERENV_ copies (--cleanenv drops the rest). No
# squashfuse on a node: Apptainer unpacks the SIF into APPTAINER_TMPDIR at every start;
# that is a folder of the task's own under the node's TMPDIR (Slurm's node-local one on
# the sites), removed when apptainer ends (a task killed outright leaves it to the
# site's TMPDIR clean-up). The wrapper stays the task's parent for that: Slurm signals
# every process of the step, apptainer included; the wrapper's traps only wait for it.
# --nv on a node without the NVIDIA driver: Apptainer starts the container without a
# word; the wrapper says it (train doctor's nv_no_driver).
NV_NO_DRIVER = "no NVIDIA driver on this node"
APPTAINER_TASK = "\n".join((
    READY_PER_TASK,
    "set -f",
    "for v in $(compgen -v); do for p in " + " ".join(PASS_THROUGH)
    + " ${" + ENV_NAMES_VAR + ":-}; do",
    '    if [[ $v == $p ]]; then export "APPTAINERENV_$v=${!v}"; break; fi',
    "done; done",
    "set +f",
    # the task's temporary folder (TASK_WRAPPER's), where apptainer binds it: under /tmp
    'case ${TMPDIR:-} in /tmp/?*) export APPTAINERENV_TMPDIR="$TMPDIR" ;; esac',
    'if [ "$2 $3" = "exec --nv" ] && [ ! -e /dev/nvidiactl ]; then',
    '    echo "train: apptainer --nv on $(hostname): ' + NV_NO_DRIVER
    + ' (/dev/nvidiactl is missing): the program sees no GPU" >&2',
    "fi",
    # the image (the first word after exec's options): a FIFO or a device there keeps
    # apptainer waiting on it until the walltime; a missing one apptainer names itself
    "img=; skip=0",
    'for a in "${@:3}"; do',
    '    if [ "$skip" = 1 ]; then skip=0; continue; fi',
    "    case $a in --bind) skip=1 ;; -*) ;; *) img=$a; break ;; esac",
    "done",
    'if [ -e "$img" ] && [ ! -f "$img" ] && [ ! -d "$img" ]; then',
    '    echo "train: apptainer on $(hostname): the image $img is not a file or a folder'
    ' there (a FIFO or a device: apptainer would wait on it)" >&2; exit 2',
    "fi",
    'unpack=$(mktemp -d "${TMPDIR:-/tmp}/train-apptainer-${SLURM_JOB_ID:-0}.XXXXXX") || {',
    '    echo "train: apptainer on $(hostname): cannot make a folder under ${TMPDIR:-/tmp}'
    ' for the unpacked image" >&2; exit 3; }',
    'declare -x APPTAINER_TMPDIR="$unpack"',
    "trap 'rm -rf \"$unpack\"' EXIT",
    "trap : USR1 USR2 TERM INT",
    '"$@"',
))


def job_environment(nccl_env: Mapping[str, str], runtime: str = "none") -> dict[str, str]:
    """Fixed values every training process gets (and apptainer's own: APPTAINER_ENV)."""
    extra = APPTAINER_ENV if runtime == "apptainer" else {}
    return {"PYTHONUNBUFFERED": "1", ALLOC_CONF_VAR: TUNED_ALLOC_CONF, **nccl_env, **extra}


def runtime_prefix(runtime: str, *, image: str | None, gpus: bool, binds: Sequence[str],
                   run_dir: str, env: Mapping[str, str]) -> list[str]:
    if runtime == "none":
        return []
    if image is None:
        raise ValueError(f"runtime {runtime} needs an image")
    if runtime == "apptainer":
        argv = ["apptainer", "exec"]
        if gpus:
            argv.append("--nv")
        argv.append("--cleanenv")
        # `env` reaches the container by name (the task wrapper exports APPTAINERENV_ copies
        # of the batch shell's values): apptainer's own --env parser splits a value on ','
        # and '=' (PYTORCH_CUDA_ALLOC_CONF has commas), and quotes break it
        for spec in dict.fromkeys([*binds, run_dir]):
            argv += ["--bind", spec]
        return [*argv, image]
    if runtime == "docker":
        # --init: the command is not PID 1, which ignores a signal it has no handler for
        # (TERM would not stop programs we did not write). Signals come from DOCKER_TASK,
        # by name, not from the CLI's proxy: Slurm signals the CLI too, which would make
        # two of each. The image has no passwd entry for the task's user (DOCKER_TASK
        # sets it): HOME must be somewhere that user can write.
        argv = ["--rm", "--init", "--sig-proxy=false", "--stop-signal", "TERM",
                "--network", "host", "--ipc", "host", "-e", "HOME=/tmp"]
        if gpus:
            argv += ["--gpus", "all"]
        for name, value in env.items():
            argv += ["-e", f"{name}={value}"]
        for name in PASS_THROUGH:
            argv += ["-e", name]
        for spec in dict.fromkeys([*binds, run_dir]):
            argv += ["-v", spec if ":" in spec else f"{spec}:{spec}"]
        # `env` as entrypoint: the command after the image runs as given (the image's
        # runscript would otherwise prepend `python -m train`)
        return ["bash", "-c", DOCKER_TASK, "train-task", *argv, "-w", run_dir,
                "--entrypoint", "env", image]
    raise ValueError(f"unknown runtime {runtime!r}")
