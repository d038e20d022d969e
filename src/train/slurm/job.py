"""A SLURM job: its spec (YAML and/or flags) and its validation against a cluster profile.

`resolve` is pure: spec + profile -> ResolvedJob or a ConfigError naming the field and what
is allowed. Nothing is written or submitted before it succeeds.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from train.clusters.profiles import (
    GpuWatch,
    NodeType,
    Profile,
    format_mem,
    format_time,
    parse_mem,
    parse_time,
)
from train.config import RunConfig, check_value, opt, run_config_from_argv
from train.errors import ConfigError, UsageError
from train.gpus import all_bf16_capable
from train.programs import imports_lightning
from train.runtime.hostmem import DEFAULT_WORKER_MEM_MB
from train.secrets import is_secret_name, redact_text
from train.slurm.contract import NAVSIM_PREFETCH_OVERRIDE, NAVSIM_WORKERS_OVERRIDE
from train.workloads import navsim
from train.yamlio import shown

LAUNCH_MODES = ("auto", "torchrun", "tasks")
STOP_SIGNALS = ("USR1", "TERM", "none")
# signal: the program gets the stop signal and checkpoints; kill: the tool ends it itself
STOP_MODES = ("signal", "kill")
ENTRIES = ("train", "command", "navsim")
NAVSIM_SCRIPT = "/opt/navsim/navsim/planning/script/run_training.py"  # navsim.def's checkout
# NAVSIM's usual training split (its scripts/training/*.sh at the pinned commit); the
# Hydra group `train_test_split` has no default there (`???`), so the job always passes one
NAVSIM_SPLIT = "navtrain"
# ddp: the job sets Lightning's strategy; none: the script's own config decides (forks such
# as a run_training_dense.py that hard-code one would clash with an override)
NAVSIM_STRATEGIES = ("ddp", "none")
# a Hydra config name: what train_test_split=NAME can select
_HYDRA_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
NAVSIM_DATA_ROOT = "/data/navsim"  # navsim.def: dataset/, dataset/maps and exp/ under it
# Passed into every container by name (the job's own values at run time), beside the
# rank and SLURM variables container.PASS_THROUGH lists: the walltime contract's TRAIN_*,
# experiment trackers' and model hubs' settings.
PASSED_BY_DEFAULT = ("TRAIN_*", "SLURM_JOB_NAME", "SLURM_STEP_ID", "SLURM_RESTART_COUNT",
                     "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_SUBMIT_DIR",
                     "WANDB_*", "HF_*", "HUGGINGFACE_*", "MLFLOW_*", "COMET_*")
RUNTIMES = ("none", "apptainer", "docker")
# the Python a job runs where none is given: the nodes' (or the image's) python3
DEFAULT_PYTHON = "python3"
# CPUs for each process a node runs (a GPU rank, or the one process of a CPU job) where
# --cpus-per-task is not given: Gilbreth's documented example and the field notes' jobs
# give a GPU 4. Under torchrun the node's one task runs every rank, so it gets 4 per GPU.
CPUS_PER_PROCESS = 4
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A constraint a feature can be ANDed onto: no alternatives, brackets, groups or counts.
_AND_ONLY = re.compile(r"^[^|\[\]()*,]+$")
# alternatives of plain features only: what may go into Slurm's matching OR, [a|b]
_OR_LIST = re.compile(r"[A-Za-z0-9_.:-]+(?:\|[A-Za-z0-9_.:-]+)+")
# `train run` options that the job sets itself.
_RESERVED_RUN_FLAGS = ("--out", "--time-budget")
DEFAULT_MARGIN = 300
DEFAULT_CHUNKS = 10
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: no trailing newline
# names a job may pass through but not set: the batch shell, Slurm or the launcher own them.
# PYTHONPATH is the program's to set (a fork put on the path, as the field notes' NAVSIM
# fork needed): the batch shell runs no Python, and the images set none of their own.
# PYTHONHOME stays: a wrong one stops every Python, `train launch` included.
RESERVED_ENV = {"PATH", "BASH_ENV", "ENV", "HOME", "SHELL", "IFS", "RANK", "LOCAL_RANK",
                "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES", "PYTHONHOME"}
RESERVED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "TRAIN_", "LD_",
                         "APPTAINER", "SINGULARITY")
# Options the renderer writes itself: an extra option may not set them (the field to use).
SBATCH_OWNED = {
    "--nodes": "nodes", "-N": "nodes", "--ntasks": "ntasks_per_node", "-n": "ntasks_per_node",
    "--ntasks-per-node": "ntasks_per_node", "--gres": "gpus_per_node",
    "--gpus": "gpus_per_node", "-G": "gpus_per_node", "--gpus-per-node": "gpus_per_node",
    "--gpus-per-task": "gpus_per_node", "--time": "time", "-t": "time",
    "--signal": "stop_signal and signal_margin", "--output": "out", "-o": "out",
    "--error": "out", "-e": "out", "--job-name": "name", "-J": "name",
    "--account": "account", "-A": "account", "--partition": "partition", "-p": "partition",
    "--qos": "qos", "-q": "qos", "--constraint": "constraint", "-C": "constraint",
    "--mem": "mem", "--mem-per-cpu": "mem", "--mem-per-gpu": "mem",
    "--cpus-per-task": "cpus_per_task", "-c": "cpus_per_task",
    "--requeue": "requeue", "--no-requeue": "requeue", "--open-mode": "(none: the chain "
    "appends to its logs)", "--kill-on-invalid-dep": "(none: the chain needs it)",
    "--dependency": "(none: the chain sets it)", "-d": "(none: the chain sets it)",
    "--array": "(none)", "-a": "(none)", "--chdir": "out", "-D": "out",
    "--export": "env", "--export-file": "env", "--wrap": "(nothing: the job is the script)",
    "--hold": "(nothing: every chunk after the first would stay held)",
    "--test-only": "(nothing: train render is the dry run)",
    "--clusters": "cluster (the chain's own sbatch/scancel work on one cluster)",
    "--cpus-per-gpu": "cpus_per_task", "--ntasks-per-gpu": "ntasks_per_node",
    "--batch": "(nothing)",
}
SRUN_OWNED = {
    **{k: v for k, v in SBATCH_OWNED.items() if k not in ("--output", "-o", "--error", "-e")},
    "--kill-on-bad-exit": "(nothing: a failed rank ends the step)",
    "--jobid": "(nothing: the step runs in its own job)",
    "--multi-prog": "entry command (one program for every task)",
}
MAX_CHUNKS_LIMIT = 1000  # years of walltime at any site; beyond it, a typo


def check_env_item(item: str) -> tuple[str, str | None]:
    """`NAME` (passed through) or `NAME=VALUE` -> (name, value or None)."""
    name, sep, value = item.partition("=")
    if not ENV_NAME_RE.fullmatch(name):
        raise ConfigError("env", f"{name!r} is not a variable name (letters, digits and "
                          f"'_', not starting with a digit), in {item!r}")
    if "\0" in value:
        raise ConfigError("env", f"the value of {name} holds a NUL byte")
    if sep and (name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)):
        raise ConfigError("env", f"{name} is set by Slurm, the job or the launcher (the batch "
                          "shell depends on it); it cannot be given a value here")
    # by name: API_KEYS, PGPASSWORD, MYSQL_PWD, GITHUB_PAT, *_PASSPHRASE, *_PRIVATE_KEY;
    # by value: a password in a URL (DATABASE_URL=postgres://u:p@h/db), token=...,
    # "--password X" in a command line, a JWT or a well-known token format
    if sep and (is_secret_name(name) or redact_text(value) != value):
        why = ("its name" if is_secret_name(name) else "its value holds a credential: "
               "a URL's user:password@, token=..., --password X")
        raise ConfigError("env", f"{name} looks like a secret ({why}): a value given here "
                          f"is written into the job script; pass it through by name "
                          f"instead (--env {name} exports it from where you submit; set "
                          f"it there)")
    return name, (value if sep else None)


@dataclass(frozen=True)
class Bind:
    src: str
    dst: str
    read_only: bool = False

    @property
    def spec(self) -> str:
        """SRC[:DST][:ro], the form apptainer --bind and docker -v both take."""
        if self.src == self.dst and not self.read_only:
            return self.src
        return f"{self.src}:{self.dst}" + (":ro" if self.read_only else "")


def parse_bind(item: str, base: str | None = None) -> Bind:
    """SRC[:DST[:ro|rw]]; SRC is made absolute from `base` (or the working directory)."""
    parts = item.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ConfigError("bind", f"{item!r} is not SRC, SRC:DST or SRC:DST:ro")
    if any(c in item for c in "\n\0,"):
        raise ConfigError("bind", f"{item!r}: a path with a newline, NUL or ',' cannot be "
                          "bound (the runtimes split on ',')")
    src = os.path.abspath(os.path.join(base or os.getcwd(), parts[0]))
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    if not dst.startswith("/"):
        raise ConfigError("bind", f"{item!r}: the destination {dst!r} must be an absolute "
                          "path (and a path with ':' in it cannot be bound)")
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise ConfigError("bind", f"{item!r}: the mode must be ro or rw, got {mode!r}")
    return Bind(src=src, dst=os.path.normpath(dst), read_only=mode == "ro")


def check_extra_option(item: str, field_name: str, owned: dict[str, str]) -> None:
    """One option per item, `--name=value`, `--flag` or `-xVALUE`; none the job sets."""
    if not item.startswith("--") or item == "--":
        raise ConfigError(field_name, f"{item!r}: give one long option per item, e.g. "
                          "--reservation=NAME (short and bundled letters are not taken)")
    if any(c in item for c in "\n\r\0"):
        raise ConfigError(field_name, f"{item!r} holds a line break or NUL")
    key = item.split("=", 1)[0]
    if " " in key or len(key) < 4:
        raise ConfigError(field_name, f"{item!r}: give the value with '=' "
                          f"({key.split()[0]}=VALUE), one option per item")
    # Slurm takes any unambiguous prefix of a long option: so are they checked here
    for name, use in owned.items():
        if name.startswith("--") and name.startswith(key):
            how = use if use.startswith("(") else f"(use {use} instead)"
            raise ConfigError(field_name, f"{key} ({name}) is set by the job itself {how}")


@dataclass(frozen=True)
class JobSpec:
    """What to run where; flags override the YAML file, which overrides defaults."""

    name: str = opt("train", "Job and run name; the run directory is runs/NAME.",
                    short="-J", kind=str)
    cluster: str | None = opt(None, "Cluster profile (train clusters lists them; "
                              "`train init` makes it a default).", short="-M", kind=str,
                              optional=True)
    workload: tuple[str, ...] = opt((), "What follows `--`: for entry train, the "
                                    "workload and its `train run` arguments; for command, "
                                    "the command; for navsim, extra Hydra overrides.",
                                    kind=list)
    entry: str = opt("train", "train (`train run`), command (any program, run verbatim: "
                     "under torch's launcher or one rank per task, see --launch) or navsim "
                     "(NAVSIM's Lightning training, nodes/devices/strategy set from the "
                     "job).", short="-e", kind=str, choices=ENTRIES)
    account: str | None = opt(None, "SLURM account.", short="-A", kind=str, optional=True)
    partition: str | None = opt(None, "Partition (not on sites that use constraints).",
                                short="-p", kind=str, optional=True)
    qos: str | None = opt(None, "Quality of service.", short="-q", kind=str, optional=True)
    constraint: str | None = opt(None, "Node constraint, e.g. h200|l40s on Torch.",
                                 short="-C", kind=str, optional=True)
    time: str | None = opt(None, "Walltime per chunk (SLURM format; default: the "
                           "profile's).", short="-t", kind=str, optional=True)
    nodes: int = opt(1, "Nodes.", short="-N", kind=int, positive=True)
    gpus_per_node: int = opt(0, "GPUs per node.", short="-g", kind=int, minimum=0)
    gpu_type: str | None = opt(None, "GPU type, e.g. a100.", kind=str, optional=True)
    cpus_per_task: int | None = opt(None, f"CPUs per task, passed to srun explicitly "
                                    f"(default: {CPUS_PER_PROCESS} for each process the "
                                    f"task runs: {CPUS_PER_PROCESS} x the GPUs per node "
                                    "under torchrun, within the node).", short="-c",
                                    kind=int, positive=True, optional=True)
    mem: str | None = opt(None, "Memory per node, e.g. 50G (default: the CPUs' share of "
                          "the node, plus the DataLoader workers' memory, within the "
                          "node).", kind=str, optional=True)
    ntasks_per_node: int | None = opt(None, "Tasks per node (default: 1 for torchrun, the "
                                      "GPU count for tasks).", kind=int, positive=True,
                                      optional=True)
    max_chunks: int | None = opt(None, "Bound on the chain: walltime-sized jobs, each "
                                 "resuming the previous, submitted one at a time until the "
                                 "work is complete (in requeue mode: runs of the one job). "
                                 "Default: 10, or 1 for a command without a stop signal.",
                                 kind=int, positive=True, optional=True)
    launch: str = opt("auto", "auto (one process; for several: tasks for navsim and for a "
                      "script that imports Lightning, torchrun otherwise), torchrun (one "
                      "task per node; torch's launcher starts one process per GPU) or tasks "
                      "(one task per GPU, as Lightning expects).",
                      kind=str, choices=LAUNCH_MODES)
    runtime: str = opt("auto", "Container runtime: apptainer, docker or none (the nodes' "
                       "own --python). auto: apptainer where an image is given, none where "
                       "--python is; a job that needs torch with neither is refused.",
                       kind=str, choices=("auto", *RUNTIMES))
    image: str | None = opt(None, "Container image (SIF path or docker tag).", kind=str,
                            optional=True)
    requeue: bool = opt(False, "Requeue mode: after each checkpointed stop, requeue this "
                        "same job (from the host batch shell) instead of chaining new ones.",
                        kind=bool)
    stop_signal: str = opt("auto", "Signal the program gets signal_margin seconds before "
                           "the walltime, to checkpoint and exit 0: USR1, TERM or none "
                           "(auto: USR1; none for --entry command; TERM, from the tool "
                           "itself, with --stop-mode kill).", kind=str,
                           choices=("auto", *STOP_SIGNALS))
    signal_margin: int | None = opt(None, "Seconds before the walltime at which the stop "
                                    "signal is sent and by which the trainer's own time "
                                    "budget ends (default: 300, or a quarter of a shorter "
                                    "walltime).", kind=int, positive=True, optional=True)
    time_budget: bool = opt(True, "Give the trainer a time budget of walltime minus the "
                            "margin (signal delivery alone is coarse).", kind=bool)
    stop_mode: str = opt("signal", "signal: at the margin the program gets the stop signal "
                         "and checkpoints itself. kill: for a program with no handler that "
                         "saves on its own every so often: at the margin the tool ends it "
                         "(TERM, then KILL after a grace) and the next chunk continues from "
                         "its last save (the work since is redone; the job log says how "
                         "much).", kind=str, choices=STOP_MODES)
    resume_args: str | None = opt(None, "Arguments added to the program's own in every chunk "
                                  "that follows a checkpointed stop (never in the first "
                                  "chunk of a run), for a program that resumes only when "
                                  "told, e.g. --resume-args=--init_from=resume (entry "
                                  "command or navsim).", kind=str, optional=True)
    save_path: tuple[str, ...] = opt((), "Where the program saves (a file or folder, may "
                                     "repeat; relative paths are from --chdir or the submit "
                                     "folder). A stop counts as checkpointed only when the "
                                     "progress file, a file of the run folder or of a "
                                     "save path changed since the chunk began; otherwise "
                                     "the chain ends 'stopped before any save'.", kind=list)
    workers: int = opt(0, "DataLoader workers per process (checked against memory).",
                       kind=int, minimum=0)
    worker_mem: str = opt(f"{DEFAULT_WORKER_MEM_MB // 1024}G", "Host memory per "
                          "DataLoader worker (the default is from the field notes' "
                          "host-OOM job; give what yours take).", kind=str)
    preempt: bool = opt(False, "Submit as preemptible where the site supports it.",
                        kind=bool)
    out: str | None = opt(None, "Run directory (default: runs/NAME under the submit "
                          "directory).", kind=str, optional=True)
    python: str = opt(DEFAULT_PYTHON, "Python on the nodes (runtime none) or in the image.",
                      kind=str)
    chdir: str | None = opt(None, "Folder the program runs in (default: the submit "
                            "folder), for programs that read relative paths; it must be "
                            "visible on the nodes (in the container: bound).", kind=str,
                            optional=True)
    sweep_seeds: tuple[int, ...] = opt((), 'A seed sweep, e.g. "4 6 8": one Slurm job '
                                       "array, one task (and chain) per seed, under "
                                       "runs/NAME/seed-S (`train summary NAME` compares "
                                       "them; a command gets TRAIN_SWEEP_VALUE).",
                                       kind=tuple)
    sweep: str | None = opt(None, "A sweep over one flag's values, NAME=V1,V2,...: one Slurm "
                            "job array, one task (and chain) per value, under "
                            "runs/NAME/task-I. Entry train: a `train run` flag (lr=1e-3,5e-4 "
                            "adds --lr V); entry command: any NAME, each task gets "
                            "TRAIN_SWEEP_INDEX and TRAIN_SWEEP_VALUE.", kind=str,
                            optional=True)
    sweep_throttle: int | None = opt(None, "At most this many tasks of the sweep's job array "
                                     "run at once (Slurm's array throttle; default: none, the "
                                     "site's per-user limits apply). It bounds every chunk: "
                                     "a throttled sweep's tasks run in requeue mode, each "
                                     "requeued after a checkpointed stop.", kind=int,
                                     positive=True, optional=True)
    env: tuple[str, ...] = opt((), "Environment for the program (may repeat): NAME passes "
                               "the job's own value through at run time (never written "
                               "down), NAME=VALUE sets one.", kind=list)
    bind: tuple[str, ...] = opt((), "Host path the container sees (may repeat): SRC, "
                                "SRC:DST or SRC:DST:ro.", kind=list)
    data: str | None = opt(None, "NAVSIM data directory (holding dataset/, dataset/maps "
                           "and exp/): bound at /data/navsim, where the image expects it.",
                           kind=str, optional=True)
    navsim_split: str = opt(NAVSIM_SPLIT, "NAVSIM's train/test split (a config of its "
                            "common/train_test_split/, e.g. navtrain, navmini, trainval), "
                            "passed as train_test_split=NAME (entry navsim).", kind=str)
    navsim_script: str = opt(NAVSIM_SCRIPT, "NAVSIM training script, an absolute path in "
                             "the image or a bound directory, e.g. a fork's "
                             "run_training_dense.py (entry navsim).", kind=str)
    navsim_strategy: str = opt("ddp", "Lightning strategy: ddp (set by the job) or none "
                               "(no override: the script's config decides, for forks that "
                               "hard-code one) (entry navsim).", kind=str,
                               choices=NAVSIM_STRATEGIES)
    min_free_mb: int | None = opt(None, "Wait until every GPU of the node has this many "
                                  "MiB free before starting (shared nodes); the wait counts "
                                  "against the chunk's time budget and is logged.", kind=int,
                                  positive=True, optional=True)
    wait_timeout: int = opt(3600, "Seconds the GPU memory wait may take at most (it also "
                            "ends 60 s before the chunk's deadline).", kind=int,
                            positive=True)
    fallback_batch: int | None = opt(None, "After the wait times out, train with this "
                                     "--batch-size instead of failing (entry train).",
                                     kind=int, positive=True, optional=True)
    gpu_watch_interval: int | None = opt(None, "GPU jobs: seconds between samples of every "
                                         "GPU's utilisation and memory (runs/NAME/gpu/"
                                         "NODE.csv, shown by `train status`); 0 turns the "
                                         "watch off (default: the cluster profile's).",
                                         kind=int, minimum=0, optional=True)
    gpu_idle_threshold: int | None = opt(None, "GPU jobs: utilisation percent (0-100) under "
                                         "which a GPU counts as idle (default: the cluster "
                                         "profile's; Torch's is its published cancel line).",
                                         kind=int, minimum=0, optional=True)
    gpu_idle_minutes: int | None = opt(None, "GPU jobs: minutes every sample of a GPU must "
                                       "be idle before the log warns (default: the cluster "
                                       "profile's).", kind=int, positive=True, optional=True)
    sbatch_extra: tuple[str, ...] = opt((), "Extra sbatch option (may repeat), e.g. "
                                        "--reservation=NAME, --exclude=NODES, "
                                        "--mail-type=END; options the job sets itself are "
                                        "refused.", kind=list)
    srun_extra: tuple[str, ...] = opt((), "Extra srun option for the job step (may "
                                      "repeat), e.g. --mpi=none.", kind=list)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value(f, getattr(self, f.name))
        if not _NAME_RE.match(self.name):
            raise ConfigError("name", f"must be letters, digits, '.', '_' or '-' (at most 64, "
                              f"starting with a letter or digit); got {self.name!r}")
        if self.max_chunks is not None and self.max_chunks > MAX_CHUNKS_LIMIT:
            raise ConfigError("max_chunks", f"must be at most {MAX_CHUNKS_LIMIT}, got "
                              f"{self.max_chunks}")
        if not self.workload and self.entry == "train":
            object.__setattr__(self, "workload", ("demo",))  # `train submit` alone: demo
        if self.workload and not self.workload[0] and self.entry != "navsim":
            raise ConfigError("workload", "the program's name is empty")
        if not self.workload and self.entry != "navsim":
            example = "python train.py" if self.entry == "command" else "demo --episodes 3000"
            raise ConfigError("workload", f"give what to run after --, e.g. -- {example}")
        for item in self.env:
            check_env_item(item)
        for item in self.bind:
            parse_bind(item)
        for item in self.sbatch_extra:
            check_extra_option(item, "sbatch_extra", SBATCH_OWNED)
        for item in self.srun_extra:
            check_extra_option(item, "srun_extra", SRUN_OWNED)
        self._check_resume()
        if self.entry == "command" and self.stop == "none" and self.chunks > 1 \
                and not self.requeue:
            raise ConfigError("max_chunks", f"{self.chunks} chunks of a command with no stop "
                              "signal: the program would be killed at each walltime without "
                              "a chance to checkpoint, and nothing would tell the next chunk "
                              "where to go on. Give --stop-signal USR1 (or TERM), handle it "
                              "(checkpoint, exit 0), or run one chunk (--max-chunks 1)")
        if self.fallback_batch is not None and self.entry != "train":
            raise ConfigError("fallback_batch", "only `train run` takes --batch-size; your "
                              "program can read TRAIN_* and pick its own batch size")
        if self.fallback_batch is not None and self.min_free_mb is None:
            raise ConfigError("fallback_batch", "is what the GPU memory wait falls back to: "
                              "set min_free_mb too")
        if self.data is not None and self.entry != "navsim":
            raise ConfigError("data", "is for --entry navsim; use --bind for other data")
        if self.gpu_idle_threshold is not None and self.gpu_idle_threshold > 100:
            raise ConfigError("gpu_idle_threshold", f"must be a percentage (0 to 100), got "
                              f"{self.gpu_idle_threshold}")
        if self.gpu_watch_interval is not None and self.gpu_watch_interval > 3600:
            raise ConfigError("gpu_watch_interval", f"must be at most 3600 seconds (one "
                              f"sample an hour), got {self.gpu_watch_interval}; 0 turns "
                              "the watch off")
        self._check_navsim()

    def _check_resume(self) -> None:
        """--stop-mode, --resume-args and --save-path: values the batch shell can use."""
        if self.stop_mode == "kill" and self.stop_signal not in ("auto", "TERM"):
            raise ConfigError("stop_mode", f"kill ends the program with TERM, then KILL: "
                              f"--stop-signal {self.stop_signal} cannot go with it (leave "
                              "--stop-signal out)")
        if self.resume_args is not None:
            if self.entry == "train":
                raise ConfigError("resume_args", "is for --entry command or navsim: "
                                  "`train run` resumes from its checkpoint by itself")
            if any(c in self.resume_args for c in "\n\r\0"):
                raise ConfigError("resume_args", "must be on one line, without NUL")
            try:
                words = shlex.split(self.resume_args)
            except ValueError as exc:
                raise ConfigError("resume_args", f"{self.resume_args!r} cannot be split into "
                                  f"arguments as a shell would: {exc}") from None
            if not words:
                raise ConfigError("resume_args", "is empty: give the arguments the program "
                                  "resumes with, e.g. --resume-args=--init_from=resume")
        for item in self.save_path:
            if not item or any(c in item for c in "\n\r\0"):
                raise ConfigError("save_path", f"{item!r} is not a path (empty, or it holds "
                                  "a line break or NUL)")

    @property
    def resume_argv(self) -> tuple[str, ...]:
        """--resume-args as the program gets them (split as a shell would)."""
        return tuple(shlex.split(self.resume_args)) if self.resume_args else ()

    def _check_navsim(self) -> None:
        """The NAVSIM options: given only with entry navsim; values Hydra and the node take."""
        given = [f.name for f in fields(self) if f.name.startswith("navsim_")
                 and getattr(self, f.name) != f.default]
        if given and self.entry != "navsim":
            raise ConfigError(given[0], "is for --entry navsim")
        if not _HYDRA_NAME_RE.match(self.navsim_split):
            raise ConfigError("navsim_split", f"{self.navsim_split!r} is not a split name "
                              "(letters, digits, '_', '.', '-'): one of NAVSIM's "
                              "common/train_test_split/ configs, e.g. navtrain")
        script = self.navsim_script
        if not script.startswith("/") or any(c in script for c in "\n\r\0"):
            raise ConfigError("navsim_script", f"{script!r} must be an absolute path on one "
                              "line (the script as the image sees it, e.g. "
                              f"{NAVSIM_SCRIPT})")
        if self.entry != "navsim":
            return
        navsim.check_workload(self.workload)
        for arg in self.workload:
            key = arg.split("=", 1)[0].lstrip("+~")
            if key == "train_test_split":
                raise ConfigError("workload", f"{arg!r}: the job passes the split itself; "
                                  "give it with --navsim-split")
            if key == "trainer.params.strategy" and self.navsim_strategy != "none":
                raise ConfigError("workload", f"{arg!r}: the job sets the strategy; give "
                                  "--navsim-strategy none to leave it to your overrides or "
                                  "the script")

    @property
    def stop(self) -> str:
        """The stop signal in force: the field, or the entry's default (TERM, from the
        tool itself, in stop mode kill)."""
        if self.stop_mode == "kill":
            return "TERM"
        if self.stop_signal != "auto":
            return self.stop_signal
        return "none" if self.entry == "command" else "USR1"

    @property
    def chunks(self) -> int:
        """The bound on the chain in force: the field, or the default for the entry."""
        if self.max_chunks is not None:
            return self.max_chunks
        return 1 if self.entry == "command" and self.stop == "none" else DEFAULT_CHUNKS


@dataclass(frozen=True)
class ResolvedJob:
    """A validated job with every value the renderer needs."""

    spec: JobSpec
    profile: Profile
    node: NodeType
    partition: str | None
    qos: str | None
    minutes: int
    mem_mb: int
    ntasks_per_node: int
    launch: str  # single, torchrun or tasks
    margin: int  # seconds
    run_config: RunConfig | None
    # The --constraint value: the user's, narrowed to the alternatives that have gpu_type,
    # with the GPU type's feature ANDed on where the site selects types by feature.
    constraint: str | None = None
    # The GPU type typed into the count (--gres=gpu:TYPE:N) where the site types GRES.
    gres_type: str | None = None
    run_dir: str = ""  # absolute
    # `train run`'s results CSV, absolute (entry train only); the job passes it explicitly
    results_csv: str | None = None
    # what the container sees, as SRC:DST[:ro]: the profile's binds, the job's, NAVSIM's
    # data, the run directory, and the results CSV's directory where it lies outside them
    binds: tuple[str, ...] = ()
    # the program's environment: values set (NAME=VALUE) and names passed through from
    # the job's environment at run time (patterns such as WANDB_* allowed)
    env_values: tuple[tuple[str, str], ...] = ()
    env_names: tuple[str, ...] = ()
    whole_node_mem: bool = False  # --mem=0: Slurm gives the job all of each node's memory
    # the GPU utilisation watch in force (the job's settings over the profile's); None for a
    # job without GPUs or with the watch off
    gpu_watch: GpuWatch | None = None
    # an image without `train` (found at submit, train.images.features): the client's own
    # launcher bound read-only into it, as SRC:DST:ro; empty for an image that has `train`
    launcher_binds: tuple[str, ...] = ()

    @property
    def time_budget_seconds(self) -> int | None:
        if not self.spec.time_budget:
            return None
        return max(10, self.minutes * 60 - self.margin)

    @property
    def stop(self) -> str:
        return self.spec.stop

    @property
    def chunks(self) -> int:
        return self.spec.chunks

    @property
    def processes_per_node(self) -> int:
        if self.launch == "torchrun":
            return max(1, self.spec.gpus_per_node)
        return self.ntasks_per_node

    def resources(self) -> dict[str, Any]:
        """What `train doctor` needs to turn a cause into flags (kept in chain.json)."""
        batch = self.run_config.batch_size if self.run_config is not None else None
        return {"nodes": self.spec.nodes, "gpus_per_node": self.spec.gpus_per_node,
                "ntasks_per_node": self.ntasks_per_node,
                "processes_per_node": self.processes_per_node, "launch": self.launch,
                "mem_mb": self.mem_mb, "node_mem_mb": self.node.mem_mb,
                "workers": self.spec.workers,
                "worker_mem_mb": parse_mem(self.spec.worker_mem, "worker_mem"),
                "batch_size": batch, "partition": self.partition,
                "constraint": self.constraint, "image": self.spec.image,
                "gpu_watch": None if self.gpu_watch is None else {
                    "interval": self.gpu_watch.interval,
                    "idle_threshold": self.gpu_watch.idle_threshold,
                    "idle_minutes": self.gpu_watch.idle_minutes}}


def _choose_node(spec: JobSpec, profile: Profile) -> tuple[NodeType, str | None]:
    if not profile.partitions_allowed:
        if spec.partition:
            raise ConfigError("partition", f"{profile.name} does not use partitions; request "
                              f"GPUs with --constraint (one of "
                              f"{', '.join(profile.constraints)}, alternatives with '|')")
        if not spec.constraint:
            raise ConfigError("constraint", f"{profile.name} needs a constraint instead of a "
                              f"partition: one of {', '.join(profile.constraints)}")
        names = _unbracketed(spec.constraint).split("|")
        unknown = [n for n in names if n not in profile.constraints]
        if unknown:
            raise ConfigError("constraint", f"unknown constraint {unknown[0]!r} on "
                              f"{profile.name}; known: {', '.join(profile.constraints)} "
                              "(alternatives as a|b, or [a|b] for one type on every node)")
        if spec.gpu_type is not None:
            # land only where the requested type is (with none, resolve lists the types)
            names = [n for n in names if spec.gpu_type in profile.constraints[n].gpu_types] \
                or names
        nodes = [profile.constraints[n] for n in names]
        # the job must fit on every alternative it may land on
        merged = NodeType(
            name="|".join(names),
            gpus_per_node=min(n.gpus_per_node for n in nodes),
            gpu_types=tuple(t for n in nodes for t in n.gpu_types),
            cpus_per_node=min(n.cpus_per_node for n in nodes),
            mem_mb=min(n.mem_mb for n in nodes),
            max_minutes=min((n.max_minutes for n in nodes if n.max_minutes is not None),
                            default=None),
            max_nodes=min((n.max_nodes for n in nodes if n.max_nodes is not None),
                          default=None),
            max_gpus=min((n.max_gpus for n in nodes if n.max_gpus is not None), default=None),
            cpu_jobs=all(n.cpu_jobs for n in nodes),
        )
        return merged, None
    partition = spec.partition or profile.default_partition
    if partition is None:
        raise ConfigError("partition", f"{profile.name} requires a partition; one of "
                          f"{', '.join(profile.partitions)}")
    if partition not in profile.partitions:
        raise ConfigError("partition", f"unknown partition {partition!r} on {profile.name}; "
                          f"known: {', '.join(profile.partitions)}")
    return profile.partitions[partition], partition


def _unbracketed(constraint: str) -> str:
    """[a|b] (Slurm's matching OR) without its brackets."""
    if len(constraint) > 2 and constraint[0] == "[" and constraint[-1] == "]":
        return constraint[1:-1]
    return constraint


def _one_type_for_all(spec: JobSpec, constraint: str | None) -> str | None:
    """Alternatives as Slurm's matching OR where the job has several nodes.

    With `a|b` each node of a job may match a different alternative (a DDP job on L40S and
    H200 nodes at once, run at the slower one's pace); `[a|b]` makes every node match the
    same one. A multi-node job's plain alternatives are bracketed; one written as [a|b]
    stays so; other expressions with '|' (with '&', counts or groups) are refused.
    """
    if constraint is None or "|" not in constraint or _unbracketed(constraint) != constraint:
        return constraint
    if spec.nodes == 1 and _unbracketed(spec.constraint or "") == (spec.constraint or ""):
        return constraint
    if _OR_LIST.fullmatch(constraint):
        return f"[{constraint}]"
    raise ConfigError("constraint", f"{constraint!r} on {spec.nodes} nodes: Slurm may give "
                      f"each node a different alternative; give one type for every node "
                      f"with the matching OR [a|b] (alternatives only), or one alternative")


def _gpu_type_request(spec: JobSpec, profile: Profile, node: NodeType,
                      partition: str | None) -> tuple[str | None, str | None]:
    """(--constraint value, type for a typed GRES): how the site is asked for gpu_type.

    Called once gpu_type is known to be on the node set. A type the partition or
    constraint implies needs nothing more; a mixed node set gets the type the site's way,
    or is refused: a validated gpu_type is never dropped.
    """
    constraint = spec.constraint if profile.partitions_allowed else node.name
    gpu_type = spec.gpu_type
    if gpu_type is None or spec.gpus_per_node == 0:
        return constraint, None
    if profile.gpu_type_request == "gres":
        return constraint, gpu_type
    if set(node.gpu_types) == {gpu_type}:
        return constraint, None
    where = f"partition {partition}" if partition else f"constraint {node.name}"
    mixed = f"{where} mixes {', '.join(dict.fromkeys(node.gpu_types))} GPUs"
    if profile.gpu_type_request == "none":
        raise ConfigError("gpu_type", f"{profile.name} cannot request a GPU type "
                          f"(gpu_type_request: none) and {mixed}, so {gpu_type!r} cannot be "
                          f"honoured; choose a partition or constraint with only "
                          f"{gpu_type} GPUs, or set gpu_type_request in your profile")
    feature = profile.gpu_feature(gpu_type)
    if not constraint:
        return feature, None
    if feature in constraint.split("&"):
        return constraint, None
    if not _AND_ONLY.match(constraint):
        raise ConfigError("constraint", f"{constraint!r} cannot take the feature {feature!r} "
                          f"that selects {gpu_type} GPUs ({mixed}): Slurm cannot AND a "
                          f"feature onto alternatives; give one alternative, or features "
                          f"joined with '&'")
    return f"{constraint}&{feature}", None


def _run_config(spec: JobSpec) -> RunConfig:
    """Validate the workload arguments now, as `train run` will parse them on the node."""
    for flag in _RESERVED_RUN_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in spec.workload):
            raise ConfigError("workload", f"{flag} is set by the job (the run directory and "
                              "the walltime); remove it from the workload arguments")
    try:
        return run_config_from_argv(list(spec.workload))
    except ConfigError:
        raise  # names the run config's field (lr, seeds, ...)
    except UsageError as exc:  # argparse: an unknown flag, a flag without its value
        raise ConfigError("workload", str(exc)) from None


