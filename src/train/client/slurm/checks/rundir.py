"""The run folder: an earlier run there that this job cannot continue (another entry, or
other settings: the rule `train run` applies on the node), and the COMPLETE marker an
earlier run left."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from train.batch import contract
from train.client.slurm import queue
from train.client.slurm.chain import Chain, load_chain, record_problem
from train.client.slurm.checks.problem import Problem
from train.client.slurm.queue import ACTIVE_STATES
from train.client.slurm.resolve import ResolvedJob
from train.common.errors import ConfigError, UsageError


def identity_problems(job: ResolvedJob) -> list[Problem]:
    """An earlier run in the job's folder that this job cannot continue: another entry, or
    (entry train) other identity settings, as `train run` would find on the node."""
    from train.client.slurm.render import train_argv
    from train.workloads.config import run_config_from_argv
    from train.workloads.runrecord import describe, differences, read_run_record

    spec = job.spec
    run_dir = Path(job.run_dir)
    field, flag = ("out", "--out") if spec.out else ("name", "--name")
    which = f"{flag} {spec.out if spec.out else spec.name}"
    where, holds, new = str(run_dir), "holds", "run"
    seed: int | None = None
    sweep = _sweep_chain(job)
    if sweep is not None:  # said of the sweep's --name (or --out) and its seeds
        field, flag, value, seed = sweep
        which, where = f"{flag} {value}", f"{{seeds}} ({run_dir.parent}/seed-N)"
        holds, new = "{holds}", "sweep"
    problems = []
    if (run_dir / contract.CHAIN_RECORD).is_file():
        try:
            entry = load_chain(run_dir).record.get("entry")
        except UsageError:
            entry = None  # an unreadable record: submit says so when it keeps it aside
        if isinstance(entry, str) and entry != spec.entry:
            problems.append(Problem(field, f"{which}: {where} {holds} an earlier chain of "
                                    f"--entry {entry}, and this job is --entry {spec.entry}: "
                                    f"choose another {flag} (or remove that folder)",
                                    files=False, seed=seed))
    if spec.entry == "train" and not problems:
        cfg = run_config_from_argv(train_argv(job))
        try:
            differ = differences(cfg, read_run_record(cfg))
        except ConfigError as exc:  # a config.json that is not train's (exit 2 either way)
            return [Problem(field, f"{which}: {exc}", files=False)]
        if differ:
            problems.append(Problem(field, f"{which}: {where} {holds} an earlier run with "
                                    f"other settings ({describe(differ)}); `train run` "
                                    "would refuse to continue it on the node. Give its "
                                    f"settings, or another {flag} for a new {new}",
                                    files=False, seed=seed))
    return problems


def foreign_folder_problems(job: ResolvedJob) -> list[Problem]:
    """An --out that holds files and no run of train (no chain.json or sweep.json; for a
    `train run` job no config.json, the run record identity_problems judges): a chain
    puts jobs/, logs/, COMPLETE and its program's files there, replacing what it finds
    and searching all of it at each chunk's end. A sweep's task folders are the sweep's."""
    from train.client.slurm.sweep import is_task_job

    if job.spec.out is None:
        return []
    run_dir = Path(job.run_dir)
    there = next((p for p in (run_dir, *run_dir.parents) if os.path.lexists(p)), None)
    if there is not None and not there.is_dir():
        return [Problem("out", f"--out {job.spec.out}: {there} is not a folder (a file, or "
                        "a link to none): give a new or empty folder", files=False)]
    if is_task_job(job):  # a sweep's task folders are the sweep's: its folder is judged
        root = run_dir.parent  # (a task's folder run by hand, and beside one the seeds'
        # results.csv, are the sweep's; a model's folder with its config.json is not)

        def task_run(p: Path) -> bool:
            return re.fullmatch(r"(seed|task)-[0-9]+", p.name) is not None and p.is_dir() \
                and any((p / n).exists() for n in (contract.CHAIN_RECORD, "config.json"))

        try:
            runs = any(task_run(p) for p in root.iterdir())
        except OSError:
            runs = False
        listed = _held(root, [contract.SWEEP_RECORD],
                       lambda p: task_run(p) or (runs and p.name == "results.csv"))
        return [] if listed is None else [Problem(
            "out", f"--out {root}: the sweep's folder holds files ({listed}) and no sweep of "
            "train (no sweep.json): its tasks' folders, logs and scripts would go among them; "
            "give a new or empty folder", files=False)]
    listed = _held(run_dir, [contract.CHAIN_RECORD, contract.SWEEP_RECORD,
                             *(["config.json"] if job.spec.entry == "train" else [])])
    if listed is None:
        return []
    inside = os.path.join(job.spec.out, job.spec.name)
    return [Problem("out", f"--out {job.spec.out}: {run_dir} holds files ({listed}) and no "
                    "run of train (no chain.json): the chain would write its script, logs "
                    "and COMPLETE marker among them and replace files of those names; give "
                    f"a new or empty folder (e.g. --out {inside})", files=False)]


