"""The chain engine's interpreter: the batch host runs the engine (train.batch) with the
`python3` the job's PATH finds there (sbatch hands the submitting shell's PATH on, the
site set-up runs first). The login node sees the same PATH: a python3 missing here, or
older than the engine needs, is refused at submit with the fix, not found after the
queue wait."""

from __future__ import annotations

from collections.abc import Mapping

from train.batch.engine import MIN_PYTHON
from train.client.preflight.result import which
from train.client.slurm.checks.problem import Problem
from train.client.slurm.render import ENGINE_PYTHON
from train.client.slurm.resolve import ResolvedJob
from train.common import _proc

_VERSION = "import sys; print('%d %d' % sys.version_info[:2])"
FIX = ("the chain engine runs with the python3 of the job's PATH on the batch host (any "
       "Python 3.{minor} or newer, standard library only): put one on PATH before you "
       "submit (e.g. `module load python`), or add the line that loads it to the cluster "
       "profile's modules")


def engine_problems(job: ResolvedJob, environ: Mapping[str, str]
                    ) -> tuple[list[Problem], list[str]]:
    """(problems, notes): python3 on this PATH, and its version."""
    fix = FIX.format(minor=MIN_PYTHON[1])
    found = which(ENGINE_PYTHON, environ)
    if found is None:
        if job.profile.modules:  # the site set-up may bring it on the nodes
            return [], [f"no {ENGINE_PYTHON} on this PATH: the job counts on the cluster "
                        f"profile's set-up to bring one ({fix})"]
        return [Problem("python", f"no {ENGINE_PYTHON} on this PATH: {fix}")], []
    try:
        out = _proc.run([found, "-E", "-s", "-c", _VERSION], timeout=60,
                        env=dict(environ)).stdout.split()
        version = (int(out[0]), int(out[1]))
    except (_proc.ProcError, ValueError, IndexError) as exc:
        return [Problem("python", f"{found} does not run here ({exc}): {fix}")], []
    if version < MIN_PYTHON:
        return [Problem("python", f"{found} is Python {version[0]}.{version[1]}: {fix}")], []
    return [], []
