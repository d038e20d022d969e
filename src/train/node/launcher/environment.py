"""What `train launch` checks, sets and sizes before the program starts (train.node.launch
calls them in order): CUDA, torch, the program, its environment defaults and folder, the
scontrol stand-in, the wait for free GPU memory (the field notes' wait-and-run wrapper)
and the DataLoader workers per process.

Inside the step a program's `scontrol requeue` (Lightning's SLURM plugin runs it on the
walltime signal, after saving its checkpoint) must not requeue the job from inside: the
chain goes on by itself. The stand-in asks the batch shell to end the step (TERM to its
tasks: Lightning then exits 0) by writing the file TRAIN_STOP_REQUEST names; the next chunk
resumes from the checkpoint. Anything else goes to the real scontrol."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

from train.batch.contract import (
    DEADLINE_VAR,
    FALLBACK_BATCH_VAR,
    NAVSIM_PREFETCH_OVERRIDE,
    NAVSIM_WORKERS_OVERRIDE,
)
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
    from train.common.entry import bound_root

    if importlib.util.find_spec("torch") is None:
        fix = "use an image with torch" if bound_root() else \
            f"install the training runtime ({install_hint('run')}) or use an image with torch"
        raise ResourceError(f"--launch torchrun runs torch's launcher, and this Python "
                            f"({sys.executable}) cannot import torch: {fix}, or --launch "
                            "tasks (the program starts its ranks itself)")


def find_program(command: Sequence[str], env: Mapping[str, str]) -> None:
    """A program that is not there fails now, by name, not as a traceback per rank."""
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
    shutil.rmtree(folder, ignore_errors=True)


WORKER_VAR = "TRAIN_DATALOADER_WORKERS"
MIB = 1024 * 1024
# what is left for the work itself when the wait ends at the latest
MIN_WORK_SECONDS = 60


def wait_for_gpu_memory(min_free_mb: int, timeout: float, poll: float = 10.0) -> bool:
    """True once every visible GPU has min_free_mb free; False on timeout."""
    try:
        import pynvml
    except ImportError:
        log.info("GPU memory wait skipped: NVIDIA's management library is not installed")
        return True
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("GPU memory wait skipped: no NVIDIA driver here (%s)", exc)
        return True
    deadline = time.monotonic() + timeout
    try:
        while True:
            free = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free
                    for i in range(pynvml.nvmlDeviceGetCount())]
            if all(f >= min_free_mb * MIB for f in free):
                log.info("GPU memory free: %s MiB (need %d)", [f // MIB for f in free],
                         min_free_mb)
                return True
            if time.monotonic() >= deadline:
                return False
            log.info("waiting for %d MiB free on every GPU, have %s MiB", min_free_mb,
                     [f // MIB for f in free])
            # never past the deadline: a --wait-timeout shorter than the poll is kept
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))
    finally:
        pynvml.nvmlShutdown()


def wait_budget(timeout: float, env: Mapping[str, str], now: float) -> float:
    """The wait's timeout, cut so that the wait never eats the chunk's time budget: it
    ends MIN_WORK_SECONDS before the deadline at the latest."""
    from train.node.signals import parse_deadline

    deadline = parse_deadline(env.get(DEADLINE_VAR, ""))
    if deadline is None:
        return timeout
    return max(0.0, min(timeout, deadline - now - MIN_WORK_SECONDS))


def wait_or_fall_back(min_free_mb: int, wait_timeout: float, fallback_batch: int | None,
                      env: MutableMapping[str, str], command: list[str]) -> list[str]:
    """Wait for the memory; on timeout the command with --batch-size fallback_batch (and
    FALLBACK_BATCH_VAR set), or a ResourceError without one."""
    start = time.time()
    timeout = wait_budget(wait_timeout, env, start)
    if timeout < wait_timeout:
        log.info("GPU memory wait: at most %.0f s (the chunk's deadline leaves that, not "
                 "the %g s asked for)", timeout, wait_timeout)
    ok = wait_for_gpu_memory(min_free_mb, timeout)
    used = time.time() - start
    log.info("GPU memory wait took %.0f s of the chunk's time budget", used)
    if ok:
        return command
    if fallback_batch is None:
        raise ResourceError(f"GPUs did not reach {min_free_mb} MiB free within "
                            f"{timeout:.0f} s (the wait's limit)")
    log.warning("GPU memory still short after %.0f s: falling back to batch size %d",
                used, fallback_batch)
    env[FALLBACK_BATCH_VAR] = str(fallback_batch)  # the run may resume with it
    return [*command, "--batch-size", str(fallback_batch)]


def cap_workers(requested: int, cpus: int, procs_per_node: int, host_free: int,
                per_worker: int) -> tuple[int, str]:
    """DataLoader workers per process that the task's CPUs and the host memory allow."""
    by_cpu = max(0, cpus - 1)  # one CPU for the training process itself
    by_mem = host_free // max(1, procs_per_node * per_worker)
    allowed = min(requested, by_cpu, by_mem)
    reason = (f"requested {requested}, {cpus} CPUs allow {by_cpu}, host memory "
              f"{host_free // MIB} MiB / ({procs_per_node} processes x "
              f"{per_worker // MIB} MiB) allows {by_mem}")
    return max(0, allowed), reason


def size_workers(workers: int, worker_mem_mb: int, mode: str, nproc_per_node: int | None,
                 step: SlurmStep, env: MutableMapping[str, str], command: list[str]
                 ) -> list[str]:
    """Cap --workers for this node, export it (WORKER_VAR) and return the command with a
    workers override of its own set to the capped value."""
    from train.common.hostmem import available_bytes

    procs = (nproc_per_node or max(1, step.gpus_on_node)) if mode == "torchrun" \
        else step.ntasks_per_node
    cpus = step.cpus_per_task // procs if mode == "torchrun" else step.cpus_per_task
    allowed, why = cap_workers(workers, cpus, procs, available_bytes(), worker_mem_mb * MIB)
    log.info("DataLoader workers per process: %d (%s)", allowed, why)
    env[WORKER_VAR] = str(allowed)
    # a Hydra override for the workers (NAVSIM's preset) gets the capped value too, and
    # with none left, DataLoader's prefetch_factor must be null (torch refuses it)
    workers_key, prefetch_key = NAVSIM_WORKERS_OVERRIDE + "=", NAVSIM_PREFETCH_OVERRIDE + "="
    if any(a.startswith(workers_key) for a in command):
        command = [f"{workers_key}{allowed}" if a.startswith(workers_key) else a
                   for a in command]
        if allowed == 0 and not any(a.startswith(prefetch_key) for a in command):
            command.append(f"{prefetch_key}null")
    return command
