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
from train.clusters.profiles import format_mem, format_time
from train.errors import ConfigError
from train.slurm.job import ResolvedJob, chunk_names

_PLAIN = re.compile(r"^[A-Za-z0-9_.,:=@%/+|-]+$")
LIBRARY_NAME = "job-lib.sh"

# Each srun task of a one-task-per-GPU launch becomes one torch rank.
TASK_ENV = ('export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" '
            'WORLD_SIZE="$SLURM_NTASKS" LOCAL_WORLD_SIZE="${SLURM_NTASKS_PER_NODE:-1}"; '
            'export APPTAINERENV_RANK="$RANK" APPTAINERENV_LOCAL_RANK="$LOCAL_RANK" '
            'APPTAINERENV_WORLD_SIZE="$WORLD_SIZE" '
            'APPTAINERENV_LOCAL_WORLD_SIZE="$LOCAL_WORLD_SIZE" '
            'APPTAINERENV_MASTER_ADDR="$MASTER_ADDR" APPTAINERENV_MASTER_PORT="$MASTER_PORT"; '
            'exec "$@"')


class Var(str):
    """An element of the step that is a shell variable reference, expanded at run time."""


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
    py = [*prefix, spec.python]
    workload = train_argv(job, run_dir)
    if job.launch == "torchrun":
        return [*srun, *py, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}",
                f"--nproc-per-node={max(1, spec.gpus_per_node)}", "--rdzv-backend=c10d",
                Var("--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT"),
                Var("--rdzv-id=$SLURM_JOB_ID"), "-m", "train", "run", *workload]
    if job.launch == "tasks":
        return [*srun, "bash", "-c", TASK_ENV, "train-task", *py, "-m", "train", "run",
                *workload]
    return [*srun, *py, "-m", "train", "run", *workload]


def _quote(arg: str) -> str:
    return f'"{arg}"' if isinstance(arg, Var) else shlex.quote(arg)


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
        f"RUNTIME={shlex.quote(spec.runtime)}",
        f"IMAGE={shlex.quote(spec.image or '')}",
    ]
    env = container.job_environment(job.profile.nccl_env)
    out.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    if job.launch != "single":
        out += ["MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
                "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
                "export MASTER_ADDR MASTER_PORT"]
    if job.profile.modules and spec.runtime == "apptainer":
        out += ["", "# site set-up (from the cluster profile)", *job.profile.modules]
    out += ["", "# shellcheck disable=SC2016,SC2054  # literal arguments, quoted on purpose",
            "STEP=(", *_wrap(step_argv(job, run_dir)), ")", "",
            f"# --- {LIBRARY_NAME} (inlined) ---", _strip_header(ctx.library),
            f"# --- end of {LIBRARY_NAME} ---", "", "train_main", ""]
    return "\n".join(out)


def _wrap(argv: Sequence[str]) -> list[str]:
    return ["    " + _quote(arg) for arg in argv]
