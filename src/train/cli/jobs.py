"""`train render` and `train submit`: a job, or a sweep of jobs, from the job file,
`train init`'s defaults and the flags."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.cli.common import HelpFormatter, interrupted
from train.common.errors import EXIT_OK, ConfigError, UsageError
from train.common.fields import add_fields, build, flags_from, load_yaml

if TYPE_CHECKING:
    from train.cli.common import Subparsers


JOB_EPILOG = """\
The workload and its arguments follow `--`, exactly as `train run` takes them, e.g.
  train submit job.yaml --max-chunks 5 -- demo --episodes 9000 --res 32
A job YAML file takes the same keys as the flags (with underscores), `workload` a list.
Bad input exits 2 and nothing is submitted.
"""


def add_jobs(sub: Subparsers) -> None:
    """`train render` and `train submit`: the job file, and the job's fields as flags in
    groups (cli/jobhelp.py JOB_GROUPS)."""
    from train.cli.jobhelp import add_help, full_epilog, job_groups
    from train.client.slurm.jobspec import JobSpec

    for name, text in (("render", "print the sbatch script(s) of a job (dry run)"),
                       ("submit", "submit a job as a chain of chunks")):
        p = sub.add_parser(name, help=text, description=text.capitalize() + ".",
                           epilog=JOB_EPILOG, formatter_class=HelpFormatter, add_help=False,
                           usage="%(prog)s [JOB.yaml] [OPTIONS] [-- WORKLOAD [ARG ...]]")
        add_help(p)
        p.add_argument("job_file", nargs="?", type=Path, metavar="JOB.yaml",
                       help="job spec file")
        groups = job_groups(p)
        groups["cluster"].add_argument("--profile", type=Path, action="append", default=[],
                                       metavar="FILE",
                                       help="extra cluster profile YAML (may repeat)")
        groups["no_check"].add_argument(
            "--no-check", action="store_true",
            help="skip the login node's look at the image, the program and --python (for "
            "nodes that see files or programs this login node does not), and submit without "
            "asking Slurm first (sbatch --test-only)")
        add_fields(p, JobSpec, skip=("workload",), group=groups.__getitem__)
        p.epilog = JOB_EPILOG + full_epilog(p)
        p.unknown_hint = _program_typed


def _program_typed(parsed: argparse.Namespace, extras: list[str]) -> str | None:
    """`train submit python my_train.py` (no `--`): a program taken for the job file and
    its arguments: the error says how to run it (None: not a program)."""
    from train.client.programs import command_hint

    if parsed.job_file is None:
        return None
    hint = command_hint([str(parsed.job_file), *extras])
    return f"workload: {hint}" if hint else None


def _resolved_jobs(args: argparse.Namespace, workload: list[str] | None
                   ) -> tuple[Any, Path | None, list[tuple[Any, Any]]]:
    """The job, or a sweep's jobs (one per task of its job array), each validated: (spec,
    the sweep's directory or None, [(SweepTask or None, job)])."""
    from train.client.slurm.resolve import resolve
    from train.client.slurm.sweep import split, task_job
    from train.client.slurm.sweepargs import single_job

    origin: dict[str, Path] = {}  # field -> the defaults file, where its value is from
    try:
        spec, profile = _job_spec(args, workload, origin)
        if not spec.sweep_seeds and not spec.sweep:
            if spec.sweep_throttle is not None:
                raise UsageError("sweep_throttle: is for a sweep (--sweep-seeds or --sweep)")
            return spec, None, [(None, resolve(single_job(spec), profile))]
        root, specs = split(spec, profile.max_array_size)
        return spec, root, [(task, task_job(task, resolve(s, profile))) for task, s in specs]
    except ConfigError as exc:
        raise _said_as_default(exc, origin) from None


