"""Traps a `--entry command` job walks into after the queue wait, said at render and submit
(warnings: the login node reads only the script it can find, and guesses from its text):

- a stop signal the program has no handler for: it dies of it (138 for USR1) at the margin;
- a chain whose program saves nowhere the chain looks (no --save-path, nothing written to
  TRAIN_RUN_DIR): it ends after chunk 1, "stopped before any save";
- --resume-args or --stop-mode kill on a job of one chunk (a command is one chunk unless
  --max-chunks or --total-time asks for a chain): nothing would ever resume;
- a --save-path in the container under no bind and absent on the host: what the program
  saves there stays in its container, unseen by the chain.
A launcher of its own (srun, torchrun, deepspeed, accelerate launch) inside the job's step
is refused.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from train.client.programs import LIGHTNING, SCRIPT_LIMIT, script_of
from train.client.slurm.checks.files import PYTHON_NAME
from train.client.slurm.checks.problem import Problem
from train.client.slurm.jobitems import parse_bind
from train.client.slurm.resolve import ResolvedJob
from train.common.launchers import accelerate_prefix, given_job_options

FOLDER_LIMIT = 50  # .py files beside the script that are read for a handler
# where a program's saves are seen by the chain without --save-path
_SAVES_SEEN = (b"TRAIN_RUN_DIR", b"TRAIN_PROGRESS_FILE", b"PL_TRAINER_DEFAULT_ROOT_DIR")
# torchrun's options that take no value (every other option takes one, as --opt V or
# --opt=V): after them comes the script or module
_TORCHRUN_FLAGS = ("--standalone", "--no-python", "--no_python", "-m", "--module",
                   "--run-path", "--run_path")
_TORCH_LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _texts(script: Path) -> list[bytes]:
    """The script's text and its neighbours' (.py files of its folder, a bounded few)."""
    out = []
    try:
        neighbours = sorted(p for p in script.parent.glob("*.py") if p != script)
    except OSError:
        neighbours = []
    for path in [script, *neighbours[:FOLDER_LIMIT]]:
        try:
            if path.is_file():
                with open(path, "rb") as fh:
                    out.append(fh.read(SCRIPT_LIMIT))
        except OSError:
            continue
    return out


def _handles(texts: list[bytes], signal: str) -> bool:
    """Whether any text sets a handler for SIG<signal>, or leaves it to Lightning (whose
    SLURM support saves and requeues on USR1)."""
    for text in texts:
        if f"SIG{signal}".encode() in text or b"TRAIN_STOP_SIGNAL" in text \
                or b"SLURMEnvironment" in text:
            return True
        if signal == "USR1" and LIGHTNING.search(text):
            return True
    return False


def trap_notes(job: ResolvedJob) -> list[str]:
    """The warnings for a command job's program (none for other entries)."""
    spec = job.spec
    if spec.entry != "command":
        return []
    notes = []
    script = script_of(spec.workload, spec.chdir)
    texts = _texts(script) if script is not None else []
    if texts and spec.stop_mode == "signal" and job.stop in ("USR1", "TERM") \
            and not _handles(texts, job.stop):
        code = 128 + (10 if job.stop == "USR1" else 15)
        notes.append(f"--stop-signal {job.stop}: {script} (and the .py files beside it) set "
                     f"no handler for SIG{job.stop}, so the program dies of it (exit {code}) "
                     f"{job.margin} s before the walltime, after the queue wait. Add one that "
                     f"saves and exits 0 (signal.signal(signal.SIG{job.stop}, handler)), or "
                     "give --stop-mode kill (for a program that saves on its own), or "
                     "--stop-signal none (one chunk)")
    shown = " ".join(spec.workload)
    # (a program run in its run folder, --chdir {task_dir}: what it writes there is seen)
    inside = spec.chdir is not None and Path(job.run_dir) in (
        Path(os.path.abspath(spec.chdir)), *Path(os.path.abspath(spec.chdir)).parents)
    if job.chunks > 1 and not spec.save_path and job.run_dir not in shown and not inside \
            and "TRAIN_RUN_DIR" not in shown \
            and not any(w in t for t in texts for w in _SAVES_SEEN) \
            and not any(LIGHTNING.search(t) for t in texts):
        notes.append(f"a chain of up to {job.chunks} chunks goes on only after a stop that "
                     "saved something (under the run folder TRAIN_RUN_DIR, or a --save-path), "
                     "and nothing says where this program saves: it would end after chunk 1 "
                     "'stopped before any save'. Give --save-path DIR (the file or folder it "
                     "saves to), or save under $TRAIN_RUN_DIR")
    if job.chunks == 1 and (spec.resume_args is not None or spec.stop_mode == "kill"):
        given = "--resume-args" if spec.resume_args is not None else "--stop-mode kill"
        notes.append(f"{given} is for a chain, and this job is one chunk (a command is, "
                     "unless asked): give --total-time D-HH:MM:SS (chunks of --time until "
                     "then) or --max-chunks N")
    notes += [f"--save-path {given}: the {spec.runtime} container shares no folder with the "
              f"batch host there (none of its binds holds it, and the host has no {given}): "
              "what the program saves there stays in its container, and the chain never "
              f"sees it; bind a folder there (--bind SRC:{given})"
              for given in _unshared_saves(job)]
    return notes


