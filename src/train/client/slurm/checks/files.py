"""The program a job starts and the data it reads, where the login node sees them as the
nodes will: a `--entry command` program or `python SCRIPT`, a NAVSIM script, NAVSIM's
dataset under --data."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from train.client.preflight.result import which
from train.client.programs import PROGRAM_NAME, command_as_run, program_slip
from train.client.slurm.checks.problem import Problem
from train.client.slurm.jobitems import parse_bind
from train.client.slurm.resolve import ResolvedJob

PYTHON_NAME = re.compile(r"python[0-9.]*")
# python's options that take the next argument as their value
_PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")


def program_problems(job: ResolvedJob, environ: Mapping[str, str]
                     ) -> tuple[list[Problem], list[str]]:
    """The program the job starts, where the login node sees it as the nodes will."""
    spec = job.spec
    folder = _program_folder(job)
    wanted: list[tuple[str, str, bool]] = []  # (field, path as given, must be executable)
    problems: list[Problem] = []
    notes: list[str] = []
    if spec.entry == "command":
        program = command_as_run(spec.workload, spec.runtime, spec.python)[0]
        slip = program_slip(program)
        if "/" in program:
            wanted.append(("workload", program, True))
        elif spec.runtime == "none" and which(program, environ) is None:
            problems.append(Problem("workload", f"{program!r} is not a program on this "
                                    "PATH, which the nodes run the job with (--runtime "
                                    f"none): a typo{slip}, or give its path"))
        elif spec.runtime != "none" and not PROGRAM_NAME.fullmatch(program):
            notes.append(f"the command after -- starts {program!r}, which is looked up on "
                         f"the PATH inside the image, on the node: not checked here{slip}")
        script = python_script(spec.workload)
        if script is not None:
            wanted.append(("workload", script, False))
    elif spec.entry == "navsim":
        wanted.append(("navsim_script", spec.navsim_script, False))
    for field, given, executable in wanted:
        inside = os.path.normpath(os.path.join(folder, given))
        host = host_path(job, inside)
        if host is None:  # a path in the image: only the nodes can look
            continue
        where = f" (in {folder})" if not given.startswith("/") else ""
        flag = "--navsim-script" if field == "navsim_script" else "the command after --"
        try:
            is_file, is_dir = os.path.isfile(host), os.path.isdir(host)
        except OSError:  # (both return False for a name too long)
            is_file = is_dir = False
        if is_dir:
            problems.append(Problem(field, f"{flag}: {given}{where} is a folder, not a "
                                    "program or script"))
        elif not is_file:
            here = os.path.abspath(given)  # (--chdir {task_dir}: a new folder holds none)
            found = f": {here}" if where and os.path.isfile(here) else ""
            problems.append(Problem(field, f"{flag}: {given}{where} does not exist"
                                    + (f" (it is {host} here)" if host != inside else "")
                                    + f"; give its path, absolute or from that folder{found}"))
        elif executable and not os.access(host, os.X_OK):
            problems.append(Problem(field, f"{flag}: {given}{where} is not executable: "
                                    f"chmod +x it, or run it with its interpreter (-- bash "
                                    f"{given}, -- python {given})"))
    return problems, notes


def python_script(argv: Sequence[str]) -> str | None:
    """The script of `python [OPTIONS] SCRIPT ...`; None for another program, `-m`, `-c`
    or `-` (standard input)."""
    if not argv or not PYTHON_NAME.fullmatch(os.path.basename(argv[0])):
        return None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-" or arg.startswith(("-m", "-c")):
            return None
        if arg in _PYTHON_VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _program_folder(job: ResolvedJob) -> str:
    """Where the program starts, as the container sees it: --chdir, else the submit folder
    (the job's working directory; apptainer keeps it), docker's -w the run folder."""
    chdir = getattr(job.spec, "chdir", None)
    if chdir:
        return os.path.abspath(str(chdir))
    return job.run_dir if job.spec.runtime == "docker" else os.getcwd()


def host_path(job: ResolvedJob, path: str) -> str | None:
    """The host path the program sees at `path` (absolute), or None where it is inside the
    image: runtime none sees the host; a container, what is bound into it (the job's and
    the profile's binds, the run folder; apptainer also the home and working folders)."""
    spec = job.spec
    if spec.runtime == "none":
        return path
    pairs = [(b.dst, b.src) for b in map(parse_bind, job.binds)]
    pairs.append((job.run_dir, job.run_dir))
    if spec.runtime == "apptainer":
        pairs += [(os.getcwd(), os.getcwd()), *((h, h) for h in [os.path.expanduser("~")]
                                                 if h.startswith("/"))]
    best: tuple[str, str] | None = None
    for dst, src in pairs:
        if (path == dst or path.startswith(dst.rstrip("/") + "/")) and (
                best is None or len(dst) > len(best[0])):
            best = (dst, src)
    if best is None:
        return None
    rest = path[len(best[0]):].lstrip("/")
    return os.path.join(best[1], rest) if rest else best[1]


def navsim_data_problems(job: ResolvedJob) -> tuple[list[Problem], list[str]]:
    """In a container, NAVSIM reads its dataset and maps under /data/navsim: the folder
    --data binds there must hold them, and without --data (or a bind there, or the data
    roots moved with --env) the image's own empty folders are all the job finds, after the
    queue wait. The nodes' own NAVSIM (runtime none) reads the environment: not checked."""
    from train.client.slurm.navsim import NAVSIM_DATA_ROOT

    spec = job.spec
    if spec.entry != "navsim" or spec.runtime == "none":
        return [], []
    if spec.data is None:
        root = NAVSIM_DATA_ROOT
        bound = any(b.dst == root or b.dst.startswith(root + "/") or root.startswith(
            b.dst.rstrip("/") + "/") for b in map(parse_bind, job.binds))
        moved = any(name == "OPENSCENE_DATA_ROOT" for name, _ in job.env_values)
        if bound or moved:
            return [], []
        return [Problem("data", f"--entry navsim trains on NAVSIM's dataset, and nothing is "
                        f"bound where the image looks for it ({root}: dataset/ with the logs "
                        "and sensor blobs, dataset/maps, exp/): give --data DIR, the folder "
                        "on the cluster's shared file system that holds them")], []
    data = os.path.abspath(spec.data)
    missing = [sub for sub in ("dataset", "dataset/maps")
               if not os.path.isdir(os.path.join(data, sub))]
    if not missing:
        return [], []
    return [Problem("data", f"--data {spec.data}: {data} has no {missing[0]}/ (the image "
                    f"reads NAVSIM's logs and sensor blobs from {NAVSIM_DATA_ROOT}/dataset "
                    f"and the maps from {NAVSIM_DATA_ROOT}/dataset/maps, and --data is "
                    "bound at /data/navsim): give the folder that holds dataset/")], []


def profile_bind_problems(job: ResolvedJob) -> tuple[list[Problem], list[str]]:
    """The profile's binds are the site's shared file systems (home, scratch, project
    space): each is bound into every container on every node, and a missing source fails
    the container's start there ("mount source ... doesn't exist"). One this login node
    does not have either is refused here, before the queue wait."""
    if job.spec.runtime == "none":
        return [], []
    problems = []
    for path in job.profile.binds:
        try:
            there = os.path.isdir(path)
        except (OSError, ValueError):
            there = False
        if not there:
            problems.append(Problem(
                "binds", f"the profile {job.profile.name}'s bind {path} is no folder on "
                "this login node (the profile says it is a shared file system, bound into "
                f"every {job.spec.runtime} container): the container would not start on "
                f"the nodes; remove it from your profile (extends: {job.profile.name}, "
                "binds: [...])"))
    return problems, []
