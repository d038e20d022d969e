"""What the login node can check before a job is queued, so that nothing it could have
found is left for the compute node after the queue wait.

`train submit` refuses (exit 2, naming the flag and the fix) a job whose
- image is not there, or is not a SIF (apptainer), or is not in the Docker engine that
  answers here (docker; an engine that does not answer is said, not refused);
- program is not there: a `--entry command` program or `python SCRIPT` given as a path
  (absolute, or relative to the folder the program runs in), a NAVSIM script, and with
  `--runtime none` a program name that is not on this PATH (the nodes get this PATH);
  paths inside the image are not checked;
- `--python` (runtime none) cannot import torch where the job needs it, or this package
  (every job step runs `train run` or `train launch` with it); asked with
  importlib.util.find_spec: nothing is imported;
- run folder holds an earlier run of the same name with other settings (the rule
  `train run` applies on the node: train.workloads.runrecord), or of another --entry;
- profile's binds (in a container: the site's shared file systems) are not folders here;
- NAVSIM's data (in a container) is not bound where the image reads it, or the --data
  folder has no dataset/ or dataset/maps;
- command starts a launcher of its own inside the job's step: srun, or torchrun (or
  python -m torch.distributed.run) where the job already starts a process per GPU;
- chain engine has no python3 (3.6 or newer) on the job's PATH (checks.python).

The image, program, Python and NAVSIM data checks look at files and programs:
`--no-check` skips them, for a login node that does not see what the nodes see. `train
render` says the same as warnings (it works anywhere, a laptop included). Also at submit: the
COMPLETE marker an earlier run left in the folder is cleared (the scheduler does it, once
chunk 1 is queued), and SBATCH_* variables of the environment are not passed to sbatch
(`sbatch_environment`): every chunk runs with exactly the job spec's options. Where Slurm
refuses a job with --sbatch-extra options and accepts it without them, the refusal is
said as theirs.

The checks live in train.client.slurm.checks, one module per family; this one runs them in
order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from train.client.slurm.checks.files import (
    navsim_data_problems,
    profile_bind_problems,
    program_problems,
)
from train.client.slurm.checks.imagefit import feature_problems, image_problems
from train.client.slurm.checks.problem import NO_CHECK, Problem, merge_seeds
from train.client.slurm.checks.python import engine_problems, python_problems
from train.client.slurm.checks.resources import resource_problems
from train.client.slurm.checks.rundir import (
    check_not_active,
    foreign_folder_problems,
    identity_problems,
    stale_complete,
)
from train.client.slurm.checks.sbatchenv import sbatch_variable_notes
from train.client.slurm.checks.traps import launcher_problems
from train.client.slurm.resolve import ResolvedJob
from train.common.errors import ConfigError

__all__ = ["check_jobs", "environment_problems"]


def check_jobs(jobs: Sequence[ResolvedJob], *, submitting: bool, no_check: bool = False,
               environ: Mapping[str, str] | None = None) -> list[str]:
    """Every check for these jobs (one, or a sweep's). Submitting: a problem is exit 2
    (ConfigError naming the first one's field, with all of them); rendering: each is a
    warning. Returns the warnings and notes to print."""
    env = os.environ if environ is None else environ
    notes: list[str] = sbatch_variable_notes(env) if submitting else []
    found: list[Problem] = []
    if jobs and not no_check:  # a sweep's chains share the image, program and Python
        problems, seen = environment_problems(jobs[0], env)
        found += problems
        notes += seen
    for job in jobs:
        found += run_folder_problems(job, submitting, notes)
    if submitting and jobs and not no_check:  # the chain engine's python3 on this PATH
        problems, seen = engine_problems(jobs[0], env)
        found += problems
        notes += seen
    if submitting and jobs and not no_check:  # resources: Slurm is asked (slurm.testonly)
        problems, seen = resource_problems(jobs[0], env)
        found += problems
        notes += seen
    if not found:
        return notes
    found = merge_seeds(list(dict.fromkeys(found)))  # (a sweep's tasks share its folder)
    texts = [p.text + (f" ({NO_CHECK})" if p.files else "") for p in found]
    if submitting:
        also = "".join(f"\n  also, {p.field}: {t}" for p, t in zip(found[1:], texts[1:],
                                                                   strict=True))
        raise ConfigError(found[0].field, texts[0] + also)
    return [*notes, *(f"train submit would refuse this: {p.field}: {t}"
                      for p, t in zip(found, texts, strict=True))]


def run_folder_problems(job: ResolvedJob, submitting: bool, notes: list[str]
                        ) -> list[Problem]:
    """One chain's folder and command: a chain still queued or running there (submitting:
    exit 2 at once), an earlier run it cannot continue, a launcher in its command; the
    COMPLETE marker an earlier run left goes into `notes`."""
    if submitting:  # a chain still queued or running there is the first thing to say
        from train.client.slurm.sweep import is_task_job

        check_not_active(Path(job.run_dir), sweep_task=is_task_job(job))
    foreign = foreign_folder_problems(job)
    found = [*foreign, *identity_problems(job), *launcher_problems(job)]
    marker = stale_complete(job)
    if marker is not None and not foreign:
        notes.append(f"{marker} was left by an earlier run: "
                     + ("cleared, so that it does not end this chain after its first "
                        "chunk" if submitting else "train submit clears it"))
    return found


def environment_problems(job: ResolvedJob, environ: Mapping[str, str] | None = None
                         ) -> tuple[list[Problem], list[str]]:
    """The image, the program and the Python of a job: (problems, notes on what could not
    be checked)."""
    env = os.environ if environ is None else environ
    problems, notes = image_problems(job, env)
    image_refused = bool(problems)
    for found, seen in (program_problems(job, env), python_problems(job, env),
                        navsim_data_problems(job), profile_bind_problems(job)):
        problems += found
        notes += seen
    if not image_refused:  # (an image refused above is not asked what it holds)
        found, seen = feature_problems(job, env)
        problems += found
        notes += seen
    return problems, notes
