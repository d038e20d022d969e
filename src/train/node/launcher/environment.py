"""What `train launch` checks and sets before the program starts: CUDA where the step has
GPUs, torch for its launcher, the program itself, the NCCL defaults and the program's own
environment defaults, its working folder."""

from __future__ import annotations

import logging
import os
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
