"""The `train` command; the only place that turns exceptions into messages and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from train import __version__
from train.config import (
    FlagParser,
    add_fields,
    add_run_arguments,
    flags_from,
    load_yaml,
    run_config_from_args,
)
from train.errors import EXIT_FAILURE, EXIT_OK, TrainError, UsageError, runtime_missing
from train.nodeentry import add_launch_arguments

log = logging.getLogger("train")

RUN_EPILOG = """\
exit codes:
  0  the run is complete, or it stopped cleanly (time budget, SIGUSR1, SIGTERM, SIGINT)
     after writing a checkpoint: OUT/status.json says which; run the same command to resume
  1  an unexpected failure
  2  bad input (unknown workload, config key or value; unwritable --out); nothing written
  3  a resource is missing: GPU memory at start-up, the StarCraft II game (SC2PATH), a
     usable CUDA with --device cuda (the message names the cause and the fix), or the
     training runtime (pip install './[run]' in a checkout of this repository)

A YAML file given with --config takes the same keys as the flags (with underscores);
flags override it.
"""

JOB_EPILOG = """\
The workload and its arguments follow `--`, exactly as `train run` takes them, e.g.
  train submit job.yaml --max-chunks 5 -- demo --episodes 9000 --res 32
A job YAML file takes the same keys as the flags (with underscores), `workload` a list.
Bad input exits 2 and nothing is submitted.
"""


DESCRIPTION = """\
Train on a university SLURM cluster inside a pinned container: write your defaults once
(train init), render or submit a job as a chain of walltime-sized chunks that checkpoint
and resume, follow it (status, logs, doctor), and train for real with train run (the demo
needs no cluster or GPU: train run demo). `train COMMAND --help` describes each command.
"""

# render and submit: the job's flags by topic (field name -> group), so the help reads as
# a few short lists; a field not named here lands in "other" (a unit test refuses that)
JOB_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "job": ("what runs, and where its files go",
            ("name", "cluster", "entry", "out", "sweep_seeds", "sweep", "sweep_throttle",
             "no_check")),
    "resources": ("what the job asks SLURM for, per node",
                  ("account", "partition", "qos", "constraint", "time", "nodes",
                   "gpus_per_node", "gpu_type", "cpus_per_task", "mem", "ntasks_per_node",
                   "workers", "worker_mem", "preempt")),
    "chain": ("walltime-sized chunks that checkpoint and resume",
              ("max_chunks", "requeue", "stop_signal", "signal_margin", "time_budget",
               "stop_mode", "resume_args", "save_path")),
    "container": ("the runtime, the image, and what the program sees of the host",
                  ("runtime", "image", "python", "bind", "env")),
    "program": ("how the program is started on the nodes",
                ("launch", "chdir", "data", "navsim_split", "navsim_script",
                 "navsim_strategy")),
    "GPU memory wait": ("before the program starts, on shared GPUs",
                        ("min_free_mb", "wait_timeout", "fallback_batch")),
    "monitoring": ("GPU utilisation watch while the job runs",
                   ("gpu_watch_interval", "gpu_idle_threshold", "gpu_idle_minutes")),
    "passed to SLURM": ("options this tool has no flag for",
                        ("sbatch_extra", "srun_extra")),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`-A, --account ACCOUNT` (the value named once), help from column 32."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"


def _job_groups(p: argparse.ArgumentParser) -> dict[str, Any]:
    """The render/submit parser's argument groups, by field name ("other" for the rest)."""
    by_field: dict[str, Any] = {}
    for title, (text, names) in JOB_GROUPS.items():
        group = p.add_argument_group(f"{title} ({text})")
        by_field.update(dict.fromkeys(names, group))
    by_field[""] = p.add_argument_group("other")
    return by_field


