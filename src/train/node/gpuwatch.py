"""The GPU utilisation watch: `train launch` starts one process per node (`spawn`), so
that sampling never slows or blocks training (some sites cancel jobs whose GPUs sit idle).
It writes NVML's readings into the file (train.common.gpuwatch_file), each straight there
(no buffer), and warns once when every sample of a GPU stayed under the threshold for the
idle time, again only after it recovered. It ends with its parent (PR_SET_PDEATHSIG, and the
parent polled, also from a thread while the loop waits in NVML). NVML is never shut down
(nvmlShutdown can hang on a broken driver).
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.common.gpuwatch_file import (
    CSV_HEADER,
    MAX_MIB,
    MIB,
    START_MARK,
    WarmUp,
    WatchSettings,
    _num,
    csv_path,
)

__all__ = ["die_with_parent", "main", "parent_watch", "process_alive", "spawn"]

log = logging.getLogger("train.gpuwatch")

# the parent and the stop flag are checked this often while waiting for the next sample
TICK_SECONDS = 1.0
# the most GPUs one sampler watches (NVML's count beyond it is a broken library)
MAX_GPUS = 64
# a GPU that gives no reading this many samples in a row is given up
MAX_FAILURES = 10
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


@dataclass
class IdleTracker:
    """Per GPU: since when every sample was under the threshold (the first sample of the
    current idle run), and whether that run was warned about; samples in the warm-up (from
    the first sample) do not count."""

    threshold: float
    minutes: float
    since: dict[int, float] = field(default_factory=dict)
    warned: set[int] = field(default_factory=set)
    warm: WarmUp | None = None

    def update(self, now: float, utils: Mapping[int, float]) -> list[tuple[int, float]]:
        """The GPUs whose idle run just reached the idle time, with the run's start."""
        if self.warm is None:
            self.warm = WarmUp(self.threshold, now)
        crossed = []
        for gpu, util in utils.items():
            if not self.warm.counts(gpu, now, util):
                continue
            if util >= self.threshold:
                self.since.pop(gpu, None)
                self.warned.discard(gpu)
                continue
            since = self.since.setdefault(gpu, now)
            if gpu not in self.warned and now - since >= self.minutes * 60:
                self.warned.add(gpu)
                crossed.append((gpu, since))
        return crossed

    def warning(self, node: str, crossed: Sequence[tuple[int, float]]) -> str:
        gpus = ", ".join(str(g) for g, _ in crossed)
        since = time.strftime("%H:%M:%S", time.localtime(min(s for _, s in crossed)))
        plural = "s" if len(crossed) > 1 else ""
        return (f"GPU watch on {node}: GPU{plural} {gpus} stayed under "
                f"{_num(self.threshold)}% utilisation for {_num(self.minutes)} min (every "
                f"sample since {since}). An idle GPU wastes the allocation, and some sites "
                "cancel such jobs (NYU Torch does). Check that the program really uses the "
                "GPU (--device cuda; the model and every batch moved to it) and that its "
                "input keeps up: more DataLoader workers (--workers), data on fast storage, "
                "a larger batch")


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
    where they cannot be true."""
    u, m_used, m_total = _number(util), _number(used), _number(total)
    if u is None or m_used is None or m_total is None or not 0 <= u <= 100:
        return None
    used_mib, total_mib = m_used / MIB, m_total / MIB
    if not (0 <= used_mib < MAX_MIB and 0 <= total_mib < MAX_MIB
            and used_mib <= total_mib * 1.01):
        return None
    return int(u), int(m_used) // MIB, int(m_total) // MIB


class Sampler:
    """One sample of every watched GPU: (gpu, util %, used MiB, total MiB) rows. A GPU that
    cannot be read is tried again, and given up after MAX_FAILURES in a row; a reading that
    cannot be true leaves it out of that sample only."""

    def __init__(self, nvml: Any, gpus: Sequence[int]) -> None:
        self.nvml = nvml
        self.gpus: list[int] = list(gpus)  # the GPUs still watched
        self.handles: dict[int, Any] = {}
        self.failures: dict[int, int] = dict.fromkeys(self.gpus, 0)  # in a row
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
                self._once("invalid", gpu, "GPU watch: GPU %d gave a reading that cannot be "
                           "true (utilisation %s, memory used %s of %s bytes); such samples "
                           "are left out", gpu, _text(util, 40), _text(used, 40),
                           _text(total, 40))
                continue
            rows.append((gpu, *reading))
        return rows


def _wait(seconds: float, sleep: Callable[[float], None],
          keep_going: Callable[[], bool]) -> bool:
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
    """Sample until keep_going says no (or max_samples are taken). The exit code: 1 where
    the file cannot be opened, else 0 (no NVML, no GPU, a failed write...)."""
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


def _gpu_count(nvml: Any) -> int | None:
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
    """(the descriptor, 0) of a regular file (a FIFO would block, a device takes anything),
    else (None, the exit code)."""
    fd = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: opening a FIFO without a reader fails at once (ENXIO) instead of waiting
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd, 0
    except OSError as exc:
        if fd is None and exc.errno != errno.ENXIO:
            log.warning("GPU watch off: cannot write %s (%s)", path, _text(exc))
            return None, 1
    log.warning("GPU watch off: %s is not a regular file; nothing is written", path)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
    return None, 0


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
        view = memoryview(text.encode("ascii", errors="replace"))
        try:
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.EIO, "nothing was written")
                view = view[written:]
        except OSError as exc:  # a full disk, a lost NFS server: one line, exit 0
            log.warning("GPU watch stopped: cannot write %s (%s)", path, _text(exc))
            return False
        return True

    try:
        new = os.fstat(fd).st_size == 0
    except OSError:
        new = False
    # the header on disk before the first sample, then where this sampler's run begins
    if not write((CSV_HEADER + "\n" if new else "") + f"{START_MARK}{clock():.1f}\n"):
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
            log.warning("%s", tracker.warning(node, crossed))
        taken += 1
        if max_samples is not None and taken >= max_samples:
            return 0
        if not _wait(settings.interval, sleep, keep_going):
            return 0


def process_alive(pid: int) -> bool:
    """A zombie counts as gone."""
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
    """keep_going for the sampler. The parent of this process's own shows its end as a new
    parent id (reliable even if the pid is reused)."""
    if parent == os.getppid():
        return lambda: os.getppid() == parent
    return lambda: process_alive(parent)


def spawn(run_dir: Path | str, node: str, settings: WatchSettings, parent: int, *,
          env: Mapping[str, str] | None = None,
          popen: Callable[..., Any] = subprocess.Popen) -> Any:
    """Start the sampler process (stderr shared: its lines go to the job's log)."""
    from train.common.entry import bound_entry_argv, bound_root, module_argv

    # (not `-m`: a train.py in the current folder would be imported as `train`; the bound
    # launcher's copy is found through its own entry, never through PYTHONPATH)
    module = "train.node.gpuwatch"
    start = bound_entry_argv(sys.executable, module) if bound_root() else \
        module_argv(sys.executable, module)
    argv = [*start, "--out", str(run_dir),
            "--node", node, "--interval", _num(settings.interval),
            "--idle-threshold", _num(settings.idle_threshold),
            "--idle-minutes", _num(settings.idle_minutes), "--parent", str(parent)]
    return popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 env=None if env is None else dict(env), close_fds=True)


