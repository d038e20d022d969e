"""The GPU watch's files and settings: what the sampler (node) writes and the reader
(client: standard library only) reads, and the warm-up rule both apply.

`RUN_DIR/gpu/NODE.csv`: CSV_HEADER once (a chain's chunks append to one file), a START_MARK
line where each sampler run begins, then one line per GPU per sample. Idle stretches are
counted per sampler run, never across a START_MARK, and after a warm-up (WarmUp).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from train.batch.contract import (
    GPU_IDLE_MINUTES_VAR,
    GPU_IDLE_THRESHOLD_VAR,
    GPU_WATCH_DIR,
    GPU_WATCH_INTERVAL_VAR,
)

CSV_HEADER = "time,gpu,util_pct,mem_used_mib,mem_total_mib"
MIB = 1024 * 1024
# used by readers that are not told the job's settings (the project's defaults)
DEFAULT_IDLE_THRESHOLD = 10
DEFAULT_IDLE_MINUTES = 30
# Start-up is not idleness: a GPU's samples count toward an idle stretch only from its first
# sample at or over the threshold, or from this many minutes after its sampler started. The
# sampler starts with `train launch`, before the program: the container starts, Python
# imports torch, CUDA initialises, the ranks meet and the data is indexed, with the GPU at
# 0% throughout (a few minutes on the field's jobs; the multi-node rendezvous alone can
# take minutes). 10 minutes covers that, while a program that never uses the GPU is still
# reported after 10 minutes plus the idle time; longer start-ups (a feature cache rebuilt
# in every chunk) are real idle GPU time and are reported.
WARMUP_MINUTES = 10.0
# the line each sampler writes before its first sample (then its start as unix time)
START_MARK = "# sampler started at "
# what a reading may say: memory in MiB below this (2 PiB), GPU indexes in the files up to
# MAX_GPU_INDEX, times in the files between 0 and MAX_TIME (unix seconds, the year 5138)
MAX_MIB = 2**31
MAX_GPU_INDEX = 1023
MAX_TIME = 10**11
_NODE_FILE_RE = re.compile(r"[^A-Za-z0-9._-]")


def csv_path(run_dir: Path | str, node: str) -> Path:
    name = _NODE_FILE_RE.sub("_", node).lstrip(".") or "node"
    return Path(run_dir) / GPU_WATCH_DIR / f"{name}.csv"


@dataclass(frozen=True)
class WatchSettings:
    interval: float  # seconds between samples (> 0)
    idle_threshold: float  # percent: a sample under it is idle
    idle_minutes: float  # how long every sample must be idle before the warning

    def as_env(self) -> dict[str, str]:
        return {GPU_WATCH_INTERVAL_VAR: _num(self.interval),
                GPU_IDLE_THRESHOLD_VAR: _num(self.idle_threshold),
                GPU_IDLE_MINUTES_VAR: _num(self.idle_minutes)}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def settings_from_env(env: Mapping[str, str]) -> WatchSettings | None:
    """The job's settings as the rendered script passes them; None when the watch is off
    (no interval or 0). A value that is not a number raises ValueError naming it."""
    raw = env.get(GPU_WATCH_INTERVAL_VAR, "").strip()
    if not raw:
        return None
    values: list[float] = []
    for name, default in ((GPU_WATCH_INTERVAL_VAR, None),
                          (GPU_IDLE_THRESHOLD_VAR, DEFAULT_IDLE_THRESHOLD),
                          (GPU_IDLE_MINUTES_VAR, DEFAULT_IDLE_MINUTES)):
        text = env.get(name, "").strip() or str(default)
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}={text!r} must be a non-negative number")
        values.append(value)
    interval, threshold, minutes = values
    if interval == 0:
        return None
    return WatchSettings(interval, min(threshold, 100.0), minutes)


@dataclass
class WarmUp:
    """Which GPUs of one sampler run are past their warm-up: from the first sample at or
    over the threshold, or from `start` + WARMUP_MINUTES. `start` None (not known: a file
    read from its tail): no warm-up."""

    threshold: float
    start: float | None
    done: set[int] = field(default_factory=set)

    def counts(self, gpu: int, now: float, util: float) -> bool:
        if self.start is None or gpu in self.done:
            return True
        if util >= self.threshold or now - self.start >= WARMUP_MINUTES * 60:
            self.done.add(gpu)
            return True
        return False
