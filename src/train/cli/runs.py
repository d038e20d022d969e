"""Following submitted runs: `train status`, `logs`, `cancel`, `summary`, and `doctor` (a
run's failed or stuck jobs explained, or the login node checked before a job: --preflight)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.common.errors import EXIT_FAILURE, EXIT_OK, TrainError, UsageError

if TYPE_CHECKING:
    from train.cli.common import Subparsers

log = logging.getLogger("train")


def add_summary(sub: Subparsers) -> None:
    p = sub.add_parser("summary", help="a sweep's results: per task and across seeds",
                       description="A sweep of your command (-e command with --sweep-seeds "
                       "or --sweep NAME=V1,V2,...): a table of each task's final metrics "
                       "(the losses and the task's own metric first, e.g. eval_loss, "
                       "train_loss, accuracy) and its state, and for seeds each metric's "
                       "mean +- std. A task's metrics are read from $TRAIN_METRICS_FILE "
                       "(metrics.json in its folder: a JSON object the program writes), "
                       "else Hugging Face's all_results.json or Lightning's metrics.csv "
                       "under its folder. A `train run` sweep (the demo): a table of the "
                       "seeds (episodes, final evaluation, state) with the mean +- std of "
                       "their final evaluations, and runs/NAME/summary.csv: the seeds' "
                       "episode rewards (moving average), their mean and standard "
                       "deviation per episode; summary.png is drawn where matplotlib is "
                       "installed. Works on the login-node client.")
    p.add_argument("ref", metavar="NAME", help="the sweep's name (runs/NAME)")
    p.add_argument("--runs", type=Path, default=Path("runs"), metavar="DIR",
                   help="where runs live (default: runs)")
    p.add_argument("--smooth", type=int, default=25, help="a `train run` sweep: the "
                   "moving-average window of summary.csv (default 25)")


def add_status(sub: Subparsers) -> None:
    p = _add_run_parser(sub, "status", "state of a run's chain of jobs", "?")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", dest="all_runs",
                   help="every run under --runs in one table: state, progress, GPU "
                   "utilisation and `train doctor`'s verdict")
    p.add_argument("--tasks", action="store_true", help="a sweep: one line per "
                   "task (its chain's state, newest chunk, progress, time and GPU-hours)")
    p.add_argument("--chunks", action="store_true", help="a chain: each chunk's time "
                   "waited in the queue, time run and GPU-hours; and, where matplotlib is "
                   "installed, a picture of its chunks over time (RUN/chunks.png)")


def add_logs(sub: Subparsers) -> None:
    p = _add_run_parser(sub, "logs", "print a run's job log", None)
    p.add_argument("--err", action="store_true", help="the stderr log (tracebacks, "
                   "logging, Lightning's output); without it, where it is")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing until the job ends")
    p.add_argument("--job", default=None, help="a particular chunk's job id")


def add_cancel(sub: Subparsers) -> None:
    _add_run_parser(sub, "cancel", "cancel a run's whole chain", None)


def _add_run_parser(sub: Subparsers, name: str, text: str, nargs: str | None
                    ) -> argparse.ArgumentParser:
    """A command about one run: the run's name or job id, and where runs live."""
    p = sub.add_parser(name, help=text, description=text.capitalize() + ".")
    p.add_argument("ref", nargs=nargs, metavar="NAME|JOBID",
                   help="run name (runs/NAME) or any job id of its chain")
    p.add_argument("--runs", type=Path, default=Path("runs"), metavar="DIR",
                   help="where runs live (default: runs)")
    return p


def _cmd_status(args: argparse.Namespace) -> int:
    from train.client.slurm.chain import chain_dirs, find_run, load_chain, unreadable_runs
    from train.client.slurm.chainstatus import chain_status, format_status
    from train.client.slurm.sweep import is_sweep
    from train.client.slurm.sweeparray import format_sweep_status, sweep_status

    if args.ref is None and not os.path.isdir(args.runs):  # (a typo read as no runs)
        if os.path.exists(args.runs):
            raise UsageError(f"--runs: {args.runs} is not a folder (give the folder that "
                             "holds the runs)")
        _print(args, [], lambda: [f"no runs: {args.runs} does not exist (nothing was "
                                  "submitted from here yet, or --runs names another folder)"])
        return EXIT_OK
    if args.all_runs:
        if args.ref is not None:
            raise UsageError("status: --all shows every run; give no run name with it")
        from train.client.doctor import report

        rows = report.overview(args.runs)
        _print(args, rows, lambda: report.format_overview(rows) if rows
               else [f"no runs under {args.runs}"])
        return EXIT_OK
    found = find_run(args.ref, args.runs) if args.ref is not None else None
    if found is not None and is_sweep(found):
        if args.chunks:
            raise UsageError(f"status: --chunks shows one chain's chunks, and {args.ref} is "
                             f"a sweep: --tasks for a line per task, or `train status "
                             f"{found.name}/TASK --chunks` for one task's chunks")
        st = sweep_status(found)
        _print(args, st, lambda: format_sweep_status(st, args.tasks))
        return EXIT_OK
    if found is not None:
        statuses = [chain_status(load_chain(found))]
    else:  # every run: one unreadable record does not hide the others
        statuses = []
        for run_dir in chain_dirs(args.runs):
            try:
                statuses.append(chain_status(load_chain(run_dir)))
            except UsageError as exc:
                statuses.append({"name": run_dir.name, "run_dir": str(run_dir),
                                 "state": "unreadable", "cause": str(exc)})
        statuses += [{"name": run_dir.name, "run_dir": str(run_dir), "state": "unreadable",
                      "cause": why} for run_dir, why in unreadable_runs(args.runs)]
    if args.json:
        print(json.dumps(statuses if args.ref is None else statuses[0], indent=2))
    else:
        for st in statuses:
            print("\n".join(format_status(st, args.chunks)) if st["state"] != "unreadable"
                  else f"{st['name']}: unreadable  {st['run_dir']}\n  {st['cause']}")
    if args.chunks and found is not None:  # the picture of the one chain named
        from train.client.slurm.chaincost import draw

        path, note = draw(statuses[0])
        print(f"written: {path}" if path else f"train: {note}",
              file=sys.stderr if args.json or not path else sys.stdout)
    return EXIT_OK


