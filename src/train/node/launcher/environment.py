"""What `train launch` checks and sets before the program starts: CUDA where the step has
GPUs, torch for its launcher, the program itself, the NCCL defaults and the program's own
environment defaults, its working folder, and the scontrol stand-in.

Inside the step a program's `scontrol requeue` (Lightning's SLURM plugin runs it on the
walltime signal, after saving its checkpoint) must not requeue the job from inside: the
chain goes on by itself. The stand-in asks the batch shell to end the step (TERM to its
tasks: Lightning then exits 0) by writing the file TRAIN_STOP_REQUEST names; the next chunk
resumes from the checkpoint. Anything else goes to the real scontrol."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

from train.common import cuda_check
from train.common.errors import ResourceError, UsageError, install_hint
from train.common.secrets.environment import recorded_environment
from train.node.launcher.step import SlurmStep

log = logging.getLogger("train.node.launch")

# A hung collective fails the job with a message instead of burning the walltime.
NCCL_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"}


def check_cuda(step: SlurmStep, env: Mapping[str, str]) -> None:
    """A step with GPUs starts no worker unless CUDA works here: the cause (driver too old
    for the image's torch, no `--nv`, ...) as a ResourceError, not workers on the CPU."""
    if step.gpus_on_node == 0:
        return
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # a program of the image's own (tasks)
        log.info("CUDA check skipped: this image's Python has no torch")
        return
    problem = cuda_check.check(cuda_check.gather_facts(env))
    if problem is not None:
        raise ResourceError(f"this step has {step.gpus_on_node} GPU(s) on node "
                            f"{step.nodes[step.node_id]}, but {problem}")
    log.info("CUDA check passed: %d GPU(s) usable", step.gpus_on_node)


def log_interconnect(env: Mapping[str, str]) -> None:
    ib = Path("/sys/class/infiniband")
    devices = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    if devices:
        log.info("InfiniBand visible: %s", ", ".join(devices))
    else:
        log.info("InfiniBand not visible: NCCL will use TCP sockets across nodes")
    nccl = recorded_environment(env, ("NCCL_", "TORCH_NCCL_"))  # NCCL_IB_PASSWD: redacted
    log.info("NCCL settings: %s", nccl or "defaults")


def need_torch() -> None:
    """--mode torchrun runs torch's launcher in this process: an image without torch is
    said in one line (exit 3), not as a traceback on every node."""
    import importlib.util

    from train.common.entry import bound_root

    if importlib.util.find_spec("torch") is None:
        fix = "use an image with torch" if bound_root() else \
            f"install the training runtime ({install_hint('run')}) or use an image with torch"
        raise ResourceError(f"--launch torchrun runs torch's launcher, and this Python "
                            f"({sys.executable}) cannot import torch: {fix}, or --launch "
                            "tasks (the program starts its ranks itself)")


def find_program(command: Sequence[str], env: Mapping[str, str]) -> None:
    """A program that is not there fails now, by name, not as a traceback per rank."""
    import shutil

    program = command[0]
    if "/" in program:
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            raise UsageError(f"launch: {program} is not an executable file here (inside "
                             "the container, if the job runs in one)")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise UsageError(f"launch: program {program!r} is not on PATH here (inside the "
                         "container, if the job runs in one); PATH is "
                         f"{env.get('PATH', os.defpath)}")


LIGHTNING_ROOT_VAR = "PL_TRAINER_DEFAULT_ROOT_DIR"


def program_environment(step: SlurmStep, mode: str, env: MutableMapping[str, str]) -> None:
    """Defaults for the program that the user's own setting (--env, or the host's value
    with runtime none) always beats: Lightning's default_root_dir is the run folder (its
    hpc checkpoints are saved and restored there, never in the submit folder another run
    shares; a Trainer(default_root_dir=...) of the script still wins), and in tasks mode
    the OpenMP threads of each rank are its task's CPUs (torchrun sets 1 for its workers)."""
    run_dir = env.get("TRAIN_RUN_DIR")
    if run_dir and LIGHTNING_ROOT_VAR not in env:
        env[LIGHTNING_ROOT_VAR] = run_dir
    if mode == "tasks" and "OMP_NUM_THREADS" not in env and env.get("SLURM_CPUS_PER_TASK"):
        env["OMP_NUM_THREADS"] = str(step.cpus_per_task)
        log.info("OMP_NUM_THREADS=%d (the task's CPUs)", step.cpus_per_task)


def enter_folder(folder: str | None) -> None:
    """--chdir: the program runs in this folder (relative paths it reads are from there)."""
    if folder is None:
        return
    try:
        os.chdir(folder)
    except OSError as exc:
        raise UsageError(f"launch: --chdir {folder}: {exc.strerror or exc} here (inside the "
                         "container, if the job runs in one)") from None
    log.info("working folder: %s", folder)


SCONTROL_SHIM = """#!/bin/sh
[ "${1:-}" != --train-shim-probe ] || exit 0
if [ -n "${TRAIN_SHIM_ACTIVE:-}" ]; then  # found itself again: no real scontrol here
    echo "train: no scontrol on PATH besides train's stand-in" >&2
    exit 127
fi
if [ "${1:-}" = requeue ]; then
    # (a temporary name of this process's own: every task of the step may ask at once)
    tmp="${TRAIN_STOP_REQUEST:-}.tmp.${SLURM_PROCID:-0}.$$"
    if [ -z "${TRAIN_STOP_REQUEST:-}" ] || ! { echo "requeue ${2:-}" > "$tmp" && \
            mv "$tmp" "$TRAIN_STOP_REQUEST"; }; then
        echo "train: scontrol requeue is not run inside a job step, and the request to end" \
            "this chunk could not be written (${TRAIN_STOP_REQUEST:-no TRAIN_STOP_REQUEST})" >&2
        exit 1
    fi
    echo "train: the program asked to requeue job ${2:-}: this chunk ends now (its" \
        "checkpoint is written) and the chain's next chunk continues" >&2
    exit 0
fi
self_dir=$(cd "$(dirname "$0")" && pwd -P)
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | while IFS= read -r d; do
    [ "$(cd "$d" 2>/dev/null && pwd -P)" = "$self_dir" ] || printf '%s\n' "$d"
done | paste -sd: -)
TRAIN_SHIM_ACTIVE=1
export PATH TRAIN_SHIM_ACTIVE
exec scontrol "$@"
"""


SHIM_FOLDER = ".scontrol-shim"


def install_scontrol_shim(env: MutableMapping[str, str]) -> Path | None:
    """Put the stand-in first on PATH for the program (and its children). It lives in the
    run folder (one per run, rewritten in place by each launch: nothing is left in /tmp,
    whose noexec mounts at some sites would also make the stand-in be skipped for the real
    scontrol); a run folder where it cannot execute falls back to a fresh folder under
    $TMPDIR, returned so that a launch that does not exec can remove it. Returns the
    folder, or None where the program keeps the real scontrol."""
    import subprocess
    import tempfile

    run_dir = env.get("TRAIN_RUN_DIR")
    for place in ([Path(run_dir) / SHIM_FOLDER] if run_dir else []) + [None]:
        folder = place
        try:
            folder = place or Path(tempfile.mkdtemp(prefix=".train-shim-",
                                                    dir=os.environ.get("TMPDIR")))
            folder.mkdir(exist_ok=True)
            _write_shim(folder / "scontrol")
            subprocess.run([str(folder / "scontrol"), "--train-shim-probe"], check=True,
                           timeout=30, capture_output=True)
        except (OSError, subprocess.SubprocessError):
            remove_shim(folder)  # (never the run folder's)
            continue
        path = env.get("PATH") or os.defpath
        env["PATH"] = f"{folder}{os.pathsep}{path}"
        return folder
    log.warning("no place to run the scontrol stand-in: a program that runs `scontrol "
                "requeue` (Lightning's SLURM support) would requeue the job from inside")
    return None


def _write_shim(shim: Path) -> None:
    """Write the stand-in unless it is there already: a new file renamed over the old one
    (tasks on other nodes may be running it), with an old modification time, so that it
    never looks like something the program saved during the chunk."""
    with contextlib.suppress(OSError):
        if shim.read_text(encoding="utf-8") == SCONTROL_SHIM and os.access(shim, os.X_OK):
            return
    tmp = shim.with_name(f".scontrol.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(SCONTROL_SHIM, encoding="utf-8")
        tmp.chmod(0o755)
        os.utime(tmp, (0, 0))
        os.replace(tmp, shim)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def remove_shim(folder: Path | None) -> None:
    """A stand-in folder of this launch's own under $TMPDIR (never the run folder's)."""
    if folder is None or folder.name == SHIM_FOLDER:
        return
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
