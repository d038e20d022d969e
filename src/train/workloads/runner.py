"""`train run`: validate, set up the runtime, train, and record the outcome.

Order matters: every input is checked before anything is written; the allocator settings
are applied before CUDA initialises; only rank 0 writes results, and the completion record
(status.json, COMPLETE, progress) before the central CSV row and the plot, whose failures
are warnings in status.json, never a failed chunk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any

from train.batch import contract
from train.common import hostmem
from train.common.errors import ConfigError
from train.common.fields import check_writable_dir
from train.common.jsonio import read_json_object, write_json_atomic
from train.common.secrets.commands import masked_argv
from train.common.secrets.environment import masked_environment
from train.node.distributed import DistContext, init_distributed
from train.node.signals import StopController, effective_budget
from train.workloads.config import RunConfig
from train.workloads.dqn import trainer
from train.workloads.dqn.replay import ReplayBuffer
from train.workloads.envs.pysc2_env import check_available
from train.workloads.envs.spec import ObsSpec
from train.workloads.runrecord import batch_fallback, check_same_run
from train.workloads.runtime import results
from train.workloads.runtime.checkpoint import CheckpointManager
from train.workloads.runtime.memory import apply_allocator_settings
from train.workloads.runtime.precision import resolve_precision

log = logging.getLogger(__name__)

HOST_ENV_CHECK = ("PYTHONPATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV")


def validate(cfg: RunConfig) -> None:
    check_writable_dir(cfg.out_dir, "out")
    csv_path = cfg.results_csv_path
    check_writable_dir(csv_path.parent, "results_csv")  # (names too long included)
    if csv_path.is_dir():  # else it fails only after training, when the row is appended
        raise ConfigError("results_csv", f"{csv_path} is a directory; name a file, e.g. "
                          f"{csv_path / 'results.csv'}")
    check_same_run(cfg)
    # every seed's checkpoint folder, before any seed trains: no folder or link under a
    # checkpoint's name (it would block a save hours later), and writable where it exists
    for seed in cfg.seeds:
        folder = cfg.out_dir / f"seed_{seed}" / "checkpoints"
        CheckpointManager(folder).check_names()
        if folder.is_dir():
            check_writable_dir(folder, "out")
    check_memory(cfg)
    if cfg.workload == "sc2":  # pysc2 and the game, before anything is written
        check_available(mock=cfg.sc2_env == "mock")


def check_memory(cfg: RunConfig) -> None:
    """The replay buffer (and the network's activations at this resolution) must fit in the
    host memory this process can expect (shared by the node's processes), or the run would
    end in a MemoryError or the OOM killer after writing its files."""
    replay = ReplayBuffer.bytes_needed(cfg.replay_size, ObsSpec(cfg.res))
    # the two conv layers' outputs (16 + 32 channels, float32) for a batch, forward and back
    activations = 3 * cfg.batch_size * 48 * cfg.res * cfg.res * 4
    needed = replay + activations
    free = hostmem.available_bytes()
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    except ValueError:
        local = 1  # not torchrun's: one process
    share = free // local
    if needed > share:
        gib = 2**30
        raise ConfigError("replay_size", f"a replay of {cfg.replay_size} at res {cfg.res} "
                          f"needs {needed / gib:.1f} GiB of host memory (replay "
                          f"{replay / gib:.1f} GiB), but this process can expect "
                          f"{share / gib:.1f} GiB ({local} process(es) share "
                          f"{free / gib:.1f} GiB available); lower --replay-size or --res")


def run(cfg: RunConfig) -> results.RunSummary:
    validate(cfg)
    stopper = StopController(effective_budget(cfg.time_budget))
    alloc_conf = apply_allocator_settings()
    ctx = init_distributed(cfg.device)
    with contextlib.ExitStack() as lock:
        precision = resolve_precision(cfg.precision, ctx.device)
        v = results.versions(ctx.device)
        log.info("python %s, torch %s, CUDA %s, cuDNN %s, GPU %s", v["python"], v["torch"],
                 v["cuda"], v["cudnn"], v["gpu"])
        log.info("device %s, precision %s, world size %d", ctx.device, precision.name,
                 ctx.world_size)
        if ctx.is_main:
            _start_run(cfg, ctx, lock, {"precision": precision.name, "allocator": alloc_conf})
        with stopper:
            summary = trainer.train(cfg, ctx, precision, stopper)
        summary.status = {
            "complete": summary.complete,
            "stop_reason": summary.stop_reason,
            "target_episodes": cfg.episodes,
            "seeds": summary.seeds,
            "world_size": ctx.world_size,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "warnings": [],
        }
        if ctx.is_main:
            _record_outcome(cfg, summary)
        ctx.barrier()
        if summary.complete and ctx.is_main:  # what it did, and where the results are
            for line in results.outcome_lines(cfg.out_dir, cfg.seeds, cfg.results_csv_path):
                log.info("%s", line)
        elif not summary.complete:
            log.warning("run stopped before the end (%s); resume with the same command",
                        summary.stop_reason)
        return summary


def _start_run(cfg: RunConfig, ctx: DistContext, lock: contextlib.ExitStack,
               settings: dict[str, Any]) -> None:
    """Rank 0 before training: the run folder, its lock (held in `lock`), config.json."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    lock.enter_context(results.RunLock(cfg.out_dir))
    # again under the lock: a run may have finished meanwhile
    previous = check_same_run(cfg)
    write_json_atomic(cfg.out_dir / "config.json", results.run_metadata(
        cfg.to_dict(), ctx.device, {
            **settings,
            "world_size": ctx.world_size,
            # why `--device auto` trained on the CPU (or on fewer GPUs than seen)
            "cuda_problem": ctx.cuda_problem,
            "argv": masked_argv(sys.argv),  # --wandb-key X: the value masked
            # what reached this process of the host's Python set-up (none should,
            # inside a container)
            "process_env": masked_environment(
                {k: os.environ.get(k) for k in HOST_ENV_CHECK}),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "batch_fallback": batch_fallback(cfg, previous),
        }))


def _record_outcome(cfg: RunConfig, summary: results.RunSummary) -> None:
    """Rank 0 at the end of every chunk. The completion record comes first: a finished
    chunk whose CSV append or plot fails (flock is ENOSYS on some Lustre mounts; a full
    disk) must still end its chain, or every rerun fails the same way."""
    status_path = cfg.out_dir / "status.json"
    write_json_atomic(status_path, summary.status)
    marker = cfg.out_dir / contract.COMPLETE_MARKER
    if summary.complete:
        marker.touch()
    else:
        marker.unlink(missing_ok=True)
    # every chunk, complete or not: the batch shell sees how much work this one added
    contract.write_progress(cfg.out_dir, results.work_done(cfg, summary),
                            len(cfg.seeds) * cfg.episodes)
    warnings = results.append_result_rows(cfg)
    warnings += _plot_learning_curves(cfg)
    if not warnings:
        return
    for message in warnings:
        log.warning("%s", message)
    summary.status["warnings"] = warnings
    try:
        write_json_atomic(status_path, summary.status)
    except OSError as exc:
        log.warning("could not record these warnings in %s: %s", status_path, exc)


def _plot_learning_curves(cfg: RunConfig) -> list[str]:
    """The learning-curve plot; a failure (matplotlib or the file system) is a warning."""
    path = cfg.out_dir / "learning_curve.png"
    try:
        curves = {}
        for seed in cfg.seeds:
            history = read_json_object(cfg.out_dir / f"seed_{seed}" / "episodes.json", None)
            if history.get("rewards"):
                curves[f"seed {seed}"] = history["rewards"]
        if curves:
            results.plot_learning_curves(path, curves, f"{cfg.workload} res {cfg.res}")
    except Exception as exc:  # a plot never fails a finished chunk
        return [f"plot: could not write {path}: {type(exc).__name__}: {exc}"]
    return []
