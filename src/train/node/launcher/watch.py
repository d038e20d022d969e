"""The node's GPU utilisation sampler (train.node.gpuwatch), started by `train launch`
on node-local rank 0 where the job asks for it, stopped when torch's launcher returns."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from train.common import gpuwatch_file
from train.node.launcher.step import SlurmStep

log = logging.getLogger("train.node.launch")


def start_gpu_watch(step: SlurmStep, mode: str, env: Mapping[str, str],
                    spawn: Callable[..., Any] | None = None) -> Any:
    """Start the node's GPU sampler (node-local rank 0 only: torch's launcher agent, or the
    task with local id 0) when the job's settings ask for one and the node has GPUs. The
    sampler's parent is this process (in tasks mode the program it execs into, the same
    pid). Never fails the launch: any problem is a warning. Returns the process or None."""
    from train.node import gpuwatch

    if step.gpus_on_node == 0 or (mode != "torchrun" and step.localid != 0):
        return None
    try:
        settings = gpuwatch_file.settings_from_env(env)
    except ValueError as exc:
        log.warning("GPU watch not started: %s", exc)
        return None
    run_dir = env.get("TRAIN_RUN_DIR")
    if settings is None or not run_dir:
        return None
    node = step.nodes[step.node_id]
    try:
        return (spawn or gpuwatch.spawn)(run_dir, node, settings, os.getpid(),
                                         env=dict(env))
    except Exception as exc:  # whatever starting it raises: training goes on without it
        log.warning("GPU watch not started on %s: %s", node, exc)
        return None


def stop_gpu_watch(proc: Any) -> None:
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.terminate()
        proc.wait(timeout=10)