def _group_of(groups: dict[str, Any]) -> Callable[[str], Any]:
    return lambda field: groups.get(field, groups[""])


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="train", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"train {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="train a workload (the GPU training entrypoint)",
                       description="Train a workload: demo (built-in beacon game, no GPU or "
                       "cluster needed) or sc2 (StarCraft II through pysc2).",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)

    p = sub.add_parser("clusters", help="list cluster profiles, show one, or probe the site "
                       "(on its login node: what Slurm says against the profile)")
    p.add_argument("action", nargs="?", choices=["list", "show", "probe"], default="list")
    p.add_argument("name", nargs="?", help="profile to show or probe")
    p.add_argument("--write", action="store_true",
                   help="probe: write the probed values as your profile NAME (extends NAME)")
    p.add_argument("--profile", type=Path, action="append", default=[], metavar="FILE",
                   help="extra profile YAML (may repeat)")

    from train.slurm.job import JobSpec

    for name, text in (("render", "print the sbatch script(s) of a job (dry run)"),
                       ("submit", "submit a job as a chain of chunks")):
        p = sub.add_parser(name, help=text, description=text.capitalize() + ".",
                           epilog=JOB_EPILOG, formatter_class=HelpFormatter,
                           usage="%(prog)s [JOB.yaml] [OPTIONS] [-- WORKLOAD [ARG ...]]")
        p.add_argument("job_file", nargs="?", type=Path, metavar="JOB.yaml",
                       help="job spec file")
        groups = _job_groups(p)
        groups["cluster"].add_argument("--profile", type=Path, action="append", default=[],
                                       metavar="FILE",
                                       help="extra cluster profile YAML (may repeat)")
        groups["no_check"].add_argument(
            "--no-check", action="store_true",
            help="skip the login node's look at the image, the program and --python (for "
            "nodes that see files or programs this login node does not), and submit without "
            "asking Slurm first (sbatch --test-only)")
        add_fields(p, JobSpec, skip=("workload",), group=_group_of(groups))

    p = sub.add_parser("init", help="write your defaults for jobs (cluster, account, ...)",
                       description="Write the defaults every job starts from (flags and the "
                       "job file beat them). On a terminal with no flags: questions; "
                       "otherwise the flags given are set, the rest kept.")
    p.add_argument("--cluster", "-M", default=None, help="cluster profile")
    p.add_argument("--account", "-A", default=None, help="SLURM account")
    p.add_argument("--partition", "-p", default=None, help="partition")
    p.add_argument("--runtime", default=None, choices=["none", "apptainer", "docker"])
    p.add_argument("--image", default=None, help="SIF path or docker tag")
    p.add_argument("--python", default=None, help="Python on the nodes or in the image")
    p.add_argument("--bind", action="append", default=None, metavar="SRC[:DST[:ro]]",
                   help="a bind every job gets (may repeat)")
    p.add_argument("--env", action="append", default=None, metavar="NAME[=VALUE]",
                   help="an environment setting every job gets (may repeat)")
    p.add_argument("--show", action="store_true", help="print the defaults and their file")
    p.add_argument("--reset", action="store_true", help="start from nothing, not the file")
    p.add_argument("--profile", type=Path, action="append", default=[], metavar="FILE",
                   help="extra cluster profile YAML (may repeat)")

    p = sub.add_parser("image", help="lint, translate, build, test, export and digest images",
                       description="Container images from containers/*.def (the copy "
                       "installed with the package when not run from a clone; --defs DIR "
                       "names another folder). Works from any directory: %%files sources "
                       "resolve from the folder above the definitions, as `apptainer build` "
                       "run from the repository root does.")
    p.add_argument("action", choices=["lint", "translate", "build", "test", "export",
                                      "digest", "new"],
                   help="digest: the content digest of a built image (every file's path, "
                   "mode and sha256), to compare an image on the cluster with CI's")
    p.add_argument("images", nargs="*", metavar="IMAGE",
                   help="base, sc2, navsim or a .def path (lint: all when none given)")
    p.add_argument("--defs", type=Path, default=None, metavar="DIR",
                   help="folder holding the .def files and requirements/ (default: "
                   "$TRAIN_DEFS, the clone's containers/, then the installed copy)")
    p.add_argument("--no-cache", action="store_true",
                   help="build: no effect since every Docker build starts from the base "
                   "image (kept for scripts that pass it)")
    p.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                   help="override a %%arguments default (may repeat)")
    p.add_argument("--localimage", action="append", default=[], metavar="SIF=TAG",
                   help="docker tag to use for a localimage bootstrap (may repeat)")
    p.add_argument("--tag", default=None, help="docker tag (default: train/IMAGE:local)")
    p.add_argument("--from", dest="from_image", choices=["base", "sc2", "navsim"],
                   default="base", help="new: the image of ours to build on")
    p.add_argument("--requirements", type=Path, default=None, metavar="FILE",
                   help="new: your requirements (name and version specifier, one a line)")
    p.add_argument("--editable", type=Path, default=None, metavar="DIR",
                   help="new: a local project installed editable at /opt/src/NAME")
    p.add_argument("--find-links", type=Path, default=None, metavar="DIR",
                   help="new: resolve from this folder of wheels only, not the index")
    p.add_argument("--engine", choices=["auto", "apptainer", "docker"], default="auto")
    p.add_argument("--fakeroot", action="store_true", help="apptainer build --fakeroot")
    p.add_argument("--network", choices=["none", "default", "host"], default=None,
                   help="build, docker engine: the network the build's steps reach (default "
                   "none: offline inputs only, as in CI; `default` for a real build that "
                   "downloads the CUDA base's packages, the game and the wheels)")
    p.add_argument("--out", type=Path, default=None,
                   help="translate: context dir; build, test, digest: SIF path (docker "
                   "build: the build record's path); export: tar path; digest: also write "
                   "the listing there when a docker tag is used")

    p = sub.add_parser("launch", help="start a workload on every node of a job step "
                       "(inside the container)",
                       description="Run inside the container on each node of a SLURM job "
                       "step: derive the rendezvous from SLURM and start the command after "
                       "`--` (torchrun: one task per node; tasks: one task per GPU).")
    add_launch_arguments(p)

    p = sub.add_parser("summary", help="a seed sweep's results: per seed and across seeds",
                       description="Print a table of the sweep's seeds (episodes, final "
                       "evaluation, state) with the mean +- std of their final evaluations, "
                       "and write runs/NAME/summary.csv: the seeds' episode rewards (moving "
                       "average), their mean and standard deviation per episode. Works on "
                       "the login-node client; summary.png is drawn where matplotlib is "
                       "installed.")
    p.add_argument("ref", metavar="NAME", help="the sweep's name (runs/NAME)")
    p.add_argument("--runs", type=Path, default=Path("runs"), metavar="DIR",
                   help="where runs live (default: runs)")
    p.add_argument("--smooth", type=int, default=25, help="moving-average window "
                   "(default 25)")

    for name, text in (("status", "state of a run's chain of jobs"),
                       ("logs", "print a run's job log"),
                       ("cancel", "cancel a run's whole chain")):
        p = sub.add_parser(name, help=text, description=text.capitalize() + ".")
        p.add_argument("ref", nargs=None if name != "status" else "?", metavar="NAME|JOBID",
                       help="run name (runs/NAME) or any job id of its chain")
        p.add_argument("--runs", type=Path, default=Path("runs"), metavar="DIR",
                       help="where runs live (default: runs)")
        if name == "status":
            p.add_argument("--json", action="store_true", help="machine-readable output")
            p.add_argument("--all", action="store_true", dest="all_runs",
                           help="every run under --runs in one table: state, progress, GPU "
                           "utilisation and `train doctor`'s verdict")
            p.add_argument("--tasks", action="store_true", help="a sweep: one line per "
                           "task (its chain's state, newest chunk, progress)")
        if name == "logs":
            p.add_argument("--err", action="store_true", help="the stderr log (tracebacks, "
                           "logging, Lightning's output); without it, where it is")
            p.add_argument("--follow", "-f", action="store_true",
                           help="keep printing until the job ends")
            p.add_argument("--job", default=None, help="a particular chunk's job id")

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
    from train.runtime.signals import install_early_handlers

    install_early_handlers()  # before torch is imported: that takes seconds
    from train import runner
    from train.runtime.signals import ignore_late_walltime_signal

    cfg = run_config_from_args(args)
    try:
        result = runner.run(cfg)
    finally:
        ignore_late_walltime_signal()
    if not result.complete:
        print(f"train: stopped early ({result.stop_reason}); run the same command to "
              f"continue from the last checkpoint in {cfg.out}", file=sys.stderr)
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        # Everything is written and the ranks have met at the last barrier. torch's gloo
        # can still abort a rank as the process group is torn down while a peer leaves
        # ("terminate called without an active exception", exit -6), failing a chunk
        # whose work is done: leave without running the C++ destructors.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK


