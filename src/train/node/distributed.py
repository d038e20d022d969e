"""Device choice, CPU threads and torch.distributed set-up. Object collectives (pickled
dicts, stop flags) always go through a gloo group: NCCL cannot move CPU objects and, used
for them, hangs instead of failing. The process group is never destroyed (gloo can abort a
rank then): `train run` ends a distributed run with os._exit once everything is written."""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from train.common import cuda_check
from train.common.errors import ResourceError, UsageError

log = logging.getLogger(__name__)

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# A hung collective fails the job after this long instead of burning the walltime.
COLLECTIVE_TIMEOUT = dt.timedelta(minutes=30)


@dataclass
class DistContext:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    object_group: Any = field(default=None, repr=False)
    # why CUDA is unusable where `--device auto` fell back to the CPU (or saw fewer GPUs)
    cuda_problem: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.object_group)
        return out

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (None elsewhere), through the gloo group."""
        if not self.distributed:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0, group=self.object_group)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on any rank (keeps ranks in lockstep)."""
        return any(self.all_gather_object(bool(flag)))

    def barrier(self) -> None:
        """All ranks meet here (through gloo): rank 0 writes results while the others
        wait, so no rank tears its process group down while a peer still uses it (gloo
        aborts the process then)."""
        if self.distributed:
            dist.barrier(group=self.object_group)


def _int_var(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"environment variable {name} must be an integer, got "
                         f"{value!r}") from None


def resolve_device(request: str, local_rank: int = 0) -> tuple[torch.device, str | None]:
    """The device, and why CUDA is unusable (None when it is usable or was not asked for).
    cuda: an unusable CUDA is a ResourceError naming the cause and the fix (exit 3, before
    anything is written); auto: the CPU then, with a warning that names the cause."""
    if request == "cpu":
        return torch.device("cpu"), None
    facts = cuda_check.gather_facts()
    problem = cuda_check.check(facts)
    if problem is not None and request == "cuda":
        raise ResourceError(f"--device cuda: {problem}")
    if cuda_check.unserved_gpus(facts):  # it would die at its first kernel: stop here
        raise ResourceError(f"--device {request}: {problem}")
    if facts.torch_available and facts.torch_devices > 0:
        if problem is not None:  # auto, and torch sees fewer GPUs than expected
            log.warning("--device auto: using the GPUs torch sees, but %s", problem)
        return torch.device("cuda", local_rank % facts.torch_devices), problem
    # a GPU is here (NVML, CUDA_VISIBLE_DEVICES) or the job was given one: say why it is unused
    if cuda_check.expected_devices(facts) or facts.slurm_gpus not in (None, "", "0"):
        log.warning("--device auto: training on the CPU: %s", problem)
    else:  # no GPU anywhere in sight (a laptop, a CPU node, the demo): nothing to fix
        log.info("--device auto: no GPU here, training on the CPU")
    return torch.device("cpu"), problem


def configure_threads(local_world_size: int, environ: Mapping[str, str] | None = None) -> int:
    """Share the CPUs this process may use among the ranks on the node: torch otherwise
    starts a thread per core of the whole node, oversubscribing a job given a few CPUs."""
    env = os.environ if environ is None else environ
    if env.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cpus or 1) // max(1, local_world_size))
    torch.set_num_threads(threads)
    return threads


def init_distributed(device_request: str, environ: Mapping[str, str] | None = None
                     ) -> DistContext:
    """Single process, or a torchrun rank with its process groups initialised."""
    env = os.environ if environ is None else environ
    present = [v for v in TORCHRUN_VARS if v in env]
    # a world of one (`train launch`'s single mode, `torchrun --nproc-per-node 1`) needs
    # no process group
    if not present or (env.get("WORLD_SIZE") == "1" and env.get("RANK") == "0"):
        device, problem = resolve_device(device_request)
        configure_threads(1, env)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return DistContext(device=device, cuda_problem=problem)
    missing = [v for v in TORCHRUN_VARS if v not in env]
    if missing:
        raise UsageError(f"environment variable {missing[0]} is missing: torchrun sets "
                         f"{', '.join(TORCHRUN_VARS)} together (found {', '.join(present)})")
    rank, world, local_rank = (_int_var(env, v) for v in TORCHRUN_VARS)
    if not 0 <= rank < world:
        raise UsageError(f"environment variable RANK={rank} is outside 0..{world - 1} "
                         f"(WORLD_SIZE={world})")
    local_world = _int_var(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1
    device, problem = resolve_device(device_request, local_rank)
    configure_threads(local_world, env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    object_group = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    log.info("rank %d/%d (local %d) on %s, backend %s, object group gloo; process group "
             "ready at unix time %.3f", rank, world, local_rank, device, backend, time.time())
    return DistContext(device=device, rank=rank, world_size=world, local_rank=local_rank,
                       local_world_size=local_world, backend=backend,
                       object_group=object_group, cuda_problem=problem)
