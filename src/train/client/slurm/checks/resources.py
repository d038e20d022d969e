"""The job's resources, as Slurm answers `sbatch --test-only` (train.client.slurm.testonly):
a refusal names the job's flag, or --sbatch-extra where the job without those options is
accepted."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping

from train.client.slurm import reservations
from train.client.slurm.checks.problem import Problem
from train.client.slurm.checks.sbatchenv import sbatch_environment
from train.client.slurm.resolve import ResolvedJob
from train.client.slurm.testonly import ask


def resource_problems(job: ResolvedJob, environ: Mapping[str, str]
                      ) -> tuple[list[Problem], list[str]]:
    """Slurm asked whether it would take the job (its partition, nodes, GPUs, time):
    (a refusal of the job's, a note where sbatch itself failed)."""
    env = sbatch_environment(environ)
    refused = ask(job, env)
    if refused is None:
        return [], []
    if job.spec.sbatch_extra:
        refused = _extras_at_fault(job, refused, env)
    if not refused[0]:  # not a refusal of the job's: sbatch itself will say
        return [], [refused[1]]
    after = _maintenance_at_fault(job, env)
    if after is not None:
        return [], [after]
    return [Problem(refused[0], refused[1], files=False)], []


def _maintenance_at_fault(job: ResolvedJob, environ: dict[str, str]) -> str | None:
    """Slurm's test refuses a job that needs a node a maintenance holds during its first
    chunk's time (22.05 to 26.05: "Requested node configuration is not available"), where
    sbatch queues it to wait. Asked again to begin after the maintenance: accepted, the
    refusal is the maintenance's (a note; the job is queued)."""
    now = time.time()
    found = reservations.touching(job, environ, now, now + job.minutes * 60)
    if not found:
        return None
    end = max(r.end for r in found)
    if ask(job, environ, time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))):
        return None
    return (f"Slurm cannot place this job before the site's maintenance ends ("
            f"{'; '.join(r.words(now) for r in found)}): `sbatch --test-only` refuses it "
            f"now and accepts it to begin at {reservations.at(end)}; it is queued, and "
            "waits until then")


def _extras_at_fault(job: ResolvedJob, refused: tuple[str, str],
                     environ: dict[str, str]) -> tuple[str, str]:
    """Where Slurm refuses a job with --sbatch-extra options, the job without them is
    asked too: accepted, the refusal is theirs (it names no flag of the job's, or one that
    was not the cause: an --exclude that leaves too few nodes reads as the GPU request)."""
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
