"""The contract between the chain engine (train.batch.chunk, on the batch host) and the
rest of train, defined once.

File names in the run directory, the chain's event names and the progress file's format
live here; the engine, the client, the runner and the CLI import them from here. Names and
pure helpers only, nothing heavy: the login node, the batch host and every node read it.
"""

import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

# -- files in the run directory -------------------------------------------------------
COMPLETE_MARKER = "COMPLETE"  # the work is done (written by `train run`, rank 0)
PROGRESS_FILE = "progress"  # one line "DONE TOTAL": work units (episodes over all seeds)
CHAIN_RECORD = "chain.json"  # written by `train submit`
CHAIN_IDS = "chain.ids"  # one line "CHUNK JOBID" per chunk, appended by whoever submits it
CHAIN_EVENTS = "chain.events"  # one line "UNIXTIME CHUNK JOBID EVENT [DETAIL]" per event
LOG_DIR = "logs"
JOBS_DIR = "jobs"
JOB_SCRIPT = "chain.sbatch"  # in JOBS_DIR: the one script every chunk of the chain runs
SWEEP_RECORD = "sweep.json"  # a seed sweep's directory: its chains, one per seed
# Written by the chain engine when a chunk of the run ends by a checkpointed stop (something
# was saved since it began): from then on every chunk gets the job's --resume-args.
SAVED_MARKER = "checkpointed"
# A program's final metrics, a JSON object of numbers (TRAIN_METRICS_FILE names it): what
# `train summary` shows for a command's sweep (train.client.slurm.sweepmetrics).
METRICS_FILE = "metrics.json"

# -- events ---------------------------------------------------------------------------
EV_STARTED = "started"  # detail: "RESTARTS DONE TOTAL"
# a chain with a floor (--time-min): the time limit Slurm started the chunk with (shorter
# than --time where backfill fitted it into a hole), and --time, in seconds: "LIMIT ASKED"
EV_LIMIT = "limit"
EV_EXTENDED = "extended"  # detail: the next chunk's job id
EV_EXTEND_FAILED = "extend_failed"  # detail: sbatch's message
EV_STOPPED = "stopped"  # a clean, checkpointed stop; the next chunk continues. "DONE TOTAL"
EV_COMPLETE = "complete"
EV_FAILED = "failed"  # detail: "CODE [NODE]": the first failing task's code, its node
EV_NO_PROGRESS = "no_progress"  # a chunk ended without adding work; the chain stops
EV_INCOMPLETE = "incomplete"  # the bound on chunks (or restarts) was reached first
EV_REQUEUED = "requeued"  # requeue mode: the chain engine requeued this job. "RESTARTS"
EV_TIMEOUT = "timeout"  # TERM at the walltime: the step overran the signal margin
EV_TERMINATED = "terminated"  # TERM before the walltime: scancel, preemption, requeue
EV_CANCELLED = "cancelled"  # `train cancel`
# a stop (the stop signal, or stop mode kill) before the program saved anything since the
# chunk began: the chain ends; a resubmitted chain of the run continues the chunk count.
# "DONE TOTAL"
EV_UNSAVED = "unsaved"
UNSAVED_TEXT = "stopped before any save"
# a step that ran into the walltime after the stop signal (still evaluating, saving too
# slowly) is ended by the tool; with a save to go on from, the chain goes on, at most
# OVERRUN_BOUND times a chain. "COUNT DONE TOTAL"
EV_OVERRAN = "overran"
OVERRUN_BOUND = 2
# the timeout event's last word where the overrun that ended the chain was one past the
# bound ("ELAPSED bound")
OVERRUN_BOUND_WORD = "bound"

EVENTS = (EV_STARTED, EV_LIMIT, EV_EXTENDED, EV_EXTEND_FAILED, EV_STOPPED, EV_COMPLETE,
          EV_FAILED, EV_NO_PROGRESS, EV_INCOMPLETE, EV_REQUEUED, EV_TIMEOUT, EV_TERMINATED,
          EV_CANCELLED, EV_UNSAVED, EV_OVERRAN)

