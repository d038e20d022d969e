"""What a run shows while it trains (Progress: a live bar on a terminal, plain periodic lines
in batch logs, each with the episode rate and the time left at that rate), what it leaves
behind (rank 0 only), and what is read back of it: config.json, the seeds' outcomes, the
progress count the batch shell reads, evaluation JSON, the central CSV (shared by many jobs
at once: rows appended under a file lock, after the completion record, so nothing here
fails a chunk), the plot."""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import logging
import os
import platform
import socket
import stat
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from train import __version__
from train.common import _proc
from train.common.errors import ConfigError
from train.common.jsonio import read_json_object, to_builtin, write_json_atomic
from train.common.secrets.environment import recorded_environment
from train.workloads.config import RunConfig

log = logging.getLogger(__name__)


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        proc = _proc.run(["git", "rev-parse", "HEAD"], cwd=cwd, timeout=10)
    except _proc.ProcError:
        return None
    return proc.stdout.strip() or None


def versions(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "train": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
        else None,
        "gpu": None,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_capability"] = list(torch.cuda.get_device_capability(device))
    return info


def run_metadata(config: Mapping[str, Any], device: torch.device, extra: Mapping[str, Any]
                 ) -> dict[str, Any]:
    return {
        "config": dict(config),
        "versions": versions(device),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "environment": recorded_environment(os.environ),  # without secrets
        **extra,
    }


# flock(2) errors that mean "this file system has no locks" (some Lustre mounts without
# -o flock, NFS without a lock manager), not "this file cannot be written"
NO_LOCK_ERRNOS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK})


def _has_row(fd: int, key: Mapping[str, Any]) -> bool:
    size = os.fstat(fd).st_size
    if size == 0:
        return False
    text = os.pread(fd, size, 0).decode("utf-8", errors="replace")
    wanted = {k: str(to_builtin(v)) for k, v in key.items()}
    return any(all(row.get(k) == v for k, v in wanted.items())
               for row in csv.DictReader(io.StringIO(text)))


