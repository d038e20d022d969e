"""Host memory this process can still use: the node's MemAvailable, cut to what its memory
cgroup allows (Slurm's `--mem` is the job's cgroup limit: a check against the node alone
passed the field's 16-GPU job, then 5 oom_kill events). No heavy imports."""

from __future__ import annotations

import os
from pathlib import Path

# Host memory one DataLoader worker is counted at when the job does not say: the job's
# up-front check uses it, and the rendered `train launch --worker-mem-mb` caps the workers
# by it on the node (the doctor's host-OOM advice counts the same figure).
# From the field notes (seed 003): 4 L40S ranks x 8 workers = 32 workers on a 256 GB node
# were OOM-killed, so a worker there took more than 256 / 32 = 8 GB; the fix the notes
# settled on, 2 workers per rank (8 a node), has to fit: at most 256 / 8 = 32 GB each.
# 24 GB lies in (8, 32] and leaves the fix's node 256 - 8 x 24 = 64 GB (16 GB a rank) for
# the training processes themselves. With it, that job (--mem 250G) is refused and told
# 250 // (4 x 24) = 2 workers per rank. Workers that hold less: give --worker-mem.
DEFAULT_WORKER_MEM_MB = 24 * 1024


def available_bytes() -> int:
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    left = cgroup_memory_left()
    return free if left is None else min(free, left)


_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a page-rounded 2**63-1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def cgroup_memory_left(self_cgroup: str | None = None,
                       root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process's memory cgroup and its ancestors still allow (at the tightest
    level), or None where none has a limit. `self_cgroup`: /proc/self/cgroup's text."""
    if self_cgroup is None:
        try:
            self_cgroup = Path("/proc/self/cgroup").read_text(encoding="utf-8")
        except OSError:
            return None
    left: list[int] = []  # what each limited level allows
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2: one unified hierarchy
            base, files = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own tree
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        directory = base / rel.strip().lstrip("/")
        while True:  # the job's limit sits above the step's own cgroup
            limit = _read_int(directory / files[0])
            used = _read_int(directory / files[1])
            if limit is not None and limit < _UNLIMITED and used is not None:
                left.append(max(0, limit - used))
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return min(left, default=None)