def _cmd_clusters(args: argparse.Namespace) -> int:
    from train.clusters.profiles import Registry, describe

    registry = Registry(args.profile)
    if args.write and args.action != "probe":
        raise UsageError("--write: only with `train clusters probe NAME`")
    if args.action == "show":
        if not args.name:
            raise UsageError("clusters show: name a profile; known: "
                             + ", ".join(registry.names()))
        print(yaml.safe_dump(describe(registry.get(args.name)), sort_keys=False), end="")
        return EXIT_OK
    if args.action == "probe":
        from train.clusters.probe import probe

        if not args.name:
            raise UsageError("clusters probe: name a profile; known: "
                             + ", ".join(registry.names()))
        lines, read = probe(registry.get(args.name), write=args.write,
                            extra_files=args.profile)
        print("\n".join(lines))
        return EXIT_OK if read else EXIT_FAILURE
    for name in registry.names():
        prof = registry.get(name)
        print(f"{name:10s} {prof.description}  [{prof.source}]")
    return EXIT_OK


def _resolved_jobs(args: argparse.Namespace, workload: list[str] | None
                   ) -> tuple[Any, Path | None, list[tuple[Any, Any]]]:
    """The job, or a sweep's jobs (one per task of its job array), each validated: (spec,
    the sweep's directory or None, [(SweepTask or None, job)])."""
    from train.slurm.job import resolve

    spec, profile = _job_spec(args, workload)
    if not spec.sweep_seeds and not spec.sweep:
        if spec.sweep_throttle is not None:
            raise UsageError("sweep_throttle: is for a sweep (--sweep-seeds or --sweep)")
        return spec, None, [(None, resolve(spec, profile))]
    from train.slurm.sweep import split, task_job

    root, specs = split(spec, profile.max_array_size)
    return spec, root, [(task, task_job(task, resolve(s, profile))) for task, s in specs]


