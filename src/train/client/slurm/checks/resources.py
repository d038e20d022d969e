"""The job's resources, as Slurm answers `sbatch --test-only` (train.client.slurm.testonly):
a refusal names the job's flag, or --sbatch-extra where the job without those options is
accepted."""

from __future__ import annotations

import re
from collections.abc import Mapping

from train.client.slurm.checks.problem import Problem
from train.client.slurm.checks.sbatchenv import sbatch_environment
from train.client.slurm.resolve import ResolvedJob


def resource_problems(job: ResolvedJob, environ: Mapping[str, str]
                      ) -> tuple[list[Problem], list[str]]:
    """Slurm asked whether it would take the job (its partition, nodes, GPUs, time):
    (a refusal of the job's, a note where sbatch itself failed)."""
    from train.client.slurm.testonly import ask

    refused = ask(job, sbatch_environment(environ))
    if refused is not None and job.spec.sbatch_extra:
        refused = _extras_at_fault(job, refused, sbatch_environment(environ))
    if refused is not None and refused[0]:
        return [Problem(refused[0], refused[1], files=False)], []
    if refused is not None:  # not a refusal of the job's: sbatch itself will say
        return [], [refused[1]]
    return [], []

def _extras_at_fault(job: ResolvedJob, refused: tuple[str, str] | None,
                     environ: dict[str, str]) -> tuple[str, str] | None:
    """Where Slurm refuses a job with --sbatch-extra options, the job without them is
    asked too: accepted, the refusal is theirs (it names no flag of the job's, or one that
    was not the cause: an --exclude that leaves too few nodes reads as the GPU request)."""
    import dataclasses

    from train.client.slurm.testonly import ask

    if refused is None:
        return None
    spec = job.spec
    plain = dataclasses.replace(job, spec=dataclasses.replace(spec, sbatch_extra=()))
    if ask(plain, environ) is not None:
        return refused  # refused without them too: the first answer stands
    words = re.sub(r"^`sbatch --test-only` failed, naming nothing of the job: ", "",
                   refused[1])
    words = re.sub(r"^Slurm refuses this job \(`sbatch --test-only`: (.*?)\); it asked for "
                   r".*$", r"\1", words, flags=re.S)
    extras = " ".join(f"--sbatch-extra={item}" for item in spec.sbatch_extra)
    return "sbatch_extra", (f"Slurm refuses this job with {extras} and accepts it without "
                            f"(`sbatch --test-only`: {words}); nothing was queued: correct or "
                            "drop that option (--no-check submits without asking)")