def append_csv_row(path: Path, row: Mapping[str, Any],
                   key: Sequence[str] = ()) -> bool:
    """Append one row under an exclusive lock, the header once. A row whose `key` columns
    match one in the file is not appended again (a run killed after its append and before
    recording it reruns it). Where the file system refuses flock the row goes in one
    O_APPEND write() (writers cannot interleave inside a row) and False is returned."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            locked = True
        except OSError as exc:
            if exc.errno not in NO_LOCK_ERRNOS:
                raise
            locked = False
        try:
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=list(row), lineterminator="\n")
            if key and _has_row(fd, {k: row[k] for k in key}):
                return locked
            if os.fstat(fd).st_size == 0:
                writer.writeheader()
            writer.writerow({k: to_builtin(v) for k, v in row.items()})
            data = buf.getvalue().encode("utf-8")
            written = os.write(fd, data)
            while locked and 0 < written < len(data):  # a short write: finish it
                data = data[written:]
                written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.EIO, f"short write to {path}: {written} of {len(data)} "
                              "bytes of a row")
            os.fsync(fd)
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return locked


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return arr
    window = max(1, min(window, arr.size))
    cumsum = np.cumsum(np.insert(arr, 0, 0.0))
    head = cumsum[1:window] / np.arange(1, window)
    tail = (cumsum[window:] - cumsum[:-window]) / window
    return np.concatenate([head, tail])


def plot_learning_curves(path: Path, curves: Mapping[str, Sequence[float]], title: str,
                         reference: Mapping[str, float] | None = None) -> None:
    """One line per seed (raw and moving average), optional horizontal reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, rewards in curves.items():
        xs = np.arange(1, len(rewards) + 1)
        line = ax.plot(xs, rewards, alpha=0.25)[0]
        window = max(1, len(rewards) // 20)
        ax.plot(xs, moving_average(rewards, window), color=line.get_color(),
                label=f"{label} (moving avg {window})")
    for label, value in (reference or {}).items():
        ax.axhline(value, linestyle="--", linewidth=1, label=label, color="gray")
    ax.set_xlabel("episode")
    ax.set_ylabel("episode reward")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def outcome_lines(out_dir: Path, seeds: Sequence[int], results_csv: Path) -> list[str]:
    """What a finished run did and where its results are."""
    evaluation = read_json_object(out_dir / "eval" / "test_results.json", None)
    lines = [f"run complete: {out_dir}"]
    for seed in seeds:
        ev = evaluation.get(str(seed))
        mean = ev.get("mean_reward") if isinstance(ev, dict) else None
        if not isinstance(ev, dict) or not isinstance(mean, (int, float)):
            lines.append(f"seed {seed}: not evaluated (--eval-episodes 0, or done earlier)")
            continue
        text = (f"seed {seed}: evaluation reward {mean:.3g} +- {ev.get('std_reward') or 0:.2g}"
                f" over {len(ev.get('episode_rewards') or [])} episodes after "
                f"{ev.get('trained_episodes')} trained")
        scripted = ev.get("scripted_mean_reward")
        if isinstance(scripted, (int, float)):
            text += f"; the scripted policy scores {scripted:.3g}"
            if scripted > 0:
                text += f" ({100 * mean / scripted:.0f}% of it)"
        lines.append(text)
    curve = out_dir / "learning_curve.png"
    if curve.is_file():
        lines.append(f"learning curve: {curve}")
    if results_csv.is_file():
        lines.append(f"results CSV: {results_csv}")
    folders = [out_dir / f"seed_{s}" / "checkpoints" for s in seeds]
    lines.append("checkpoints: " + ", ".join(str(f) for f in folders if f.is_dir()))
    return lines


RUN_LOCK = ".train.lock"  # in the run directory: held by the rank-0 process of a run


class RunLock:
    """A flock on the run directory for the life of a run: two runs on one --out would
    delete each other's checkpoints. The kernel drops it when the process dies, so a chain's
    next chunk never finds a stale lock; the file names the holder for the second run."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / RUN_LOCK
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        try:  # never through a symbolic link, never anything but a regular file
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                         0o644)
        except OSError as exc:
            raise ConfigError("out", f"cannot lock {self.path}: {exc.strerror or exc} (it "
                              "must be a regular file, not a link or a folder)") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError("out", f"cannot lock {self.path}: not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another run"
            os.close(fd)
            raise ConfigError("out", f"{self.path.parent} is in use by {holder}; wait for "
                              "it to end, or use another --out") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in NO_LOCK_ERRNOS:
                log.warning("out: the file system of %s refuses flock; two runs on this "
                            "folder would not be stopped", self.path.parent)
                return self
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock; the file stays (unlinking would race)
            self._fd = None


@dataclass
class RunSummary:
    complete: bool
    stop_reason: str | None
    seeds: dict[str, dict[str, Any]]  # status.json's: {"4": {"episodes": 50, "complete": true}}
    status: dict[str, Any] = field(default_factory=dict)  # status.json, once `train run` wrote it


def work_done(cfg: RunConfig, summary: RunSummary) -> int:
    """Episodes trained over all seeds, each seed counted up to the target (progress DONE)."""
    done = 0
    for seed in cfg.seeds:
        episodes = summary.seeds.get(str(seed), {}).get("episodes")
        if episodes is None:  # not reached in this chunk: what an earlier chunk recorded
            recorded = read_json_object(cfg.out_dir / f"seed_{seed}" / "summary.json",
                                        None).get("episodes")
            episodes = recorded if isinstance(recorded, int) else 0
        done += min(max(episodes, 0), cfg.episodes)
    return done


def _result_row(cfg: RunConfig, seed: int, summary: dict[str, Any]) -> dict[str, Any]:
    episodes = int(summary["episodes"])
    history = read_json_object(cfg.out_dir / f"seed_{seed}" / "episodes.json", None)
    rewards = history.get("rewards") or []
    ev = read_json_object(cfg.out_dir / "eval" / "test_results.json", None).get(str(seed))
    if not isinstance(ev, dict) or ev.get("trained_episodes") != episodes:
        ev = {}  # the chunk that finished the seed did not evaluate these weights
    last = rewards[-20:] or [float("nan")]
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "run": str(cfg.out_dir),
        "workload": cfg.workload,
        "seed": seed,
        "res": cfg.res,
        "episodes": episodes,
        "batch_size": cfg.batch_size,
        "train_reward_last20": float(np.mean(last)),
        "eval_mean_reward": ev.get("mean_reward"),
        "eval_std_reward": ev.get("std_reward"),
        "world_size": summary.get("ranks_checked"),
    }


def append_result_rows(cfg: RunConfig) -> list[str]:
    """A central CSV row for each finished seed that has none for its finished total
    (summary.json's csv_episodes): each problem is a warning, and a rerun appends a row that
    failed, never one twice."""
    warnings: list[str] = []
    path = cfg.results_csv_path
    for seed in cfg.seeds:
        summary_path = cfg.out_dir / f"seed_{seed}" / "summary.json"
        summary = read_json_object(summary_path, None)
        if not summary.get("complete") or summary.get("csv_episodes") == summary.get(
                "episodes"):
            continue
        what = f"the row for seed {seed} ({summary.get('episodes')} episodes)"
        try:
            # keyed by run, seed and total: never twice, even if killed before the record
            locked = append_csv_row(path, _result_row(cfg, seed, summary),
                                            key=("run", "seed", "episodes"))
        except OSError as exc:
            warnings.append(f"results_csv: could not append {what} to {path}: {exc}; the "
                            "same command appends it when run again")
            continue
        if not locked:
            warnings.append(f"results_csv: the file system of {path} refuses flock; {what} "
                            "was appended without the lock, in one O_APPEND write")
        summary["csv_rows"] = int(summary.get("csv_rows", 0)) + 1
        summary["csv_episodes"] = summary["episodes"]
        try:
            write_json_atomic(summary_path, summary)
        except OSError as exc:
            warnings.append(f"results_csv: {what} was appended to {path} but not recorded "
                            f"in {summary_path} ({exc}); a rerun appends it again")
    return warnings


# The rate (and so the ETA) is measured over the last this many episodes: the first
# episodes of a run, before the replay holds enough to learn from, are many times faster
# than the rest, and an average since the start would promise too little time.
RATE_WINDOW = 20
# No ETA from fewer episodes than this (the first one alone says nothing of the rest).
ETA_MIN_EPISODES = 2


def format_duration(seconds: float) -> str:
    """45s, 2m05s, 1h02m: short enough for a progress line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, total: int, initial: int, label: str, interval: float,
                 stream: TextIO | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.count = initial
        self.label = label
        self.interval = interval
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and self.stream.isatty()
        self._clock = clock
        self._recent: deque[tuple[float, int]] = deque([(clock(), initial)],
                                                       maxlen=RATE_WINDOW + 1)
        self._last = float("-inf")  # the first update always shows

    def update(self, count: int, **metrics: float) -> None:
        self.count = count
        if not self.enabled:
            return
        now = self._clock()
        self._recent.append((now, count))
        final = count >= self.total
        if not final and now - self._last < (0.2 if self.live else self.interval):
            return
        self._last = now
        # episodes per second over the last RATE_WINDOW episodes, and the time left at it
        (t0, c0), (t1, c1) = self._recent[0], self._recent[-1]
        rate = (c1 - c0) / max(t1 - t0, 1e-9) if c1 > c0 else 0.0
        timing = f"{rate:.2f} ep/s" + (
            f", ETA {format_duration(max(0, self.total - count) / rate)}"
            if rate and c1 - c0 >= ETA_MIN_EPISODES and not final else "")
        stats = " ".join(f"{k}={v:.3g}" for k, v in metrics.items())
        if self.live:
            width = 24
            filled = int(width * count / max(self.total, 1))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {count}/{self.total} "
                              f"{timing} {stats}\033[K")
            if final:
                self.stream.write("\n")
        else:
            stamp = time.strftime("%H:%M:%S")
            self.stream.write(f"{stamp} {self.label} episode {count}/{self.total} "
                              f"({timing}) {stats}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.live and self.count < self.total:
            self.stream.write("\n")
            self.stream.flush()
