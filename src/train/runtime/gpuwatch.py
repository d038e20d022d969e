"""GPU utilisation watch: a sampler process per node, and the readers of what it wrote.

Some sites cancel jobs whose GPUs sit idle (NYU Torch publishes thresholds per node family
and enforces them), and an idle GPU is a symptom anyway: a starved data loader, a program
on the CPU. `train launch` starts one sampler per node (`spawn`) as a separate process, so
that sampling never slows or blocks training:

    python -m train.runtime.gpuwatch --out RUN_DIR --node NAME --interval S \
        --idle-threshold P --idle-minutes M --parent PID

It reads every GPU of the job through NVML (`nvidia-ml-py`, imported lazily) each interval
and appends one line per GPU to `RUN_DIR/gpu/NODE.csv` (CSV_HEADER; the header is written
once, when the file is new, so the chunks of a chain append to one file), flushed after
each sample. It logs one warning when every sample of a GPU stayed under the threshold for
the idle time, and again only after that GPU recovered and fell again. It exits when the
parent is gone, on SIGTERM or SIGINT, and at once (exit 0, one info line) where NVML or a
GPU is missing. The walltime USR1 (Slurm sends it to every process of the step) is ignored.

`summary` and `idle_findings` stream the files (never a whole file in memory; `summary`
reads at most the last `max_bytes` of each) and skip lines they cannot read.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from train.slurm.contract import (
    GPU_IDLE_MINUTES_VAR,
    GPU_IDLE_THRESHOLD_VAR,
    GPU_WATCH_DIR,
    GPU_WATCH_INTERVAL_VAR,
)

log = logging.getLogger("train.gpuwatch")

CSV_HEADER = "time,gpu,util_pct,mem_used_mib,mem_total_mib"
MIB = 1024 * 1024
# the parent and the stop flag are checked this often while waiting for the next sample
TICK_SECONDS = 1.0
# what `summary` reads of a file at most (its tail): about 20 days of 8 GPUs every 30 s
SUMMARY_MAX_BYTES = 16 * MIB
# used by readers that are not told the job's settings (the project's defaults)
DEFAULT_IDLE_THRESHOLD = 10
DEFAULT_IDLE_MINUTES = 30
_NODE_FILE_RE = re.compile(r"[^A-Za-z0-9._-]")


def csv_path(run_dir: Path | str, node: str) -> Path:
    """`RUN_DIR/gpu/NODE.csv`, the node's name reduced to a safe file name."""
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


# -- sampling -------------------------------------------------------------------------


@dataclass
class _IdleRun:
    since: float | None = None  # time of the first sample of the current idle run
    warned: bool = False


@dataclass
class IdleTracker:
    """Per GPU: since when every sample was under the threshold, and whether that run was
    warned about. A sample at or over the threshold ends the run and re-arms the warning."""

    threshold: float
    minutes: float
    runs: dict[int, _IdleRun] = field(default_factory=dict)

    def update(self, now: float, utils: Mapping[int, float]) -> list[tuple[int, float]]:
        """Record one sample; the GPUs whose idle run just reached the idle time, with the
        time the run started."""
        crossed = []
        for gpu, util in utils.items():
            run = self.runs.setdefault(gpu, _IdleRun())
            if util >= self.threshold:
                run.since, run.warned = None, False
                continue
            if run.since is None:
                run.since = now
            if not run.warned and now - run.since >= self.minutes * 60:
                run.warned = True
                crossed.append((gpu, run.since))
        return crossed


def idle_warning(node: str, crossed: Sequence[tuple[int, float]], threshold: float,
                 minutes: float) -> str:
    gpus = ", ".join(str(g) for g, _ in crossed)
    since = time.strftime("%H:%M:%S", time.localtime(min(s for _, s in crossed)))
    plural = "s" if len(crossed) > 1 else ""
    return (f"GPU watch on {node}: GPU{plural} {gpus} stayed under {_num(threshold)}% "
            f"utilisation for {_num(minutes)} min (every sample since {since}). An idle GPU "
            "wastes the allocation, and some sites cancel such jobs (NYU Torch does). Check "
            "that the program really uses the GPU (--device cuda; the model and every batch "
            "moved to it) and that its input keeps up: more DataLoader workers (--workers), "
            "data on fast storage, a larger batch")


