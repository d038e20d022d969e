"""GPU utilisation watch: a sampler process per node, and the readers of what it wrote.

Some sites cancel jobs whose GPUs sit idle (NYU Torch publishes thresholds per node family
and enforces them), and an idle GPU is a symptom anyway: a starved data loader, a program
on the CPU. `train launch` starts one sampler per node (`spawn`) as a separate process, so
that sampling never slows or blocks training:

    python -m train.runtime.gpuwatch --out RUN_DIR --node NAME --interval S \
        --idle-threshold P --idle-minutes M --parent PID

It reads every GPU of the job through NVML (`nvidia-ml-py`, imported lazily) each interval
and appends one line per GPU to `RUN_DIR/gpu/NODE.csv` (CSV_HEADER; the header is written
once, when the file is new, so the chunks of a chain append to one file), written straight
to the file (no buffer) after each sample. Each sampler writes a START_MARK line before its
first sample: a chain's chunks append to one file, and the queue wait between two chunks is
no idle time. Only a regular file is written: a FIFO, a device
or a socket at that path is one line in the log and exit 0. Readings that cannot be true
(utilisation outside 0..100, memory negative or absurd) are left out of that sample; a GPU
that cannot be read is tried again at the next samples and given up after MAX_FAILURES in
a row. It logs one warning when every sample of a GPU stayed under the threshold for the
idle time, and again only after that GPU recovered and fell again.

It ends when the parent is gone (the kernel sends it SIGTERM: PR_SET_PDEATHSIG; the parent
is also polled, by the sampling loop and by a thread that ends the process even while the
loop waits in NVML), and on SIGTERM or SIGINT, which keep their default action so that they end
it even inside an NVML call that blocks (every sample is on disk already). NVML is never
shut down (nvmlShutdown can hang on a broken driver; the process is ending anyway). Where
NVML or a GPU is missing it exits at once (exit 0, one info line). The walltime USR1 (Slurm
sends it to every process of the step) is ignored.

Idle stretches (the live warning, `summary`, `idle_findings`) are counted per sampler run,
never across a START_MARK, and after a warm-up: a sampler starts before the program has
imported torch or touched CUDA, so a GPU's samples do not count until its first busy
sample or until WARMUP_MINUTES after the sampler started, whichever comes first.

`summary` and `idle_findings` stream the files (never a whole file in memory; both read at
most the last `max_bytes` of each, SUMMARY_MAX_BYTES by default), skip lines they cannot
read and never raise on a file's content.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import numbers
import os
import re
import signal
import stat
import subprocess
import sys
import threading
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
_START_RE = re.compile(r"# sampler started at (\d{1,11}(?:\.\d+)?)\s*$")
# the most GPUs one sampler watches (NVML's count beyond it is a broken library)
MAX_GPUS = 64
# a GPU that gives no reading this many samples in a row is given up
MAX_FAILURES = 10
# what a reading may say: memory in MiB below this (2 PiB), GPU indexes in the files up to
# MAX_GPU_INDEX, times in the files between 0 and MAX_TIME (unix seconds, the year 5138)
MAX_MIB = 2**31
MAX_GPU_INDEX = 1023
MAX_TIME = 10**11
_NODE_FILE_RE = re.compile(r"[^A-Za-z0-9._-]")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _text(value: Any, limit: int = 200) -> str:
    """`value` as one short printable line for the log (a driver's message may hold
    terminal escapes; str() of a hostile object may raise)."""
    try:
        text = str(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    text = _CONTROL_RE.sub("?", text)
    return text if len(text) <= limit else text[:limit] + "..."


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
class WarmUp:
    """Which GPUs of one sampler run are past their warm-up (WARMUP_MINUTES): from the
    first sample at or over the threshold, or from `start` + the warm-up. `start` None: the
    run's start is not known (a file read from its tail, or written before the marks
    existed): no warm-up."""

    threshold: float
    start: float | None
    done: set[int] = field(default_factory=set)

    def counts(self, gpu: int, now: float, util: float) -> bool:
        """Whether this sample counts toward idle stretches."""
        if self.start is None or gpu in self.done:
            return True
        if util >= self.threshold or now - self.start >= WARMUP_MINUTES * 60:
            self.done.add(gpu)
            return True
        return False


@dataclass
class IdleTracker:
    """Per GPU: since when every sample was under the threshold, and whether that run was
    warned about. A sample at or over the threshold ends the run and re-arms the warning.
    Samples in the warm-up (WarmUp, from the tracker's first sample) do not count."""

    threshold: float
    minutes: float
    runs: dict[int, _IdleRun] = field(default_factory=dict)
    warm: WarmUp | None = None

    def update(self, now: float, utils: Mapping[int, float]) -> list[tuple[int, float]]:
        """Record one sample; the GPUs whose idle run just reached the idle time, with the
        time the run started."""
        if self.warm is None:
            self.warm = WarmUp(self.threshold, now)
        crossed = []
        for gpu, util in utils.items():
            if not self.warm.counts(gpu, now, util):
                continue
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
    if all(re.fullmatch(r"[0-9]{1,6}", v) for v in items):
        chosen = sorted({int(v) for v in items if int(v) < count})
        return chosen or every
    uuids: dict[str, int] = {}
    for i in every:
        with contextlib.suppress(Exception):
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            uuids[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = i
    chosen = sorted({uuids[v] for v in items if v in uuids})
    return chosen or every


def _number(value: Any) -> float | None:
    """A finite real number as float, else None (None, text, NaN, 1e300 ** 2, 10**400)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def valid_reading(util: Any, used: Any, total: Any) -> tuple[int, int, int] | None:
    """(util %, used MiB, total MiB) from NVML's values (percent, bytes, bytes), or None
    where they cannot be true: a utilisation that is not a number in 0..100, memory that is
    not a number, negative, MAX_MIB or more, or more used than there is (1% slack)."""
    u, m_used, m_total = _number(util), _number(used), _number(total)
    if u is None or m_used is None or m_total is None or not 0 <= u <= 100:
        return None
    used_mib, total_mib = m_used / MIB, m_total / MIB
    if not (0 <= used_mib < MAX_MIB and 0 <= total_mib < MAX_MIB
            and used_mib <= total_mib * 1.01):
        return None
    return int(u), int(m_used) // MIB, int(m_total) // MIB


class Sampler:
    """One sample of every watched GPU: (gpu, util %, used MiB, total MiB) rows.

    A GPU that cannot be read (its handle or a reading raises) is logged the first time and
    tried again at every later sample; after MAX_FAILURES in a row it is given up (one line
    says so). A reading that cannot be true leaves that GPU out of that sample only (counted
    in `invalid`, logged once per GPU)."""

    def __init__(self, nvml: Any, gpus: Sequence[int]) -> None:
        self.nvml = nvml
        self.gpus: list[int] = list(gpus)  # the GPUs still watched
        self.handles: dict[int, Any] = {}
        self.failures: dict[int, int] = dict.fromkeys(self.gpus, 0)  # in a row
        self.invalid: dict[int, int] = dict.fromkeys(self.gpus, 0)  # readings left out
        self._logged: set[tuple[str, int]] = set()

    def _once(self, kind: str, gpu: int, message: str, *args: Any) -> None:
        if (kind, gpu) not in self._logged:
            self._logged.add((kind, gpu))
            log.info(message, *args)

    def _read(self, gpu: int) -> tuple[Any, Any, Any]:
        if gpu not in self.handles:
            self.handles[gpu] = self.nvml.nvmlDeviceGetHandleByIndex(gpu)
        handle = self.handles[gpu]
        util = self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
        mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        return util, mem.used, mem.total

    def sample(self) -> list[tuple[int, int, int, int]]:
        rows = []
        for gpu in list(self.gpus):
            try:
                util, used, total = self._read(gpu)
            except Exception as exc:  # an NVMLError, or anything a driver shim raises
                self.handles.pop(gpu, None)  # asked for again at the next try
                self.failures[gpu] += 1
                self._once("error", gpu, "GPU watch: GPU %d cannot be read (%s); it is "
                           "tried again at the next samples", gpu, _text(exc))
                if self.failures[gpu] >= MAX_FAILURES:
                    log.info("GPU watch: GPU %d gave no reading in %d samples in a row "
                             "(%s); it is no longer sampled", gpu, MAX_FAILURES, _text(exc))
                    self.gpus.remove(gpu)
                continue
            self.failures[gpu] = 0
            reading = valid_reading(util, used, total)
            if reading is None:
                self.invalid[gpu] += 1
                self._once("invalid", gpu, "GPU watch: GPU %d gave a reading that cannot be "
                           "true (utilisation %s, memory used %s of %s bytes); such samples "
                           "are left out", gpu, _text(util, 40), _text(used, 40),
                           _text(total, 40))
                continue
            rows.append((gpu, *reading))
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
    0, also where NVML has no driver or no GPU, where the path is not a regular file, and
    where a write fails; 1 where the file cannot be opened. NVML is not shut down
    (nvmlShutdown may block on a broken driver; the sampler's process ends after this)."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        log.info("GPU watch off: NVML cannot start here (%s)", _text(exc))
        return 0
    count = _gpu_count(nvml)
    if count is None:
        return 0
    try:
        gpus = select_gpus(nvml, count, visible)
    except Exception as exc:  # a shim's UUIDs: never fatal
        log.info("GPU watch: the job's GPUs cannot be told apart (%s); watching all %d",
                 _text(exc), count)
        gpus = list(range(count))
    sampler = Sampler(nvml, gpus)
    if not sampler.gpus:
        log.info("GPU watch off: no GPU on this node")
        return 0
    return _sample_loop(sampler, run_dir, node, settings, clock, sleep, keep_going,
                        max_samples)


def _gpu_count(nvml: Any) -> int | None:
    """How many GPUs NVML sees, at most MAX_GPUS; None (logged) where it cannot say."""
    try:
        raw = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        log.info("GPU watch off: NVML cannot count the GPUs (%s)", _text(exc))
        return None
    if isinstance(raw, bool) or not isinstance(raw, numbers.Integral):
        log.info("GPU watch off: NVML gave no GPU count (%s)", _text(raw, 40))
        return None
    count = int(raw)
    if count <= 0:
        log.info("GPU watch off: no GPU on this node")
        return None
    if count > MAX_GPUS:
        log.info("GPU watch: NVML reports more than %d GPUs; only the first %d are watched",
                 MAX_GPUS, MAX_GPUS)
        return MAX_GPUS
    return count


def _open_csv(path: Path) -> tuple[int | None, int]:
    """(the file's descriptor, 0), opened for appending only where it is a regular file (a
    FIFO would block the open, a device accepts or refuses anything); else (None, the exit
    code), logged: 0 where the path is not a regular file, 1 where it cannot be opened."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: opening a FIFO without a reader fails at once instead of waiting
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            log.warning("GPU watch off: %s is not a regular file; nothing is written", path)
            return None, 0
        log.warning("GPU watch off: cannot write %s (%s)", path, _text(exc))
        return None, 1
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:
        log.warning("GPU watch off: %s is not a regular file; nothing is written", path)
        with contextlib.suppress(OSError):
            os.close(fd)
        return None, 0
    return fd, 0


def _write_all(fd: int, text: str) -> None:
    view = memoryview(text.encode("ascii", errors="replace"))
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "nothing was written")
        view = view[written:]


def _sample_loop(sampler: Sampler, run_dir: Path | str, node: str, settings: WatchSettings,
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 keep_going: Callable[[], bool], max_samples: int | None) -> int:
    path = csv_path(run_dir, node)
    fd, code = _open_csv(path)
    if fd is None:
        return code
    try:
        return _write_samples(fd, path, sampler, node, settings, clock, sleep, keep_going,
                              max_samples)
    finally:
        with contextlib.suppress(OSError):  # a full disk or NFS may fail the close too
            os.close(fd)


def _write_samples(fd: int, path: Path, sampler: Sampler, node: str,
                   settings: WatchSettings, clock: Callable[[], float],
                   sleep: Callable[[float], None], keep_going: Callable[[], bool],
                   max_samples: int | None) -> int:
    tracker = IdleTracker(settings.idle_threshold, settings.idle_minutes)
    log.info("GPU watch: %d GPU(s) (%s) every %s s into %s; a warning after %s min under "
             "%s%%", len(sampler.gpus), ", ".join(map(str, sampler.gpus)),
             _num(settings.interval), path, _num(settings.idle_minutes),
             _num(settings.idle_threshold))
    def write(text: str) -> bool:
        try:
            _write_all(fd, text)
        except OSError as exc:  # a full disk, a lost NFS server: one line, exit 0
            log.warning("GPU watch stopped: cannot write %s (%s)", path, _text(exc))
            return False
        return True

    try:
        new = os.fstat(fd).st_size == 0
    except OSError:
        new = False
    if new and not write(CSV_HEADER + "\n"):  # on disk before the first sample
        return 0
    if not write(f"{START_MARK}{clock():.1f}\n"):  # where this sampler's run begins
        return 0
    taken = 0
    while True:
        now = clock()
        rows = sampler.sample()
        if not sampler.gpus:
            log.info("GPU watch stopped: no GPU can be read")
            return 0
        if rows and not write("".join(f"{now:.1f},{g},{u},{used},{total}\n"
                                      for g, u, used, total in rows)):
            return 0
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
    if pid <= 0:
        return False  # 0 and negative numbers name process groups, not a process
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
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
    from train.entry import module_argv

    # (not `-m`: a train.py in the current folder would be imported as `train`)
    argv = [*module_argv(sys.executable, "train.runtime.gpuwatch"), "--out", str(run_dir),
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
    # the walltime USR1 reaches every process of the step: the sampler samples on
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    # TERM and INT end it where it stands, also inside a blocking NVML call or open (a
    # Python handler would run only once that call returns): every sample is on disk
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    parent_alive = parent_watch(os.getppid() if args.parent is None else args.parent)
    if not parent_alive():  # gone before the kernel was told to end this with it
        return 0
    try:
        import pynvml
    except ImportError:
        log.info("GPU watch off: NVIDIA's management library (nvidia-ml-py) is not "
                 "installed")
        return 0
    except Exception as exc:  # a broken install: a library that raises as it loads
        log.info("GPU watch off: NVIDIA's management library (nvidia-ml-py) cannot be "
                 "loaded (%s)", _text(exc))
        return 0
    settings = WatchSettings(args.interval, min(args.idle_threshold, 100.0),
                             args.idle_minutes)
    done = threading.Event()
    threading.Thread(target=_exit_with_parent, args=(parent_alive, done), daemon=True,
                     name="gpuwatch-parent").start()
    try:
        return watch(pynvml, args.out, args.node, settings, keep_going=parent_alive,
                     visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    finally:
        done.set()


def _exit_with_parent(parent_alive: Callable[[], bool], done: threading.Event) -> None:
    """The parent polled from a thread of its own: where the main thread is stuck in an
    NVML call (pynvml's ctypes calls release the GIL) and the parent is not this process's
    own (no PR_SET_PDEATHSIG then), the process still ends with it. Every sample is on disk
    (unbuffered writes): exit 0 at once."""
    while not done.wait(TICK_SECONDS):
        if not parent_alive():
            os._exit(0)


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Linux: have the kernel send `sig` to this process when its parent ends (the thread
    that started it; an exec of the parent keeps it alive). Whether that was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(sig),
                              ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))) == 0
    except Exception:  # no libc, no prctl: the parent is still polled
        return False


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
    """One CSV line, or None for the header, garbage and impossible values: a time outside
    0 < t < MAX_TIME, a GPU index outside 0..MAX_GPU_INDEX, a utilisation outside 0..100,
    memory outside 0..MAX_MIB."""
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
    return Record(line, t, gpu, util, used, total)


