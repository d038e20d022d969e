"""`train doctor`: explain a run's failed or stuck jobs, or check the login node
(--preflight)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from train.common.errors import EXIT_FAILURE, EXIT_OK, UsageError

if TYPE_CHECKING:
    from train.cli.common import Subparsers


def add_doctor(sub: Subparsers) -> None:
    """`train doctor [NAME|JOBID|DIR]`, with the preflight's group."""
    p = sub.add_parser(
        "doctor", help="explain a run's failed or stuck jobs, with the fix",
        description="What happened to each chunk of a run, the cause with its evidence "
        "(log file and line) and the fix as the flags to change. Exit 0: healthy; 1: a "
        "problem was found; 2: bad input.")
    p.add_argument("ref", nargs="?", metavar="NAME|JOBID|DIR",
                   help="a run name (runs/NAME), any job id of its chain, or its directory "
                   "(default: the newest run under --runs)")
    p.add_argument("--runs", type=Path, default=Path("runs"), metavar="DIR",
                   help="where runs live (default: runs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--full", action="store_true", help="search every byte of logs over "
                   "256 MiB (by default their first 32 MiB and last 128 MiB)")
    pre = p.add_argument_group(
        "preflight", "--preflight checks, on the login node, what a job needs before it is "
        "submitted: the container runtime, the image, the account, the runs root and the "
        "image's CUDA against the nodes' driver (values not given come from `train init`'s "
        "defaults)")
    pre.add_argument("--preflight", action="store_true", help="run the checks (no run is "
                     "diagnosed); exit 0 when none failed, 1 when one did")
    pre.add_argument("-M", "--cluster", default=None, help="the cluster profile")
    pre.add_argument("--profile", type=Path, action="append", default=[], metavar="FILE",
                     help="an extra cluster profile file")
    pre.add_argument("-A", "--account", default=None, help="the account jobs are charged to")
    pre.add_argument("-p", "--partition", default=None, help="the partition jobs run in")
    pre.add_argument("-C", "--constraint", default=None, help="the node type (constraint)")
    pre.add_argument("--image", default=None, help="the image: a SIF path or a docker tag")
    pre.add_argument("--runtime", default=None, help="auto, apptainer, docker or none")
    pre.add_argument("--python", default=None, help="the Python jobs run in an image not of "
                     "ours (default python3), asked what it holds")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from train.client.doctor import report as doctor_report

    if args.preflight:
        return _preflight(args)
    report = doctor_report.diagnose(doctor_report.resolve(args.ref, args.runs), full=args.full)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(doctor_report.format_report(report)))
    return EXIT_OK if report.healthy else EXIT_FAILURE


def _preflight(args: argparse.Namespace) -> int:
    from train.client.clusters.profiles import Registry
    from train.client.defaults import defaults_path, load_defaults
    from train.client.preflight.result import checks_json, failed, format_checks
    from train.client.preflight.suite import run_preflight

    if args.ref is not None:
        raise UsageError("doctor: --preflight checks the login node, not a run; give no run "
                         "name with it")
    # the flags given, over `train init`'s defaults
    given = {**load_defaults(), **{k: v for k, v in vars(args).items() if v is not None}}
    python = str(given.get("python") or "python3")
    if python.startswith("-") or not python.strip() or "\x00" in python:
        raise UsageError(f"--python: {python[:80]!r} is not an interpreter (a command name or "
                         "path, not starting with '-')")
    registry = Registry(args.profile)
    cluster = given.get("cluster")
    if cluster is None:
        raise UsageError(f"cluster: --preflight needs the cluster: --cluster NAME (one of "
                         f"{', '.join(registry.names())}), or `train init --cluster NAME` "
                         f"(it goes to {defaults_path()})")
    checks = run_preflight(
        registry.get(str(cluster)), image=given.get("image"), account=given.get("account"),
        runs_root=args.runs, runtime=given.get("runtime") or "auto", python=python,
        partition_or_constraint=given.get("partition") or given.get("constraint"))
    if args.json:
        print(json.dumps(checks_json(checks), indent=2))
    else:
        print("\n".join(format_checks(checks)))
    return EXIT_FAILURE if failed(checks) else EXIT_OK
