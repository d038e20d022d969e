"""The Pythons a job runs with, asked here without importing anything: --python with
--runtime none, and the chain engine's python3. sbatch hands the submitting shell's PATH on,
so the batch host finds the python3 this login node finds: one missing or too old here is
refused at submit, not found after the queue wait."""

from __future__ import annotations

import os
from collections.abc import Mapping

from train.batch.engine import MIN_PYTHON
from train.client.preflight.result import which
from train.client.slurm.checks.problem import Problem
from train.client.slurm.render import ENGINE_PYTHON
from train.client.slurm.resolve import ResolvedJob, torch_need
from train.common import _proc

PYTHON_TIMEOUT = 60.0  # a Python on a slow shared file system starting cold
# asks for modules without importing them (torch takes seconds to import); the working
# folder is left out of the path, as the job's steps leave it out (train.common.entry): a train.py
# there is not this package
_FIND_SPECS = ("import importlib.util, os, sys\n"
               "here = os.path.realpath(os.getcwd())\n"
               "sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]\n"
               "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
_VERSION = "import sys; print('%d %d' % sys.version_info[:2])"
ENGINE_FIX = ("the chain engine runs with the python3 of the job's PATH on the batch host (any "
              "Python 3.{minor} or newer, standard library only): put one on PATH before you "
              "submit (e.g. `module load python`), or add the line that loads it to the "
              "cluster profile's modules")


def python_problems(job: ResolvedJob, environ: Mapping[str, str]
                    ) -> tuple[list[Problem], list[str]]:
    """Runtime none: the job runs --python on the nodes as it is here. What the job needs
    of it is asked without importing anything."""
    spec = job.spec
    if spec.runtime != "none":
        return [], []
    needs = torch_need(spec, job.launch)
    # every step runs this package with --python: `train run`, or `train launch` before
    # the program (render.step_argv)
    modules = [*(["torch"] if needs else []), "train"]
    ways_out = ("Give a container, --runtime apptainer --image X.sif (`train image build "
                "base` makes one), or a Python environment with torch on the shared file "
                "system, --python /path/to/env/bin/python")
    python: str | None
    what = "is not found here"
    if "/" in spec.python:
        python = os.path.abspath(spec.python)
        if os.path.isdir(python):
            what, python = "is a folder, not a Python (give the environment's bin/python)", None
        elif os.path.isfile(python) and not os.access(python, os.X_OK):
            what, python = f"({python}) is there but not executable", None
        elif not os.path.isfile(python):
            python = None
    else:
        python = which(spec.python, environ)
    if python is None:
        return [Problem("python", f"--python {spec.python} {what} (runtime none runs it on "
                        f"the nodes; the job needs {needs or 'this package'}). "
                        + ways_out)], []
    try:
        proc = _proc.run([python, "-c", _FIND_SPECS, *modules], timeout=PYTHON_TIMEOUT,
                         check=False, env=environ)
    except _proc.ProcError as exc:
        return [], [f"--python {spec.python} could not be asked what it can import: {exc}"]
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        return [Problem("python", f"--python {spec.python} ({python}) does not run here "
                        f"(exit {proc.returncode}: {said[-1] if said else 'no output'}). "
                        + ways_out)], []
    missing = proc.stdout.split()
    if "torch" in missing:
        return [Problem("python", f"--python {spec.python} ({python}) cannot import torch, "
                        f"which {needs} needs: with --runtime none the nodes run it as it "
                        f"is here. {ways_out}")], []
    if "train" in missing:
        return [Problem("python", f"--python {spec.python} ({python}) cannot import this "
                        "package, which the job runs on the nodes (`train run`, or `train "
                        "launch` before the program): "
                        "install it into that environment (from the checkout: pip install "
                        "'./[run]'), or give a container (--runtime apptainer --image "
                        "X.sif)")], []
    return [], []


def engine_problems(job: ResolvedJob, environ: Mapping[str, str]
                    ) -> tuple[list[Problem], list[str]]:
    """(problems, notes): python3 on this PATH, and its version."""
    fix = ENGINE_FIX.format(minor=MIN_PYTHON[1])
    found = which(ENGINE_PYTHON, environ)
    if found is None:
        if job.profile.modules:  # the site set-up may bring it on the nodes
            return [], [f"no {ENGINE_PYTHON} on this PATH: the job counts on the cluster "
                        f"profile's set-up to bring one ({fix})"]
        return [Problem("python", f"no {ENGINE_PYTHON} on this PATH: {fix}")], []
    try:
        out = _proc.run([found, "-E", "-s", "-c", _VERSION], timeout=PYTHON_TIMEOUT,
                        env=dict(environ)).stdout.split()
        version = (int(out[0]), int(out[1]))
    except (_proc.ProcError, ValueError, IndexError) as exc:
        return [Problem("python", f"{found} does not run here ({exc}): {fix}")], []
    if version < MIN_PYTHON:
        return [Problem("python", f"{found} is Python {version[0]}.{version[1]}: {fix}")], []
    return [], []
