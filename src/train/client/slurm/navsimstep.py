"""NAVSIM's program in the job step, from the resolved job: its training command, with
Lightning's trainer matching the job (nodes, GPUs, precision, strategy) and the DataLoader's
workers, run through the node side's feature-cache phase (train.workloads.navsim). Apart
from train.client.slurm.navsim because it needs the resolved job (the spec needs that one).
"""

from __future__ import annotations

from collections.abc import Sequence

from train.batch.contract import (
    NAVSIM_CACHE_PATH_OVERRIDE,
    NAVSIM_PREFETCH_OVERRIDE,
    NAVSIM_SPLIT_OVERRIDE,
    NAVSIM_WORKERS_OVERRIDE,
    override_value,
)
from train.client.slurm.navsim import STRATEGY_OVERRIDE
from train.client.slurm.resolve import ResolvedJob
from train.common.entry import module_argv
from train.common.gpus import all_bf16_capable

CACHE_DIR = "navsim-cache"  # in the run folder, unless the job gives cache_path=


def step_argv(navsim_command: Sequence[str]) -> list[str]:
    """The step's program: NAVSIM's command (`PYTHON SCRIPT OVERRIDES...`) run by the node
    side's feature-cache phase, with the same Python."""
    return [*module_argv(navsim_command[0], "train.workloads.navsim"), *navsim_command]


def navsim_command(job: ResolvedJob) -> list[str]:
    """NAVSIM's training command with Lightning's trainer matching the job (Hydra overrides
    of navsim's default_training.yaml at the pinned commit; it has no `devices` key)."""
    spec = job.spec
    gpus = spec.gpus_per_node
    # bf16 only if every GPU type the job can land on has it (the trainer's own rule)
    types = (spec.gpu_type,) if spec.gpu_type else job.node.gpu_types
    precision = "bf16-mixed" if all_bf16_capable(types) else "16-mixed"
    strategy = [] if spec.navsim_strategy == "none" \
        else [f"{STRATEGY_OVERRIDE}={spec.navsim_strategy}"]
    prefetch = [f"{NAVSIM_PREFETCH_OVERRIDE}=null"] if spec.workers == 0 else []
    cache = [] if override_value(spec.workload, NAVSIM_CACHE_PATH_OVERRIDE) is not None \
        else [f"{NAVSIM_CACHE_PATH_OVERRIDE}={job.run_dir}/{CACHE_DIR}"]  # (the job's own)
    return [spec.python, spec.navsim_script,
            f"{NAVSIM_SPLIT_OVERRIDE}={spec.navsim_split}",
            # one Lightning root for every chunk: Lightning's SLURM support saves its
            # checkpoint there on the walltime signal and resumes from it (ckpt_path None).
            # default_training.yaml has the key (${output_dir}, a new directory per run):
            # overridden, not added with '+' (Hydra refuses to add an existing key)
            f"trainer.params.default_root_dir={job.run_dir}/lightning",
            f"trainer.params.num_nodes={spec.nodes}",
            f"+trainer.params.devices={max(1, gpus)}",
            *strategy,
            f"trainer.params.accelerator={'gpu' if gpus else 'cpu'}",
            f"trainer.params.precision={precision if gpus else 32}",
            f"{NAVSIM_WORKERS_OVERRIDE}={spec.workers}",
            *prefetch,
            *cache,
            *spec.workload]