def _unshared_saves(job: ResolvedJob) -> list[str]:
    """The container job's absolute --save-path items under no bind's destination that
    the batch host does not have either."""
    if job.spec.runtime == "none":
        return []
    dests = [Path(parse_bind(b).dst) for b in job.binds]
    out = []
    for given in job.spec.save_path:
        path = Path(os.path.normpath(given))
        if path.is_absolute() and not any(d == path or d in path.parents for d in dests) \
                and not os.path.lexists(path):
            out.append(given)
    return out


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
        program = _after_options(argv[1:])
        return [Problem("workload", "the command after -- starts with srun, and the job's "
                        "step is already started by srun (one task per node, or one per GPU "
                        "with --launch tasks): an srun inside it waits for the CPUs and GPUs "
                        "that step holds (inside a container there is no srun at all). Give "
                        f"the program itself: -- {shlex.join(program)}", files=False)]
    if accelerate_prefix(argv):
        return _accelerate_problems(job)
    if job.launch == "single":  # one process in all: a torchrun of one process is harmless
        return []
    rest: list[str] | None = None
    launcher = "torch's launcher"
    if name == "torchrun":
        rest = _torchrun_program(argv[1:])
    elif name == "deepspeed":  # its launcher starts a process per GPU too; the script
        # finds torch's launcher's RANK, WORLD_SIZE, ... as deepspeed.initialize reads them
        launcher = "DeepSpeed's launcher"
        script = next((i for i, word in enumerate(argv) if word.endswith(".py")), None)
        rest = ["python", *argv[script:]] if script is not None else ["python", "SCRIPT.py"]
    elif PYTHON_NAME.fullmatch(name) and len(argv) > 2 and argv[1] == "-m" \
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
    return [Problem("workload", f"the command after -- is {launcher} ({name}), and "
                    f"the job already runs {how}: each of its processes would start a "
                    "launcher of its own, whose workers contend for the same "
                    f"{'GPUs' if spec.gpus_per_node else 'CPUs'} and port. Give the program "
                    f"the launcher runs: -- {shlex.join(rest)}", files=False)]


def _accelerate_problems(job: ResolvedJob) -> list[Problem]:
    """`accelerate launch` runs as each node's launcher (train.common.launchers): never one
    per task, with the job's shape its own, and no stop signal it would die of."""
    spec = job.spec
    per_node = max(1, spec.gpus_per_node)
    shape = (f"{spec.nodes} node(s) x {per_node} process(es): the job gives it "
             "--num_processes, --num_machines, --machine_rank and the rendezvous")
    problems = []
    if job.launch == "tasks":
        problems.append(Problem("launch", "accelerate launch starts the processes of its "
                                "node itself, so it runs once per node, in the place of "
                                "torch's launcher: --launch torchrun (the default), not one "
                                f"task per GPU ({shape})", files=False))
    given = given_job_options(spec.workload)
    if given:
        problems.append(Problem("workload", f"accelerate launch's {', '.join(given)} "
                                f"belong to the job ({shape}): remove them, and give the "
                                "job's shape with -N and -g", files=False))
    if spec.stop != "none" and spec.stop_mode != "kill":
        problems.append(Problem("stop_signal", f"accelerate launch has no handler for the "
                                f"stop signal {spec.stop}, which reaches every process of "
                                "the step: it would die of it, its workers with it. Chain "
                                "it with --stop-mode kill (the tool ends it at the margin, "
                                "the next chunk resumes from the program's last save: "
                                "--save-path, --resume-args), or --stop-signal none",
                                files=False))
    return problems


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


def _after_options(args: Sequence[str]) -> list[str]:
    """The program after a launcher's own options (those with a value written --opt=V;
    srun's short options with a separate value are not told apart: good enough for a
    hint)."""
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            return list(args[i:])
    return ["PROGRAM"]
