"""What a cluster profile holds once validated: the site's rules (Profile), its node
types (NodeType) and the GPU watch's defaults (GpuWatch). Plain frozen data; the YAML is
checked into these by train.client.clusters.validate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# How GPUs are counted: --gres=gpu:N or --gpus-per-node=N.
GPU_REQUEST_STYLES = ("gres", "gpus_per_node")
# How a GPU type is selected: typed in that count (gpu:TYPE:N), as a node feature in
# --constraint, or not at all (the partition or constraint must imply it).
GPU_TYPE_REQUESTS = ("gres", "constraint", "none")


@dataclass(frozen=True)
class NodeType:
    """A partition, or on sites without partitions a node constraint."""

    name: str
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    cpus_per_node: int
    mem_mb: int
    max_minutes: int | None
    max_nodes: int | None = None
    max_gpus: int | None = None
    # the NVIDIA driver of these nodes (`nvidia-smi`), e.g. "550.54.15"; None: not recorded
    driver_version: str | None = None
    # a job without GPUs may run here (nodes with GPUs: false unless the profile says so,
    # since a GPU job that forgot -g would run on the CPU for its walltime)
    cpu_jobs: bool = False
    # a job of more than one node takes every GPU of each node (a site's rule, e.g. UVA
    # RC's for Rivanna's gpu partition); one node may take fewer
    multi_node_whole: bool = False


@dataclass(frozen=True)
class GpuWatch:
    """The GPU watch of GPU jobs (train.node.gpuwatch); `interval` 0: no watch."""

    interval: int = 30
    idle_threshold: int = 10
    idle_minutes: int = 30


# where a profile says nothing: no site policy known, an idle GPU is one under 10% (the
# catch-all line of NYU Torch's published policy) for half an hour
DEFAULT_GPU_WATCH = GpuWatch()


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    account_required: bool
    account_hint: str
    partition_required: bool
    partitions_allowed: bool
    default_partition: str | None
    qos_required: bool
    default_qos: str | None
    qos_limits: Mapping[str, int | None]
    gpu_request: str
    backfill_minutes: int | None
    default_minutes: int
    modules: tuple[str, ...]
    binds: tuple[str, ...]
    scratch_root: str
    nccl_env: Mapping[str, str]
    preempt_flags: tuple[str, ...]
    partitions: Mapping[str, NodeType] = field(default_factory=dict)
    constraints: Mapping[str, NodeType] = field(default_factory=dict)
    gpu_type_request: str = "none"
    gpu_features: Mapping[str, str] = field(default_factory=dict)
    # names passed into containers from the job's environment (NAME or PREFIX_*)
    env: tuple[str, ...] = ()
    # the site's command that lists the user's accounts (argv, run without a shell)
    account_list_command: tuple[str, ...] = ()
    # every node is this machine (the local test cluster): its file systems are all shared
    single_host: bool = False
    # the jobs' default GPU utilisation watch (each job may set its own)
    gpu_watch: GpuWatch = DEFAULT_GPU_WATCH
    # the most tasks one job array may have (Slurm's MaxArraySize, default 1001)
    max_array_size: int = 1001

    def gpu_feature(self, gpu_type: str) -> str:
        """The node feature that selects `gpu_type` (gpu_type_request: constraint)."""
        return self.gpu_features.get(gpu_type, gpu_type)
