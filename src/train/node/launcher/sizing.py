"""DataLoader workers per process: what was asked, capped by the task's CPUs and the host
memory, exported to the program (and into a Hydra override of the workers, NAVSIM's)."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping

from train.batch.contract import NAVSIM_PREFETCH_OVERRIDE, NAVSIM_WORKERS_OVERRIDE
from train.node.launcher.step import SlurmStep

log = logging.getLogger("train.node.launch")

WORKER_VAR = "TRAIN_DATALOADER_WORKERS"
MIB = 1024 * 1024


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