# The step's environment names a file here that a program touches once its signal
# handlers are in place (`train run` and `train launch` do): the chain engine passes the
# walltime USR1 on at once after that, and holds it back during start-up before it.
SIGNAL_READY_VAR = "TRAIN_SIGNAL_READY"
# Each rank has a file of its own: the step's value with this and the rank appended (by the
# per-task wrapper, `train launch` and torchrun's per-worker wrapper); the chain engine
# passes the signal on once every rank of the step has said it is ready.
READY_RANK_SUFFIX = ".rank-"
# The walltime contract's other names that Python reads (the engine exports them): the
# job's stop signal, and the Unix time by which the step must have checkpointed.
STOP_SIGNAL_VAR = "TRAIN_STOP_SIGNAL"
DEADLINE_VAR = "TRAIN_DEADLINE"
# Set by `train launch` when its GPU memory wait fell back to a smaller --batch-size: the run
# then continues with either batch size (from then on, batch_size is not compared on resume)
FALLBACK_BATCH_VAR = "TRAIN_FALLBACK_BATCH"
# The step's rendezvous port (MASTER_PORT, torchrun's --master-port), picked by the engine on
# the batch host, which is the job's first node, where rank 0 listens: the job id's place in
# [PORT_BASE, PORT_BASE + PORT_SPAN), below Linux's ephemeral ports (32768 and up, which a
# busy node's own connections hold), or the next one free there (another job on a shared
# node, a program's own server).
MASTER_PORT_VAR = "TRAIN_MASTER_PORT"
PORT_BASE, PORT_SPAN = 20000, 10000


def job_port(job_id: int) -> int:
    """The job id's rendezvous port (what `train launch` uses outside the engine)."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def _binds(port: int) -> bool:
    """Whether a server may bind the port now in every address family this host has (an
    IPv6-only host has no IPv4 sockets at all; a listener on IPv6 alone leaves IPv4's
    port free); False where the host has neither."""
    import socket

    tried = False
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # the host has no such family
            continue
        with sock:
            try:
                sock.bind(("", port))
            except OSError:
                return False
        tried = True
    return tried


def free_job_port(job_id: int, tries: int = 64) -> int:
    """The first of the job id's port and the ones after it that this host lets a server
    bind now (the job id's own where none does)."""
    own = job_port(job_id)
    for step in range(tries):
        port = PORT_BASE + (own - PORT_BASE + step) % PORT_SPAN
        if _binds(port):
            return port
    return own


def rank_ready_path(value: str, rank: int) -> str:
    """The readiness file of one rank: the step's path with the rank's suffix, in place of
    a suffix an outer wrapper already gave it (the rank it names is the outer task's)."""
    base, sep, tail = value.rpartition(READY_RANK_SUFFIX)
    if not (sep and tail and all("0" <= c <= "9" for c in tail)):
        base = value
    return "{}{}{}".format(base, READY_RANK_SUFFIX, int(rank))


def batch_fallback(batch_size: int, env: Optional[Mapping[str, str]] = None) -> bool:
    """`train launch` fell back to this batch size (its GPU memory wait ran out)."""
    return (os.environ if env is None else env).get(FALLBACK_BATCH_VAR) == str(batch_size)


# A sweep's array task: the path (without .out/.err) of the log files Slurm opened for it
# beside the sweep's logs, exported by the array's script; its output goes to its chain's
# own log, and the chain engine removes them at its end when they are empty.
ARRAY_LOG_VAR = "TRAIN_ARRAY_LOG"

# Docker containers of a job carry this label (value: the job id), so the chain engine can
# remove what a killed step left running.
DOCKER_JOB_LABEL = "train.job"

# The GPU utilisation watch (train.node.gpuwatch): the job's settings, which the rendered
# script exports to the step for `train launch` (set only for GPU jobs with the watch on),
# and the folder of the run directory that holds one CSV file per node.
GPU_WATCH_INTERVAL_VAR = "TRAIN_GPU_WATCH_INTERVAL"  # seconds between samples
GPU_IDLE_THRESHOLD_VAR = "TRAIN_GPU_IDLE_THRESHOLD"  # percent: under it a sample is idle
GPU_IDLE_MINUTES_VAR = "TRAIN_GPU_IDLE_MINUTES"  # idle this long: a warning in the log
GPU_WATCH_DIR = "gpu"  # RUN_DIR/gpu/NODE.csv

# The task wrapper's (train.batch.task): a task's temporary folder on its node
# (TMPDIR/train-job.JOBID-RESTART.XXXXXX), the folder of the tasks' end records (file
# task-PROCID: "CODE UNIXTIME NODE [SIGNAL]"), the earlier jobs' folders to remove
# (patterns JOBID-RESTART).
TMP_PREFIX = "train-job."
TASK_EXITS_VAR = "TRAIN_TASK_EXITS"
STALE_TMP_VAR = "TRAIN_STALE_TMP"
# The engine's own folder for a chunk (the time the chunk began, the tasks' exit records):
# RUN_DIR/.chunk-JOBID-RESTART, removed at its end; one a killed chunk left is removed by
# the next.
CHUNK_DIR_PREFIX = ".chunk-"
# Variables the training process reads, passed into a container by name so their host
# values carry over (Apptainer through APPTAINERENV_ copies, Docker with -e NAME).
PASS_THROUGH = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID",
                "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE",
                "SLURM_JOB_NODELIST", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE",
                "CUDA_VISIBLE_DEVICES", "TRAIN_MASTER_ADDR", MASTER_PORT_VAR,
                SIGNAL_READY_VAR)
