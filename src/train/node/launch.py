"""`train launch` on every node of a SLURM job step: the flow (`prepare`, then `launch`);
its parts live in train.node.launcher, one module per concern.

Modes: torchrun (torch's elastic launcher in this process, a worker per GPU), tasks (this
task is one rank; the command replaces this process) and single (rank 0 of 1 on loopback,
as `torchrun --nproc-per-node 1` gives it, so a script written for torch's launcher runs
unchanged). `accelerate launch` takes torch's launcher's place and starts the node's
processes itself (train.common.launchers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from train.common.errors import UsageError
from train.common.gpuwatch_file import settings_from_env
from train.common.hostmem import DEFAULT_WORKER_MEM_MB
from train.common.launchers import accelerate_prefix, with_job_options
from train.common.secrets.commands import masked_argv
from train.node import gpuwatch
from train.node.launcher.environment import (
    NCCL_DEFAULTS,
    check_cuda,
    enter_folder,
    find_program,
    install_scontrol_shim,
    log_interconnect,
    need_torch,
    program_environment,
    remove_shim,
    size_workers,
    wait_or_fall_back,
)
from train.node.launcher.step import (
    LOOPBACK,
    MASTER_ADDR_VAR,
    SlurmStep,
    free_port,
    read_step,
    ready_per_rank,
    resolve_address,
    run_torchrun,
    tasks_env,
    torchrun_argv,
)

__all__ = ["LaunchOptions", "launch", "prepare"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchOptions:
    mode: str
    command: list[str]
    nproc_per_node: int | None = None
    min_free_mb: int | None = None
    wait_timeout: float = 3600.0
    fallback_batch: int | None = None
    workers: int | None = None
    worker_mem_mb: int = DEFAULT_WORKER_MEM_MB
    chdir: str | None = None


def prepare(opts: LaunchOptions, env: MutableMapping[str, str]) -> tuple[SlurmStep, str,
                                                                           list[str]]:
    """Everything before starting: checks, waits, caps. Returns (step, master, command)."""
    log.info("launch started at unix time %.3f", time.time())
    if not opts.command:
        raise UsageError("launch: give the command after --, e.g. -- python -m train run demo")
    if opts.mode == "torchrun":
        need_torch()
    step = read_step(env)
    check_cuda(step, env)  # before the memory wait: a broken CUDA never frees up
    # (one process alone meets itself on loopback: its node's name need not resolve)
    master = LOOPBACK if opts.mode == "single" else \
        env.get(MASTER_ADDR_VAR) or resolve_address(step.master)
    command = list(opts.command)
    for key, value in NCCL_DEFAULTS.items():
        env.setdefault(key, value)
    log_interconnect(env)
    if opts.min_free_mb is not None:
        if step.gpus_on_node == 0:
            log.info("GPU memory wait skipped: no GPU on this node")
        else:
            command = wait_or_fall_back(opts.min_free_mb, opts.wait_timeout,
                                        opts.fallback_batch, env, command)
    if opts.workers is not None:
        command = size_workers(opts.workers, opts.worker_mem_mb, opts.mode,
                               opts.nproc_per_node, step, env, command)
    return step, master, command


def start_gpu_watch(step: SlurmStep, mode: str, env: Mapping[str, str]) -> Any:
    """`train launch`: the node's sampler, started by node-local rank 0 only (torch's
    launcher agent, or the task with local id 0; in tasks mode its parent is the program
    this process execs into, the same pid) when the job's settings ask for one and the node
    has GPUs. Never fails the launch: any problem is a warning. The process, or None."""
    if step.gpus_on_node == 0 or (mode != "torchrun" and step.localid != 0):
        return None
    try:
        settings = settings_from_env(env)
    except ValueError as exc:
        log.warning("GPU watch not started: %s", exc)
        return None
    run_dir = env.get("TRAIN_RUN_DIR")
    if settings is None or not run_dir:
        return None
    node = step.nodes[step.node_id]
    try:
        return gpuwatch.spawn(run_dir, node, settings, os.getpid(), env=dict(env))
    except Exception as exc:  # whatever starting it raises: training goes on without it
        log.warning("GPU watch not started on %s: %s", node, exc)
        return None


def launch(opts: LaunchOptions, env: MutableMapping[str, str] | None = None) -> int:
    """torchrun mode returns when the node's workers are done; tasks mode execs."""
    environ = os.environ if env is None else env
    step, master, command = prepare(opts, environ)
    enter_folder(opts.chdir)
    accelerate = accelerate_prefix(command) > 0 and opts.mode != "tasks"
    mode = "tasks" if opts.mode == "torchrun" and accelerate else opts.mode
    # (torchrun runs `python -m MODULE` with its own interpreter: no program to find)
    if mode != "torchrun" or "--no-python" in torchrun_argv(step, master, 1, command):
        find_program(command, environ)
    program_environment(step, opts.mode, environ)
    command = ready_per_rank(mode, step.procid, command, environ)
    # the stand-in turns `scontrol requeue` into "end this chunk": only under the job's
    # batch shell, which watches for that request
    shim = install_scontrol_shim(environ) if environ.get("TRAIN_STOP_REQUEST") else None
    watcher = start_gpu_watch(step, opts.mode, environ)
    nproc = opts.nproc_per_node or max(1, step.gpus_on_node)
    if mode == "torchrun":
        def cleanup() -> None:
            if watcher is not None:
                with contextlib.suppress(Exception):
                    watcher.terminate()
                    watcher.wait(timeout=10)
            remove_shim(shim)

        return run_torchrun(step, master, nproc, command, environ, cleanup)
    port = free_port(master) if opts.mode == "single" else step.port
    environ.update(tasks_env(step, master, port))
    if accelerate:
        per_node = 1 if opts.mode == "single" else nproc
        command = with_job_options(command, len(step.nodes), step.node_id, master, port,
                                   len(step.nodes) * per_node)
        if "OMP_NUM_THREADS" not in environ and environ.get("SLURM_CPUS_PER_TASK"):
            # (else accelerate gives each process the whole node's cores over its count)
            environ["OMP_NUM_THREADS"] = str(max(1, step.cpus_per_task // per_node))
        log.info("node %d/%d: accelerate launch starts its %d process(es): %s",
                 step.node_id, len(step.nodes), per_node, " ".join(masked_argv(command)))
    elif opts.mode == "single":
        log.info("single process (rank 0 of 1, master %s:%s): %s", master, port,
                 " ".join(masked_argv(command)))
    else:
        log.info("rank %d/%d (node %d, local %d), master %s:%d: %s", step.procid,
                 step.ntasks, step.node_id, step.localid, master, step.port,
                 " ".join(masked_argv(command)))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, dict(environ))  # noqa: S606 (argv list, no shell)