def _print(args: argparse.Namespace, data: Any, lines: Callable[[], Iterable[str]]) -> None:
    """`data` as JSON with --json, else the lines of text `lines()` gives."""
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines()))


def _cmd_logs(args: argparse.Namespace) -> int:
    from train.client.slurm.chain import find_run, load_chain, log_path
    from train.client.slurm.queue import ACTIVE_STATES, job_states
    from train.client.slurm.sweep import is_sweep, not_a_chain

    run_dir = find_run(args.ref, args.runs)
    if is_sweep(run_dir):
        raise not_a_chain("logs", args.ref, run_dir)
    chain = load_chain(run_dir)
    path = log_path(chain, args.job, args.err)
    if not args.err:  # the program's own stderr (tracebacks, logging, Lightning) is apart
        err = log_path(chain, args.job, True)
        with contextlib.suppress(OSError):
            if err.stat().st_size > 0:
                print(f"train: this is the job's stdout; its stderr is in {err} ("
                      f"{err.stat().st_size} bytes: `train logs {args.ref} --err`)",
                      file=sys.stderr)
    position = 0
    while True:
        if path.exists():
            with open(path, encoding="utf-8", errors="replace") as fh:
                fh.seek(position)
                chunk = fh.read()
                position = fh.tell()
            sys.stdout.write(chunk)
            sys.stdout.flush()
        if not args.follow:
            if not path.exists():
                raise UsageError(f"logs: {path} does not exist: the job has not started, "
                                 "or ended before writing it (`train status "
                                 f"{args.ref}` says which)")
            return EXIT_OK
        job_id = path.name.rsplit("-", 1)[-1].split(".")[0]  # logs/NAME-JOBID.out
        if job_states([job_id]).get(job_id, {}).get("state") not in ACTIVE_STATES:
            return EXIT_OK
        time.sleep(1.0)


def _cmd_cancel(args: argparse.Namespace) -> int:
    from train.client.slurm.chain import cancel_chain, find_run, load_chain
    from train.client.slurm.sweep import is_sweep

    run_dir = find_run(args.ref, args.runs)
    if is_sweep(run_dir):
        from train.client.slurm.sweeparray import cancel_sweep

        ids, unread = cancel_sweep(run_dir)
        none = "no active job among what could be read (below)" if unread else \
            "no active jobs"
        print(f"cancelled sweep {run_dir.name}: {' '.join(ids) if ids else none}")
        for exc in unread[1:]:
            print(f"train: {exc}", file=sys.stderr)
        if unread:
            raise unread[0]
        return EXIT_OK
    chain = load_chain(run_dir)
    cancelled = cancel_chain(chain)
    print(f"cancelled {chain.record['name']}: "
          f"{' '.join(cancelled) if cancelled else 'no active jobs'}")
    return EXIT_OK


def _cmd_summary(args: argparse.Namespace) -> int:
    from train.client.slurm.chain import find_run
    from train.client.slurm.sweep import is_sweep
    from train.client.slurm.sweepsummary import summarize

    root = find_run(args.ref, args.runs)
    if not is_sweep(root):
        raise UsageError(f"summary: {args.ref} is not a sweep (submit one with "
                         "--sweep-seeds or --sweep NAME=V1,V2,...)")
    if args.smooth < 1:
        raise UsageError(f"summary: --smooth must be at least 1, got {args.smooth}")
    from train.client.slurm.sweepmetrics import is_command_sweep, summarize_metrics

    left_out: list[str] = []
    written: list[str] = []
    if is_command_sweep(root):  # a command's sweep: each task's final metrics
        lines, notes = summarize_metrics(root, _chain_states(root), left_out)
    else:
        summary = summarize(root, args.smooth, _chain_states(root))
        lines, notes, left_out = summary.table, summary.notes, summary.left_out
        written = [str(p) for p in (summary.csv, summary.plot) if p is not None]
    print("\n".join(lines))
    for note in notes:
        print(f"train: {note}", file=sys.stderr)
    if written:
        print(f"written: {' and '.join(written)}")
    if left_out:  # the rest is summarised; what could not be read is said
        for line in left_out[1:]:
            print(f"train: left out of the summary: {line}", file=sys.stderr)
        raise UsageError(f"summary: left out: {left_out[0]}")
    return EXIT_OK


def _chain_states(root: Path) -> dict[str, str]:
    """Each task's chain state as `train status` shows it, where Slurm answers; the
    summary falls back to the run folders where it does not (or a chain has no record)."""
    from train.client.slurm.sweeparray import sweep_status

    try:
        chains = sweep_status(root)["chains"]
    except TrainError as exc:
        log.debug("summary: no chain states: %s", exc)
        return {}
    return {str(c["label"]): str(c["state"]) for c in chains if c["state"] != "unreadable"}


def add_doctor(sub: Subparsers) -> None:
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
    _print(args, report.as_dict(), lambda: doctor_report.format_report(report))
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
    _print(args, checks_json(checks), lambda: format_checks(checks))
    return EXIT_FAILURE if failed(checks) else EXIT_OK
