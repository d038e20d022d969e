"""`train clusters`: list cluster profiles, show one, or probe the site."""

from __future__ import annotations

import argparse
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