def _job_spec(args: argparse.Namespace, workload: list[str] | None) -> tuple[Any, Any]:
    from train.clusters.profiles import Registry
    from train.defaults import LISTS, defaults_path, joined, load_defaults, merged
    from train.slurm.job import JobSpec, job_from_sources

    file_values = load_yaml(args.job_file) if args.job_file is not None else {}
    flags: dict[str, Any] = flags_from(args, JobSpec, skip=("workload",))
    if workload is not None:
        flags["workload"] = list(workload)
    base = merged(load_defaults(), file_values)
    for key in LISTS:  # list flags add to the file's and the defaults' lists
        if key in flags and isinstance(base.get(key), list):
            flags[key] = joined(map(str, base[key]), flags[key])  # flags are text
    spec = job_from_sources(base, flags)
    registry = Registry(args.profile)
    if spec.cluster is None:
        raise UsageError(f"no cluster given: use --cluster NAME (one of "
                         f"{', '.join(registry.names())}), or set a default with "
                         f"`train init --cluster NAME` (it goes to {defaults_path()})")
    return spec, registry.get(spec.cluster)


def _cmd_init(args: argparse.Namespace) -> int:
    from train.clusters.profiles import Registry
    from train.defaults import (
        ASKED,
        ask,
        defaults_path,
        interactive,
        load_defaults,
        merged,
        write_defaults,
    )

    path = defaults_path()
    current = load_defaults(path) if path.exists() and not args.reset else {}
    if args.show:
        print(f"# {path}" + ("" if path.exists() else " (not written yet)"))
        print(yaml.safe_dump(current, sort_keys=False), end="")
        return EXIT_OK
    given = {k: getattr(args, k) for k in ASKED if getattr(args, k) is not None}
    profiles = Registry(args.profile).names()
    asking = not given and interactive()
    values = ask(profiles, current) if asking else merged(current, given)
    written = write_defaults(values, profiles, path)
    print(f"defaults written to {written}")
    print(yaml.safe_dump(load_defaults(written), sort_keys=False), end="")
    return EXIT_OK


