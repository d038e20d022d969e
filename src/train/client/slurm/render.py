"""Rendering: a resolved job -> sbatch script text. A pure function, golden-tested.

`#SBATCH` lines come in a fixed order. Every value in the shell part is `shlex.quote`d, so
any argument (quotes, `$(...)`, backticks, `;`, newlines) reaches the training process
byte for byte. `#SBATCH` lines are parsed by sbatch, not by a shell: values there are bare
when they are plain, and double-quoted otherwise.
"""

from __future__ import annotations

import os
import re
import shlex
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from train.batch import contract
from train.batch.contract import NAVSIM_CACHE_PATH_OVERRIDE, override_value
from train.batch.engine import ENGINE_DIR
from train.client import container
from train.client.clusters.units import format_mem, format_time, parse_mem
from train.client.programs import command_as_run
from train.client.slurm import navsimstep
from train.client.slurm.jobpaths import host_path
from train.client.slurm.resolve import ResolvedJob
from train.client.slurm.sweep import SWEEP_INDEX_VAR, SWEEP_VALUE_VAR
from train.common.entry import bound_entry_argv as entry_argv
from train.common.entry import bound_entry_code as nodeentry_code
from train.common.entry import entry_code, module_argv
from train.common.errors import ConfigError
from train.common.secrets.commands import masked_argv

_PLAIN = re.compile(r"^[A-Za-z0-9_.,:=@%/+|-]+$")
STEP_GRACE_SECONDS = 30
STEP_WIDTH = 88  # the step command's lines, the ` \` included
# the interpreter the chain engine runs with on the batch host and the nodes (outside the
# container): the node's own python3 (3.6 on EL8, 3.9 on RHEL 9), after the site set-up
ENGINE_PYTHON = "python3"
ENGINE_VAR = "ENGINE"
PYTHON_M_TRAIN_VAR = "PYTHON_M_TRAIN"
BOUND_LAUNCHER_VAR = "BOUND_LAUNCHER"
_NAMED = {PYTHON_M_TRAIN_VAR: "the train package's command line, never a train.py of "
                              "the folder it runs in",
          BOUND_LAUNCHER_VAR: "the client's launcher, bound read-only into an image "
                              "without train (train.node.nodeentry)"}


