"""`train launch`: start a workload on every node of a job step, inside the container; its
flags and its start live in train.node.nodeentry (the node side, standard library only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from train.node.nodeentry import add_launch_arguments

if TYPE_CHECKING:
    from train.cli.common import Subparsers


def add_launch(sub: Subparsers) -> None:
    p = sub.add_parser("launch", help="start a workload on every node of a job step "
                       "(inside the container)",
                       description="Run inside the container on each node of a SLURM job "
                       "step: derive the rendezvous from SLURM and start the command after "
                       "`--` (torchrun: one task per node; tasks: one task per GPU).")
    add_launch_arguments(p)
