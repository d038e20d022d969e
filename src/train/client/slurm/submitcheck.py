"""What the login node can check before a job is queued, so that nothing it could have
found is left for the compute node after the queue wait: the checks of
train.client.slurm.checks (one module per family, each saying what it refuses), run here
in order. `train submit` refuses (exit 2, naming the flag and the fix) what they find;
`train render` says the same as warnings (it works anywhere, a laptop included).
`--no-check` skips those that look at files and programs (the image, the program, the
Pythons, NAVSIM's data, Slurm's `--test-only`), for a login node that does not see what
the nodes see.
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
from train.client.slurm.sweep import is_task_job
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
    for job in jobs:  # its folder and command
        if submitting:  # a chain still queued or running there is the first thing to say
            check_not_active(Path(job.run_dir), sweep_task=is_task_job(job))
        foreign = foreign_folder_problems(job)
        found += [*foreign, *identity_problems(job), *launcher_problems(job)]
        marker = stale_complete(job)
        if marker is not None and not foreign:
            notes.append(f"{marker} was left by an earlier run: "
                         + ("cleared, so that it does not end this chain after its first "
                            "chunk" if submitting else "train submit clears it"))
    # the chain engine's python3 on this PATH, then the resources (Slurm asked: testonly)
    late = (engine_problems, resource_problems) if submitting and jobs and not no_check else ()
    for check in late:
        problems, seen = check(jobs[0], env)
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


def environment_problems(job: ResolvedJob, environ: Mapping[str, str] | None = None
                         ) -> tuple[list[Problem], list[str]]:
    """The image, the program and the Python of a job: (problems, notes on what could not
    be checked)."""
    env = os.environ if environ is None else environ
    problems, notes = image_problems(job, env)
    answers = [program_problems(job, env), python_problems(job, env),
               navsim_data_problems(job), profile_bind_problems(job)]
    if not problems:  # (an image refused above is not asked what it holds)
        answers.append(feature_problems(job, env))
    for found, seen in answers:
        problems += found
        notes += seen
    return problems, notes
