"""The `train` command; the only place that turns exceptions into messages and exit codes."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from train import __version__
from train.config import WORKLOADS, build_config, field_table, load_yaml
from train.errors import EXIT_FAILURE, EXIT_OK, TrainError

log = logging.getLogger("train")

RUN_EPILOG = """\
exit codes:
  0  the run is complete, or it stopped cleanly (time budget, SIGUSR1, SIGTERM, SIGINT)
     after writing a checkpoint: OUT/status.json says which; run the same command to resume
  1  an unexpected failure
  2  bad input (unknown workload, config key or value; unwritable --out); nothing written
  3  a resource is missing: GPU memory at start-up, or the StarCraft II game (SC2PATH)

A YAML file given with --config takes the same keys as the flags (with underscores);
flags override it.
"""


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="train a workload (the GPU training entrypoint)",
                       description="Train a workload: demo (built-in beacon game, no GPU or "
                       "cluster needed) or sc2 (StarCraft II through pysc2).",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", nargs="?", default=None, metavar="WORKLOAD",
                   help=f"one of: {', '.join(WORKLOADS)} (default: demo)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="YAML file with any of the options below")
    for f in field_table():
        if f.name == "workload":
            continue
        meta = f.metadata
        help_text = meta["doc"]
        if meta["choices"]:
            help_text += f" Choices: {', '.join(meta['choices'])}."
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        help_text += f" (default: {default})"
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                       metavar=f.name.upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train", description=__doc__)
    parser.add_argument("--version", action="version", version=f"train {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_run_parser(sub)
    return parser


def _setup_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def _cmd_run(args: argparse.Namespace) -> int:
    from train import runner

    file_values = load_yaml(args.config) if args.config is not None else {}
    flags = {f.name: getattr(args, f.name) for f in field_table()
             if f.name != "workload" and getattr(args, f.name) is not None}
    if args.workload is not None:
        flags["workload"] = args.workload
    cfg = build_config(file_values, flags)
    result = runner.run(cfg)
    if not result.complete:
        print(f"train: stopped early ({result.stop_reason}); checkpoint written in "
              f"{cfg.out}; run the same command to continue", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return _cmd_run(args)
    except TrainError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("train: interrupted", file=sys.stderr)
        return 130
    except Exception:
        log.exception("unexpected failure")
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
