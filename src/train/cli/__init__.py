"""The `train` command (its exceptions become messages and exit codes in one place, shared
with the bound launcher: train.node.nodeentry.reported). One module per command (or family)
holds its parser and its handler; handlers import what they need when they run, so `train
launch` on the nodes stays light."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from train import __version__
from train.cli import clusters, image, jobs, launch, runs
from train.cli.common import HelpFormatter, interrupted
from train.common.errors import EXIT_OK, runtime_missing
from train.common.fields import FlagParser
from train.node.nodeentry import reported, run_launch, setup_logging

if TYPE_CHECKING:
    from train.cli.common import Subparsers

DESCRIPTION = """\
Train on a university SLURM cluster inside a pinned container: write your defaults once
(train init), render or submit a job as a chain of walltime-sized chunks that checkpoint
and resume, follow it (status, logs, doctor), and train for real with train run (the demo
needs no cluster or GPU: train run demo). `train COMMAND --help` describes each command.
"""

# each sub-command's parser, in the order `train --help` lists them
ADD_COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    launch.add_run, clusters.add_clusters, jobs.add_jobs, clusters.add_init,
    image.add_image, launch.add_launch, runs.add_summary, runs.add_status, runs.add_logs,
    runs.add_cancel, runs.add_doctor)
# each sub-command's handler
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": launch._cmd_run, "clusters": clusters._cmd_clusters, "status": runs._cmd_status,
    "logs": runs._cmd_logs, "cancel": runs._cmd_cancel, "image": image._cmd_image,
    "init": clusters._cmd_init, "summary": runs._cmd_summary, "doctor": runs._cmd_doctor}
# and those that also take the words after `--` (None: no `--` given)
WITH_WORKLOAD: dict[str, Callable[[argparse.Namespace, list[str] | None], int]] = {
    "render": jobs._cmd_render, "submit": jobs._cmd_submit,
    "launch": lambda args, workload: run_launch(args, workload or [])}


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="train", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"train {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in ADD_COMMANDS:  # in this order in `train --help`
        add(sub)
    return parser


def _value_flag_joined(raw: list[str], flag: str) -> list[str]:
    """`FLAG VALUE` as `FLAG=VALUE`: a value that is itself a flag (--resume-args
    --init_from=resume), which argparse would take for an option of its own."""
    out: list[str] = []
    it = iter(raw)
    for arg in it:
        value = next(it, None) if arg == flag else None
        out.append(arg if value is None else f"{flag}={value}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    workload: list[str] | None = None  # None: no `--` given
    if "--" in raw and any(c in raw[: raw.index("--")] for c in WITH_WORKLOAD):
        cut = raw.index("--")
        raw, workload = raw[:cut], raw[cut + 1:]
    raw = _value_flag_joined(raw, "--resume-args")
    parser = build_parser()
    args = parser.parse_args(raw)
    setup_logging(args.verbose)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if args.command not in ("launch", "run"):  # (they set their own)
        # TERM (a `timeout`, a closed session) ends a command as Ctrl-C does: the program
        # it waits on, in a process group of its own, is killed with it
        signal.signal(signal.SIGTERM, interrupted)
    return reported(lambda: _dispatch(args, workload))


def _dispatch(args: argparse.Namespace, workload: list[str] | None) -> int:
    try:
        if args.command in WITH_WORKLOAD:
            return WITH_WORKLOAD[args.command](args, workload)
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # `train status | head`: the reader left, nothing to report
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # no flush error at exit
        return EXIT_OK
    except ModuleNotFoundError as exc:  # a client-only install: `train run` needs the run extra
        missing = runtime_missing(exc)
        if missing is None:
            raise
        raise missing from None
