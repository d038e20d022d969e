"""`train clusters`: list cluster profiles, show one, or probe the site; and `train init`:
write the defaults every job starts from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from train.common.errors import EXIT_FAILURE, EXIT_OK, UsageError

if TYPE_CHECKING:
    from train.cli.common import Subparsers


def add_clusters(sub: Subparsers) -> None:
    p = sub.add_parser("clusters", help="list cluster profiles, show one, or probe the site "
                       "(on its login node: what Slurm says against the profile)")
    p.add_argument("action", nargs="?", choices=["list", "show", "probe"], default="list")
    p.add_argument("name", nargs="?", help="profile to show or probe")
    p.add_argument("--write", action="store_true",
                   help="probe: write the probed values into the profile's own file (for "
                   "a shipped one: yours, extending it), the earlier file kept as FILE.1, .2, ...")
    p.add_argument("--profile", type=Path, action="append", default=[], metavar="FILE",
                   help="extra profile YAML (may repeat)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"probe: the longest each site command may take, then it is killed "
                   f"with its children (default: {PROBE_TIMEOUT:g}, at most {MAX_TIMEOUT:g})")


PROBE_TIMEOUT = 30.0  # train.client.clusters.probe.site.TIMEOUT (the parser imports no probe)
MAX_TIMEOUT = 600.0


def _cmd_clusters(args: argparse.Namespace) -> int:
    from train.client.clusters.profiles import Registry, describe

    registry = Registry(args.profile)
    for flag, given in (("--write", args.write), ("--timeout", args.timeout is not None)):
        if given and args.action != "probe":
            raise UsageError(f"{flag}: only with `train clusters probe NAME`")
    timeout = PROBE_TIMEOUT if args.timeout is None else float(args.timeout)
    if not 0 < timeout <= MAX_TIMEOUT:  # NaN too
        raise UsageError(f"--timeout: seconds above 0, at most {MAX_TIMEOUT:g}; got {timeout:g}")
    if args.action != "list" and not args.name:
        raise UsageError(f"clusters {args.action}: name a profile; known: "
                         + ", ".join(registry.names()))
    if args.action == "show":
        print(yaml.safe_dump(describe(registry.get(args.name)), sort_keys=False), end="")
        return EXIT_OK
    if args.action == "probe":
        from train.client.clusters.probe.command import probe
        from train.common._proc import printable

        lines, read, failed = probe(registry.get(args.name), write=args.write,
                                    extra_files=args.profile, timeout=timeout)
        print(printable("\n".join(lines)), flush=True)  # the report, whatever --write did
        if failed is not None:
            raise failed
        return EXIT_OK if read else EXIT_FAILURE
    for name in registry.names():
        prof = registry.get(name)
        print(f"{name:10s} {prof.description}  [{prof.source}]")
    return EXIT_OK


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