def _job_spec(args: argparse.Namespace, workload: list[str] | None,
              origin: dict[str, Path]) -> tuple[Any, Any]:
    from train.client.clusters.profiles import Registry
    from train.client.defaults import LISTS, defaults_path, joined, load_defaults, merged
    from train.client.slurm.jobspec import JobSpec

    if args.job_file is not None and args.job_file.suffix in (".py", ".sh"):
        _refuse_program("JOB.yaml", [str(args.job_file)])
    file_values = load_yaml(args.job_file) if args.job_file is not None else {}
    flags: dict[str, Any] = flags_from(args, JobSpec, skip=("workload",))
    if workload is not None:
        flags["workload"] = list(workload)
    defaults = load_defaults()
    base = merged(defaults, file_values)
    for key in LISTS:  # list flags add to the file's and the defaults' lists
        if key in flags and isinstance(base.get(key), list):
            flags[key] = joined(map(str, base[key]), flags[key])  # flags are text
    # (a scalar value from the defaults file alone: its errors name the file)
    # (a list from the defaults file alone too: a flag adds to it, then either may be bad)
    origin.update(dict.fromkeys(set(defaults) - set(merged({}, file_values)) - set(flags),
                                defaults_path()))
    _infer_entry(flags, base)
    spec = build(JobSpec, base, flags)
    if spec.entry == "train":
        _refuse_program("workload", spec.workload)
    registry = Registry(args.profile)
    if spec.cluster is None:
        raise UsageError(f"no cluster given: use --cluster NAME (one of "
                         f"{', '.join(registry.names())}), or set a default with "
                         f"`train init --cluster NAME` (it goes to {defaults_path()})")
    return spec, registry.get(spec.cluster)


def _infer_entry(flags: dict[str, Any], base: dict[str, Any]) -> None:
    """No --entry given (by flag, job file or defaults): the entry from what follows `--`
    (train.client.programs.implied_entry: a program runs as `-e command` would)."""
    from train.client.programs import implied_entry

    if "entry" in flags or "entry" in base:
        return
    typed = flags.get("workload", base.get("workload"))
    if isinstance(typed, list) and typed and implied_entry([str(t) for t in typed]) \
            == "command":
        flags["entry"] = "command"


def _refuse_program(field: str, typed: Any) -> None:
    """A program where a `train run` workload goes (`train submit my_train.py`, `-- python
    my_train.py` without --entry command): the error says what to type."""
    from train.client.programs import command_hint

    hint = command_hint(list(typed))
    if hint is not None:
        raise UsageError(f"{field}: {hint}")


def _said_as_default(exc: ConfigError, origin: dict[str, Path]) -> ConfigError:
    """A bad value that came from the defaults file (not the job file, not a flag), said
    as the file's, with how to override or remove it."""
    path = origin.get(exc.field)
    if path is None:
        return exc
    from train.client.defaults import LISTS

    flag = "--" + exc.field.replace("_", "-")
    how = (f"{flag} adds to that list: remove the item from that file" if exc.field in LISTS
           else f"give {flag} to override it, or remove it from that file")
    return ConfigError(exc.field, f"{str(exc).partition(': ')[2]} (this {exc.field} is "
                       f"not from your command line: it is in the defaults file {path}; "
                       f"{how}, e.g. `train init` and '-' for it)")


def _cmd_render(args: argparse.Namespace, workload: list[str] | None) -> int:
    from train.client.slurm.render import render

    spec, root, jobs = _resolved_jobs(args, workload)
    jobs = _check_jobs(args, spec, jobs, submitting=False)
    if root is not None:
        from train.client.slurm.sweeparray import array_script

        print(f"# ---- the sweep's job array: {root}/jobs/array.sbatch ----")
        print(array_script(spec.name, root, jobs, spec.sweep_throttle), end="")
    for task, job in jobs:
        if task is not None:
            print(f"# ---- task {task.index} ({task.label}): chain {job.run_dir}, "
                  "jobs/chain.sbatch ----")
        print(render(job), end="")
    return EXIT_OK


