"""A job resolved against a cluster profile: every value the renderer needs, and every
check that can be made before submission.

`resolve` is pure: spec + profile -> ResolvedJob or a ConfigError naming the field and what
is allowed. Nothing is written or submitted before it succeeds. The node type is
train.client.slurm.placement's, the paths and binds train.client.slurm.jobpaths'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from train.client.clusters.schema import GpuWatch, NodeType, Profile
from train.client.clusters.units import format_mem, format_time, parse_mem, parse_time
from train.client.programs import imports_lightning
from train.client.slurm import navsim
from train.client.slurm.jobitems import check_env_item
from train.client.slurm.jobpaths import job_paths
from train.client.slurm.jobspec import CPUS_PER_PROCESS, DEFAULT_PYTHON, MAX_CHUNKS_LIMIT, JobSpec
from train.client.slurm.placement import choose_node, gpu_type_request, one_type_for_all
from train.common.errors import ConfigError, UsageError
from train.common.hostmem import DEFAULT_WORKER_MEM_MB
from train.common.launchers import accelerate_prefix
from train.workloads.config import RunConfig, run_config_from_argv

# Passed into every container by name (the job's own values at run time), beside the
# rank and SLURM variables container.PASS_THROUGH lists: the walltime contract's TRAIN_*,
# experiment trackers' and model hubs' settings.
PASSED_BY_DEFAULT = ("TRAIN_*", "SLURM_JOB_NAME", "SLURM_STEP_ID", "SLURM_RESTART_COUNT",
                     "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_SUBMIT_DIR",
                     "WANDB_*", "HF_*", "HUGGINGFACE_*", "MLFLOW_*", "COMET_*")
# `train run` options that the job sets itself.
_RESERVED_RUN_FLAGS = ("--out", "--time-budget")
DEFAULT_MARGIN = 300


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
    # the chunk's floor (sbatch --time-min) in minutes: a chunk may start this short where
    # the scheduler has a hole; 0 where every chunk asks for the whole walltime
    time_min: int = 0
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
                "runtime": self.spec.runtime, "python": self.spec.python,
                "gpu_watch": None if self.gpu_watch is None
                else dataclasses.asdict(self.gpu_watch)}



def resolve(spec: JobSpec, profile: Profile) -> ResolvedJob:
    """Every check that can be made before submission; errors name the field."""
    if profile.account_required and not spec.account:
        raise ConfigError("account", f"{profile.name} requires --account; "
                          f"{profile.account_hint}")
    node, partition = choose_node(spec, profile)
    qos = _qos(spec, profile)
    minutes = _walltime(spec, profile, node, qos)
    margin = _signal_margin(spec, minutes)
    time_min = _time_min(spec, minutes, margin)
    _check_gpus(spec, profile, node, partition)
    # the GPU type requested the site's way, alternatives made one for every node
    constraint, gres_type = gpu_type_request(spec, profile, node, partition)
    constraint = one_type_for_all(spec, constraint)
    _check_job_size(spec, profile, node, partition)
    launch = _launch_mode(spec)
    ntasks = _tasks_per_node(spec, launch)
    # the defaults in force, settled here: the resolved job's spec holds them
    spec = dataclasses.replace(spec, runtime=_runtime(spec, launch),
                               cpus_per_task=_cpus_per_task(spec, node, launch, ntasks),
                               **_total_chunks(spec, minutes))
    mem_mb, whole_node = _memory(spec, node, launch, ntasks)
    if spec.runtime != "none" and not spec.image:
        raise ConfigError("image", f"runtime {spec.runtime} needs --image")
    for field, value in (("image", spec.image or ""), ("python", spec.python)):
        if value.startswith("-"):  # (srun, docker and apptainer take it for an option)
            raise ConfigError(field, f"{value!r} starts with '-': the command before it "
                              "would read it as one of its options (a file: give ./NAME)")
    if spec.preempt and not profile.preempt_flags:
        raise ConfigError("preempt", f"{profile.name} has no preemptible jobs")
    run_config = _run_config(spec) if spec.entry == "train" else None
    return ResolvedJob(spec=spec, profile=profile, node=node, partition=partition, qos=qos,
                       minutes=minutes, mem_mb=mem_mb, ntasks_per_node=ntasks, launch=launch,
                       margin=margin, time_min=time_min,
                       run_config=run_config, constraint=constraint, gres_type=gres_type,
                       whole_node_mem=whole_node, **job_paths(spec, profile, run_config),
                       **_environment(spec, profile), gpu_watch=_gpu_watch(spec, profile))


def _total_chunks(spec: JobSpec, minutes: int) -> dict[str, Any]:
    """--total-time as the chain's bound: max_chunks = total / walltime, rounded up."""
    if spec.total_time is None:
        return {}
    chunks = -(-parse_time(spec.total_time, "total_time") // minutes)  # (rounded up)
    if chunks > MAX_CHUNKS_LIMIT:
        raise ConfigError("total_time", f"{spec.total_time} in chunks of "
                          f"{format_time(minutes)} is {chunks} chunks, over the bound of "
                          f"{MAX_CHUNKS_LIMIT}: give a longer --time")
    if spec.entry == "command" and spec.stop == "none" and chunks > 1 and not spec.requeue:
        raise ConfigError("total_time", f"{spec.total_time} in chunks of "
                          f"{format_time(minutes)} is {chunks} chunks of a command with no "
                          "stop signal: nothing would tell the program to checkpoint before "
                          "each walltime. Give --stop-signal USR1 (or TERM) and handle it "
                          "(checkpoint, exit 0), or one chunk (no --total-time)")
    return {"max_chunks": chunks, "total_time": None}


def _qos(spec: JobSpec, profile: Profile) -> str | None:
    """The QOS in force (the job's, else the profile's default): one the site knows."""
    qos = spec.qos or profile.default_qos
    if profile.qos_required and not qos:
        raise ConfigError("qos", f"{profile.name} requires --qos; one of "
                          f"{', '.join(profile.qos_limits)}")
    if qos and profile.qos_limits and qos not in profile.qos_limits:
        raise ConfigError("qos", f"unknown QOS {qos!r} on {profile.name}; known: "
                          f"{', '.join(profile.qos_limits)}")
    return qos


def _walltime(spec: JobSpec, profile: Profile, node: NodeType, qos: str | None) -> int:
    """Minutes per chunk (the job's, else the profile's), within the node's and QOS's."""
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
    return minutes


def _signal_margin(spec: JobSpec, minutes: int) -> int:
    """Seconds before the walltime for the stop signal: the job's, else DEFAULT_MARGIN or a
    quarter of a shorter walltime; it must leave time to run."""
    margin = spec.signal_margin if spec.signal_margin is not None \
        else min(DEFAULT_MARGIN, minutes * 60 // 4)
    if margin >= minutes * 60:
        raise ConfigError("signal_margin", f"{margin} s leaves no time in a "
                          f"{format_time(minutes)} walltime; use less than {minutes * 60}")
    return margin


def _time_min(spec: JobSpec, minutes: int, margin: int) -> int:
    """The chunk's floor: the job's --time-min, or for a chain that stops at a signal a
    quarter of the walltime (a 30-minute chunk fits a 10-minute hole before a
    maintenance), and always a minute more than the margin (a chunk that short still
    works before its stop signal); 0 (off) where it would be the walltime itself."""
    if spec.time_min == "off":
        return 0
    if spec.time_min is None:
        if spec.requeue or spec.stop == "none" or spec.chunks < 2:
            return 0
        floor = max(-(-minutes // 4), _least(margin))
        return floor if floor < minutes else 0
    floor = parse_time(spec.time_min, "time_min")
    if spec.requeue:
        raise ConfigError("time_min", "is for a chain of jobs: requeue mode runs one job again, "
                          "and a requeued job keeps the time limit it first started with")
    if spec.stop == "none":
        raise ConfigError("time_min", "a chunk that starts shorter than --time must stop at "
                          "its stop signal, and this job has none (--stop-signal none): give "
                          "a stop signal, or leave --time-min out")
    if floor > minutes:
        raise ConfigError("time_min", f"{format_time(floor)} is over the walltime "
                          f"{format_time(minutes)}: the floor is at most --time")
    if floor < _least(margin):
        raise ConfigError("time_min", f"{format_time(floor)} leaves a chunk that short no "
                          f"minute of work before its stop signal ({margin} s before its "
                          f"end): give at least {format_time(_least(margin))}, or off")
    return floor if floor < minutes else 0


def _least(margin: int) -> int:
    """The shortest floor in minutes: a minute of work before the stop signal."""
    return -(-margin // 60) + 1


def _check_gpus(spec: JobSpec, profile: Profile, node: NodeType,
                partition: str | None) -> None:
    """The GPUs asked for are on the node (count and type), and a GPU-only node set is not
    asked for none."""
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


def _check_job_size(spec: JobSpec, profile: Profile, node: NodeType,
                    partition: str | None) -> None:
    """The node type's limits per job: nodes, GPUs over all nodes, and where the site has
    a job of more than one node take every GPU of each node (the node type's
    multi_node_whole), all of them, or one node."""
    if node.max_nodes is not None and spec.nodes > node.max_nodes:
        raise ConfigError("nodes", f"{spec.nodes} is over the {node.name} limit of "
                          f"{node.max_nodes} nodes per job")
    if node.max_gpus is not None and spec.nodes * spec.gpus_per_node > node.max_gpus:
        raise ConfigError("gpus_per_node", f"{spec.nodes} x {spec.gpus_per_node} GPUs is "
                          f"over the {node.max_gpus}-GPU limit per job on {node.name}")
    if not node.multi_node_whole or spec.nodes <= 1 \
            or spec.gpus_per_node == node.gpus_per_node:
        return
    what = f"{partition} partition" if partition else f"constraint {node.name}"
    raise ConfigError("gpus_per_node", f"{profile.name}'s {what}: a job of more than one "
                      f"node takes all {node.gpus_per_node} GPUs of each node: "
                      f"-g {node.gpus_per_node} (or one node); the job asks for "
                      f"{spec.nodes} nodes of {spec.gpus_per_node}")


def _launch_mode(spec: JobSpec) -> str:
    """single, torchrun or tasks: the job's --launch, or auto's choice for the entry; the
    stop signal must survive it."""
    launch = spec.launch
    if spec.entry == "navsim":
        if launch == "torchrun":
            raise ConfigError("launch", "entry navsim runs one task per GPU (Lightning "
                              "expects that); use --launch tasks")
        launch = "tasks"
    elif launch == "auto":
        # a Lightning script wants one task per GPU from Slurm (under torch's launcher its
        # SLURM support, the stop signal's handler included, is off)
        lightning = spec.entry == "command" and imports_lightning(spec.workload, spec.chdir) \
            and not accelerate_prefix(spec.workload)  # (its own launcher: one per node)
        launch = "single" if spec.nodes * max(1, spec.gpus_per_node) == 1 \
            else "tasks" if lightning else "torchrun"
    if launch == "torchrun" and spec.stop == "TERM" and spec.stop_mode != "kill":
        ways = ("accelerate launch, in its place, dies of any stop signal: chain it with "
                "--stop-mode kill (--save-path, --resume-args)" if accelerate_prefix(
                    spec.workload) else "Use USR1 (the launcher passes it to the workers), "
                "or --launch tasks")
        raise ConfigError("stop_signal", "TERM cannot be the stop signal under torch's "
                          "launcher: Slurm signals every process of the step, and the "
                          f"launcher takes TERM as the end of the job and fails it. {ways}")
    return launch


def _tasks_per_node(spec: JobSpec, launch: str) -> int:
    """Tasks per node: one per GPU for launch tasks, else one (it starts the processes)."""
    if launch == "tasks":
        ntasks = spec.ntasks_per_node or max(1, spec.gpus_per_node)
        if spec.gpus_per_node and ntasks != spec.gpus_per_node:
            raise ConfigError("ntasks_per_node", f"one-task-per-GPU launch needs "
                              f"--ntasks-per-node equal to the GPUs per node "
                              f"({spec.gpus_per_node}), got {ntasks}")
        return ntasks
    ntasks = spec.ntasks_per_node or 1
    if ntasks != 1:
        raise ConfigError("ntasks_per_node", f"{launch} launch runs one task per node "
                          f"(it starts the per-GPU processes itself); got {ntasks}. "
                          "Use --launch tasks for one task per GPU")
    return ntasks


def _memory(spec: JobSpec, node: NodeType, launch: str, ntasks: int) -> tuple[int, bool]:
    """(MB per node, whether --mem=0 asks for the whole node): the tasks' CPUs within the
    node, the memory within the node, the DataLoader workers within the memory."""
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
    return mem_mb, whole_node


def torch_need(spec: JobSpec, launch: str) -> str | None:
    """What in the job needs torch, or None: `train run`, NAVSIM's training, torch's
    launcher, and a program on GPUs (its CUDA, NCCL and torch come with the image: a GPU
    job without one runs the nodes' bare python3)."""
    what = {"train": "`train run`", "navsim": "NAVSIM's training"}
    return what.get(spec.entry) or ("torch's launcher (torchrun)" if launch == "torchrun"
                                    else "a program on GPUs (-g)" if spec.gpus_per_node
                                    else None)


def _runtime(spec: JobSpec, launch: str) -> str:
    """The runtime in force. auto: apptainer with an image (the three sites' runtime), the
    nodes' own Python where --python names one; a job that needs torch with neither is
    refused here, not after the queue wait (the nodes' python3 is the login node's, which
    has no torch)."""
    if spec.runtime != "auto":
        return spec.runtime
    if spec.image:
        return "apptainer"
    needs = torch_need(spec, launch)
    if needs is None or spec.python != DEFAULT_PYTHON:
        return "none"
    raise ConfigError("runtime", f"no --runtime and no --image: {needs} needs torch, and "
                      "without them "
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
    given = {"interval": spec.gpu_watch_interval, "idle_threshold": spec.gpu_idle_threshold,
             "idle_minutes": spec.gpu_idle_minutes}
    watch = dataclasses.replace(profile.gpu_watch,
                                **{k: v for k, v in given.items() if v is not None})
    return watch if watch.interval > 0 else None



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
        values.update(navsim.node_data_env(spec.data))
    return {"env_values": tuple(values.items()),
            "env_names": tuple(n for n in dict.fromkeys(names) if n not in values)}

