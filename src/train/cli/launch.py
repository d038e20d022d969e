"""The commands that train: `train run` (the GPU training entrypoint) and `train launch`,
which starts it, or any workload, on every node of a job step inside the container (its
flags and its start live in train.node.nodeentry: the node side, standard library only)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from train.common.errors import EXIT_OK
from train.node.nodeentry import add_launch_arguments
from train.workloads.config import add_run_arguments, run_config_from_args

if TYPE_CHECKING:
    from train.cli.common import Subparsers


RUN_EPILOG = """\
exit codes:
  0  the run is complete, or it stopped cleanly (time budget, SIGUSR1, SIGTERM, SIGINT)
     after writing a checkpoint: OUT/status.json says which; run the same command to resume
  1  an unexpected failure
  2  bad input (unknown workload, config key or value; unwritable --out); nothing written
  3  a resource is missing: GPU memory at start-up, the StarCraft II game (SC2PATH), a
     usable CUDA with --device cuda (the message names the cause and the fix), or the
     training runtime (pip install './[run]' in a checkout of this repository)

A YAML file given with --config takes the same keys as the flags (with underscores);
flags override it.
"""


def add_run(sub: Subparsers) -> None:
    p = sub.add_parser("run", help="train a workload (the GPU training entrypoint)",
                       description="Train a workload: demo (built-in beacon game, no GPU or "
                       "cluster needed) or sc2 (StarCraft II through pysc2).",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)


def add_launch(sub: Subparsers) -> None:
    p = sub.add_parser("launch", help="start a workload on every node of a job step "
                       "(inside the container)",
                       description="Run inside the container on each node of a SLURM job "
                       "step: derive the rendezvous from SLURM and start the command after "
                       "`--` (torchrun: one task per node; tasks: one task per GPU).")
    add_launch_arguments(p)


def _cmd_run(args: argparse.Namespace) -> int:
    from train.node.signals import install_early_handlers

    install_early_handlers()  # before torch is imported: that takes seconds
    from train.node.signals import ignore_late_walltime_signal
    from train.workloads import runner

    cfg = run_config_from_args(args)
    try:
        result = runner.run(cfg)
    finally:
        ignore_late_walltime_signal()
    if not result.complete:
        print(f"train: stopped early ({result.stop_reason}); run the same command to "
              f"continue from the last checkpoint in {cfg.out}", file=sys.stderr)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        # Everything is written and the ranks have met at the last barrier. torch's gloo
        # can still abort a rank as the process group is torn down while a peer leaves
        # ("terminate called without an active exception", exit -6), failing a chunk
        # whose work is done: leave without running the C++ destructors.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK
