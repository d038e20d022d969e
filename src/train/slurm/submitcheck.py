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
  `train run` applies on the node: train.runrecord), or of another --entry;
- NAVSIM's data (in a container) is not bound where the image reads it, or the --data
  folder has no dataset/ or dataset/maps;
- command starts a launcher of its own inside the job's step: srun, or torchrun (or
  python -m torch.distributed.run) where the job already starts a process per GPU.

The image, program, Python and NAVSIM data checks look at files and programs:
`--no-check` skips them, for a login node that does not see what the nodes see. `train
render` says the same as warnings (it works anywhere, a laptop included). Also at submit: the
COMPLETE marker an earlier run left in the folder is cleared (the scheduler does it, once
chunk 1 is queued), and SBATCH_* variables of the environment are not passed to sbatch
(`sbatch_environment`): every chunk runs with exactly the job spec's options. Where Slurm
refuses a job with --sbatch-extra options and accepts it without them, the refusal is
said as theirs.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from train import _proc
from train.errors import ConfigError, UsageError
from train.slurm import contract
from train.slurm.job import SBATCH_OWNED, ResolvedJob, parse_bind

NO_CHECK = ("if the compute nodes see files or programs that this login node does not, "
            "submit with --no-check")
PYTHON_TIMEOUT = 60.0  # a Python on a slow shared file system starting cold
DOCKER_TIMEOUT = 60.0
_PYTHON_NAME = re.compile(r"python[0-9.]*")
# python's options that take the next argument as their value
_PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")
# asks for modules without importing them (torch takes seconds to import); the working
# folder is left out of the path, as the job's steps leave it out (train.entry): a train.py
# there is not this package
_FIND_SPECS = ("import importlib.util, os, sys\n"
               "here = os.path.realpath(os.getcwd())\n"
               "sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]\n"
               "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
# sbatch reads these too, as the options SBATCH_CLUSTERS and SBATCH_HINT
_SLURM_OPTION_VARS = ("SLURM_CLUSTERS", "SLURM_HINT")
# variable suffix -> sbatch option, where it is not the suffix in lower case with '-'
_VAR_OPTIONS = {"TIMELIMIT": "--time", "MEM_PER_NODE": "--mem", "ARRAY_INX": "--array",
                "DEBUG": "--verbose", "NO_KILL": "--no-kill"}


@dataclass(frozen=True)
class Problem:
    """What would fail the job on the nodes: the field (flag) at fault, what and the fix."""

    field: str
    text: str
    files: bool = True  # about files or programs: --no-check skips it
    # a sweep's chain: its seed, the text saying {seeds} where problems of the same text
    # for several seeds are said once
    seed: int | None = None


def _merge_seeds(found: list[Problem]) -> list[Problem]:
    """A sweep's problems said once for all the seeds that have the same one."""
    merged: dict[tuple[str, str, bool], list[int]] = {}
    out: list[Problem] = []
    for p in found:
        if p.seed is None:
            out.append(p)
            continue
        key = (p.field, p.text, p.files)
        if key not in merged:
            merged[key] = []
            out.append(p)
        merged[key].append(p.seed)
    result = []
    for p in out:
        if p.seed is None:
            result.append(p)
            continue
        seeds = merged[(p.field, p.text, p.files)]
        said = f"the folder of seed {seeds[0]}" if len(seeds) == 1 else \
            "the folders of seeds " + ", ".join(map(str, seeds[:-1])) + f" and {seeds[-1]}"
        text = p.text.replace("{seeds}", said).replace(
            "{holds}", "holds" if len(seeds) == 1 else "hold")
        result.append(Problem(p.field, text, p.files))
    return result


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
        if submitting:  # a chain still queued or running there is the first thing to say
            from train.slurm.submission import _check_not_active

            _check_not_active(Path(job.run_dir))
        found += identity_problems(job)
        found += launcher_problems(job)
        marker = stale_complete(job)
        if marker is not None:
            notes.append(f"{marker} was left by an earlier run: "
                         + ("cleared, so that it does not end this chain after its first "
                            "chunk" if submitting else "train submit clears it"))
    if submitting and jobs and not no_check:  # resources: Slurm is asked (slurm.testonly)
        from train.slurm.testonly import ask

        refused = ask(jobs[0], sbatch_environment(env))
        if refused is not None and jobs[0].spec.sbatch_extra:
            refused = _extras_at_fault(jobs[0], refused, sbatch_environment(env))
        if refused is not None and refused[0]:
            found.append(Problem(refused[0], refused[1], files=False))
        elif refused is not None:  # not a refusal of the job's: sbatch itself will say
            notes.append(refused[1])
    if not found:
        return notes
    found = _merge_seeds(found)
    texts = [p.text + (f" ({NO_CHECK})" if p.files else "") for p in found]
    if submitting:
        also = "".join(f"\n  also, {p.field}: {t}" for p, t in zip(found[1:], texts[1:],
                                                                   strict=True))
        raise ConfigError(found[0].field, texts[0] + also)
    return [*notes, *(f"train submit would refuse this: {p.field}: {t}"
                      for p, t in zip(found, texts, strict=True))]


# -- image, program, Python -------------------------------------------------------------
def environment_problems(job: ResolvedJob, environ: Mapping[str, str] | None = None
                         ) -> tuple[list[Problem], list[str]]:
    """The image, the program and the Python of a job: (problems, notes on what could not
    be checked)."""
    env = os.environ if environ is None else environ
    problems: list[Problem] = []
    notes: list[str] = []
    for found, seen in (image_problems(job, env), program_problems(job, env),
                        python_problems(job, env), navsim_data_problems(job),
                        feature_problems(job, env)):
        problems += found
        notes += seen
    return problems, notes


def image_problems(job: ResolvedJob, environ: Mapping[str, str]
                   ) -> tuple[list[Problem], list[str]]:
    spec = job.spec
    image = spec.image
    if spec.runtime == "none" or not image:
        return [], []
    if spec.runtime == "docker":
        return _docker_image(image, environ)
    if "://" in image:  # docker://, oras://, library://: apptainer fetches it on the node
        return [], [f"--image {image} is fetched by apptainer on the nodes; not checked here"]
    from train import preflight

    path = Path(os.path.abspath(image))
    check = preflight.check_image_file(path, job.profile, preflight.read_mounts())
    if check.ok is False:
        tilde = " (a '~' is not expanded in the job: give the full path)" \
            if image.startswith("~") else ""
        return [Problem("image", f"--image {image}: {check.detail}{tilde}; {check.fix}")], []
    notes = [f"--image {image}: {check.fix}"] if check.fix else []  # (storage the nodes
    # may not mount)
    found, seen = _arch_problems(job, path, environ)
    return found, notes + seen


def feature_problems(job: ResolvedJob, environ: Mapping[str, str]
                     ) -> tuple[list[Problem], list[str]]:
    """What the image must offer the step (train.images.features): Python, torch for
    --launch torchrun, `train` for its own entries; no NVML for the GPU watch is a note."""
    from train.images import features

    found, notes = features.image_features(job, environ)
    if found is None:
        return [], notes
    refusals, warnings = features.problems(job, found)
    return [Problem("image", text) for text in refusals], notes + warnings


def _arch_problems(job: ResolvedJob, path: Path, environ: Mapping[str, str]
                   ) -> tuple[list[Problem], list[str]]:
    """The partition's GPUs against the architectures the image's torch carries (its lock,
    read through its labels): a V100 job with the CUDA 13 image fails at its first kernel,
    after the queue wait."""
    from train import preflight

    if not job.node.gpu_types or job.spec.gpus_per_node == 0:
        return [], []
    search = environ.get("PATH", os.defpath)
    binary = shutil.which("apptainer", path=search) or shutil.which("singularity",
                                                                    path=search)
    if binary is None and not path.is_dir():
        return [], [f"--image {job.spec.image}: its GPU architectures were not compared with "
                    f"the {job.node.name} GPUs: apptainer is not on PATH here"]
    facts = preflight.image_facts(path, binary or "", job.profile)
    if facts is None:
        return [], []
    check = preflight.check_arch([job.node], True, "apptainer", facts)
    if check.ok is False:
        return [Problem("image", f"--image {job.spec.image}: {check.detail}; {check.fix}")], []
    return [], [f"--image {job.spec.image}: {check.detail}; {check.fix}"] if check.warn else []


def _docker_image(tag: str, environ: Mapping[str, str]) -> tuple[list[Problem], list[str]]:
    binary = shutil.which("docker", path=environ.get("PATH", os.defpath))
    if binary is None:
        return [], [f"--image {tag} could not be checked: docker is not on PATH here"]
    try:
        proc = _proc.run([binary, "image", "inspect", "--format", "{{.Id}}", tag],
                         timeout=DOCKER_TIMEOUT, check=False, env=environ)
    except _proc.ProcError as exc:
        return [], [f"--image {tag} could not be checked: {exc}"]
    if proc.returncode == 0:
        return [], []
    said = (proc.stderr or proc.stdout).strip()
    if "no such image" in said.lower():
        return [Problem("image", f"--image {tag}: the Docker engine here has no such image; "
                        f"build it (`train image build base --engine docker --tag {tag}`) "
                        "or `docker load` it")], []
    last = said.splitlines()[-1] if said else f"exit {proc.returncode}"
    return [], [f"--image {tag} could not be checked (the Docker engine did not answer: "
                f"{last})"]


def program_problems(job: ResolvedJob, environ: Mapping[str, str]
                     ) -> tuple[list[Problem], list[str]]:
    """The program the job starts, where the login node sees it as the nodes will."""
    spec = job.spec
    folder = _program_folder(job)
    wanted: list[tuple[str, str, bool]] = []  # (field, path as given, must be executable)
    problems: list[Problem] = []
    if spec.entry == "command":
        program = spec.workload[0]
        if "/" in program:
            wanted.append(("workload", program, True))
        elif spec.runtime == "none" and shutil.which(
                program, path=environ.get("PATH", os.defpath)) is None:
            problems.append(Problem("workload", f"{program!r} is not a program on this "
                                    "PATH, which the nodes run the job with (--runtime "
                                    "none): a typo, or give its path"))
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
            problems.append(Problem(field, f"{flag}: {given}{where} does not exist"
                                    + (f" (it is {host} here)" if host != inside else "")
                                    + "; give its path, absolute or from that folder"))
        elif executable and not os.access(host, os.X_OK):
            problems.append(Problem(field, f"{flag}: {given}{where} is not executable: "
                                    f"chmod +x it, or run it with its interpreter (-- bash "
                                    f"{given}, -- python {given})"))
    return problems, []


def python_script(argv: Sequence[str]) -> str | None:
    """The script of `python [OPTIONS] SCRIPT ...`; None for another program, `-m`, `-c`
    or `-` (standard input)."""
    if not argv or not _PYTHON_NAME.fullmatch(os.path.basename(argv[0])):
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


def python_problems(job: ResolvedJob, environ: Mapping[str, str]
                    ) -> tuple[list[Problem], list[str]]:
    """Runtime none: the job runs --python on the nodes as it is here. What the job needs
    of it is asked without importing anything."""
    spec = job.spec
    if spec.runtime != "none":
        return [], []
    needs = {"train": "`train run`", "navsim": "NAVSIM's training"}.get(spec.entry) or (
        "torch's launcher (--launch torchrun)" if job.launch == "torchrun" else None)
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
        python = shutil.which(spec.python, path=environ.get("PATH", os.defpath))
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


# -- a launcher in the workload ---------------------------------------------------------
# torchrun's options that take no value (every other option takes one, as --opt V or
# --opt=V): after them comes the script or module
_TORCHRUN_FLAGS = ("--standalone", "--no-python", "--no_python", "-m", "--module",
                   "--run-path", "--run_path")
_TORCH_LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def launcher_problems(job: ResolvedJob) -> list[Problem]:
    """A command job whose program is a launcher of its own: the job's step already is one
    (srun starts its tasks; under --launch torchrun or tasks each GPU gets its process).
    `srun` inside the step waits for resources the step holds (and is not in an image);
    torchrun inside the job's own launcher starts a launcher per process."""
    spec = job.spec
    if spec.entry != "command" or not spec.workload:
        return []
    argv = list(spec.workload)
    name = os.path.basename(argv[0])
    if name == "srun":
        program = _after_options(argv[1:], ())
        return [Problem("workload", "the command after -- starts with srun, and the job's "
                        "step is already started by srun (one task per node, or one per GPU "
                        "with --launch tasks): an srun inside it waits for the CPUs and GPUs "
                        "that step holds (inside a container there is no srun at all). Give "
                        f"the program itself: -- {_joined(program)}", files=False)]
    if job.launch == "single":  # one process in all: a torchrun of one process is harmless
        return []
    rest: list[str] | None = None
    if name == "torchrun":
        rest = _torchrun_program(argv[1:])
    elif _PYTHON_NAME.fullmatch(name) and len(argv) > 2 and argv[1] == "-m" \
            and argv[2] in _TORCH_LAUNCH_MODULES:
        rest = _torchrun_program(argv[3:])
        name = f"{name} -m {argv[2]}"
    if rest is None:
        return []
    per_node = max(1, spec.gpus_per_node)
    procs = f"{per_node} process{'es' if per_node > 1 else ''} a node"
    how = (f"torch's launcher itself (--launch torchrun: {procs}, the rendezvous on the "
           "first node)" if job.launch == "torchrun" else
           f"one task per GPU ({per_node} a node, --launch tasks)")
    return [Problem("workload", f"the command after -- is torch's launcher ({name}), and "
                    f"the job already runs {how}: each of its processes would start a "
                    "launcher of its own, whose workers contend for the same "
                    f"{'GPUs' if spec.gpus_per_node else 'CPUs'} and port. Give the program "
                    f"the launcher runs: -- {_joined(rest)}", files=False)]


def _torchrun_program(args: Sequence[str]) -> list[str]:
    """What torchrun runs, as the job's launcher wants it: `python SCRIPT ARGS`, `python
    -m MODULE ARGS`, or the program itself after --no-python."""
    module = no_python = False
    items = iter(args)
    for arg in items:
        if arg in ("-m", "--module"):
            module = True
        elif arg in ("--no-python", "--no_python"):
            no_python = True
        elif arg.startswith("-") and arg != "-" and "=" not in arg \
                and arg not in _TORCHRUN_FLAGS:
            next(items, None)  # its value
        elif not arg.startswith("-") or arg == "-":
            rest = [arg, *items]
            return rest if no_python else ["python", "-m", *rest] if module else \
                ["python", *rest]
    return ["python", "SCRIPT"]


def _after_options(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """The program after a launcher's own options (those with a value written --opt=V;
    srun's short options with a separate value are not told apart: good enough for a
    hint)."""
    for i, arg in enumerate(args):
        if not arg.startswith("-") or arg in flags:
            return list(args[i:])
    return ["PROGRAM"]


def _joined(argv: Sequence[str]) -> str:
    import shlex

    return shlex.join(argv) if argv else "PROGRAM"


# -- NAVSIM's data ----------------------------------------------------------------------
def navsim_data_problems(job: ResolvedJob) -> tuple[list[Problem], list[str]]:
    """In a container, NAVSIM reads its dataset and maps under /data/navsim: the folder
    --data binds there must hold them, and without --data (or a bind there, or the data
    roots moved with --env) the image's own empty folders are all the job finds, after the
    queue wait. The nodes' own NAVSIM (runtime none) reads the environment: not checked."""
    from train.slurm.job import NAVSIM_DATA_ROOT

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


# -- Slurm's refusal of --sbatch-extra --------------------------------------------------
def _extras_at_fault(job: ResolvedJob, refused: tuple[str, str] | None,
                     environ: dict[str, str]) -> tuple[str, str] | None:
    """Where Slurm refuses a job with --sbatch-extra options, the job without them is
    asked too: accepted, the refusal is theirs (it names no flag of the job's, or one that
    was not the cause: an --exclude that leaves too few nodes reads as the GPU request)."""
    import dataclasses

    from train.slurm.testonly import ask

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


# -- the run folder ---------------------------------------------------------------------
def identity_problems(job: ResolvedJob) -> list[Problem]:
    """An earlier run in the job's folder that this job cannot continue: another entry, or
    (entry train) other identity settings, as `train run` would find on the node."""
    from train.config import run_config_from_argv
    from train.runrecord import describe, differences, read_run_record
    from train.slurm.render import train_argv
    from train.slurm.scheduler import load_chain

    spec = job.spec
    run_dir = Path(job.run_dir)
    field, flag = ("out", "--out") if spec.out else ("name", "--name")
    which = f"{flag} {spec.out if spec.out else spec.name}"
    where, holds, new = str(run_dir), "holds", "run"
    seed: int | None = None
    sweep = _sweep_chain(job)
    if sweep is not None:  # said of the sweep's --name (or --out) and its seeds
        field, flag, value, seed = sweep
        which, where = f"{flag} {value}", f"{{seeds}} ({run_dir.parent}/seed-N)"
        holds, new = "{holds}", "sweep"
    problems = []
    if (run_dir / contract.CHAIN_RECORD).is_file():
        try:
            entry = load_chain(run_dir).record.get("entry")
        except UsageError:
            entry = None  # an unreadable record: submit says so when it keeps it aside
        if isinstance(entry, str) and entry != spec.entry:
            problems.append(Problem(field, f"{which}: {where} {holds} an earlier chain of "
                                    f"--entry {entry}, and this job is --entry {spec.entry}: "
                                    f"choose another {flag} (or remove that folder)",
                                    files=False, seed=seed))
    if spec.entry == "train" and not problems:
        cfg = run_config_from_argv(train_argv(job))
        try:
            differ = differences(cfg, read_run_record(cfg))
        except ConfigError as exc:  # a config.json that is not train's (exit 2 either way)
            return [Problem(field, f"{which}: {exc}", files=False)]
        if differ:
            problems.append(Problem(field, f"{which}: {where} {holds} an earlier run with "
                                    f"other settings ({describe(differ)}); `train run` "
                                    "would refuse to continue it on the node. Give its "
                                    f"settings, or another {flag} for a new {new}",
                                    files=False, seed=seed))
    return problems


def _sweep_chain(job: ResolvedJob) -> tuple[str, str, str, int] | None:
    """(field, flag, value, seed) of the sweep a chain is one seed of (train.slurm.sweep
    names it NAME-sS in ROOT/seed-S): the flag the user gave is --name, or --out where the
    root is not runs/NAME; None for a chain of its own."""
    from train.slurm.sweep import seed_dir

    run_dir = Path(job.run_dir)
    found = re.fullmatch(r"seed-([0-9]+)", run_dir.name)
    if found is None:
        return None
    seed = int(found.group(1))
    suffix = f"-s{seed}"
    if seed_dir(seed) != run_dir.name or not job.spec.name.endswith(suffix):
        return None
    base = job.spec.name[:-len(suffix)]
    if run_dir.parent == Path(os.path.abspath(os.path.join("runs", base))):
        return "name", "--name", base, seed
    return "out", "--out", str(run_dir.parent), seed


def stale_complete(job: ResolvedJob) -> Path | None:
    """The COMPLETE marker an earlier run left in the job's folder (it would end a new
    chain of a program other than `train run` after its first chunk)."""
    marker = Path(job.run_dir) / contract.COMPLETE_MARKER
    return marker if os.path.lexists(marker) else None


# -- sbatch's own variables -------------------------------------------------------------
def _dropped(name: str) -> bool:
    """What train's sbatch calls do not pass on: the chain's own (job-lib.sh's
    train_sbatch) drops the same, so chunk 1 and its successors are submitted alike."""
    return name != "SLURM_CONF" and name.startswith(("SLURM_", "SBATCH_", "SALLOC_"))


def sbatch_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for `train submit`'s sbatch: this one without SBATCH_* (they would
    override chunk 1's #SBATCH lines only), SALLOC_* or SLURM_* (an allocation's, when
    submitting from inside one) variables; SLURM_CONF stays."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if not _dropped(k)}


def sbatch_variable_notes(environ: Mapping[str, str]) -> list[str]:
    """A warning for each variable of the environment that would set an option of the job
    (SBATCH_*, and SLURM_CLUSTERS/SLURM_HINT), with the flag to give instead."""
    notes = []
    for name in sorted(environ):
        if not (name.startswith("SBATCH_") or name in _SLURM_OPTION_VARS):
            continue
        suffix = name.split("_", 1)[1]
        option = _VAR_OPTIONS.get(suffix, "--" + suffix.lower().replace("_", "-"))
        use = SBATCH_OWNED.get(option)
        if use is None:
            instead = f"give --sbatch-extra={option}=VALUE instead"
        elif "(" in use:  # "(why)", or "field (why)" for an option the field does not set
            why = use[1:-1] if use.startswith("(") else use
            instead = f"the job sets {option} itself: {why}"
        else:  # "field", or "field and field"
            flags = " and ".join("--" + f.replace("_", "-") for f in use.split(" and "))
            instead = f"give {flags} instead"
        notes.append(f"{name}={environ[name]} is not passed to sbatch: every chunk of the "
                     f"chain runs with the job's own options ({instead})")
    return notes
