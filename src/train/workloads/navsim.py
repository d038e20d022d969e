"""NAVSIM's training feature cache: computed once per chain, used by every later chunk.

At the pinned NAVSIM commit `run_training.py` computes every scene's features again at every
start (hours on navtrain), so the step runs NAVSIM's command through this module
(train.client.slurm.navsimstep), which trains from the cache (`cache_path=`) once it is
marked complete for the same split and agent; else the first task runs NAVSIM's caching
script for the scenes the cache lacks and marks it, the others wait for the marker. A cache
cut by the walltime signal (or TERM) is not marked: the chunk ends as a stop (exit 0) and
the next completes it, first removing the scenes written in its last CUT_WINDOW_S seconds
(NAVSIM takes a scene whose files exist as cached, and one may be cut mid-write).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from train.batch.contract import (
    NAVSIM_CACHE_ONLY_OVERRIDE,
    NAVSIM_CACHE_PATH_OVERRIDE,
    NAVSIM_CACHE_SWITCHES,
    NAVSIM_FORCE_CACHE_OVERRIDE,
    NAVSIM_SPLIT_OVERRIDE,
    SIGNAL_READY_VAR,
    override_key,
    override_value,
)
from train.common.jsonio import write_json_atomic

CACHING_SCRIPT = "run_dataset_caching.py"  # NAVSIM's, beside run_training.py
# beside the cache folder, never in it (NAVSIM takes every entry there as a log folder)
COMPLETE_SUFFIX = ".train-complete.json"
STARTED_SUFFIX = ".train-started.json"
# a scene file cut in the middle of its write was written at most this long before the
# newest file of a cut cache (one pickle's write; the features are computed before it)
CUT_WINDOW_S = 120.0
POLL_S = 2.0


def cache_key(overrides: Sequence[str]) -> dict[str, Any]:
    """What the cached features depend on, as far as the job's overrides tell: the split
    (its scenes) and the agent's settings (its feature and target builders)."""
    return {"split": override_value(overrides, NAVSIM_SPLIT_OVERRIDE),
            "agent": [a for a in overrides if override_key(a) == "agent"
                      or override_key(a).startswith("agent.")]}


def marker_paths(cache: Path) -> tuple[Path, Path]:  # (complete, started)
    return (cache.with_name(cache.name + COMPLETE_SUFFIX),
            cache.with_name(cache.name + STARTED_SUFFIX))


def _without_managed(args: Sequence[str]) -> list[str]:
    return [a for a in args if override_key(a) not in NAVSIM_CACHE_SWITCHES]


def training_command(command: Sequence[str]) -> list[str]:
    """NAVSIM's training from the complete cache: no feature computed, no dataset scan."""
    return [*_without_managed(command), f"{NAVSIM_FORCE_CACHE_OVERRIDE}=false",
            f"{NAVSIM_CACHE_ONLY_OVERRIDE}=true"]


def caching_command(command: Sequence[str], cpus: int) -> list[str]:
    """NAVSIM's caching script beside the training script, with the same overrides,
    computing only the scenes the cache lacks, in a process pool of `cpus` workers (its
    default worker is a Ray cluster sized by the whole node) unless the job picks one."""
    python, script, *overrides = command
    pool = [] if any(override_key(a) == "worker" or override_key(a).startswith("worker.")
                     for a in overrides) else \
        ["worker=single_machine_thread_pool", "worker.use_process_pool=true",
         f"worker.max_workers={max(1, cpus)}"]
    return [python, str(Path(script).with_name(CACHING_SCRIPT)),
            *_without_managed(overrides), f"{NAVSIM_FORCE_CACHE_OVERRIDE}=false", *pool]


