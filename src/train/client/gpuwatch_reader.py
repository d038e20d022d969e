"""The GPU watch's reader, on the client (`train status`, `train doctor`): what the
samplers wrote, as a summary per node and as idle stretches with their evidence. Files are
streamed (at most their last `max_bytes`), and their content never raises.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from train.batch.contract import GPU_WATCH_DIR
from train.common.gpuwatch_file import (
    DEFAULT_IDLE_MINUTES,
    DEFAULT_IDLE_THRESHOLD,
    MAX_GPU_INDEX,
    MAX_MIB,
    MAX_TIME,
    MIB,
    WarmUp,
    _num,
)

# what `summary` reads of a file at most (its tail): about 20 days of 8 GPUs every 30 s
SUMMARY_MAX_BYTES = 16 * MIB
# a START_MARK line, the sampler run's start in unix seconds
_START_RE = re.compile(r"# sampler started at (\d{1,11}(?:\.\d+)?)\s*$")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line number in the file
    time: float
    gpu: int
    util: float  # (the memory columns are checked, never read)


def parse_line(text: str, line: int) -> Record | None:
    """One CSV line, or None for the header, garbage and impossible values."""
    parts = text.strip().split(",")
    if len(parts) != 5 or any(len(p) > 40 for p in parts):
        return None
    try:
        t, util = float(parts[0]), float(parts[2])
        gpu, used, total = int(parts[1]), int(parts[3]), int(parts[4])
    except ValueError:
        return None
    if not (0 < t < MAX_TIME and 0 <= util <= 100 and 0 <= gpu <= MAX_GPU_INDEX
            and 0 <= used < MAX_MIB and 0 <= total < MAX_MIB):
        return None  # NaN fails every comparison
    return Record(line, t, gpu, util)


def _stamp(t: float, fmt: str) -> str:
    """A unix time in local time; never raises (a time out of range is shown as a number)."""
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}" if math.isfinite(t) and abs(t) < 1e15 else "?"


def _count_lines(f: IO[bytes], end: int) -> int:  # read in chunks, never whole
    f.seek(0)
    count, left = 0, end
    while left > 0:
        chunk = f.read(min(left, MIB))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def read_records(path: Path, max_bytes: int | None = None) -> Iterator[Record]:
    """The file's valid records, streamed; with max_bytes only its tail (from the first
    whole line of the last max_bytes), line numbers still counted from the file's start."""
    for item in read_items(path, max_bytes):
        if isinstance(item, Record):
            yield item


def read_items(path: Path, max_bytes: int | None = None,
               count_skipped: bool = True) -> Iterator[Record | float]:
    """read_records, with each sampler's START_MARK as its start time (a float) where it
    stands in the file; count_skipped False: line numbers count from the tail's start."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        start, line = 0, 0
        if max_bytes is not None and size > max_bytes:
            start = size - max_bytes
            line = _count_lines(f, start) if count_skipped else 0
            f.seek(start - 1)
            if f.read(1) != b"\n":  # inside a line: skip to the next whole one
                f.readline()
                line += 1
        else:
            f.seek(0)
        for raw in f:
            line += 1
            if not raw.endswith(b"\n"):
                return  # the sample being written now
            text = raw.decode("utf-8", errors="replace")
            if text.startswith("#"):
                mark = _START_RE.match(text)
                began = float(mark.group(1)) if mark else 0.0
                if 0 < began < MAX_TIME:
                    yield began
                continue
            record = parse_line(text, line)
            if record is not None:
                yield record


def _per_node(run_dir: Path | str, read: Callable[[Path], _T]) -> Iterator[tuple[Path, _T]]:
    """Each node's file as `read` reads it; one that cannot be read is left out."""
    try:
        paths = sorted(p for p in (Path(run_dir) / GPU_WATCH_DIR).glob("*.csv") if p.is_file())
    except OSError:
        return
    for path in paths:
        try:
            yield path, read(path)
        except (OSError, ValueError, ArithmeticError):
            continue


def idle_settings(record: Mapping[str, Any]) -> tuple[float, float]:
    """The job's GPU idle threshold (percent) and minutes, as `train submit` recorded them
    in the chain's resources; the watch's defaults where they are missing or odd."""
    res = record.get("resources")
    watch = res.get("gpu_watch") if isinstance(res, dict) else None
    given = watch if isinstance(watch, dict) else {}
    threshold, minutes = (float(v) if isinstance(v := given.get(name), (int, float))
                          and not isinstance(v, bool) else default
                          for name, default in (("idle_threshold", DEFAULT_IDLE_THRESHOLD),
                                                ("idle_minutes", DEFAULT_IDLE_MINUTES)))
    return threshold, minutes


def summary(run_dir: Path | str, threshold: float = DEFAULT_IDLE_THRESHOLD,
            minutes: float = DEFAULT_IDLE_MINUTES, max_bytes: int = SUMMARY_MAX_BYTES
            ) -> dict[str, dict[str, Any]]:
    """Per node (those with a valid line): utilisation over every sample and the latest,
    and whether a GPU is idle now (every sample under `threshold` for `minutes` up to the
    latest; "partial": the file was read from its tail)."""
    return {path.stem: node for path, node in _per_node(
        run_dir, lambda p: _summarise(p, threshold, minutes, max_bytes)) if node is not None}


