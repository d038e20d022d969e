"""Rendering: a resolved job -> sbatch script text. A pure function, golden-tested.

`#SBATCH` lines come in a fixed order. Every value in the shell part is `shlex.quote`d, so
any argument (quotes, `$(...)`, backticks, `;`, newlines) reaches the training process
byte for byte. `#SBATCH` lines are parsed by sbatch, not by a shell: values there are bare
when they are plain, and double-quoted otherwise.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from train import container
from train.clusters.profiles import format_mem, format_time, parse_mem
from train.errors import ConfigError
from train.slurm.job import ResolvedJob, chunk_names, navsim_command

_PLAIN = re.compile(r"^[A-Za-z0-9_.,:=@%/+|-]+$")
LIBRARY_NAME = "job-lib.sh"

# apptainer --cleanenv drops the host environment; the per-task SLURM and rank variables
# `train launch` reads are handed in through APPTAINERENV_ copies made in each task.
APPTAINER_TASK_ENV = (
    "for v in " + " ".join(container.PASS_THROUGH) + "; do "
    'if [ -n "${!v+x}" ]; then export "APPTAINERENV_$v=${!v}"; fi; done; exec "$@"'
)


@dataclass(frozen=True)
class RenderContext:
    run_dir: str  # absolute
    library: str  # text of slurm/job-lib.sh


def library_path() -> Path:
    """The job library shipped in the package (slurm/job-lib.sh links to it)."""
    return Path(__file__).with_name(LIBRARY_NAME)


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
    style = job.profile.gpu_request
    if style == "gpus_per_node":
        kind = f"{job.spec.gpu_type}:" if job.spec.gpu_type else ""
        return f"--gpus-per-node={kind}{gpus}"
    if style == "gres_typed" and job.spec.gpu_type:
        return f"--gres=gpu:{job.spec.gpu_type}:{gpus}"
    return f"--gres=gpu:{gpus}"


def sbatch_options(job: ResolvedJob, chunk: int, run_dir: str) -> list[str]:
    spec = job.spec
    name = chunk_names(spec)[chunk - 1]
    pairs: list[tuple[str, str | None]] = [
        ("job-name", name),
        ("account", spec.account),
        ("partition", job.partition),
        ("qos", job.qos),
        ("constraint", spec.constraint),
        ("nodes", str(spec.nodes)),
        ("ntasks-per-node", str(job.ntasks_per_node)),
        ("cpus-per-task", str(spec.cpus_per_task)),
        ("mem", format_mem(job.mem_mb)),
    ]
    lines = [f"--{k}={sbatch_value(v, k.replace('-', '_'))}" for k, v in pairs if v]
    gpu = gpu_option(job)
    if gpu:
        lines.append(gpu)
    lines += [
        f"--time={format_time(job.minutes)}",
        f"--signal=B:USR1@{job.margin}",
        "--open-mode=append",
        f"--output={sbatch_value(run_dir + '/logs/%x-%j.out', 'out')}",
        f"--error={sbatch_value(run_dir + '/logs/%x-%j.err', 'out')}",
        "--requeue" if spec.requeue else "--no-requeue",
    ]
    if spec.preempt:
        for flag in job.profile.preempt_flags:
            key, _, value = flag.partition("=")
            lines.append(f"{key}={sbatch_value(value, 'preempt')}" if value else key)
    return lines


def train_argv(job: ResolvedJob, run_dir: str) -> list[str]:
    budget = job.time_budget_seconds
    tail = ["--out", run_dir]
    if budget is not None:
        tail += ["--time-budget", str(budget)]
    return [*job.spec.workload, *tail]


def step_argv(job: ResolvedJob, run_dir: str) -> list[str]:
    spec = job.spec
    srun = ["srun", "--kill-on-bad-exit=1", f"--nodes={spec.nodes}",
            f"--ntasks-per-node={job.ntasks_per_node}",
            f"--cpus-per-task={spec.cpus_per_task}"]
    prefix = container.runtime_prefix(
        spec.runtime, image=spec.image, gpus=spec.gpus_per_node > 0,
        binds=job.profile.binds, run_dir=run_dir,
        env=container.job_environment(job.profile.nccl_env))
    if spec.runtime == "apptainer":
        prefix = ["bash", "-c", APPTAINER_TASK_ENV, "train-task", *prefix]
    if spec.entry == "command":
        run = list(spec.workload)
    elif spec.entry == "navsim":
        run = navsim_command(job)
    else:
        run = [spec.python, "-m", "train", "run", *train_argv(job, run_dir)]
    if job.launch == "single":
        return [*srun, *prefix, *run]
    launch = [spec.python, "-m", "train", "launch", f"--mode={job.launch}"]
    if job.launch == "torchrun":
        launch.append(f"--nproc-per-node={max(1, spec.gpus_per_node)}")
    if spec.workers:
        launch += [f"--workers={spec.workers}",
                   f"--worker-mem-mb={parse_mem(spec.worker_mem, 'worker_mem')}"]
    return [*srun, *prefix, *launch, "--", *run]




def _strip_header(library: str) -> str:
    lines = library.splitlines()
    while lines and (lines[0].startswith("#!") or lines[0].startswith("# shellcheck")):
        lines.pop(0)
    return "\n".join(lines).strip("\n")


def render(job: ResolvedJob, chunk: int, ctx: RenderContext) -> str:
    """The sbatch script of chunk `chunk` (1-based) of the job."""
    spec = job.spec
    if not 1 <= chunk <= spec.chunks:
        raise ValueError(f"chunk {chunk} is outside 1..{spec.chunks}")
    run_dir = ctx.run_dir
    out: list[str] = ["#!/bin/bash"]
    out += [f"#SBATCH {line}" for line in sbatch_options(job, chunk, run_dir)]
    out += [
        f"# Rendered by `train render` for cluster {job.profile.name}: chunk {chunk} of "
        f"{spec.chunks}.",
        "# Edit the job spec and render again rather than editing this file.",
        "set -euo pipefail",
        "",
        f"RUN_DIR={shlex.quote(run_dir)}",
        f"CHUNK={chunk}",
        f"CHUNKS={spec.chunks}",
        f"REQUEUE={1 if spec.requeue else 0}",
        # programs other than `train run` write no COMPLETE marker: success completes
        f"COMPLETE_ON_SUCCESS={0 if spec.entry == 'train' else 1}",
        f"RUNTIME={shlex.quote(spec.runtime)}",
        f"IMAGE={shlex.quote(spec.image or '')}",
    ]
    env = container.job_environment(job.profile.nccl_env)
    out.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    if job.profile.modules and spec.runtime == "apptainer":
        out += ["", "# site set-up (from the cluster profile)", *job.profile.modules]
    out += ["", "# shellcheck disable=SC2016,SC2054  # literal arguments, quoted on purpose",
            "STEP=(", *_wrap(step_argv(job, run_dir)), ")", "",
            f"# --- {LIBRARY_NAME} (inlined) ---", _strip_header(ctx.library),
            f"# --- end of {LIBRARY_NAME} ---", "", "train_main", ""]
    return "\n".join(out)


def _wrap(argv: Sequence[str]) -> list[str]:
    return ["    " + shlex.quote(arg) for arg in argv]
