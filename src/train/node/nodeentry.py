"""`train launch` for an image that has no `train` of its own, run by the bound entry
(train.common.entry): from here on the standard library only, torch where the image has it
(tests/unit/test_nodeentry.py). `python -m train launch` shares the parser and the start,
and the job step's line starts here too (`light_launch`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from train.common.errors import EXIT_FAILURE, TrainError
from train.common.hostmem import DEFAULT_WORKER_MEM_MB

__all__ = ["add_launch_arguments", "light_launch", "main", "reported", "run_launch",
           "setup_logging"]


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    ranks = p.add_argument_group("how the ranks start")
    ranks.add_argument("--mode", choices=["torchrun", "tasks", "single"], default="torchrun",
                       help="torchrun (one task per node, a worker per GPU), tasks (this "
                       "task is one rank) or single (one process: checks and waits, then "
                       "runs it)")
    ranks.add_argument("--nproc-per-node", type=int, default=None,
                       help="torchrun workers per node (default: the node's GPUs, 1 on CPU)")
    ranks.add_argument("--chdir", default=None, metavar="DIR",
                       help="run the command in this folder")
    gpu = p.add_argument_group("GPU memory at start-up")
    gpu.add_argument("--min-free-mb", type=int, default=None,
                     help="wait until every GPU has this much free memory")
    gpu.add_argument("--wait-timeout", type=float, default=3600.0,
                     help="seconds to wait for --min-free-mb (default 3600)")
    gpu.add_argument("--fallback-batch", type=int, default=None,
                     help="after the wait times out, add --batch-size N instead of failing")
    loader = p.add_argument_group("DataLoader workers")
    loader.add_argument("--workers", type=int, default=None,
                        help="DataLoader workers wanted per process (capped by CPUs and "
                        "memory; exported as TRAIN_DATALOADER_WORKERS)")
    loader.add_argument("--worker-mem-mb", type=int, default=DEFAULT_WORKER_MEM_MB,
                        help="host memory per DataLoader worker, in MB (default "
                        f"{DEFAULT_WORKER_MEM_MB}, as for rendered jobs)")


def run_launch(args: argparse.Namespace, command: list[str]) -> int:
    """`train launch` with parsed arguments (both entries: an option's dest is its field)."""
    from dataclasses import fields

    from train.node.launch import LaunchOptions, launch
    from train.node.signals import ignore_late_walltime_signal, install_early_handlers

    install_early_handlers(mark_ready=False)
    given = {f.name: getattr(args, f.name) for f in fields(LaunchOptions) if f.name != "command"}
    try:
        return launch(LaunchOptions(command=command, **given))
    finally:
        ignore_late_walltime_signal()


def setup_logging(verbose: bool = False) -> None:
    """Log lines on stderr, with the rank where torch's launcher set one."""
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def reported(command: Callable[[], int]) -> int:
    """The command's exit code; the one place (with both entries) where an exception becomes
    a message and an exit code."""
    try:
        return command()
    except TrainError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("train: interrupted", file=sys.stderr)
        return 130
    except Exception:
        logging.getLogger("train").exception("unexpected failure")
        return EXIT_FAILURE


class _Declined(Exception):
    pass


class _LightParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Declined(message)


def light_launch(argv: Sequence[str]) -> int | None:
    """`python -m train launch OPTIONS -- COMMAND`, the line each task of a job step runs,
    without importing the other commands' parsers first (train.cli: 0.1-0.2 s of every
    task's start, before its program). None where the CLI answers instead: help, no
    command, or a line this parser does not take whole (the CLI's parser refuses it, and
    says so as it does for any command)."""
    raw = list(argv)
    if raw[:1] != ["launch"] or "--" not in raw:
        return None
    cut = raw.index("--")
    options, command = raw[1:cut], raw[cut + 1:]
    if not command or {"-h", "--help"} & set(options):
        return None
    parser = _LightParser(prog="train launch", add_help=False, allow_abbrev=False)
    add_launch_arguments(parser)
    try:
        args, extras = parser.parse_known_args(options)
    except _Declined:
        return None
    if extras:
        return None
    setup_logging()
    return reported(lambda: run_launch(args, command))


def main(argv: Sequence[str] | None = None) -> int:
    """`launch [OPTIONS] -- COMMAND`: the bound launcher's whole command line."""
    raw = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in raw:
        cut = raw.index("--")
        raw, command = raw[:cut], raw[cut + 1:]
    parser = argparse.ArgumentParser(prog="train (bound launcher)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_launch_arguments(sub.add_parser("launch"))
    args = parser.parse_args(raw)
    setup_logging()
    return reported(lambda: run_launch(args, command))


if __name__ == "__main__":
    raise SystemExit(main())
