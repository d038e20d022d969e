"""A SLURM job's spec: what to run where, from the YAML file and flags, and the checks the
spec makes of itself (each value alone, and the values together; NAVSIM's are
train.client.slurm.navsim's). Its resolution against a cluster profile is
train.client.slurm.resolve.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, fields

from train.client.clusters.units import parse_time
from train.client.slurm import navsim, resumeargs
from train.client.slurm.jobitems import (
    SBATCH_OWNED,
    SRUN_OWNED,
    check_env_item,
    check_extra_option,
    parse_bind,
)
from train.client.slurm.navsim import NAVSIM_SCRIPT, NAVSIM_SPLIT, NAVSIM_STRATEGIES
from train.common.errors import ConfigError
from train.common.fields import check_value, opt
from train.common.hostmem import DEFAULT_WORKER_MEM_MB

LAUNCH_MODES = ("auto", "torchrun", "tasks")
STOP_SIGNALS = ("USR1", "TERM", "none")
# signal: the program gets the stop signal and checkpoints; kill: the tool ends it itself
STOP_MODES = ("signal", "kill")
ENTRIES = ("train", "command", "navsim")
RUNTIMES = ("none", "apptainer", "docker")
# the Python a job runs where none is given: the nodes' (or the image's) python3
DEFAULT_PYTHON = "python3"
# CPUs for each process a node runs (a GPU rank, or the one process of a CPU job) where
# --cpus-per-task is not given: Gilbreth's documented example and the field notes' jobs
# give a GPU 4. Under torchrun the node's one task runs every rank, so it gets 4 per GPU.
CPUS_PER_PROCESS = 4
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_CHUNKS = 10
MAX_CHUNKS_LIMIT = 1000  # years of walltime at any site; beyond it, a typo


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
                     "job). Not given: command where a program follows -- (any word "
                     "but a `train run` workload or option), else train.", short="-e", kind=str,
                     choices=ENTRIES)
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
                                 "Default: 10, or 1 for a command (no chain unless asked: "
                                 "this or --total-time).",
                                 kind=int, positive=True, optional=True)
    total_time: str | None = opt(None, "Total walltime of the chain (SLURM format, e.g. "
                                 "3-00:00:00): --max-chunks = total / --time, rounded up.",
                                 kind=str, optional=True)
    time_min: str | None = opt(None, "A chain's chunk may start shorter than --time, down "
                               "to this (SLURM format), where the scheduler has a hole "
                               "that short (before a bigger job or a maintenance): it "
                               "stops at its stop signal and the next chunk goes on; the "
                               "chain's bound counts time, not chunks. Default for a "
                               "chain with a stop signal: a quarter of --time (at least "
                               "a minute more than the signal margin); off: every chunk "
                               "waits for a hole of the whole --time.", kind=str,
                               optional=True)
    launch: str = opt("auto", "auto (one process; for several: tasks for navsim and for a "
                      "script that imports Lightning, torchrun otherwise), torchrun (one "
                      "task per node; torch's launcher starts one process per GPU) or tasks "
                      "(one task per GPU, as Lightning expects).",
                      kind=str, choices=LAUNCH_MODES)
    runtime: str = opt("auto", "Container runtime: apptainer, docker or none (the nodes' "
                       "own --python). auto: apptainer where an image is given, none where "
                       "--python is; a job that needs torch with neither is refused.",
                       kind=str, choices=("auto", *RUNTIMES))
    image: str | None = opt(None, "Container image (SIF path or docker tag) with torch, CUDA "
                            "and NCCL: a job on GPUs, of `train run` or under torch's launcher "
                            "needs one, or --runtime none with a --python that imports torch.",
                            kind=str, optional=True)
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
                                  "command or navsim). {newest:GLOB} in them is the newest "
                                  "path matching GLOB at the chunk's start (by the number in "
                                  "its name, else its time); they are left out while none "
                                  "matches. A placeholder with doubled braces is its "
                                  "letters: {{value}} here and in the command, "
                                  "{{newest:GLOB}} in the command only.", kind=str,
                                  optional=True)
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
                            "visible on the nodes (in the container: bound). In a "
                            "sweep, {task_dir}: each task in its own folder.", kind=str,
                            optional=True)
    sweep_seeds: tuple[int, ...] = opt((), 'A seed sweep, e.g. "4 6 8": one Slurm job '
                                       "array, one task (and chain) per seed, under "
                                       "runs/NAME/seed-S (`train summary NAME` compares "
                                       "them; a command gets TRAIN_SWEEP_VALUE).",
                                       kind=tuple)
    sweep: str | None = opt(None, "A sweep over one flag's values, NAME=V1,V2,...: one Slurm "
                            "job array, one task (and chain) per value, under "
                            "runs/NAME/task-I. Entry train: a `train run` flag (lr=1e-3,5e-4 "
                            "adds --lr V); entry command: a NAME of letters, digits, '_', "
                            "'.' and '-' (optimizer.lr=...), each task gets "
                            "TRAIN_SWEEP_INDEX and TRAIN_SWEEP_VALUE, and {value}, {index} "
                            "and {task_dir} in the command, --resume-args and --save-path "
                            "become its value, index and folder ({{value}}: the letters). "
                            "Spaces around NAME and each value are dropped; no brackets.",
                            kind=str, optional=True)
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
        if str(self.time_min).strip().lower() in ("off", "false"):
            # (YAML reads an unquoted off, as the docs write it, as false)
            object.__setattr__(self, "time_min", "off")
        for f in fields(self):
            check_value(f, getattr(self, f.name))
        if not _NAME_RE.match(self.name):
            raise ConfigError("name", f"must be letters, digits, '.', '_' or '-' (at most 64, "
                              f"starting with a letter or digit); got {self.name!r}")
        if self.total_time is not None:
            _check_total_time(self.total_time, self.max_chunks)
        if self.time_min not in (None, "off"):
            _check_time_min(self.time_min)
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
                              "where to go on. Give --stop-signal USR1 (or TERM) and handle "
                              "it (checkpoint, exit 0); for a program that saves on its own "
                              "and has no handler (accelerate launch, most research code), "
                              "--stop-mode kill --save-path PATH (the chunk ends it at the "
                              "margin, the next goes on from its last save); or run one "
                              "chunk (--max-chunks 1)")
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
            resumeargs.patterns(words)  # {newest:GLOB}: well formed
        for item in self.save_path:
            if not item or any(c in item for c in "\n\r\0"):
                raise ConfigError("save_path", f"{item!r} is not a path (empty, or it holds "
                                  "a line break or NUL)")
            where = os.path.join(os.getcwd(), self.chdir or "", item)
            if os.path.normpath(where) in ("/", "//"):
                raise ConfigError("save_path", f"{item!r} is the whole file system: each "
                                  "chunk's end looks through a save path for files newer "
                                  "than its start; give the folder the program saves to")

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
        navsim.check_presets(self.navsim_split, self.navsim_script)
        if self.entry == "navsim":
            navsim.check_overrides(self.workload, self.navsim_strategy)

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
        return 1 if self.entry == "command" else DEFAULT_CHUNKS


def _check_total_time(total: str, max_chunks: int | None) -> None:
    """--total-time: a SLURM time, never with --max-chunks (it sets them)."""
    if parse_time(total, "total_time") <= 0:
        raise ConfigError("total_time", f"must be more than 0, got {total!r}")
    if max_chunks is not None:
        raise ConfigError("total_time", f"sets --max-chunks from --time (total / walltime, "
                          f"rounded up): give --total-time {total} or --max-chunks "
                          f"{max_chunks}, not both")


def _check_time_min(value: str) -> None:
    """--time-min: a SLURM time over 0 (or off)."""
    try:
        floor = parse_time(value, "time_min")
    except ConfigError as exc:
        raise ConfigError("time_min", f"{str(exc).split(': ', 1)[1]}, or off") from None
    if floor <= 0:
        raise ConfigError("time_min", f"must be more than 0 (or off), got {value!r}")