def _cmd_submit(args: argparse.Namespace, workload: list[str] | None) -> int:
    from train.client.slurm.submission import submit_chain

    spec, root, jobs = _resolved_jobs(args, workload)  # every seed validated first
    if spec.time_min is None and jobs[0][1].time_min and not args.no_check:
        from train.client.slurm.testonly import floor_starts_short

        release = floor_starts_short()
        if release is not None:
            args.time_min = "off"
            spec, root, jobs = _resolved_jobs(args, workload)
            print(f"train: note: Slurm {release} starts a job that has --time-min with that "
                  "minimum as its time limit even on idle nodes: the chain's chunks ask for "
                  "the whole --time here (give --time-min to have a floor anyway)",
                  file=sys.stderr)
    jobs = _check_jobs(args, spec, jobs, submitting=True)
    from train.client.programs import interpreter_note, submit_notes

    job = jobs[0][1]
    said = interpreter_note(job.spec.entry, job.spec.workload, job.spec.runtime,
                            job.spec.python)
    if said:
        print(f"train: {said}", file=sys.stderr)
    for note in submit_notes(spec.entry, spec.workload, job.launch, job.run_dir, spec.chdir):
        print(f"train: warning: {note}", file=sys.stderr)
    from train.client.slurm import queue

    for note in queue.submit_notes(job):
        print(f"train: note: {note}", file=sys.stderr)
    # a closed terminal (HUP) or a kill (TERM) mid-way must not leave a held job behind:
    # both unwind like Ctrl-C, through submit_chain's clean-up
    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM,
                                                                signal.SIGHUP)}
    try:
        if root is not None:  # one job array, submitted whole or not at all
            from train.client.slurm.sweep import swept_flag
            from train.client.slurm.sweeparray import array_spec, submit_sweep

            array_id = submit_sweep(spec.name, swept_flag(spec), root, jobs,
                                    spec.sweep_throttle)
            each = f"each task runs at most {job.chunks} times, requeued after each " \
                "checkpointed stop" if job.spec.requeue else \
                f"each task chunk 1 of at most {job.chunks}, chaining on its own"
            print(f"submitted sweep {spec.name}: job array {array_id} "
                  f"(--array={array_spec(len(jobs), spec.sweep_throttle)}; {each}); run "
                  f"dirs under {root}")
            return EXIT_OK
        chain = submit_chain(job)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"submitted {job.spec.name}: job {chain.ids[0]} (chunk 1 of at most "
          f"{job.chunks}; each chunk submits the next); run dir {chain.run_dir}")
    return EXIT_OK


def _check_jobs(args: argparse.Namespace, spec: Any, jobs: list[tuple[Any, Any]],
                submitting: bool) -> list[tuple[Any, Any]]:
    """What the login node can check before the queue wait (exit 2 at submit; warnings
    at render, which works anywhere), then what a command job's program walks into after
    it (warnings: a stop signal it has no handler for, saves the chain cannot see, a sweep
    whose tasks all run alike). Returns the jobs, with the client's launcher bound in where
    the image has no `train` (train.client.slurm.checks.imagefit; not with --no-check)."""
    from train.client.slurm.checks.traps import trap_notes
    from train.client.slurm.submitcheck import check_jobs

    for note in check_jobs([job for _, job in jobs], submitting=submitting,
                           no_check=args.no_check):
        print(f"train: warning: {note}", file=sys.stderr)
    if not args.no_check:
        from train.client.slurm.checks.imagefit import equip

        jobs = [(task, equip(job)) for task, job in jobs]
    notes = trap_notes(jobs[0][1])
    if spec.entry == "command" and (spec.sweep or spec.sweep_seeds):
        from train.client.slurm.sweepargs import sweep_notes

        notes = [*sweep_notes(spec.workload, spec.resume_args, spec.chdir), *notes]
    for note in notes:
        print(f"train: warning: {note}", file=sys.stderr)
    return jobs
