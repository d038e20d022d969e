"""--python with --runtime none: the nodes run it as it is here, so it must import torch
where the job needs it and this package; asked without importing anything."""

from __future__ import annotations

import os
from collections.abc import Mapping

from train.client.preflight.result import which
from train.client.slurm.checks.problem import Problem
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
