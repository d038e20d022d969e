"""A SLURM job: its spec (YAML and/or flags) and its validation against a cluster profile.

`resolve` is pure: spec + profile -> ResolvedJob or a ConfigError naming the field and what
is allowed. Nothing is written or submitted before it succeeds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from train.clusters.profiles import (
    NodeType,
    Profile,
    format_mem,
    format_time,
    parse_mem,
    parse_time,
)
from train.config import RunConfig, check_value, opt, run_config_from_argv
from train.errors import ConfigError
from train.gpus import all_bf16_capable

LAUNCH_MODES = ("auto", "torchrun", "tasks")
ENTRIES = ("train", "command", "navsim")
NAVSIM_SCRIPT = "/opt/navsim/navsim/planning/script/run_training.py"  # navsim.def's checkout
RUNTIMES = ("none", "apptainer", "docker")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# A constraint a feature can be ANDed onto: no alternatives, brackets, groups or counts.
_AND_ONLY = re.compile(r"^[^|\[\]()*,]+$")
# `train run` options that the job sets itself.
_RESERVED_RUN_FLAGS = ("--out", "--time-budget")
DEFAULT_MARGIN = 300
MAX_CHUNKS_LIMIT = 1000  # years of walltime at any site; beyond it, a typo


@dataclass(frozen=True)
class JobSpec:
    """What to run where; flags override the YAML file, which overrides defaults."""

    name: str = opt("train", "Job and run name; the run directory is runs/NAME.", kind=str)
    cluster: str = opt("local", "Cluster profile (train clusters lists them).", kind=str)
    workload: tuple[str, ...] = opt(("demo",), "What follows `--`: for entry train, the "
                                    "workload and its `train run` arguments; for command, "
                                    "the command; for navsim, extra Hydra overrides.",
                                    kind=list)
    entry: str = opt("train", "train (`train run`), command (any program, one rank per "
                     "task) or navsim (NAVSIM's Lightning training, nodes/devices/strategy "
                     "set from the job).", kind=str, choices=ENTRIES)
    account: str | None = opt(None, "SLURM account.", kind=str, optional=True)
    partition: str | None = opt(None, "Partition (not on sites that use constraints).",
                                kind=str, optional=True)
    qos: str | None = opt(None, "Quality of service.", kind=str, optional=True)
    constraint: str | None = opt(None, "Node constraint, e.g. h200|l40s on Torch.",
                                 kind=str, optional=True)
    time: str | None = opt(None, "Walltime per chunk (SLURM format; default: the "
                           "profile's).", kind=str, optional=True)
    nodes: int = opt(1, "Nodes.", kind=int, positive=True)
    gpus_per_node: int = opt(0, "GPUs per node.", kind=int, minimum=0)
    gpu_type: str | None = opt(None, "GPU type, e.g. a100.", kind=str, optional=True)
    cpus_per_task: int = opt(4, "CPUs per task (passed to srun explicitly).", kind=int,
                             positive=True)
    mem: str | None = opt(None, "Memory per node, e.g. 50G (default: a CPU-proportional "
                          "share of the node).", kind=str, optional=True)
    ntasks_per_node: int | None = opt(None, "Tasks per node (default: 1 for torchrun, the "
                                      "GPU count for tasks).", kind=int, positive=True,
                                      optional=True)
    max_chunks: int = opt(10, "Bound on the chain: walltime-sized jobs, each resuming the "
                          "previous, submitted one at a time until the work is complete "
                          "(in requeue mode: runs of the one job).", kind=int, positive=True)
    launch: str = opt("auto", "auto (one process, or torchrun for several), torchrun (one "
                      "task per node) or tasks (one task per GPU, as Lightning expects).",
                      kind=str, choices=LAUNCH_MODES)
    runtime: str = opt("none", "Container runtime: none, apptainer or docker.", kind=str,
                       choices=RUNTIMES)
    image: str | None = opt(None, "Container image (SIF path or docker tag).", kind=str,
                            optional=True)
    requeue: bool = opt(False, "Requeue mode: after each checkpointed stop, requeue this "
                        "same job (from the host batch shell) instead of chaining new ones.",
                        kind=bool)
    signal_margin: int | None = opt(None, "Seconds before the walltime at which USR1 is "
                                    "sent and by which the trainer's own time budget ends "
                                    "(default: 300, or a quarter of a shorter walltime).",
                                    kind=int, positive=True, optional=True)
    time_budget: bool = opt(True, "Give the trainer a time budget of walltime minus the "
                            "margin (signal delivery alone is coarse).", kind=bool)
    workers: int = opt(0, "DataLoader workers per process (checked against memory).",
                       kind=int, minimum=0)
    worker_mem: str = opt("4G", "Host memory per DataLoader worker.", kind=str)
    preempt: bool = opt(False, "Submit as preemptible where the site supports it.",
                        kind=bool)
    out: str | None = opt(None, "Run directory (default: runs/NAME under the submit "
                          "directory).", kind=str, optional=True)
    python: str = opt("python3", "Python on the nodes (runtime none) or in the image.",
                      kind=str)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value(f, getattr(self, f.name))
        if not _NAME_RE.match(self.name):
            raise ConfigError("name", f"must be letters, digits, '.', '_' or '-' (at most 64, "
                              f"starting with a letter or digit); got {self.name!r}")
        if self.max_chunks > MAX_CHUNKS_LIMIT:
            raise ConfigError("max_chunks", f"must be at most {MAX_CHUNKS_LIMIT}, got "
                              f"{self.max_chunks}")
        if not self.workload and self.entry != "navsim":
            raise ConfigError("workload", "give what to run after --, e.g. -- demo "
                              "--episodes 3000")


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
    # host paths the container sees: the profile's binds, the run directory, and the
    # results CSV's directory where it lies outside both
    binds: tuple[str, ...] = ()

    @property
    def time_budget_seconds(self) -> int | None:
        if not self.spec.time_budget:
            return None
        return max(10, self.minutes * 60 - self.margin)

    @property
    def processes_per_node(self) -> int:
        if self.launch == "torchrun":
            return max(1, self.spec.gpus_per_node)
        return self.ntasks_per_node


def _choose_node(spec: JobSpec, profile: Profile) -> tuple[NodeType, str | None]:
    if not profile.partitions_allowed:
        if spec.partition:
            raise ConfigError("partition", f"{profile.name} does not use partitions; request "
                              f"GPUs with --constraint (one of "
                              f"{', '.join(profile.constraints)}, alternatives with '|')")
        if not spec.constraint:
            raise ConfigError("constraint", f"{profile.name} needs a constraint instead of a "
                              f"partition: one of {', '.join(profile.constraints)}")
        names = spec.constraint.split("|")
        unknown = [n for n in names if n not in profile.constraints]
        if unknown:
            raise ConfigError("constraint", f"unknown constraint {unknown[0]!r} on "
                              f"{profile.name}; known: {', '.join(profile.constraints)}")
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
    return run_config_from_argv(list(spec.workload))


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
    binds = [*profile.binds, str(run_dir)]
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
    return {"run_dir": str(run_dir), "results_csv": None if csv is None else str(csv),
            "binds": tuple(binds)}


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
    constraint, gres_type = _gpu_type_request(spec, profile, node, partition)
    if node.max_nodes is not None and spec.nodes > node.max_nodes:
        raise ConfigError("nodes", f"{spec.nodes} is over the {node.name} limit of "
                          f"{node.max_nodes} nodes per job")
    if node.max_gpus is not None and spec.nodes * spec.gpus_per_node > node.max_gpus:
        raise ConfigError("gpus_per_node", f"{spec.nodes} x {spec.gpus_per_node} GPUs is "
                          f"over the {node.max_gpus}-GPU limit per job on {node.name}")

    launch = spec.launch
    if spec.entry != "train":
        if launch == "torchrun":
            raise ConfigError("launch", f"entry {spec.entry} runs one task per GPU (Lightning "
                              "expects that); use --launch tasks")
        launch = "tasks"
    elif launch == "auto":
        launch = "single" if spec.nodes * max(1, spec.gpus_per_node) == 1 else "torchrun"
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
    if spec.cpus_per_task * ntasks > node.cpus_per_node:
        raise ConfigError("cpus_per_task", f"{ntasks} task(s) x {spec.cpus_per_task} CPUs "
                          f"is more than the {node.cpus_per_node} CPUs of a {node.name} node")
    if spec.mem is not None:
        mem_mb = parse_mem(spec.mem, "mem")
    else:
        mem_mb = node.mem_mb * spec.cpus_per_task * ntasks // max(1, node.cpus_per_node)
    if mem_mb > node.mem_mb:
        raise ConfigError("mem", f"{format_mem(mem_mb)} is more than the "
                          f"{format_mem(node.mem_mb)} of a {node.name} node")
    procs = max(1, spec.gpus_per_node) if launch == "torchrun" else ntasks
    if spec.workers:
        per_worker = parse_mem(spec.worker_mem, "worker_mem")
        need = spec.workers * procs * per_worker
        if need > mem_mb:
            safe = mem_mb // (procs * per_worker)
            raise ConfigError("workers", f"{spec.workers} DataLoader workers x {procs} "
                              f"processes per node x {format_mem(per_worker)} = "
                              f"{format_mem(need)} is over the job's {format_mem(mem_mb)} "
                              f"per node; use at most {safe} workers per process")
    if spec.runtime != "none" and not spec.image:
        raise ConfigError("image", f"runtime {spec.runtime} needs --image")
    if spec.preempt and not profile.preempt_flags:
        raise ConfigError("preempt", f"{profile.name} has no preemptible jobs")
    run_config = _run_config(spec) if spec.entry == "train" else None
    return ResolvedJob(spec=spec, profile=profile, node=node, partition=partition, qos=qos,
                       minutes=minutes, mem_mb=mem_mb, ntasks_per_node=ntasks, launch=launch,
                       margin=margin,
                       run_config=run_config, constraint=constraint, gres_type=gres_type,
                       **_paths(spec, profile, run_config))


def navsim_command(job: ResolvedJob) -> list[str]:
    """NAVSIM's training command with Lightning's trainer matching the job (Hydra overrides
    of navsim's default_training.yaml at the pinned commit; it has no `devices` key)."""
    spec = job.spec
    gpus = spec.gpus_per_node
    # bf16 only if every GPU type the job can land on has it (the trainer's own rule)
    types = (spec.gpu_type,) if spec.gpu_type else job.node.gpu_types
    precision = "bf16-mixed" if all_bf16_capable(types) else "16-mixed"
    return [spec.python, NAVSIM_SCRIPT,
            f"trainer.params.num_nodes={spec.nodes}",
            f"+trainer.params.devices={max(1, gpus)}",
            "trainer.params.strategy=ddp",
            f"trainer.params.accelerator={'gpu' if gpus else 'cpu'}",
            f"trainer.params.precision={precision if gpus else 32}",
            f"dataloader.params.num_workers={spec.workers}",
            *spec.workload]


def job_from_sources(file_values: dict[str, Any] | None, flags: dict[str, Any]) -> JobSpec:
    from train.config import build

    return build(JobSpec, file_values, flags)