def _held(folder: Path, records: list[str], ours: Callable[[Path], bool] = lambda p: False
          ) -> str | None:
    """The first names of the files of `folder` that are not `ours`; None where it is no
    folder, holds one of `records` (a run of train), cannot be read (the submission says
    so) or holds nothing else."""
    try:
        if not folder.is_dir() or any(os.path.lexists(folder / n) for n in records):
            return None
        held = sorted(p.name for p in folder.iterdir() if not ours(p))
    except OSError:
        return None
    if not held:
        return None
    return ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")


def _sweep_chain(job: ResolvedJob) -> tuple[str, str, str, int] | None:
    """(field, flag, value, seed) of the sweep a chain is one seed of (train.client.slurm.sweep
    names it NAME-sS in ROOT/seed-S): the flag the user gave is --name, or --out where the
    root is not runs/NAME; None for a chain of its own."""
    from train.client.slurm.sweep import seed_dir

    run_dir = Path(job.run_dir)
    found = re.fullmatch(r"seed-([0-9]+)", run_dir.name)
    if found is None:
        return None
    seed = int(found.group(1))
    suffix = f"-s{seed}"
    if seed_dir(seed) != run_dir.name or not job.spec.name.endswith(suffix):
        return None
    base = job.spec.name[:-len(suffix)]
    if run_dir.parent == Path(os.path.abspath(os.path.join("runs", base))):
        return "name", "--name", base, seed
    return "out", "--out", str(run_dir.parent), seed


def stale_complete(job: ResolvedJob) -> Path | None:
    """The COMPLETE marker an earlier run left in the job's folder (it would end a new
    chain of a program other than `train run` after its first chunk)."""
    marker = Path(job.run_dir) / contract.COMPLETE_MARKER
    return marker if os.path.lexists(marker) else None


def check_not_active(run_dir: Path, sweep_task: bool = False) -> Chain | None:
    """The directory's earlier chain, if any; an error while any of it is queued or
    running (a sweep's task named ARRAY_TASK included), and for a folder of a sweep (a
    task's folder: its array task would run this chain) unless this is that sweep's
    `sweep_task`. Nothing is written."""
    if (run_dir / contract.SWEEP_RECORD).is_file():
        raise UsageError(f"name: {run_dir.name} is a sweep; choose another --name (or "
                         "--out) for a single chain")
    problem = record_problem(run_dir, "name")
    if problem is not None:  # (a FIFO there: no earlier run can be told apart)
        raise UsageError(f"{problem}; choose another --name (or --out)")
    if not sweep_task and (run_dir.parent / contract.SWEEP_RECORD).is_file():
        raise UsageError(f"out: {run_dir} is a task folder of the sweep {run_dir.parent} "
                         "(its array task runs the chain there): choose a folder outside "
                         "the sweep for a single chain")
    if not (run_dir / contract.CHAIN_RECORD).is_file():
        return None
    previous = load_chain(run_dir)
    sweep = previous.record.get("sweep")
    if sweep is not None and not sweep_task:  # (a task's folder, moved out of its sweep)
        array = sweep.get("array_job") if isinstance(sweep, dict) else None
        raise UsageError(f"out: {run_dir} holds a task of a sweep (job array "
                         f"{str(array)[:20]}): choose another folder for a single chain")
    active = [i for i, s in queue.ref_states(previous.ids).items()
              if s["state"] in ACTIVE_STATES]
    if active:
        ref = run_dir.name
        raise UsageError(f"name: {ref} already has an active chain (jobs "
                         f"{', '.join(sorted(active))}); cancel it first with `train cancel "
                         f"{ref}`, or choose another --name")
    return previous