def _cmd_render(args: argparse.Namespace, workload: list[str] | None) -> int:
    from train.slurm.render import library_path, render

    spec, root, jobs = _resolved_jobs(args, workload)
    jobs = _check_jobs(args, jobs, submitting=False)
    if root is not None:
        from train.slurm.sweeparray import array_script

        print(f"# ---- the sweep's job array: {root}/jobs/array.sbatch ----")
        print(array_script(spec.name, root, jobs, spec.sweep_throttle), end="")
    for task, job in jobs:
        if task is not None:
            print(f"# ---- task {task.index} ({task.label}): chain {job.run_dir}, "
                  "jobs/chain.sbatch ----")
        print(render(job, library_path().read_text(encoding="utf-8")), end="")
    return EXIT_OK


def _cmd_submit(args: argparse.Namespace, workload: list[str] | None) -> int:
    from train.slurm.render import library_path
    from train.slurm.scheduler import submit_chain

    spec, root, jobs = _resolved_jobs(args, workload)  # every seed validated first
    jobs = _check_jobs(args, jobs, submitting=True)
    from train.programs import submit_notes

    job = jobs[0][1]
    for note in submit_notes(spec.entry, spec.workload, job.launch, job.run_dir, spec.chdir):
        print(f"train: warning: {note}", file=sys.stderr)
    library = library_path().read_text(encoding="utf-8")
    # a closed terminal (HUP) or a kill (TERM) mid-way must not leave a held job behind:
    # both unwind like Ctrl-C, through submit_chain's clean-up
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM,
                                                                signal.SIGHUP)}
    try:
        if root is not None:  # one job array, submitted whole or not at all
            from train.slurm.sweep import swept_flag
            from train.slurm.sweeparray import array_spec, submit_sweep

            array_id = submit_sweep(spec.name, swept_flag(spec), root, jobs,
                                    spec.sweep_throttle, library)
            print(f"submitted sweep {spec.name}: job array {array_id} "
                  f"(--array={array_spec(len(jobs), spec.sweep_throttle)}; each task chunk 1 "
                  f"of at most {job.chunks}, chaining on its own); run dirs under {root}")
            return EXIT_OK
        chain = submit_chain(job, library)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"submitted {job.spec.name}: job {chain.ids[0]} (chunk 1 of at most "
          f"{job.chunks}; each chunk submits the next); run dir {chain.run_dir}")
    return EXIT_OK