# The job's own pass-through names and patterns (NAME, PREFIX_*), space-separated: the job
# script exports it and each task's wrapper passes what matches into the container.
ENV_NAMES_VAR = "TRAIN_ENV_NAMES"

# What the engine's look for saves passes over at the top of the run directory: its
# own files and `train launch`'s scontrol stand-in, which change in every chunk whatever the
# program does (shell patterns).
SAVE_SCAN_SKIP = (LOG_DIR, JOBS_DIR, GPU_WATCH_DIR, CHAIN_RECORD, CHAIN_IDS, CHAIN_EVENTS,
                  SAVED_MARKER, METRICS_FILE, "chain-*", ".scontrol-shim", ".signal-ready-*",
                  ".stop-request-*", CHUNK_DIR_PREFIX + "*", ".train", ".train.*")
# A save path that holds a run folder (`--save-path .` with runs/ below it) is looked
# through without the run folders in it (this one, scanned above, and any folder holding
# one of these records: another run or sweep of the tool) and without Python's caches.
RUN_RECORDS = (CHAIN_RECORD, SWEEP_RECORD)


# -- NAVSIM's Hydra overrides, which both sides set or read -----------------------------
# The login node writes NAVSIM's training command (train.client.slurm.navsimstep); on the
# node the launcher caps the DataLoader's workers by the task's CPUs and memory
# (train.node.launcher.environment), and the feature cache's phase (train.workloads.navsim)
# reads the split and the cache folder and sets the cache switches per chunk.
NAVSIM_WORKERS_OVERRIDE = "dataloader.params.num_workers"
# default_training.yaml's prefetch_factor (2), which torch's DataLoader refuses with no
# workers: set to null then
NAVSIM_PREFETCH_OVERRIDE = "dataloader.params.prefetch_factor"
NAVSIM_SPLIT_OVERRIDE = "train_test_split"
NAVSIM_CACHE_PATH_OVERRIDE = "cache_path"
# the cache switches: set per chunk on the node, never by the job's own overrides
NAVSIM_FORCE_CACHE_OVERRIDE = "force_cache_computation"
NAVSIM_CACHE_ONLY_OVERRIDE = "use_cache_without_dataset"
NAVSIM_CACHE_SWITCHES = (NAVSIM_FORCE_CACHE_OVERRIDE, NAVSIM_CACHE_ONLY_OVERRIDE)


def override_key(arg: str) -> str:
    """The config key a Hydra override sets (`+key=v`, `++key=v`, `~key`: key)."""
    return arg.split("=", 1)[0].lstrip("+~")


def override_value(args: Sequence[str], key: str) -> Optional[str]:
    """The value the last Hydra override of `key` gives, or None."""
    found = [arg.split("=", 1)[1] for arg in args if "=" in arg and override_key(arg) == key]
    return found[-1] if found else None

def write_progress(run_dir: Path, done: int, total: int) -> None:
    """Record the work done so far for the chain engine (atomic: temp file, rename)."""
    path = run_dir / PROGRESS_FILE
    tmp = path.with_name(".{}.tmp".format(PROGRESS_FILE))
    tmp.write_text("{} {}\n".format(int(done), int(total)), encoding="utf-8")
    tmp.replace(path)

