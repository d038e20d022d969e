"""NAVSIM as a job runs it: the presets, the Hydra overrides the job sets, their checks and
the training command, beside the workload rather than in the scheduler.

The job spec (train.client.slurm.jobspec) holds the NAVSIM options (`--navsim-split`, ...); what
they mean to NAVSIM lives here, and the job's code calls it. The node's side of NAVSIM (the
feature cache each chunk starts with) is train.workloads.navsim. Torch-free and light: the
login node imports it. The override names that `train launch` reads as well (in the
container) are the node side's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from train.common.errors import ConfigError
from train.common.gpus import all_bf16_capable
from train.workloads import navsim
from train.workloads.navsim import NAVSIM_PREFETCH_OVERRIDE, NAVSIM_WORKERS_OVERRIDE

if TYPE_CHECKING:
    from train.client.slurm.resolve import ResolvedJob

NAVSIM_SCRIPT = "/opt/navsim/navsim/planning/script/run_training.py"  # navsim.def's checkout
# NAVSIM's usual training split (its scripts/training/*.sh at the pinned commit); the
# Hydra group `train_test_split` has no default there (`???`), so the job always passes one
NAVSIM_SPLIT = "navtrain"
# ddp: the job sets Lightning's strategy; none: the script's own config decides (forks such
# as a run_training_dense.py that hard-code one would clash with an override)
NAVSIM_STRATEGIES = ("ddp", "none")
NAVSIM_DATA_ROOT = "/data/navsim"  # navsim.def: dataset/, dataset/maps and exp/ under it
STRATEGY_OVERRIDE = "trainer.params.strategy"
# a Hydra config name: what train_test_split=NAME can select
_HYDRA_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_split(split: str) -> None:
    """--navsim-split: a name Hydra can select from NAVSIM's train_test_split group."""
    if not _HYDRA_NAME_RE.match(split):
        raise ConfigError("navsim_split", f"{split!r} is not a split name (letters, digits, "
                          "'_', '.', '-'): one of NAVSIM's common/train_test_split/ configs, "
                          "e.g. navtrain")


def check_script(script: str) -> None:
    """--navsim-script: an absolute path on one line (as the image sees it)."""
    if not script.startswith("/") or any(c in script for c in "\n\r\0"):
        raise ConfigError("navsim_script", f"{script!r} must be an absolute path on one "
                          "line (the script as the image sees it, e.g. "
                          f"{NAVSIM_SCRIPT})")


def check_overrides(workload: Sequence[str], strategy: str) -> None:
    """The job's own Hydra overrides may not set what the job sets itself: the cache
    switches, the split and (unless --navsim-strategy none) the strategy."""
    navsim.check_workload(workload)
    for arg in workload:
        key = navsim.override_key(arg)
        if key == navsim.SPLIT:
            raise ConfigError("workload", f"{arg!r}: the job passes the split itself; "
                              "give it with --navsim-split")
        if key == STRATEGY_OVERRIDE and strategy != "none":
            raise ConfigError("workload", f"{arg!r}: the job sets the strategy; give "
                              "--navsim-strategy none to leave it to your overrides or "
                              "the script")


def node_data_env(data: str) -> dict[str, str]:
    """Runtime none (NAVSIM on the node itself): the data roots NAVSIM reads, set from
    --data, where a container would see them under NAVSIM_DATA_ROOT."""
    root = os.path.abspath(data)
    return {"OPENSCENE_DATA_ROOT": f"{root}/dataset",
            "NUPLAN_MAPS_ROOT": f"{root}/dataset/maps",
            "NAVSIM_EXP_ROOT": f"{root}/exp"}


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
    return [spec.python, spec.navsim_script,
            f"{navsim.SPLIT}={spec.navsim_split}",
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
            *navsim.cache_overrides(job.run_dir, spec.workload),
            *spec.workload]