def _stamp(t: float, fmt: str) -> str:
    """A unix time in local time; never raises (a time out of range is shown as a number)."""
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}" if math.isfinite(t) and abs(t) < 1e15 else "?"


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
    for item in read_items(path, max_bytes, count_skipped):
        if isinstance(item, Record):
            yield item


def read_items(path: Path, max_bytes: int | None = None,
               count_skipped: bool = True) -> Iterator[Record | float]:
    """read_records, with each sampler's START_MARK as its start time (a float) where it
    stands in the file."""
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
    out; never raises on a file's content."""
    out: dict[str, dict[str, Any]] = {}
    for path in node_files(run_dir):
        try:
            node = _summarise(path, threshold, minutes, max_bytes)
        except (OSError, ValueError, ArithmeticError):
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
    seen: set[int] = set()
    warm = WarmUp(threshold, None)
    for rec in read_items(path, max_bytes, count_skipped=False):
        if not isinstance(rec, Record):  # a new sampler run: idle time starts again
            idle_since, warm = {}, WarmUp(threshold, rec)
            continue
        seen.add(rec.gpu)
        if rec.time != last:  # a new sample round (the lines of one share its time)
            samples += 1
            latest = {}
            last = rec.time
        first = rec.time if first is None else min(first, rec.time)
        total += rec.util
        lines += 1
        latest[rec.gpu] = rec.util
        if not warm.counts(rec.gpu, rec.time, rec.util):
            continue
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
        stamp = _stamp(self.start, "%Y-%m-%d %H:%M")
        still = ", still at the latest sample" if self.ongoing else ""
        return (f"node {self.node} GPU {self.gpu}: under {_num(self.threshold)}% utilisation "
                f"(at most {self.max_util:g}%) for {self.minutes:.0f} min from {stamp}"
                f"{still}: {self.samples} samples, {self.file} lines "
                f"{self.first_line}-{self.last_line}")