def _check_jobs(args: argparse.Namespace, jobs: list[tuple[Any, Any]],
                submitting: bool) -> list[tuple[Any, Any]]:
    """What the login node can check before the queue wait (exit 2 at submit; warnings
    at render, which works anywhere). Returns the jobs, with the client's launcher bound
    in where the image has no `train` (train.images.features; not with --no-check)."""
    from train.slurm.submitcheck import check_jobs

    for note in check_jobs([job for _, job in jobs], submitting=submitting,
                           no_check=args.no_check):
        print(f"train: warning: {note}", file=sys.stderr)
    if args.no_check:
        return jobs
    from train.images.features import equip

    return [(task, equip(job)) for task, job in jobs]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _cmd_status(args: argparse.Namespace) -> int:
    from train.slurm.scheduler import (
        chain_dirs,
        chain_status,
        find_run,
        format_status,
        load_chain,
    )
    from train.slurm.sweep import is_sweep
    from train.slurm.sweeparray import format_sweep_status, sweep_status

    if args.all_runs:
        if args.ref is not None:
            raise UsageError("status: --all shows every run; give no run name with it")
        from train import doctor

        rows = doctor.overview(args.runs)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print("\n".join(doctor.format_overview(rows)) if rows else
                  f"no runs under {args.runs}")
        return EXIT_OK
    found = find_run(args.ref, args.runs) if args.ref is not None else None
    if found is not None and is_sweep(found):
        st = sweep_status(found)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print("\n".join(format_sweep_status(st, args.tasks)))
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
    if args.json:
        print(json.dumps(statuses if args.ref is None else statuses[0], indent=2))
        return EXIT_OK
    for st in statuses:
        print("\n".join(format_status(st)) if st["state"] != "unreadable"
              else f"{st['name']}: unreadable  {st['run_dir']}\n  {st['cause']}")
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from train import doctor

    if args.preflight:
        return _preflight(args)
    report = doctor.diagnose(doctor.resolve(args.ref, args.runs), full=args.full)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(doctor.format_report(report)))
    return EXIT_OK if report.healthy else EXIT_FAILURE


def _preflight(args: argparse.Namespace) -> int:
    from train import preflight
    from train.clusters.profiles import Registry
    from train.defaults import defaults_path, load_defaults

    if args.ref is not None:
        raise UsageError("doctor: --preflight checks the login node, not a run; give no run "
                         "name with it")
    defaults = load_defaults()

    def given(name: str) -> Any:
        value = getattr(args, name)
        return value if value is not None else defaults.get(name)

    registry = Registry(args.profile)
    cluster = given("cluster")
    if cluster is None:
        raise UsageError(f"cluster: --preflight needs the cluster: --cluster NAME (one of "
                         f"{', '.join(registry.names())}), or `train init --cluster NAME` "
                         f"(it goes to {defaults_path()})")
    checks = preflight.run_preflight(
        registry.get(str(cluster)), image=given("image"), account=given("account"),
        runs_root=args.runs, partition_or_constraint=given("partition") or given(
            "constraint"), runtime=given("runtime") or "auto")
    if args.json:
        print(json.dumps(preflight.checks_json(checks), indent=2))
    else:
        print("\n".join(preflight.format_checks(checks)))
    return EXIT_FAILURE if preflight.failed(checks) else EXIT_OK