def select_gpus(nvml: Any, count: int, visible: str | None) -> list[int]:
    """The NVML indexes of the job's GPUs. Under Slurm's device cgroup NVML sees only the
    job's GPUs (CUDA_VISIBLE_DEVICES then counts from 0 again): all of them. On a node
    without it NVML sees every GPU, and CUDA_VISIBLE_DEVICES names the job's ones."""
    every = list(range(count))
    items = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if not items or items == ["-1"] or len(items) >= count:
        return every
    if all(v.isdigit() for v in items):
        chosen = sorted({int(v) for v in items if int(v) < count})
        return chosen or every
    uuids: dict[str, int] = {}
    for i in every:
        with contextlib.suppress(Exception):
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            uuids[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = i
    chosen = sorted({uuids[v] for v in items if v in uuids})
    return chosen or every


class Sampler:
    """One sample of every watched GPU: (gpu, util %, used MiB, total MiB) rows. A GPU
    whose utilisation cannot be read (a MIG-enabled card, a GPU gone from the bus) is
    logged once and left out from then on."""

    def __init__(self, nvml: Any, gpus: Sequence[int]) -> None:
        self.nvml = nvml
        self.handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in gpus}

    def sample(self) -> list[tuple[int, int, int, int]]:
        rows = []
        for gpu, handle in list(self.handles.items()):
            try:
                util = int(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                rows.append((gpu, util, int(mem.used) // MIB, int(mem.total) // MIB))
            except Exception as exc:  # an NVMLError, or anything a driver shim raises
                log.info("GPU watch: GPU %d cannot be read (%s); it is not sampled", gpu,
                         exc)
                del self.handles[gpu]
        return rows


def _wait(seconds: float, sleep: Callable[[float], None],
          keep_going: Callable[[], bool]) -> bool:
    """Sleep `seconds` in ticks, checking keep_going before each; False when it said no."""
    left = seconds
    while left > 0:
        if not keep_going():
            return False
        step = min(TICK_SECONDS, left)
        sleep(step)
        left -= step
    return keep_going()


def watch(nvml: Any, run_dir: Path | str, node: str, settings: WatchSettings, *,
          clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
          keep_going: Callable[[], bool] = lambda: True, max_samples: int | None = None,
          visible: str | None = None) -> int:
    """Sample until keep_going says no (or max_samples are taken). Returns the exit code:
    0, also where NVML has no driver or no GPU; 1 where the file cannot be written."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        log.info("GPU watch off: NVML cannot start here (%s)", exc)
        return 0
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
            sampler = Sampler(nvml, select_gpus(nvml, count, visible))
        except Exception as exc:
            log.info("GPU watch off: NVML lists no GPU (%s)", exc)
            return 0
        if not sampler.handles:
            log.info("GPU watch off: no GPU on this node")
            return 0
        return _sample_loop(sampler, run_dir, node, settings, clock, sleep, keep_going,
                            max_samples)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _sample_loop(sampler: Sampler, run_dir: Path | str, node: str, settings: WatchSettings,
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 keep_going: Callable[[], bool], max_samples: int | None) -> int:
    path = csv_path(run_dir, node)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out: IO[str] = path.open("a", encoding="utf-8")
    except OSError as exc:
        log.warning("GPU watch off: cannot write %s (%s)", path, exc)
        return 1
    tracker = IdleTracker(settings.idle_threshold, settings.idle_minutes)
    log.info("GPU watch: %d GPU(s) (%s) every %s s into %s; a warning after %s min under "
             "%s%%", len(sampler.handles), ", ".join(map(str, sampler.handles)),
             _num(settings.interval), path, _num(settings.idle_minutes),
             _num(settings.idle_threshold))
    taken = 0
    with out:
        if out.tell() == 0:
            out.write(CSV_HEADER + "\n")
        while True:
            now = clock()
            rows = sampler.sample()
            if not rows:
                log.info("GPU watch stopped: no GPU can be read")
                return 0
            try:
                out.write("".join(f"{now:.1f},{g},{u},{used},{total}\n"
                                  for g, u, used, total in rows))
                out.flush()
            except OSError as exc:
                log.warning("GPU watch stopped: cannot write %s (%s)", path, exc)
                return 1
            crossed = tracker.update(now, {g: u for g, u, _, _ in rows})
            if crossed:
                log.warning("%s", idle_warning(node, crossed, settings.idle_threshold,
                                               settings.idle_minutes))
            taken += 1
            if max_samples is not None and taken >= max_samples:
                return 0
            if not _wait(settings.interval, sleep, keep_going):
                return 0


# -- the process ----------------------------------------------------------------------


def process_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # no /proc: the signal test is all there is
    state = stat.rsplit(")", 1)[-1].split()
    return not state or state[0] not in ("Z", "X")


def parent_watch(parent: int) -> Callable[[], bool]:
    """keep_going for the sampler: the parent is still there. Where the parent is this
    process's own, its end shows as a new parent id (reliable even if the pid is reused);
    for any other pid, the process must still exist."""
    if parent == os.getppid():
        return lambda: os.getppid() == parent
    return lambda: process_alive(parent)


def spawn(run_dir: Path | str, node: str, settings: WatchSettings, parent: int, *,
          env: Mapping[str, str] | None = None,
          popen: Callable[..., Any] = subprocess.Popen) -> Any:
    """Start the sampler process (stdout discarded, stderr shared: its lines go to the job's
    log). Returns the Popen object; raises what starting it raises."""
    argv = [sys.executable, "-m", "train.runtime.gpuwatch", "--out", str(run_dir),
            "--node", node, "--interval", _num(settings.interval),
            "--idle-threshold", _num(settings.idle_threshold),
            "--idle-minutes", _num(settings.idle_minutes), "--parent", str(parent)]
    return popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 env=None if env is None else dict(env), close_fds=True)


def _positive(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.runtime.gpuwatch",
                                description="Sample every GPU's utilisation into "
                                "RUN_DIR/gpu/NODE.csv until the parent process is gone.")
    p.add_argument("--out", required=True, help="the run directory")
    p.add_argument("--node", required=True, help="this node's name (the file's name)")
    p.add_argument("--interval", type=_positive, required=True, help="seconds per sample")
    p.add_argument("--idle-threshold", type=_non_negative, required=True,
                   help="utilisation percent under which a GPU counts as idle")
    p.add_argument("--idle-minutes", type=_non_negative, required=True,
                   help="minutes every sample must be idle before the warning")
    p.add_argument("--parent", type=int, default=None,
                   help="exit once this process is gone (default: the parent process)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    stop: list[int] = []
    # the walltime USR1 reaches every process of the step: the sampler samples on
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    parent_alive = parent_watch(os.getppid() if args.parent is None else args.parent)
    try:
        import pynvml
    except ImportError:
        log.info("GPU watch off: NVIDIA's management library (nvidia-ml-py) is not "
                 "installed")
        return 0
    settings = WatchSettings(args.interval, min(args.idle_threshold, 100.0),
                             args.idle_minutes)
    return watch(pynvml, args.out, args.node, settings,
                 keep_going=lambda: not stop and parent_alive(),
                 visible=os.environ.get("CUDA_VISIBLE_DEVICES"))


# -- reading --------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line number in the file
    time: float
    gpu: int
    util: float
    mem_used: int
    mem_total: int


def parse_line(text: str, line: int) -> Record | None:
    """One CSV line, or None for the header, garbage and impossible values."""
    parts = text.strip().split(",")
    if len(parts) != 5:
        return None
    try:
        t, util = float(parts[0]), float(parts[2])
        gpu, used, total = int(parts[1]), int(parts[3]), int(parts[4])
    except ValueError:
        return None
    if not (math.isfinite(t) and t > 0 and math.isfinite(util) and 0 <= util <= 100
            and gpu >= 0 and used >= 0 and total >= 0):
        return None
    return Record(line, t, gpu, util, used, total)


def _count_lines(f: IO[bytes], end: int) -> int:
    """Newlines in the first `end` bytes (read in chunks, never whole)."""
    f.seek(0)
    count, left = 0, end
    while left > 0:
        chunk = f.read(min(left, MIB))
        if not chunk:
            break
        count += chunk.count(b"\n")
        left -= len(chunk)
    return count


def read_records(path: Path, max_bytes: int | None = None,
                 count_skipped: bool = True) -> Iterator[Record]:
    """The file's valid records, streamed; with max_bytes only its tail (from the first
    whole line of the last max_bytes), line numbers still counted from the file's start
    unless count_skipped is False (then they count from the tail's start)."""
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
            record = parse_line(raw.decode("utf-8", errors="replace"), line)
            if record is not None:
                yield record


def node_files(run_dir: Path | str) -> list[Path]:
    folder = Path(run_dir) / GPU_WATCH_DIR
    try:
        return sorted(p for p in folder.glob("*.csv") if p.is_file())
    except OSError:
        return []


def summary(run_dir: Path | str, threshold: float = DEFAULT_IDLE_THRESHOLD,
            minutes: float = DEFAULT_IDLE_MINUTES, max_bytes: int = SUMMARY_MAX_BYTES
            ) -> dict[str, dict[str, Any]]:
    """Per node: {"gpus": n, "mean_util": mean of every sample of every GPU, "latest_util":
    mean over the GPUs of the latest sample, "latest_time": its unix time, "samples": sample
    rounds read, "first_time": the first one read (files over max_bytes are read from their
    tail: "partial" is then true), "latest": {gpu: util}, "idle": whether a GPU is idle now
    (every sample under `threshold` for `minutes` up to the latest), "idle_description":
    which and since when ("" when none)}. Nodes whose files hold no valid line are left
    out."""
    out: dict[str, dict[str, Any]] = {}
    for path in node_files(run_dir):
        try:
            node = _summarise(path, threshold, minutes, max_bytes)
        except OSError:
            continue
        if node is not None:
            out[path.stem] = node
    return out


def _summarise(path: Path, threshold: float, minutes: float, max_bytes: int
               ) -> dict[str, Any] | None:
    total = 0.0
    lines = samples = 0
    first: float | None = None
    last: float | None = None
    latest: dict[int, float] = {}
    idle_since: dict[int, float | None] = {}
    for rec in read_records(path, max_bytes, count_skipped=False):
        if rec.time != last:  # a new sample round (the lines of one share its time)
            samples += 1
            latest = {}
            last = rec.time
        first = rec.time if first is None else min(first, rec.time)
        total += rec.util
        lines += 1
        latest[rec.gpu] = rec.util
        if rec.util >= threshold:
            idle_since[rec.gpu] = None
        elif idle_since.get(rec.gpu) is None:
            idle_since[rec.gpu] = rec.time
    if not lines or last is None:
        return None
    idle = {g: s for g, s in idle_since.items()
            if s is not None and g in latest and last - s >= minutes * 60}
    description = ""
    if idle:
        since = min(idle.values())
        gpus = ", ".join(str(g) for g in sorted(idle))
        description = (f"GPU{'s' if len(idle) > 1 else ''} {gpus} under {_num(threshold)}% "
                       f"for {(last - since) / 60:.0f} min (since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))})")
    try:
        partial = path.stat().st_size > max_bytes
    except OSError:
        partial = False
    return {"gpus": len(idle_since), "mean_util": round(total / lines, 1),
            "latest_util": round(sum(latest.values()) / len(latest), 1),
            "latest_time": last, "first_time": first, "samples": samples,
            "latest": dict(sorted(latest.items())), "partial": partial,
            "idle": bool(idle), "idle_description": description, "file": str(path)}


@dataclass(frozen=True)
class IdleFinding:
    """A GPU under the threshold in every sample for at least the idle time."""

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
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.start))
        still = ", still at the latest sample" if self.ongoing else ""
        return (f"node {self.node} GPU {self.gpu}: under {_num(self.threshold)}% utilisation "
                f"(at most {self.max_util:g}%) for {self.minutes:.0f} min from {stamp}"
                f"{still}: {self.samples} samples, {self.file} lines "
                f"{self.first_line}-{self.last_line}")


def idle_findings(run_dir: Path | str, threshold: float, minutes: float
                  ) -> list[IdleFinding]:
    """Every run of samples of one GPU all under `threshold` spanning at least `minutes`,
    with the file and line numbers as evidence; by node, GPU and start."""
    found: list[IdleFinding] = []
    for path in node_files(run_dir):
        try:
            found += _findings(path, threshold, minutes)
        except OSError:
            continue
    return sorted(found, key=lambda f: (f.node, f.gpu, f.start))


@dataclass
class _Run:
    first: Record
    last: Record
    samples: int = 1
    max_util: float = 0.0


def _findings(path: Path, threshold: float, minutes: float) -> list[IdleFinding]:
    runs: dict[int, _Run | None] = {}
    found: list[IdleFinding] = []

    def close(run: _Run | None, ongoing: bool) -> None:
        if run is not None and run.last.time - run.first.time >= minutes * 60:
            found.append(IdleFinding(path.stem, run.first.gpu, str(path), run.first.line,
                                     run.last.line, run.first.time, run.last.time,
                                     run.samples, run.max_util, threshold, ongoing))

    for rec in read_records(path):
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


if __name__ == "__main__":
    sys.exit(main())
