"""The GPU utilisation watch's process: `train launch` starts one per node (`spawn`), so
that sampling never slows or blocks training (some sites cancel jobs whose GPUs sit idle).
It ends with its parent (PR_SET_PDEATHSIG, and the parent polled, also from a thread while
the loop waits in NVML). NVML is never shut down (nvmlShutdown can hang on a broken driver).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.common.gpuwatch_file import WatchSettings, _num, settings_from_env
from train.node.gpuwatch_sampler import TICK_SECONDS, _text, watch

if TYPE_CHECKING:
    from train.node.launcher.step import SlurmStep

__all__ = ["die_with_parent", "main", "parent_watch", "process_alive", "spawn",
           "start_gpu_watch", "stop_gpu_watch"]

log = logging.getLogger("train.gpuwatch")


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


def start_gpu_watch(step: SlurmStep, mode: str, env: Mapping[str, str]) -> Any:
    """`train launch`: the node's sampler, started by node-local rank 0 only (torch's
    launcher agent, or the task with local id 0; in tasks mode its parent is the program
    this process execs into, the same pid) when the job's settings ask for one and the node
    has GPUs. Never fails the launch: any problem is a warning. The process, or None."""
    if step.gpus_on_node == 0 or (mode != "torchrun" and step.localid != 0):
        return None
    try:
        settings = settings_from_env(env)
    except ValueError as exc:
        log.warning("GPU watch not started: %s", exc)
        return None
    run_dir = env.get("TRAIN_RUN_DIR")
    if settings is None or not run_dir:
        return None
    node = step.nodes[step.node_id]
    try:
        return spawn(run_dir, node, settings, os.getpid(), env=dict(env))
    except Exception as exc:  # whatever starting it raises: training goes on without it
        log.warning("GPU watch not started on %s: %s", node, exc)
        return None


def stop_gpu_watch(proc: Any) -> None:
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.terminate()
        proc.wait(timeout=10)


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
    p = argparse.ArgumentParser(prog="python -m train.node.gpuwatch",
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