def _summarise(path: Path, threshold: float, minutes: float, max_bytes: int
               ) -> dict[str, Any] | None:
    total = 0.0
    lines = samples = 0
    first: float | None = None
    last: float | None = None
    latest: dict[int, float] = {}
    seen: set[int] = set()

    def counted(items: Iterable[Record | float]) -> Iterator[Record | float]:
        nonlocal total, lines, samples, first, last, latest
        for rec in items:
            if isinstance(rec, Record):
                seen.add(rec.gpu)
                if rec.time != last:  # a new sample round (the lines of one share its time)
                    samples += 1
                    latest = {}
                    last = rec.time
                first = rec.time if first is None else min(first, rec.time)
                total += rec.util
                lines += 1
                latest[rec.gpu] = rec.util
            yield rec

    found = _findings(path, counted(read_items(path, max_bytes, count_skipped=False)),
                      threshold, minutes)
    if not lines or last is None:
        return None
    # idle now: a stretch that lasts up to the latest sample round
    idle = {f.gpu: f.start for f in found if f.ongoing and f.gpu in latest}
    description = ""
    if idle:
        since = min(idle.values())
        gpus = ", ".join(str(g) for g in sorted(idle))
        description = (f"GPU{'s' if len(idle) > 1 else ''} {gpus} under {_num(threshold)}% "
                       f"for {(last - since) / 60:.0f} min (since "
                       f"{_stamp(since, '%Y-%m-%d %H:%M:%S')})")
    try:
        partial = path.stat().st_size > max_bytes
    except OSError:
        partial = False
    return {"gpus": len(seen), "mean_util": round(total / lines, 1),
            "latest_util": round(sum(latest.values()) / len(latest), 1),
            "latest_time": last, "first_time": first, "samples": samples,
            "latest": dict(sorted(latest.items())), "partial": partial,
            "idle": bool(idle), "idle_description": description, "file": str(path)}


@dataclass(frozen=True)
class IdleFinding:
    node: str
    gpu: int
    file: str
    first_line: int
    last_line: int
    start: float  # unix time of the first idle sample
    end: float  # of the last one
    samples: int
    max_util: float  # the highest utilisation in the run (under the threshold)
    threshold: float
    ongoing: bool  # the run lasts up to the file's latest sample of that GPU

    @property
    def minutes(self) -> float:
        return (self.end - self.start) / 60

    def describe(self) -> str:
        stamp = _stamp(self.start, "%Y-%m-%d %H:%M")
        still = ", still at the latest sample" if self.ongoing else ""
        return (f"node {self.node} GPU {self.gpu}: under {_num(self.threshold)}% utilisation "
                f"(at most {self.max_util:g}%) for {self.minutes:.0f} min from {stamp}"
                f"{still}: {self.samples} samples, {self.file} lines "
                f"{self.first_line}-{self.last_line}")


def idle_findings(run_dir: Path | str, threshold: float, minutes: float,
                  max_bytes: int | None = SUMMARY_MAX_BYTES) -> list[IdleFinding]:
    """Every run of samples of one GPU all under `threshold` spanning at least `minutes`
    within one sampler run, with the file and line numbers (from the file's start) as
    evidence; by node, GPU and start."""
    found = [f for _, got in _per_node(run_dir, lambda p: _findings(
        p, read_items(p, max_bytes), threshold, minutes)) for f in got]
    return sorted(found, key=lambda f: (f.node, f.gpu, f.start))


@dataclass
class _Run:
    first: Record
    last: Record
    samples: int = 1
    max_util: float = 0.0


def _findings(path: Path, items: Iterable[Record | float], threshold: float,
              minutes: float) -> list[IdleFinding]:
    runs: dict[int, _Run | None] = {}
    found: list[IdleFinding] = []

    def close(run: _Run | None, ongoing: bool) -> None:
        if run is not None and run.last.time - run.first.time >= minutes * 60:
            found.append(IdleFinding(path.stem, run.first.gpu, str(path), run.first.line,
                                     run.last.line, run.first.time, run.last.time,
                                     run.samples, run.max_util, threshold, ongoing))

    warm = WarmUp(threshold, None)
    for rec in items:
        if not isinstance(rec, Record):  # a new sampler run (a new chunk): the stretches
            for run in runs.values():  # of the one before end where its samples end
                close(run, ongoing=False)
            runs, warm = {}, WarmUp(threshold, rec)
            continue
        if not warm.counts(rec.gpu, rec.time, rec.util):
            continue
        run = runs.get(rec.gpu)
        if rec.util >= threshold:
            close(run, ongoing=False)
            runs[rec.gpu] = None
        elif run is None:
            runs[rec.gpu] = _Run(rec, rec, 1, rec.util)
        else:
            run.last, run.samples = rec, run.samples + 1
            run.max_util = max(run.max_util, rec.util)
    for run in runs.values():
        close(run, ongoing=True)
    return found