def sbatch_value(value: str, field: str) -> str:
    if "\n" in value or "\r" in value:
        raise ConfigError(field, "must not contain a newline (it ends an #SBATCH line)")
    if _PLAIN.match(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def gpu_option(job: ResolvedJob) -> str | None:
    gpus = job.spec.gpus_per_node
    if gpus == 0:
        return None
    # the type is typed here only where the site types GRES; elsewhere resolve put it in
    # the constraint, or the partition or constraint implies it
    kind = f"{job.gres_type}:" if job.gres_type else ""
    if job.profile.gpu_request == "gpus_per_node":
        return f"--gpus-per-node={kind}{gpus}"
    return f"--gres=gpu:{kind}{gpus}"


def requeue_allowed(job: ResolvedJob) -> bool:
    """Whether Slurm may run this job again: requeue mode, or preemptible with requeue."""
    return job.spec.requeue or job.spec.preempt


def save_paths(job: ResolvedJob) -> list[str]:
    """--save-path as absolute paths where the batch host sees them: relative ones are
    from --chdir (where the program runs), or the submit folder; a container's path under
    a bind's destination is the bind's source's."""
    base = program_dir(job)
    paths = [os.path.normpath(os.path.join(base, p)) for p in job.spec.save_path]
    if job.spec.entry == "navsim":
        # a chunk cut while it computes NAVSIM's feature cache has saved that much: a
        # cache_path= of the user's outside the run folder counts as a save path
        cache = override_value(job.spec.workload, NAVSIM_CACHE_PATH_OVERRIDE)
        if cache and os.path.isabs(cache):
            paths.append(os.path.normpath(cache))
    if job.spec.runtime == "none":
        return paths
    return [host_path(p, job.binds) for p in paths]


def program_dir(job: ResolvedJob) -> str:
    """Where the program runs: the submit folder, or --chdir as an absolute path (relative
    ones are from the submit folder), checked on the login node where it can be seen; one
    inside the run folder is made at submit."""
    if job.spec.chdir is None:
        return os.getcwd()
    folder = os.path.abspath(job.spec.chdir)
    try:
        is_dir = os.path.isdir(folder)
    except (OSError, ValueError) as exc:
        raise ConfigError("chdir", f"{folder!r}: {exc}") from None
    run_dir = os.path.abspath(job.run_dir)
    if not is_dir and not (os.path.commonpath([folder, run_dir]) == run_dir
                           and not os.path.exists(folder)):
        raise ConfigError("chdir", f"{folder} is not a directory (the folder the program "
                          "runs in, on the cluster's shared file system)")
    return folder


def folder_to_make(job: ResolvedJob) -> Path | None:
    """--chdir inside the run folder (a sweep's --chdir {task_dir}): submit makes it, as it
    makes the run folder, before the job starts; None where the program runs elsewhere."""
    folder = Path(program_dir(job))
    run_dir = Path(os.path.abspath(job.run_dir))
    return folder if folder == run_dir or run_dir in folder.parents else None


def sbatch_options(job: ResolvedJob) -> list[str]:
    spec = job.spec
    # sbatch expands %j, %x, ... in these paths: a literal % in the run directory is %%
    logs = f"{job.run_dir}/{contract.LOG_DIR}".replace("%", "%%")
    pairs: list[tuple[str, str | None]] = [
        ("job-name", spec.name),
        ("account", spec.account),
        ("partition", job.partition),
        ("qos", job.qos),
        ("constraint", job.constraint),
        ("nodes", str(spec.nodes)),
        ("ntasks-per-node", str(job.ntasks_per_node)),
        ("cpus-per-task", str(spec.cpus_per_task)),
        ("mem", "0" if job.whole_node_mem else format_mem(job.mem_mb)),
    ]
    lines = [f"--{k}={sbatch_value(v, k.replace('-', '_'))}" for k, v in pairs if v]
    gpu = gpu_option(job)
    if gpu:
        lines.append(gpu)
    lines.append(f"--time={format_time(job.minutes)}")
    if job.time_min:
        # backfill may start a chunk this short in a hole; the engine reads the real limit
        lines.append(f"--time-min={format_time(job.time_min)}")
    if job.stop != "none":
        # to the batch shell, which passes the job's stop signal on to the step
        lines.append(f"--signal=B:USR1@{job.margin}")
    lines += [
        "--open-mode=append",
        f"--output={sbatch_value(logs + '/%x-%j.out', 'out')}",
        f"--error={sbatch_value(logs + '/%x-%j.err', 'out')}",
        "--requeue" if requeue_allowed(job) else "--no-requeue",
        # a chunk whose predecessor did not succeed is removed by Slurm itself (the sites
        # do not set kill_invalid_depend: without this it would stay pending forever)
        "--kill-on-invalid-dep=yes",
    ]
    if spec.preempt:
        for flag in job.profile.preempt_flags:
            key, _, value = flag.partition("=")
            lines.append(f"{key}={sbatch_value(value, 'preempt')}" if value else key)
    # the escape hatch, always last: options the job spec has no field for
    for item in spec.sbatch_extra:
        key, sep, value = item.partition("=")
        lines.append(f"{key}={sbatch_value(value, 'sbatch_extra')}" if sep else key)
    return lines


def step_environment(job: ResolvedJob) -> dict[str, str]:
    """Values every process of the step gets: the fixed ones, the GPU watch's settings for
    `train launch` (GPU jobs with the watch on), then the job's own."""
    watch = job.gpu_watch
    return {**container.job_environment(job.profile.nccl_env, job.spec.runtime),
            **({} if watch is None else {
                contract.GPU_WATCH_INTERVAL_VAR: str(watch.interval),
                contract.GPU_IDLE_THRESHOLD_VAR: str(watch.idle_threshold),
                contract.GPU_IDLE_MINUTES_VAR: str(watch.idle_minutes)}),
            **dict(job.env_values)}


def train_argv(job: ResolvedJob) -> list[str]:
    budget = job.time_budget_seconds
    tail = ["--out", job.run_dir]
    if job.spec.gpus_per_node > 0:
        # a GPU job trains on the GPU or stops at once (never the CPU for its walltime)
        tail += ["--device", "cuda"]
    if job.results_csv is not None:
        # absolute, after the user's own (the last one counts): every runtime, whatever
        # its working directory, writes the file that was checked at submission
        tail += ["--results-csv", job.results_csv]
    if budget is not None:
        tail += ["--time-budget", str(budget)]
    return [*job.spec.workload, *tail]


def step_segments(job: ResolvedJob) -> list[list[str]]:
    """The step's argv in the parts the script shows on lines of their own: srun and its
    options, every task's wrapper, the container runtime's (from its per-node wrapper on;
    none for runtime none), the launcher up to its `--` (where there is one), the
    program."""
    spec = job.spec
    srun = ["srun", "--kill-on-bad-exit=1", f"--nodes={spec.nodes}",
            f"--ntasks-per-node={job.ntasks_per_node}",
            f"--cpus-per-task={spec.cpus_per_task}", *spec.srun_extra]
    prefix = container.runtime_prefix(
        spec.runtime, image=spec.image, gpus=spec.gpus_per_node > 0,
        binds=(*job.binds, *job.launcher_binds), run_dir=job.run_dir,
        env=step_environment(job))
    wrapper = [ENGINE_PYTHON, "-E", "-s", engine_dir(job), "task", "--"]
    if spec.entry == "command":
        run = command_as_run(spec.workload, spec.runtime, spec.python)
    elif spec.entry == "navsim":
        # through the feature cache's phase: computed once per chain
        run = navsimstep.step_argv(navsimstep.navsim_command(job))
    else:
        # never `python -m train`: a train.py in the submit folder would be imported instead
        run = [*module_argv(spec.python), "run", *train_argv(job)]
    if job.launch == "single" and spec.entry == "train" and spec.min_free_mb is None \
            and job.gpu_watch is None and spec.chdir is None:
        return [srun, wrapper, prefix, run]  # `train run` alone: nothing to do before it
    # an image without `train`: the client's own launcher, bound in (train.node.nodeentry)
    start = entry_argv(spec.python) if job.launcher_binds else module_argv(spec.python)
    launch = [*start, "launch", f"--mode={job.launch}"]
    if job.launch == "torchrun":
        launch.append(f"--nproc-per-node={max(1, spec.gpus_per_node)}")
    if spec.workers:
        launch += [f"--workers={spec.workers}",
                   f"--worker-mem-mb={parse_mem(spec.worker_mem, 'worker_mem')}"]
    if spec.min_free_mb is not None:
        launch += [f"--min-free-mb={spec.min_free_mb}", f"--wait-timeout={spec.wait_timeout}"]
        if spec.fallback_batch is not None:
            launch.append(f"--fallback-batch={spec.fallback_batch}")
    if spec.chdir is not None:
        launch.append(f"--chdir={program_dir(job)}")
    return [srun, wrapper, prefix, [*launch, "--"], run]


def step_argv(job: ResolvedJob) -> list[str]:
    return [arg for part in step_segments(job) for arg in part]




def engine_dir(job: ResolvedJob) -> str:
    """The engine's entry in its copy in the run folder (train.batch.engine.install, at
    submit): a file, so that a folder's copy that is gone or replaced is said by python3,
    never run in its place."""
    return f"{job.run_dir}/{ENGINE_DIR}/__main__.py"


def job_record(job: ResolvedJob) -> dict[str, Any]:
    """What the chain engine needs of the job, complete (nothing left to work out on the
    batch host): written once at submit into chain.json ("job")."""
    spec = job.spec
    env = dict(job.env_values)
    return {
        "run_dir": job.run_dir,
        "max_chunks": job.chunks,
        "walltime_seconds": job.minutes * 60,
        "time_min_seconds": job.time_min * 60,
        "stop_signal": job.stop,
        "stop_margin": job.margin,
        "stop_mode": spec.stop_mode,
        # how the batch shell hands the stop signal to the step. usr1: USR1 to srun, which
        # has Slurm signal every process of the step (the docker task wrapper turns it into
        # STOP_SIGNAL for the container, outside the step). scancel: `scancel
        # --signal=TERM` to the job's steps, for TERM straight to their processes (srun
        # itself must not get TERM: it would end the step)
        "stop_via": "scancel" if job.stop == "TERM" and spec.runtime != "docker" else "usr1",
        # seconds after the step starts before a walltime signal is passed on to it (for a
        # program to start and set its handler), and in stop mode kill between the TERM
        # and the KILL: well inside the signal margin
        "step_grace": max(1, min(STEP_GRACE_SECONDS, job.margin // 2)),
        "kill_grace": max(1, min(STEP_GRACE_SECONDS, job.margin // 3)),
        # the ranks that say when they are ready for the stop signal (one file each), and
        # the step's tasks (each records its end)
        "step_ranks": spec.nodes * job.processes_per_node,
        "step_tasks": spec.nodes * job.ntasks_per_node,
        "requeue": spec.requeue,
        "requeue_allowed": requeue_allowed(job),
        # a program other than `train run` that exits 0 before its stop signal is done
        "complete_on_success": spec.entry != "train",
        "entry": spec.entry,
        "runtime": spec.runtime,
        "image": spec.image,
        "resume_args": list(spec.resume_argv),
        "resume_shown": masked_argv(spec.resume_argv),  # as the log says them
        "save_paths": save_paths(job),
        "program_dir": program_dir(job),  # {newest:GLOB} is from here
        # a sweep task's identity (its index in the array, its value); None for a chain of
        # its own
        "sweep_task": {"index": int(env[SWEEP_INDEX_VAR]), "value": env.get(SWEEP_VALUE_VAR)}
        if SWEEP_INDEX_VAR in env else None,
    }


def chain_lines(job: ResolvedJob) -> list[str]:
    """The chain's settings as comments the researcher reads (the engine reads the same
    from the job record): its bound, entry, runtime and stop, the resume arguments
    (secrets masked) and where the program saves, besides the run folder."""
    record = job_record(job)

    def word(value: object) -> str:
        return ("yes" if value else "no") if isinstance(value, bool) else str(value)

    shown = {"max_chunks": job.chunks, "walltime": format_time(job.minutes),
             "entry": job.spec.entry, "runtime": job.spec.runtime,
             **{k: record[k] for k in ("stop_signal", "stop_margin", "stop_mode",
                                       "stop_via", "requeue", "requeue_allowed")}}
    lines = ["# the chain, as the job record (chain.json) gives it to the engine:",
             *textwrap.wrap(" ".join(f"{k}={word(v)}" for k, v in shown.items()),
                            STEP_WIDTH, initial_indent="#   ", subsequent_indent="#   ")]
    if job.stop != "none":  # (the #SBATCH --signal line is the engine's, not the program's)
        lines.append(f"#   --signal=B:USR1 wakes the engine; it passes the stop on to the "
                     f"program as {job.stop}")
    if record["resume_args"]:
        lines.append("#   resume args: " + shlex.join(record["resume_shown"]))
        if any("{newest:" in word for word in record["resume_args"]):
            lines.append(f"#   program dir: {record['program_dir']} ({{newest:GLOB}} is "
                         "from here)")
    if record["save_paths"]:
        lines.append("#   save paths: " + shlex.join(record["save_paths"]))
    return lines


def render(job: ResolvedJob) -> str:
    """The sbatch script every chunk of the job's chain runs (its chunk number is the
    script's first argument: `sbatch SCRIPT 1`, and each chunk submits the next): the
    #SBATCH lines, the job's environment, the site set-up, and the step command handed to
    the chain engine, which starts it, passes it the stop signal and extends the chain."""
    spec = job.spec
    out: list[str] = ["#!/bin/bash"]
    out += [f"#SBATCH {line}" for line in sbatch_options(job)]
    out += textwrap.wrap(
        f"Rendered by `train render` (cluster {job.profile.name}): every chunk of the chain "
        "runs this script. The chain engine, which `train submit` copies into the run "
        "folder, starts the step below on every node (each task under its wrapper), passes "
        "it the stop signal and submits the next chunk. Change the job spec and render "
        "again instead of editing it.", STEP_WIDTH, initial_indent="# ",
        subsequent_indent="# ")
    out.append("set -euo pipefail")
    values = step_environment(job)
    names = [*job.env_names, *(values if spec.runtime == "apptainer" else ())]
    env = {**values, contract.ENV_NAMES_VAR: " ".join(dict.fromkeys(names))}
    out.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    out += chain_lines(job)
    out = [line for setting in out for line in _literal_settings(setting)]
    if spec.runtime == "apptainer":
        out += apptainer_setup(job.profile.modules)
    out += _literal_settings(f"{ENGINE_VAR}={shlex.quote(engine_dir(job))}")
    for text, name in _named_texts(job).items():
        out += [f"# {_NAMED[name]}", "# shellcheck disable=SC2016  # literal text",
                f"{name}={shlex.quote(text)}"]
    return "\n".join([*out, *step_command_lines(job), ""])


# a site set-up line that brings apptainer itself (module load/add, ml): needed only where
# apptainer is not on PATH already
_LOADS_APPTAINER = re.compile(r"^\s*(module\s+(load|add)|ml)\s.*\b(apptainer|singularity)\b")


def apptainer_setup(modules: Sequence[str]) -> list[str]:
    """The batch script's lines before an apptainer step: the submitting shell's Apptainer
    settings dropped (sbatch hands its whole environment on: an APPTAINER_BIND or an
    APPTAINERENV_PYTHONPATH there would reach the container past --cleanenv), then the
    site's set-up as the profile gives it; a line that loads apptainer runs only where
    apptainer is not on PATH already."""
    out = ["# the submitting shell's Apptainer settings (binds, APPTAINERENV_ values) are "
           "not the job's", 'unset "${!APPTAINER@}" "${!SINGULARITY@}"']
    if modules:
        out.append("# site set-up (from the cluster profile); apptainer's module only where "
                   "apptainer is not on PATH")
    for line in modules:
        if _LOADS_APPTAINER.match(line):
            out += ["if ! command -v apptainer >/dev/null 2>&1; then", f"    {line}", "fi"]
        else:
            out.append(line)
    return out


def _literal_settings(line: str) -> list[str]:
    """A setting line, after shellcheck's note that its quoted `$` or backtick is literal
    (a value the user gave: --env, --out, --resume-args, --save-path)."""
    if line.startswith("#") or not any(c in line for c in "$`"):
        return [line]
    return ["# shellcheck disable=SC2016  # literal values, quoted on purpose", line]


def _named_texts(job: ResolvedJob) -> dict[str, str]:
    """The long `-c` texts of the step that the command line names by a variable: the
    train package's entry point, and the bound launcher's."""
    named: dict[str, str] = {}
    argv = step_argv(job)
    if entry_code() in argv:
        named[entry_code()] = PYTHON_M_TRAIN_VAR
    if nodeentry_code() in argv:
        named[nodeentry_code()] = BOUND_LAUNCHER_VAR
    return named


def step_command_lines(job: ResolvedJob) -> list[str]:
    """The chunk handed to the engine, then the step as one shell command line, wrapped
    with ` \\` at about STEP_WIDTH columns: each part (srun, the task wrapper, the runtime,
    the launcher, the program) on lines of its own, an option and its value kept together,
    every argument shell-quoted, the long `-c` texts and the engine by their variables'
    names."""
    named = {**_named_texts(job), engine_dir(job): ENGINE_VAR}
    literal = any(c in arg for arg in step_argv(job) if arg not in named for c in "$`")
    lines = [f'exec {ENGINE_PYTHON} -E -s "${ENGINE_VAR}" chunk "$0" "$@" --']
    for part in step_segments(job):
        if not part:
            continue
        words = [f'"${named[arg]}"' if arg in named and (arg == engine_dir(job) or (
            i and part[i - 1] == "-c")) else shlex.quote(arg) for i, arg in enumerate(part)]
        lines += _fill(_units(part, words), "    ")
    note = ["# shellcheck disable=SC2016  # literal arguments, quoted on purpose"]
    return [*(note if literal else []), *(line + " \\" for line in lines[:-1]), lines[-1]]


def _units(argv: Sequence[str], words: Sequence[str]) -> list[str]:
    """The words, an option without `=` joined to the value after it."""
    units: list[str] = []
    i = 0
    while i < len(words):
        if argv[i].startswith("-") and "=" not in argv[i] and argv[i] != "--" \
                and i + 1 < len(words) and not argv[i + 1].startswith("-"):
            units.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            units.append(words[i])
            i += 1
    return units


def _fill(words: Sequence[str], indent: str) -> list[str]:
    lines = [indent + words[0]]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) + 2 > STEP_WIDTH:
            lines.append(indent + word)
        else:
            lines[-1] += " " + word
    return lines