def _under(path: Path, roots: Sequence[str]) -> bool:
    return any(path == Path(r) or Path(r) in path.parents for r in roots)


def _paths(spec: JobSpec, profile: Profile, run_config: RunConfig | None) -> dict[str, Any]:
    """The run directory, the results CSV and what the container must bind to reach both.

    Relative paths are taken from the submit directory, where the job starts; the CSV goes
    to `train run` as an absolute path, so every runtime writes the same file.
    """
    run_dir = Path(os.path.abspath(spec.out or os.path.join("runs", spec.name)))
    if run_dir == Path(run_dir.anchor):
        raise ConfigError("out", f"{run_dir} is the file system root; give a directory "
                          "for the run")
    extra = [parse_bind(b) for b in spec.bind]
    if spec.data is not None:
        data = Path(os.path.abspath(spec.data))
        try:
            is_dir = data.is_dir()
        except OSError as exc:  # a name too long for the file system, a link loop
            raise ConfigError("data", f"{shown(str(data))}: {exc.strerror or exc}") from None
        if not is_dir:
            raise ConfigError("data", f"{data} is not a directory (it should hold NAVSIM's "
                              "dataset/ and maps, and exp/ for the experiments)")
        if spec.runtime != "none":  # (on the node itself: the roots are set, see below)
            extra.append(Bind(str(data), NAVSIM_DATA_ROOT))
    for bind in extra:
        if not os.path.exists(bind.src):
            raise ConfigError("bind", f"{bind.src} does not exist (a bind's source is a "
                              "path on the cluster's shared file system)")
        if spec.runtime == "none" and (bind.src != bind.dst or bind.read_only):
            raise ConfigError("bind", f"{bind.spec}: runtime none runs on the node itself "
                              "and can neither show a path elsewhere nor make it read-only; "
                              "use a container runtime or the path itself")
        moved = bind.src != bind.dst or bind.read_only
        if bind.dst == "/" or (moved and _under(run_dir, [bind.dst])):
            raise ConfigError("bind", f"{bind.spec}: the destination would hide the run "
                              f"directory {run_dir} or make it read-only (or cover the "
                              "whole file system)")
    targets = [b.dst for b in extra]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise ConfigError("bind", f"two binds go to {twice[0]}; one destination takes one "
                          "source (--data goes to /data/navsim)")
    # same-path binds: where a host path is visible at the same path inside
    binds = [*profile.binds, str(run_dir), *(b.src for b in extra if b.src == b.dst)]
    csv: Path | None = None
    if run_config is not None:
        if run_config.results_csv is None:
            # the default: beside the run directory, shared by the runs of that directory
            csv = run_dir.parent / "results.csv"
            if spec.runtime != "none" and not _under(csv.parent, binds):
                if csv.parent == Path(csv.parent.anchor):
                    raise ConfigError("out", f"{run_dir} lies directly under "
                                      f"{csv.parent}: the results CSV beside it would need "
                                      "the whole root bound into the container; use a "
                                      "deeper --out or --results-csv")
                binds.append(str(csv.parent))
        else:
            csv = Path(os.path.abspath(run_config.results_csv))
            if spec.runtime != "none" and not _under(csv.parent, binds):
                raise ConfigError("results_csv", f"{csv} is outside what the {spec.runtime} "
                                  f"container sees (the run directory and the profile's "
                                  f"binds: {', '.join(binds)}); put it under one of them")
    specs = [*profile.binds, str(run_dir), *(b.spec for b in extra)]
    specs += [b for b in binds if b not in specs]
    return {"run_dir": str(run_dir), "results_csv": None if csv is None else str(csv),
            "binds": tuple(dict.fromkeys(specs))}