def _bounded(zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number >= 0 (`zero`: 0 allowed), else > 0."""
    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be a number {'>=' if zero else '>'} 0, "
                                             f"got {text}")
        return value
    return number


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.node.gpuwatch",
                                description="Sample every GPU's utilisation into "
                                "RUN_DIR/gpu/NODE.csv until the parent process is gone.")
    p.add_argument("--out", required=True, help="the run directory")
    p.add_argument("--node", required=True, help="this node's name (the file's name)")
    p.add_argument("--interval", type=_bounded(zero=False), required=True,
                   help="seconds per sample")
    p.add_argument("--idle-threshold", type=_bounded(zero=True), required=True,
                   help="utilisation percent under which a GPU counts as idle")
    p.add_argument("--idle-minutes", type=_bounded(zero=True), required=True,
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
    """Where the main thread is stuck in an NVML call (ctypes releases the GIL) and the
    parent is not this process's own (no PR_SET_PDEATHSIG then), it still ends with it."""
    while not done.wait(TICK_SECONDS):
        if not parent_alive():
            os._exit(0)


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Linux: the kernel sends `sig` when the thread that started this process ends."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(sig),
                              ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))) == 0
    except Exception:  # no libc, no prctl: the parent is still polled
        return False


if __name__ == "__main__":
    die_with_parent()  # first: the parent may die while this starts (main checks it)
    sys.exit(main())
