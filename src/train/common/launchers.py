"""Hugging Face's `accelerate launch` as a job's command: the login node's checks and `train
launch` on the node see it here alike. It starts the processes of its node itself (one per
GPU, through torch's launcher, or the program alone on one GPU or a CPU), so the job runs
it once per node as the node's launcher and gives it the job's shape and rendezvous as its
own flags (standard library only: the bound launcher imports it)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

# accelerate launch's options that the job sets from its shape (-N, -g) and rendezvous
JOB_OPTIONS = ("num_processes", "num_machines", "machine_rank", "main_process_ip",
               "main_process_port")


def accelerate_prefix(command: Sequence[str]) -> int:
    """How many words of the command start `accelerate launch` (`accelerate launch`: 2,
    its `accelerate-launch` script: 1, `python -m accelerate.commands.launch`: 3); 0
    for any other command."""
    name = os.path.basename(command[0]) if command else ""
    if name == "accelerate" and len(command) > 1 and command[1] == "launch":
        return 2
    if name == "accelerate-launch":
        return 1
    if name.startswith("python") and list(command[1:3]) == ["-m",
                                                            "accelerate.commands.launch"]:
        return 3
    return 0


def given_job_options(command: Sequence[str]) -> list[str]:
    """The job's own options (JOB_OPTIONS) the command gives accelerate launch itself,
    before its script (the first `.py` word, or the module after -m/--module: what
    follows is the program's)."""
    own = command[accelerate_prefix(command):]
    module = [i + 1 for i, word in enumerate(own) if word in ("-m", "--module")]
    words = itertools.takewhile(lambda word: not word.endswith(".py"),
                                own[:module[0]] if module else own)
    flags = [word.split("=", 1)[0] for word in words if word.startswith("--")]
    return [flag for flag in flags if flag[2:].replace("-", "_") in JOB_OPTIONS]


def with_job_options(command: Sequence[str], nodes: int, node_rank: int, master: str,
                     port: int, processes: int) -> list[str]:
    """The command with the job's shape and rendezvous as accelerate launch's options."""
    at = accelerate_prefix(command)
    values = (processes, nodes, node_rank, master, port)  # JOB_OPTIONS' (zip: Python 3.9)
    options = [f"--{name}={value}" for name, value in zip(JOB_OPTIONS, values)]  # noqa: B905
    return [*command[:at], *options, *command[at:]]
