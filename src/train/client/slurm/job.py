"""A SLURM job, by the names its callers import: the spec (train.client.slurm.jobspec, its list
items in train.client.slurm.jobitems) and its resolution against a cluster profile
(train.client.slurm.resolve).

Only names live here: to replace one in a test, patch the module that reads it.
"""

from __future__ import annotations

from train.client.slurm.jobitems import (
    SBATCH_OWNED,
    SRUN_OWNED,
    Bind,
    check_env_item,
    check_extra_option,
    parse_bind,
)
from train.client.slurm.jobspec import (
    CPUS_PER_PROCESS,
    DEFAULT_PYTHON,
    ENTRIES,
    LAUNCH_MODES,
    RUNTIMES,
    JobSpec,
    job_from_sources,
)
from train.client.slurm.resolve import ResolvedJob, resolve

__all__ = ["CPUS_PER_PROCESS", "DEFAULT_PYTHON", "ENTRIES", "LAUNCH_MODES", "RUNTIMES",
           "SBATCH_OWNED", "SRUN_OWNED", "Bind", "JobSpec", "ResolvedJob", "check_env_item",
           "check_extra_option", "job_from_sources", "parse_bind", "resolve"]