def _cmd_logs(args: argparse.Namespace) -> int:
    from train.slurm.scheduler import ACTIVE_STATES, find_run, job_states, load_chain, log_path
    from train.slurm.sweep import chain_paths, is_sweep

    run_dir = find_run(args.ref, args.runs)
    if is_sweep(run_dir):
        raise UsageError(f"logs: {args.ref} is a sweep; name one seed's chain: "
                         + ", ".join(f"{args.ref}/{p.name}" for _, p in chain_paths(run_dir)))
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
                raise UsageError(f"logs: {path} does not exist yet (the job has not started)")
            return EXIT_OK
        job_id = path.name.rsplit("-", 1)[-1].split(".")[0]  # logs/NAME-JOBID.out
        if job_states([job_id]).get(job_id, {}).get("state") not in ACTIVE_STATES:
            return EXIT_OK
        time.sleep(1.0)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag}: expected NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def _cmd_image(args: argparse.Namespace) -> int:
    from train.images import build as builder
    from train.images.content import digest
    from train.images.defs import parse
    from train.images.dockerfile import translate
    from train.images.lint import lint_all
    from train.images.sources import containers_dir, find_def

    if args.action == "new":
        return _image_new(args, containers_dir(args.defs))
    if args.action == "lint":
        paths = ([find_def(i, args.defs) for i in args.images]
                 or sorted(containers_dir(args.defs).glob("*.def")))
        violations = lint_all(paths)
        for v in violations:
            print(v)
        print(f"{len(paths)} definition(s), {len(violations)} violation(s)", file=sys.stderr)
        return 1 if violations else EXIT_OK
    if len(args.images) != 1:
        raise UsageError(f"image {args.action}: name exactly one image")
    path = find_def(args.images[0], args.defs)
    d = parse(path)
    root = path.parent.parent  # %files sources resolve from above containers/
    build_args = _pairs(args.build_arg, "--build-arg")
    localimages = _pairs(args.localimage, "--localimage")
    tag = args.tag or f"train/{d.name}:local"
    engine = builder.engine(args.engine)
    out = args.out.resolve() if args.out is not None else None  # before any cwd change
    if args.action == "translate":
        if out is None:
            print(translate(d, build_args, localimages).dockerfile, end="")
        else:
            builder.write_context(d, out, build_args, localimages, root)
            print(f"build context written to {out}")
        return EXIT_OK
    sif = out or Path(f"{d.name}.sif").resolve()
    if args.action == "build":
        if engine == "apptainer":
            if args.network not in (None, "default"):
                raise UsageError("--network: apptainer builds use the host's network; "
                                 "--network none|host is for --engine docker")
            result = builder.apptainer_build(d, root, sif, build_args, args.fakeroot)
            print(f"built {sif}")
        else:
            result = builder.docker_build(d, root, tag, build_args, localimages,
                                          network=args.network or "none",
                                          nocache=args.no_cache, record=out)
            print(f"built {tag} ({result.image})")
        print("\n".join(result.summary()))
        return EXIT_OK
    if args.action == "test":
        smoke = builder.smoke_args(d)
        report = builder.apptainer_test(sif, smoke) if engine == "apptainer" \
            else builder.docker_test(tag, smoke)
        print(report, end="")
        return EXIT_OK
    if args.action == "digest":
        if engine == "apptainer":
            lines = builder.apptainer_content(sif)
        else:
            lines = builder.docker_content(tag)
            if out is not None:
                out.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{digest(lines)} {len(lines)} entries "
              f"({sif if engine == 'apptainer' else tag})")
        return EXIT_OK
    if engine == "apptainer":
        raise UsageError("image export: an apptainer build is already a SIF file")
    print(builder.docker_export(tag, out or Path(f"{d.name}.tar").resolve()))
    return EXIT_OK


def _image_new(args: argparse.Namespace, containers: Path) -> int:
    from train.images.derive import PIP_INDEX, derive

    if len(args.images) != 1:
        raise UsageError("image new: name exactly one new image (NAME)")
    if args.requirements is None:
        raise UsageError("image new: --requirements FILE is required")
    index = (["--no-index", "--find-links", str(args.find_links.resolve())]
             if args.find_links is not None else ["--index-url", PIP_INDEX])
    made = derive(args.images[0], args.from_image, args.requirements, containers,
                  out=args.out, editable=args.editable, index_args=index)
    print(f"wrote {made.definition} and {made.lock} ({len(made.added)} package(s) added to "
          f"{args.from_image}: {', '.join(f'{p.name}=={p.version}' for p in made.added)})")
    print(f"next: train image lint {made.definition}; train image build {made.definition} "
          f"(Docker: --localimage {args.from_image}.sif=train/{args.from_image}:local)")
    root = made.definition.parent.parent
    if not ((root / "pyproject.toml").is_file() or (root / ".git").exists()):
        print(f"note: `train image build` builds from a source tree, and {root} has no "
              "pyproject.toml or .git: build from a project folder (`--out` inside it) or "
              "`git init` there first", file=sys.stderr)
    return EXIT_OK


