"""`train run`: validate, set up the runtime, train, and record the outcome.

Order matters: every input is checked before anything is written; the allocator settings
are applied before CUDA initialises; only rank 0 writes results.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from train.config import RunConfig, check_writable_dir
from train.runtime import results
from train.runtime.distributed import init_distributed
from train.runtime.memory import apply_allocator_settings
from train.runtime.precision import resolve_precision
from train.runtime.signals import StopController
from train.workloads.dqn import trainer

log = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
HOST_ENV_CHECK = ("PYTHONPATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV")


@dataclass(frozen=True)
class RunResult:
    complete: bool
    stop_reason: str | None
    status: dict[str, Any]


def validate(cfg: RunConfig) -> None:
    """Everything that can be checked without side effects."""
    check_writable_dir(cfg.out_dir, "out")
    check_writable_dir(cfg.results_csv_path.parent, "results_csv")
    trainer.check_workload(cfg)


def run(cfg: RunConfig) -> RunResult:
    validate(cfg)
    stopper = StopController(cfg.time_budget)
    alloc_conf = apply_allocator_settings()
    ctx = init_distributed(cfg.device)
    try:
        precision = resolve_precision(cfg.precision, ctx.device)
        v = results.versions(ctx.device)
        log.info("python %s, torch %s, CUDA %s, cuDNN %s, GPU %s", v["python"], v["torch"],
                 v["cuda"], v["cudnn"], v["gpu"])
        log.info("device %s, precision %s, world size %d", ctx.device, precision.name,
                 ctx.world_size)
        if ctx.is_main:
            cfg.out_dir.mkdir(parents=True, exist_ok=True)
            results.write_json_atomic(cfg.out_dir / "config.json", results.run_metadata(
                cfg.to_dict(), ctx.device, {
                    "precision": precision.name,
                    "allocator": alloc_conf,
                    "world_size": ctx.world_size,
                    "argv": sys.argv,
                    # what reached this process of the host's Python set-up (none should,
                    # inside a container)
                    "process_env": {k: os.environ.get(k) for k in HOST_ENV_CHECK},
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }))
        with stopper:
            summary = trainer.train(cfg, ctx, precision, stopper)
        status = {
            "complete": summary.complete,
            "stop_reason": summary.stop_reason,
            "target_episodes": cfg.episodes,
            "seeds": {str(s.seed): {"episodes": s.episodes, "complete": s.complete}
                      for s in summary.seeds},
            "world_size": ctx.world_size,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if ctx.is_main:
            results.write_json_atomic(cfg.out_dir / "status.json", status)
            # the marker the batch shell checks to end a chain (see slurm/job-lib.sh)
            marker = cfg.out_dir / COMPLETE_MARKER
            if summary.complete:
                marker.touch()
            else:
                marker.unlink(missing_ok=True)
            curves = {}
            for seed in cfg.seeds:
                history = trainer.read_json(cfg.out_dir / f"seed_{seed}" / "episodes.json")
                if history.get("rewards"):
                    curves[f"seed {seed}"] = history["rewards"]
            if curves:
                results.plot_learning_curves(cfg.out_dir / "learning_curve.png", curves,
                                             f"{cfg.workload} res {cfg.res}")
        ctx.barrier()
        if summary.complete:
            log.info("run complete: %s", cfg.out_dir)
        else:
            log.warning("run stopped before the end (%s); resume with the same command",
                        summary.stop_reason)
        return RunResult(summary.complete, summary.stop_reason, status)
    finally:
        ctx.close()
