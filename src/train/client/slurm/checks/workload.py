"""A command whose program is a launcher of its own (srun, torchrun, accelerate launch)
inside the job's step, which already is one."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from train.client.slurm.checks.files import PYTHON_NAME
from train.client.slurm.checks.problem import Problem
from train.client.slurm.resolve import ResolvedJob
from train.common.launchers import accelerate_prefix, given_job_options

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
    if name == "torchrun":
        rest = _torchrun_program(argv[1:])
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
    return [Problem("workload", f"the command after -- is torch's launcher ({name}), and "
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