def _cmd_launch(args: argparse.Namespace, command: list[str]) -> int:
    from train.nodeentry import run_launch

    return run_launch(args, command)


def _cmd_cancel(args: argparse.Namespace) -> int:
    from train.slurm.scheduler import cancel_chain, find_run, load_chain
    from train.slurm.sweep import is_sweep

    run_dir = find_run(args.ref, args.runs)
    if is_sweep(run_dir):
        from train.slurm.sweeparray import cancel_sweep

        ids = cancel_sweep(run_dir)
        print(f"cancelled sweep {run_dir.name}: {' '.join(ids) if ids else 'no active jobs'}")
        return EXIT_OK
    dirs = [run_dir]
    failures: list[TrainError] = []
    for path in dirs:  # every chain of a sweep is tried, whatever one of them does
        try:
            chain = load_chain(path)
            cancelled = cancel_chain(chain)
        except TrainError as exc:
            failures.append(exc)
            print(f"train: {path.name}: {exc}", file=sys.stderr)
            continue
        print(f"cancelled {chain.record['name']}: "
              f"{' '.join(cancelled) if cancelled else 'no active jobs'}")
    if failures:
        raise failures[0]
    return EXIT_OK


def _cmd_summary(args: argparse.Namespace) -> int:
    from train.slurm.scheduler import find_run
    from train.slurm.sweep import is_sweep, summarize

    root = find_run(args.ref, args.runs)
    if not is_sweep(root):
        raise UsageError(f"summary: {args.ref} is not a seed sweep (submit one with "
                         "--sweep-seeds)")
    if args.smooth < 1:
        raise UsageError(f"summary: --smooth must be at least 1, got {args.smooth}")
    summary = summarize(root, args.smooth, _chain_states(root))
    print("\n".join(summary.table))
    for note in summary.notes:
        print(f"train: {note}", file=sys.stderr)
    written = [str(p) for p in (summary.csv, summary.plot) if p is not None]
    if written:
        print(f"written: {' and '.join(written)}")
    return EXIT_OK


def _chain_states(root: Path) -> dict[str, str]:
    """Each task's chain state as `train status` shows it, where Slurm answers; the
    summary falls back to the run folders where it does not (or a chain has no record)."""
    from train.slurm.sweeparray import sweep_status

    try:
        chains = sweep_status(root)["chains"]
    except TrainError as exc:
        log.debug("summary: no chain states: %s", exc)
        return {}
    return {str(c["label"]): str(c["state"]) for c in chains}


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
    if "--" in raw and any(c in raw[: raw.index("--")] for c in ("render", "submit",
                                                                   "launch")):
        cut = raw.index("--")
        raw, workload = raw[:cut], raw[cut + 1:]
    raw = _value_flag_joined(raw, "--resume-args")
    parser = build_parser()
    args = parser.parse_args(raw)
    _setup_logging(args.verbose)
    commands = {"run": _cmd_run, "clusters": _cmd_clusters, "status": _cmd_status,
                "logs": _cmd_logs, "cancel": _cmd_cancel, "image": _cmd_image,
                "init": _cmd_init, "summary": _cmd_summary, "doctor": _cmd_doctor}
    try:
        if args.command == "launch":
            return _cmd_launch(args, workload or [])
        if args.command in ("render", "submit"):
            job_cmd = _cmd_render if args.command == "render" else _cmd_submit
            return job_cmd(args, workload)
        return commands[args.command](args)
    except TrainError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("train: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `train status | head`: the reader left, nothing to report
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # no flush error at exit
        return EXIT_OK
    except ModuleNotFoundError as exc:  # a client-only install: `train run` needs the run extra
        missing = runtime_missing(exc)
        if missing is None:
            log.exception("unexpected failure")
            return EXIT_FAILURE
        print(f"train: error: {missing}", file=sys.stderr)
        return missing.exit_code
    except Exception:
        log.exception("unexpected failure")
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
