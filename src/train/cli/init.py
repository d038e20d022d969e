"""`train init`: write the defaults every job starts from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from train.common.errors import EXIT_OK

if TYPE_CHECKING:
    from train.cli.common import Subparsers


def add_init(sub: Subparsers) -> None:
    p = sub.add_parser("init", help="write your defaults for jobs (cluster, account, ...)",
                       description="Write the defaults every job starts from (flags and the "
                       "job file beat them). On a terminal with no flags: questions; "
                       "otherwise the flags given are set, the rest kept.")
    job = p.add_argument_group("where jobs run")
    job.add_argument("--cluster", "-M", default=None, help="cluster profile")
    job.add_argument("--account", "-A", default=None, help="SLURM account")
    job.add_argument("--partition", "-p", default=None, help="partition")
    box = p.add_argument_group("container", "the runtime, the image and what the program "
                               "sees of the host")
    box.add_argument("--runtime", default=None, choices=["none", "apptainer", "docker"])
    box.add_argument("--image", default=None, help="SIF path or docker tag")
    box.add_argument("--python", default=None, help="Python on the nodes or in the image")
    box.add_argument("--bind", action="append", default=None, metavar="SRC[:DST[:ro]]",
                     help="a bind every job gets (may repeat)")
    box.add_argument("--env", action="append", default=None, metavar="NAME[=VALUE]",
                     help="an environment setting every job gets (may repeat)")
    file = p.add_argument_group("the defaults file")
    file.add_argument("--show", action="store_true", help="print the defaults and their file")
    file.add_argument("--reset", action="store_true", help="start from nothing, not the file")
    extra = p.add_argument_group("cluster profiles")
    extra.add_argument("--profile", type=Path, action="append", default=[], metavar="FILE",
                       help="extra cluster profile YAML (may repeat)")


def _cmd_init(args: argparse.Namespace) -> int:
    from train.client.clusters.profiles import Registry
    from train.client.defaults import (
        ASKED,
        ask,
        defaults_path,
        load_defaults,
        merged,
        write_defaults,
    )

    path = defaults_path()
    current = load_defaults(path) if not args.reset else {}  # (says a path it cannot read)
    if args.show:
        print(f"# {path}" + ("" if current or path.exists() else " (not written yet)"))
        print(yaml.safe_dump(current, sort_keys=False), end="")
        return EXIT_OK
    given = {k: getattr(args, k) for k in ASKED if getattr(args, k) is not None}
    profiles = Registry(args.profile).names()
    asking = not given and sys.stdin.isatty() and sys.stdout.isatty()
    values = ask(profiles, current) if asking else merged(current, given)
    written, kept = write_defaults(values, profiles, path)
    print(f"defaults written to {written}"
          + (f" (the earlier file is kept as {kept})" if kept else ""))
    print(yaml.safe_dump(load_defaults(written), sort_keys=False), end="")
    return EXIT_OK