def idle_findings(run_dir: Path | str, threshold: float, minutes: float,
                  max_bytes: int | None = SUMMARY_MAX_BYTES) -> list[IdleFinding]:
    """Every run of samples of one GPU all under `threshold` spanning at least `minutes`
    within one sampler run and after its warm-up (WarmUp), with the file and line numbers
    as evidence; by node, GPU and start. Only the last
    `max_bytes` of each file are read (None: all of it); line numbers still count from the
    file's start. Never raises on a file's content."""
    found: list[IdleFinding] = []
    for path in node_files(run_dir):
        try:
            found += _findings(path, threshold, minutes, max_bytes)
        except (OSError, ValueError, ArithmeticError):
            continue
    return sorted(found, key=lambda f: (f.node, f.gpu, f.start))


@dataclass
class _Run:
    first: Record
    last: Record
    samples: int = 1
    max_util: float = 0.0


def _findings(path: Path, threshold: float, minutes: float, max_bytes: int | None
              ) -> list[IdleFinding]:
    runs: dict[int, _Run | None] = {}
    found: list[IdleFinding] = []

    def close(run: _Run | None, ongoing: bool) -> None:
        if run is not None and run.last.time - run.first.time >= minutes * 60:
            found.append(IdleFinding(path.stem, run.first.gpu, str(path), run.first.line,
                                     run.last.line, run.first.time, run.last.time,
                                     run.samples, run.max_util, threshold, ongoing))

    warm = WarmUp(threshold, None)
    for rec in read_items(path, max_bytes):
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


if __name__ == "__main__":
    die_with_parent()  # first: the parent may die while this starts (main checks it)
    sys.exit(main())
