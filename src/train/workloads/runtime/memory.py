"""GPU memory: the tuned allocator settings and fail-fast preallocation (Adam allocates its
moments on the first `step()`, which on a shared GPU can fail hours into a job)."""

from __future__ import annotations

import gc
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass

import torch

from train.common import hostmem
from train.common.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF
from train.common.errors import PreallocationError

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# out of memory as torch words it: its CPU allocator (DefaultCPUAllocator: not enough memory
# / can't allocate memory), the system's ENOMEM, a device's "out of memory"
OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator|Cannot allocate memory|not enough memory|"
                           r"out of memory", re.IGNORECASE)


def apply_allocator_settings(environ: MutableMapping[str, str] | None = None) -> str:
    """Set the tuned allocator settings unless the user chose their own; before CUDA is
    initialised (the caching allocator reads the variable once)."""
    env = os.environ if environ is None else environ
    user_value = env.get(ALLOC_CONF_VAR)
    if user_value:
        log.info("%s=%s (set by the user, kept)", ALLOC_CONF_VAR, user_value)
        return user_value
    env[ALLOC_CONF_VAR] = TUNED_ALLOC_CONF
    if torch.cuda.is_initialized():
        log.warning("%s set after CUDA initialised; it takes effect in new processes only",
                    ALLOC_CONF_VAR)
    log.info("%s=%s (tuned default)", ALLOC_CONF_VAR, TUNED_ALLOC_CONF)
    return TUNED_ALLOC_CONF


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes on the device; host memory for CPU devices."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    return hostmem.available_bytes(), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def training_state_bytes(params: Iterable[torch.nn.Parameter]) -> int:
    """Bytes of parameters + gradients + Adam's two moment buffers."""
    return 4 * sum(p.numel() * p.element_size() for p in params)


@dataclass(frozen=True)
class PreallocReport:
    seconds: float
    state_bytes: int
    peak_bytes: int  # peak device memory after the dummy step (0 on CPU)


def preallocate(dummy_step: Callable[[], None], *, device: torch.device, state_bytes: int,
                what: str) -> PreallocReport:
    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        dummy_step()
    except (MemoryError, RuntimeError) as exc:
        # the CPU allocator's failure is a RuntimeError; any other is not ours to explain
        if not isinstance(exc, (MemoryError, torch.OutOfMemoryError)) and \
                not OUT_OF_MEMORY.search(str(exc)):
            raise
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        free, total = device_memory(device)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "host memory"
        raise PreallocationError(
            f"out of memory on {device} ({name}) while preallocating {what}: the optimizer "
            f"state and gradients alone need about {state_bytes / MIB:.1f} MiB plus "
            f"activations, and only {free / MIB:.1f} MiB of {total / MIB:.1f} MiB is free. "
            "Other processes may be using this GPU (check nvidia-smi); lower --batch-size "
            f"or --res, or wait for free memory. ({str(exc).splitlines()[0][:200]})"
        ) from None
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    report = PreallocReport(time.perf_counter() - start, state_bytes, int(peak))
    log.info("preallocated %s in %.3f s (optimizer state + grads %.1f MiB, peak %.1f MiB)",
             what, report.seconds, state_bytes / MIB, peak / MIB)
    return report
