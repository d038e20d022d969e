"""What of the environment is recorded (recorded_environment, masked_environment)."""

from __future__ import annotations

from collections.abc import Mapping

from train.common.secrets.commands import redact_text
from train.common.secrets.names import REDACTED, is_secret_name

FAMILIES = ("SLURM_", "SLURMD_", "CUDA_", "NCCL_", "PYTORCH_", "TORCH_")
ALLOWED = frozenset({
    # Slurm's job geometry and bookkeeping (sbatch/srun output environment)
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_GPUS", "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU",
    "SLURM_MEM_PER_GPU", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS",
    "SLURM_JOB_RESERVATION", "SLURM_CLUSTER_NAME", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID",
    "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_RESTART_COUNT", "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "SLURM_JOB_GPUS", "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SLURM_OPEN_MODE",
    "SLURM_PRIO_PROCESS", "SLURM_TASK_PID", "SLURM_CONF", "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_GID",
    "SLURM_GTIDS", "SLURM_UMASK", "SLURM_EXPORT_ENV", "SLURMD_NODENAME",
    # CUDA and its device selection
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_PATH", "CUDA_VERSION",
    "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "CUDA_CACHE_PATH",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    # NCCL's documented tuning knobs (no credentials among them)
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_DISABLE",
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT",
    "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_CUDA_SUPPORT", "NCCL_NET", "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE", "NCCL_CROSS_NIC", "NCCL_NVLS_ENABLE",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_TOPO_FILE", "NCCL_LAUNCH_MODE",
    "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT", "NCCL_TIMEOUT",
    # torch's own settings
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",
    "PYTORCH_NO_CUDA_MEMORY_CACHING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
})


def masked_environment(environ: Mapping[str, str | None]) -> dict[str, str | None]:
    """Variables as given (None for unset), the value of a secret-looking name redacted
    and credential-looking parts of the others redacted: for any variable outside the
    families of recorded_environment, e.g. a run's PYTHONPATH and CONDA_PREFIX."""
    return {name: None if value is None else REDACTED if is_secret_name(name)
            else redact_text(value) for name, value in environ.items()}


def recorded_environment(environ: Mapping[str, str],
                         families: tuple[str, ...] = FAMILIES) -> dict[str, str]:
    """The variables of `families`: allowed ones verbatim (credential-looking parts of
    their values redacted), every other one present but redacted."""
    return {name: redact_text(environ[name]) if name in ALLOWED and not is_secret_name(name)
            else REDACTED for name in sorted(environ) if name.startswith(families)}