def _environment(spec: JobSpec, profile: Profile) -> dict[str, Any]:
    """The job's NAME=VALUE settings and pass-through names (profile's, then the job's)."""
    values: dict[str, str] = {}
    names: list[str] = [*PASSED_BY_DEFAULT, *profile.env]
    for item in spec.env:
        name, value = check_env_item(item)
        if value is None:
            names.append(name)
        else:
            values[name] = value
    if spec.entry == "navsim" and spec.runtime == "none" and spec.data is not None:
        data = os.path.abspath(spec.data)
        values.update({"OPENSCENE_DATA_ROOT": f"{data}/dataset",
                       "NUPLAN_MAPS_ROOT": f"{data}/dataset/maps",
                       "NAVSIM_EXP_ROOT": f"{data}/exp"})
    return {"env_values": tuple(values.items()),
            "env_names": tuple(n for n in dict.fromkeys(names) if n not in values)}


def resolve(spec: JobSpec, profile: Profile) -> ResolvedJob:
    """Every check that can be made before submission; errors name the field."""
    if profile.account_required and not spec.account:
        raise ConfigError("account", f"{profile.name} requires --account; "
                          f"{profile.account_hint}")
    node, partition = _choose_node(spec, profile)
    qos = spec.qos or profile.default_qos
    if profile.qos_required and not qos:
        raise ConfigError("qos", f"{profile.name} requires --qos; one of "
                          f"{', '.join(profile.qos_limits)}")
    if qos and profile.qos_limits and qos not in profile.qos_limits:
        raise ConfigError("qos", f"unknown QOS {qos!r} on {profile.name}; known: "
                          f"{', '.join(profile.qos_limits)}")
    minutes = parse_time(spec.time, "time") if spec.time else profile.default_minutes
    if minutes <= 0:
        raise ConfigError("time", "must be at least one minute")
    if node.max_minutes is not None and minutes > node.max_minutes:
        raise ConfigError("time", f"{format_time(minutes)} is over the {node.name} limit "
                          f"of {format_time(node.max_minutes)} on {profile.name}")
    qos_limit = profile.qos_limits.get(qos) if qos else None
    if qos_limit is not None and minutes > qos_limit:
        raise ConfigError("time", f"{format_time(minutes)} is over the QOS {qos} limit of "
                          f"{format_time(qos_limit)} on {profile.name}")
    margin = spec.signal_margin if spec.signal_margin is not None \
        else min(DEFAULT_MARGIN, minutes * 60 // 4)
    if margin >= minutes * 60:
        raise ConfigError("signal_margin", f"{margin} s leaves no time in a "
                          f"{format_time(minutes)} walltime; use less than {minutes * 60}")
    if spec.gpus_per_node > node.gpus_per_node:
        raise ConfigError("gpus_per_node", f"{spec.gpus_per_node} is more than the "
                          f"{node.gpus_per_node} GPUs of a {node.name} node")
    if spec.gpu_type is not None:
        if spec.gpus_per_node == 0:
            raise ConfigError("gpu_type", "set gpus_per_node too")
        if spec.gpu_type not in node.gpu_types:
            allowed = ", ".join(node.gpu_types) or "none (untyped GPUs)"
            raise ConfigError("gpu_type", f"{node.name} has no {spec.gpu_type!r} GPUs; "
                              f"it has: {allowed}")
    if spec.gpus_per_node == 0 and node.gpus_per_node > 0 and not node.cpu_jobs:
        what = f"partition {partition}" if partition else f"constraint {node.name}"
        kinds = "/".join(dict.fromkeys(node.gpu_types))
        raise ConfigError("gpus_per_node", f"{what} on {profile.name} is for GPU jobs "
                          f"({node.gpus_per_node} {kinds + ' ' if kinds else ''}GPUs a "
                          "node) and the job asks for none: it would run on the CPU for "
                          "its walltime. Give the GPUs it needs: -g N (--gpus-per-node, 1 "
                          f"to {node.gpus_per_node})")
    constraint, gres_type = _gpu_type_request(spec, profile, node, partition)
    constraint = _one_type_for_all(spec, constraint)
    if node.max_nodes is not None and spec.nodes > node.max_nodes:
        raise ConfigError("nodes", f"{spec.nodes} is over the {node.name} limit of "
                          f"{node.max_nodes} nodes per job")
    if node.max_gpus is not None and spec.nodes * spec.gpus_per_node > node.max_gpus:
        raise ConfigError("gpus_per_node", f"{spec.nodes} x {spec.gpus_per_node} GPUs is "
                          f"over the {node.max_gpus}-GPU limit per job on {node.name}")

    launch = spec.launch
    if spec.entry == "navsim":
        if launch == "torchrun":
            raise ConfigError("launch", "entry navsim runs one task per GPU (Lightning "
                              "expects that); use --launch tasks")
        launch = "tasks"
    elif launch == "auto":
        # a Lightning script wants one task per GPU from Slurm (under torch's launcher its
        # SLURM support, the stop signal's handler included, is off)
        lightning = spec.entry == "command" and imports_lightning(spec.workload, spec.chdir)
        launch = "single" if spec.nodes * max(1, spec.gpus_per_node) == 1 \
            else "tasks" if lightning else "torchrun"
    if launch == "torchrun" and spec.stop == "TERM" and spec.stop_mode != "kill":
        raise ConfigError("stop_signal", "TERM cannot be the stop signal under torch's "
                          "launcher: Slurm signals every process of the step, and the "
                          "launcher takes TERM as the end of the job and fails it. Use USR1 "
                          "(the launcher passes it to the workers), or --launch tasks")
    if launch == "tasks":
        ntasks = spec.ntasks_per_node or max(1, spec.gpus_per_node)
        if spec.gpus_per_node and ntasks != spec.gpus_per_node:
            raise ConfigError("ntasks_per_node", f"one-task-per-GPU launch needs "
                              f"--ntasks-per-node equal to the GPUs per node "
                              f"({spec.gpus_per_node}), got {ntasks}")
    else:
        ntasks = spec.ntasks_per_node or 1
        if ntasks != 1:
            raise ConfigError("ntasks_per_node", f"{launch} launch runs one task per node "
                              f"(it starts the per-GPU processes itself); got {ntasks}. "
                              "Use --launch tasks for one task per GPU")
    # the defaults in force, settled here: the resolved job's spec holds them
    spec = dataclasses.replace(spec, runtime=_runtime(spec, launch),
                               cpus_per_task=_cpus_per_task(spec, node, launch, ntasks))
    cpus = spec.cpus_per_task or 1
    if cpus * ntasks > node.cpus_per_node:
        raise ConfigError("cpus_per_task", f"{ntasks} task(s) x {cpus} CPUs "
                          f"is more than the {node.cpus_per_node} CPUs of a {node.name} node")
    procs = max(1, spec.gpus_per_node) if launch == "torchrun" else ntasks
    per_worker = parse_mem(spec.worker_mem, "worker_mem")
    need = spec.workers * procs * per_worker  # the DataLoader workers' host memory a node
    whole_node = spec.mem is not None and parse_mem(spec.mem, "mem", allow_zero=True) == 0
    if whole_node:
        mem_mb = node.mem_mb  # what Slurm gives for --mem=0 (checked against the workers)
    elif spec.mem is not None:
        mem_mb = parse_mem(spec.mem, "mem")
    else:
        # the CPUs' share of the node's memory (never 0: --mem=0 is the whole node), plus
        # what the workers take, within the node (the workers' check below says if not)
        share = max(1, node.mem_mb * cpus * ntasks // max(1, node.cpus_per_node))
        mem_mb = min(node.mem_mb, share + need)
    if mem_mb > node.mem_mb:
        raise ConfigError("mem", f"{format_mem(mem_mb)} is more than the "
                          f"{format_mem(node.mem_mb)} of a {node.name} node")
    if need > mem_mb:
        _workers_do_not_fit(spec, node, procs, per_worker, mem_mb)
    if spec.runtime != "none" and not spec.image:
        raise ConfigError("image", f"runtime {spec.runtime} needs --image")
    if spec.preempt and not profile.preempt_flags:
        raise ConfigError("preempt", f"{profile.name} has no preemptible jobs")
    run_config = _run_config(spec) if spec.entry == "train" else None
    return ResolvedJob(spec=spec, profile=profile, node=node, partition=partition, qos=qos,
                       minutes=minutes, mem_mb=mem_mb, ntasks_per_node=ntasks, launch=launch,
                       margin=margin,
                       run_config=run_config, constraint=constraint, gres_type=gres_type,
                       whole_node_mem=whole_node, **_paths(spec, profile, run_config),
                       **_environment(spec, profile), gpu_watch=_gpu_watch(spec, profile))


def _runtime(spec: JobSpec, launch: str) -> str:
    """The runtime in force. auto: apptainer with an image (the three sites' runtime), the
    nodes' own Python where --python names one; a job that needs torch with neither is
    refused here, not after the queue wait (the nodes' python3 is the login node's, which
    has no torch)."""
    if spec.runtime != "auto":
        return spec.runtime
    if spec.image:
        return "apptainer"
    what = {"train": "`train run` needs torch", "navsim": "NAVSIM's training needs torch"}
    needs = what.get(spec.entry) or ("torch's launcher (torchrun) needs torch"
                                     if launch == "torchrun" else None)
    if needs is None or spec.python != DEFAULT_PYTHON:
        return "none"
    raise ConfigError("runtime", f"no --runtime and no --image: {needs}, and without them "
                      f"the job runs the nodes' own {DEFAULT_PYTHON}, which has none (it "
                      "would fail after the queue wait). Give a container: --runtime "
                      "apptainer --image X.sif (`train image build base` makes one), or a "
                      "Python environment with torch on the shared file system: --runtime "
                      "none --python /path/to/env/bin/python. `train init --image ...` (or "
                      "--python) makes either your default")


def _cpus_per_task(spec: JobSpec, node: NodeType, launch: str, ntasks: int) -> int:
    """--cpus-per-task in force: the job's, else CPUS_PER_PROCESS for each process a task
    runs (under torchrun the node's one task runs a process per GPU), within the node."""
    if spec.cpus_per_task is not None:
        return spec.cpus_per_task
    per_task = max(1, spec.gpus_per_node) if launch == "torchrun" else 1
    return max(1, min(CPUS_PER_PROCESS * per_task, node.cpus_per_node // max(1, ntasks)))


def _workers_do_not_fit(spec: JobSpec, node: NodeType, procs: int, per_worker: int,
                        mem_mb: int) -> None:
    """The DataLoader workers' memory is over the job's: exit 2 with the counts that fit."""
    need = spec.workers * procs * per_worker
    safe = mem_mb // (procs * per_worker)
    fix = f"use --workers {safe} (at most {safe} per process)" if safe else \
        "use --workers 0 (the data loaded in the training processes)"
    more = f", ask for more memory (--mem, one {node.name} node has " \
        f"{format_mem(node.mem_mb)})" if spec.mem is not None and mem_mb < node.mem_mb \
        and need < node.mem_mb else ""
    default = spec.worker_mem == f"{DEFAULT_WORKER_MEM_MB // 1024}G"
    raise ConfigError("workers", f"{spec.workers} DataLoader workers x {procs} processes "
                      f"per node x {format_mem(per_worker)} (--worker-mem) = "
                      f"{format_mem(need)} is over the job's {format_mem(mem_mb)} per "
                      f"node; {fix}{more}, or give --worker-mem the memory one of your "
                      "workers really takes" + (" (the default 24G is set from the field "
                      "notes' host-OOM job, whose workers took more than 8G each and at "
                      "most 32G)" if default else ""))


def _gpu_watch(spec: JobSpec, profile: Profile) -> GpuWatch | None:
    """The job's GPU watch settings, each from the job or else the profile."""
    if spec.gpus_per_node == 0:
        return None
    base = profile.gpu_watch
    watch = GpuWatch(
        interval=base.interval if spec.gpu_watch_interval is None
        else spec.gpu_watch_interval,
        idle_threshold=base.idle_threshold if spec.gpu_idle_threshold is None
        else spec.gpu_idle_threshold,
        idle_minutes=base.idle_minutes if spec.gpu_idle_minutes is None
        else spec.gpu_idle_minutes)
    return watch if watch.interval > 0 else None


def navsim_command(job: ResolvedJob) -> list[str]:
    """NAVSIM's training command with Lightning's trainer matching the job (Hydra overrides
    of navsim's default_training.yaml at the pinned commit; it has no `devices` key)."""
    spec = job.spec
    gpus = spec.gpus_per_node
    # bf16 only if every GPU type the job can land on has it (the trainer's own rule)
    types = (spec.gpu_type,) if spec.gpu_type else job.node.gpu_types
    precision = "bf16-mixed" if all_bf16_capable(types) else "16-mixed"
    strategy = [] if spec.navsim_strategy == "none" \
        else [f"trainer.params.strategy={spec.navsim_strategy}"]
    prefetch = [f"{NAVSIM_PREFETCH_OVERRIDE}=null"] if spec.workers == 0 else []
    return [spec.python, spec.navsim_script,
            f"train_test_split={spec.navsim_split}",
            # one Lightning root for every chunk: Lightning's SLURM support saves its
            # checkpoint there on the walltime signal and resumes from it (ckpt_path None).
            # default_training.yaml has the key (${output_dir}, a new directory per run):
            # overridden, not added with '+' (Hydra refuses to add an existing key)
            f"trainer.params.default_root_dir={job.run_dir}/lightning",
            f"trainer.params.num_nodes={spec.nodes}",
            f"+trainer.params.devices={max(1, gpus)}",
            *strategy,
            f"trainer.params.accelerator={'gpu' if gpus else 'cpu'}",
            f"trainer.params.precision={precision if gpus else 32}",
            f"{NAVSIM_WORKERS_OVERRIDE}={spec.workers}",
            *prefetch,
            *navsim.cache_overrides(job.run_dir, spec.workload),
            *spec.workload]


def job_from_sources(file_values: dict[str, Any] | None, flags: dict[str, Any]) -> JobSpec:
    from train.config import build

    return build(JobSpec, file_values, flags)
