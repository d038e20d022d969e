"""What `train launch` sizes before the program starts: the wait for free GPU memory (the
field notes' wait-and-run wrapper), bounded by the chunk's deadline, and on timeout a smaller
--batch-size where the job gives one; and the DataLoader workers per process, what was asked
capped by the task's CPUs and the host memory, exported to the program (and into a Hydra
override of the workers, NAVSIM's)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableMapping

from train.batch.contract import (
    DEADLINE_VAR,
    FALLBACK_BATCH_VAR,
    NAVSIM_PREFETCH_OVERRIDE,
    NAVSIM_WORKERS_OVERRIDE,
)
from train.common.errors import ResourceError
from train.node.launcher.step import SlurmStep

log = logging.getLogger("train.node.launch")

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