def drop_cut_scenes(cache: Path, window: float = CUT_WINDOW_S) -> int:
    """Remove the scene folders (CACHE/LOG/TOKEN) of a cut cache written in its last
    `window` seconds; how many."""
    newest: dict[Path, float] = {}
    for log in (p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else ():
        for scene in (p for p in log.iterdir() if p.is_dir()):
            times = [f.stat().st_mtime for f in scene.iterdir()] or [scene.stat().st_mtime]
            newest[scene] = max(times)
    if not newest:
        return 0
    last = max(newest.values())
    cut = [scene for scene, t in newest.items() if t >= last - window]
    for scene in cut:
        shutil.rmtree(scene, ignore_errors=True)
    return len(cut)


def read_complete(cache: Path) -> dict[str, Any] | None:
    path = marker_paths(cache)[0]
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CacheError(2, f"{path}: unreadable ({exc}); remove it to compute the cache "
                         "again") from None
    return data if isinstance(data, dict) else None


class CacheError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _log(message: str) -> None:
    print(f"train navsim: {message}", file=sys.stderr, flush=True)


class _StopWatch:
    """During the cache phase the walltime signal (USR1) or TERM cuts it: recorded, passed
    to the caching process as TERM, and this task then ends with exit 0 (a stop)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.requested = False
        self.child: subprocess.Popen[bytes] | None = None
        self._ready = env.get(SIGNAL_READY_VAR)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.terminate()

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopWatch]:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGUSR1, signal.SIGTERM)}
        if self._ready:  # a walltime signal no longer kills this task: pass it on at once
            with contextlib.suppress(OSError):
                Path(self._ready).touch()
        try:
            yield self
        finally:
            if self._ready:  # (unready before the default actions are back)
                with contextlib.suppress(OSError):
                    Path(self._ready).unlink()
            # a stop ends this task: a late copy must not kill it while Python exits
            for sig, handler in old.items():
                signal.signal(sig, signal.SIG_IGN if self.requested else handler)


def _compute(command: Sequence[str], cache: Path, key: dict[str, Any], cpus: int,
             stop: _StopWatch) -> bool:
    complete, started = marker_paths(cache)
    if started.exists():
        dropped = drop_cut_scenes(cache)
        _log(f"the cache in {cache} was cut before it was complete: completing it ({dropped} "
             f"scene(s) written in its last {CUT_WINDOW_S:.0f} s computed again)")
    argv = caching_command(command, cpus)
    if not Path(argv[1]).is_file():
        raise CacheError(2, f"NAVSIM's caching script {argv[1]} is not there (beside the "
                         "training script): the job computes the feature cache with it")
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(started, {"key": key, "job": os.environ.get("SLURM_JOB_ID", ""),
                                "time": time.time()}, indent=None, fsync=False)
    _log(f"computing the feature cache in {cache} (once for the chain): "
         + " ".join(argv))
    stop.child = subprocess.Popen(argv)
    if stop.requested:
        stop.child.terminate()
    rc = stop.child.wait()
    # (the step's signal may reach the caching process before this one)
    if stop.requested or rc in (-signal.SIGUSR1, -signal.SIGTERM):
        stop.requested = True
        _log(f"the walltime signal (or TERM) cut the feature cache in {cache}: not marked "
             "complete; the next chunk completes it")
        return False
    if rc != 0:
        raise CacheError(rc if 0 < rc < 256 else 1,
                         f"NAVSIM's caching script failed (exit code {rc}): the cache in "
                         f"{cache} is not marked complete")
    write_json_atomic(complete, {"key": key, "job": os.environ.get("SLURM_JOB_ID", ""),
                                 "time": time.time()}, indent=None, fsync=False)
    started.unlink(missing_ok=True)
    _log(f"feature cache complete: {complete}")
    return True


def _wait_for(cache: Path, stop: _StopWatch, poll: float) -> bool:
    complete = marker_paths(cache)[0]
    _log(f"waiting for the first task to complete the feature cache ({complete})")
    while not stop.requested:
        if complete.exists():
            return True
        time.sleep(poll)
    return False


def cache_phase(command: Sequence[str], env: MutableMapping[str, str],
                poll: float = POLL_S) -> list[str] | None:
    """The training command to run now, or None where the walltime signal cut the cache
    phase (this task ends with exit 0). `command` is NAVSIM's: PYTHON SCRIPT OVERRIDES."""
    if len(command) < 2:
        raise CacheError(2, "usage: python -m train.workloads.navsim PYTHON SCRIPT "
                         "[OVERRIDES...]")
    overrides = command[2:]
    path = override_value(overrides, NAVSIM_CACHE_PATH_OVERRIDE)
    if not path:
        raise CacheError(2, "NAVSIM's command has no cache_path=: the job always sets one")
    cache = Path(path)
    key = cache_key(overrides)
    done = read_complete(cache)
    if done is None:
        rank = int(env.get("SLURM_PROCID") or 0)
        cpus = int(env.get("SLURM_CPUS_PER_TASK") or os.cpu_count() or 1)
        stop = _StopWatch(env)
        with stop.installed():
            ok = _compute(command, cache, key, cpus, stop) if rank == 0 \
                else _wait_for(cache, stop, poll)
        if ok and stop.requested:
            _log("a stop came as the feature cache was complete: the next chunk trains")
        if not ok or stop.requested:
            return None
        done = read_complete(cache) or {"key": key}
    elif done.get("key") == key:
        _log(f"feature cache complete ({marker_paths(cache)[0]}): training from it")
    if done.get("key") != key:
        raise CacheError(2, f"cache_path={cache} holds the features of {done.get('key')}, "
                         f"not of this job's {key}: give another cache_path=")
    return training_command(command)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        run = cache_phase(args, os.environ)
    except CacheError as exc:
        _log(str(exc))
        return exc.code
    if run is None:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(run[0], run, dict(os.environ))  # noqa: S606 (argv list, no shell)


if __name__ == "__main__":
    sys.exit(main())
