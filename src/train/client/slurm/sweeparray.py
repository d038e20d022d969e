"""A sweep as one Slurm job array: each task chains on its own.

`train submit --sweep-seeds "4 6 8"` (or `--sweep lr=1e-3,5e-4`) renders one ordinary
chain script per task (runs/NAME/seed-S/jobs/chain.sbatch, or task-I/) and a short array
script (runs/NAME/jobs/array.sbatch, `--array=0-N%M`) whose task I runs chunk 1 of the
I-th chain. From there each task is a chain like any other: its chunk 1 records its own
job id in its chain.ids when it starts (job-lib.sh's train_array_task), submits its
successor with afterok on itself, and so on; its stop, requeue, failure and cancel touch
its own chain alone. Until a task starts, its chain.ids names it ARRAY_TASK.
A throttled sweep's tasks run in requeue mode instead (sweep.requeue_mode): each requeues
itself (as ARRAY_TASK) after a checkpointed stop and keeps its job id, so every run of
every task is the array's and Slurm's throttle bounds them all.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from pathlib import Path
from typing import Any

from train.batch import contract
from train.client.slurm import submitcheck
from train.client.slurm.job import ResolvedJob
from train.client.slurm.render import render, sbatch_options, sbatch_value
from train.client.slurm.scheduler import (
    ACTIVE_STATES,
    Chain,
    chain_record,
    chain_status,
    job_states,
    load_chain,
    parse_sbatch_id,
)
from train.client.slurm.submission import undo_submission
from train.client.slurm.sweep import SweepTask, aggregate, load_record, sweep_tasks, write_record
from train.common import _proc
from train.common.errors import ResourceError, UsageError
from train.common.jsonio import write_json_atomic

ARRAY_SCRIPT = "array.sbatch"  # in the sweep's JOBS_DIR
_OWN_OPTIONS = ("--job-name=", "--output=", "--error=")


def array_spec(count: int, throttle: int | None) -> str:
    """sbatch's --array value: tasks 0 to count-1, at most `throttle` at once."""
    return f"0-{count - 1}" + (f"%{throttle}" if throttle else "")


def array_script(name: str, root: Path, tasks: list[tuple[SweepTask, ResolvedJob]],
                 throttle: int | None) -> str:
    """The array job's script: the first task's resources, one task per chain; task I
    runs chunk 1 of chain I (its own script, its log in its own folder)."""
    first = tasks[0][1]
    logs = f"{root}/{contract.LOG_DIR}".replace("%", "%%")
    options = [o for o in sbatch_options(first) if not o.startswith(_OWN_OPTIONS)]
    options = [f"--job-name={sbatch_value(name, 'name')}", *options,
               f"--output={sbatch_value(logs + '/%x-%A_%a.out', 'out')}",
               f"--error={sbatch_value(logs + '/%x-%A_%a.err', 'out')}",
               f"--array={array_spec(len(tasks), throttle)}"]
    later = ["# there); each task requeues itself after a checkpointed stop (requeue mode),",
             "# so the array's throttle bounds every chunk of every task."] \
        if first.spec.requeue else \
        ["# there); each task's later chunks are its own jobs, submitted by that script."]
    dirs = [shlex.quote(job.run_dir) for _, job in tasks]
    names = [shlex.quote(job.spec.name) for _, job in tasks]
    return "\n".join([
        "#!/bin/bash",
        *[f"#SBATCH {line}" for line in options],
        f"# Rendered by `train submit` for the sweep {name}: task I of this job array",
        "# runs chunk 1 of the chain in TASK_DIRS[I] (its own script, jobs/chain.sbatch",
        *later,
        "set -euo pipefail",
        "TASK_DIRS=(", *[f"    {d}" for d in dirs], ")",
        "TASK_NAMES=(", *[f"    {n}" for n in names], ")",
        'dir=${TASK_DIRS[$SLURM_ARRAY_TASK_ID]}',
        'log="$dir/logs/${TASK_NAMES[$SLURM_ARRAY_TASK_ID]}-$SLURM_JOB_ID"',
        'exec >> "$log.out" 2>> "$log.err"',
        "# (the files Slurm opened for this task: removed at its end when left empty)",
        f"export {contract.ARRAY_LOG_VAR}={shlex.quote(f'{root}/{contract.LOG_DIR}/{name}')}"
        '"-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        f'exec bash "$dir/{contract.JOBS_DIR}/{contract.JOB_SCRIPT}" 1', ""])


def task_ref(array_id: str, index: int) -> str:
    return f"{array_id}_{index}"


def _set_aside(run_dir: Path, moved: list[tuple[Path, Path]]) -> None:
    """An ended chain's record and an earlier run's COMPLETE marker, kept aside as
    chain-FIRSTJOB.*: the task's new chain starts afresh from the run's checkpoint."""
    if (run_dir / contract.CHAIN_RECORD).is_file():
        old = load_chain(run_dir)
        tag = old.ids[0] if old.ids else "old"
        for name in (contract.CHAIN_RECORD, contract.CHAIN_IDS):
            path = run_dir / name
            if path.exists():
                kept = path.with_name(f"chain-{tag}{path.suffix}")
                path.replace(kept)
                moved.append((kept, path))
    marker = run_dir / contract.COMPLETE_MARKER
    if os.path.lexists(marker):
        kept = marker.with_name(f".{contract.COMPLETE_MARKER}-{int(time.time())}")
        marker.replace(kept)
        moved.append((kept, marker))


def _write_scripts(tasks: list[tuple[SweepTask, ResolvedJob]], texts: list[str],
                   written: list[Path], moved: list[tuple[Path, Path]]) -> None:
    """Each task's folder (logs/ before Slurm opens them) and its chain's script."""
    for (_, job), text in zip(tasks, texts, strict=True):
        run_dir = Path(job.run_dir)
        (run_dir / contract.LOG_DIR).mkdir(parents=True, exist_ok=True)
        (run_dir / contract.JOBS_DIR).mkdir(exist_ok=True)
        _set_aside(run_dir, moved)
        script = run_dir / contract.JOBS_DIR / contract.JOB_SCRIPT
        script.write_text(text, encoding="utf-8")
        written.append(script)


def submit_sweep(name: str, flag: str, root: Path, tasks: list[tuple[SweepTask, ResolvedJob]],
                 throttle: int | None, library: str) -> str:
    """Write every task's chain script and the array script, submit the array held,
    record the sweep and each task's chain, then release. Whole or not at all: a failure
    before the release cancels the array and removes what was written."""
    import shutil

    if shutil.which("sbatch") is None:
        raise ResourceError("sbatch is not on PATH: `train submit` runs on a cluster's login "
                            "node (`train render` prints the scripts anywhere)")
    check_sweep_root(root)
    texts = [render(job, library) for _, job in tasks]
    created = [d for d in (*reversed(root.parents), root) if not d.exists()]
    written: list[Path] = []
    moved: list[tuple[Path, Path]] = []
    array_id: str | None = None
    try:
        _write_scripts(tasks, texts, written, moved)
        (root / contract.LOG_DIR).mkdir(exist_ok=True)
        (root / contract.JOBS_DIR).mkdir(exist_ok=True)
        launcher = root / contract.JOBS_DIR / ARRAY_SCRIPT
        launcher.write_text(array_script(name, root, tasks, throttle), encoding="utf-8")
        written.append(launcher)
        array_id = parse_sbatch_id(_proc.run(
            ["sbatch", "--parsable", "--hold", str(launcher)], timeout=120,
            env=submitcheck.sbatch_environment()).stdout)
        write_record(root, name, [t for t, _ in tasks], flag, array_job=array_id,
                     throttle=throttle)
        written.append(root / contract.SWEEP_RECORD)
        for task, job in tasks:
            run_dir = Path(job.run_dir)
            ids = run_dir / contract.CHAIN_IDS
            ids.write_text(f"1 {task_ref(array_id, task.index)}\n", encoding="utf-8")
            written.append(ids)
            script = run_dir / contract.JOBS_DIR / contract.JOB_SCRIPT
            write_json_atomic(run_dir / contract.CHAIN_RECORD,
                              {**chain_record(job, task_ref(array_id, task.index), 1, script),
                               "sweep": {"array_job": array_id, "task": task.index}})
            written.append(run_dir / contract.CHAIN_RECORD)
        _proc.run(["scontrol", "release", array_id], timeout=60)
    except BaseException:
        undo_submission(array_id, written, moved, [])
        if created:  # the sweep's folder is this submission's: all of it goes
            shutil.rmtree(root, ignore_errors=True)
        for folder in reversed(created[:-1]):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return array_id


# -- states ---------------------------------------------------------------------------
def array_task_states(refs: list[str]) -> dict[str, dict[str, Any]]:
    """States of array tasks named ARRAY_TASK (tasks not started yet, or started since
    the chain.ids was read): squeue --array, then sacct; UNKNOWN where neither knows."""
    out: dict[str, dict[str, Any]] = {}
    arrays = sorted({r.partition("_")[0] for r in refs})
    if arrays:
        proc = _proc.run(["squeue", "--array", "--noheader", "--jobs", ",".join(arrays),
                          "--format", "%i|%T|%r"], check=False)
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            ref, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if ref in refs:
                out[ref] = {"state": state or "UNKNOWN", "reason": reason or None}
    missing = [r for r in refs if r not in out]
    if missing:
        argv = ["sacct", "-P", "-n", "-o", "JobID,State,ExitCode", "-j", ",".join(missing)]
        proc = _proc.run(argv, check=False)
        if "accounting storage is disabled" in proc.stdout + proc.stderr:
            proc = _proc.run(["sacct", "-c", *argv[1:]], check=False)
        for line in proc.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 3 and parts[0] in missing:
                out[parts[0]] = {"state": (parts[1].split() or ["UNKNOWN"])[0],
                                 "exit": parts[2]}
    for ref in refs:
        out.setdefault(ref, {"state": "UNKNOWN"})
    return out


def states_of(chains: list[Chain]) -> dict[str, dict[str, Any]]:
    """Every chunk's state of these chains, in one squeue (and sacct) call each kind."""
    ids = [i for c in chains for i in c.ids]
    states = job_states([i for i in ids if "_" not in i])
    states.update(array_task_states([i for i in ids if "_" in i]))
    return states


def _chains(root: Path) -> list[tuple[SweepTask, Chain]]:
    return [(t, load_chain(root / t.dir)) for t in sweep_tasks(root)]


def sweep_status(root: Path) -> dict[str, Any]:
    """The sweep as a whole (aggregate's fields, counts per chain state) and each task's
    chain status."""
    record = load_record(root)
    pairs = _chains(root)
    states = states_of([c for _, c in pairs])
    statuses = []
    for task, chain in pairs:
        st = chain_status(chain, states)
        st.update(task=task.index, label=task.label, value=task.value)
        statuses.append(st)
    out = aggregate(str(record.get("name") or root.name), root, statuses)
    out.update(flag=record.get("flag", "seeds"), array_job=record.get("array_job"),
               throttle=record.get("throttle"),
               chunks_run=sum(int(s.get("chunks_used") or 0) for s in statuses))
    return out


def check_sweep_root(root: Path) -> None:
    """A sweep may replace an ended sweep, never a single chain or an active sweep."""
    if (root / contract.CHAIN_RECORD).is_file():
        raise UsageError(f"name: {root.name} holds a single chain; choose another --name (or "
                         "--out) for a sweep")
    if not (root / contract.SWEEP_RECORD).is_file():
        return
    chains = [load_chain(root / t.dir) for t in sweep_tasks(root)
              if (root / t.dir / contract.CHAIN_RECORD).is_file()]  # (one cut short: none)
    active = [i for i, s in states_of(chains).items() if s["state"] in ACTIVE_STATES]
    if active:
        raise UsageError(f"name: {root.name} is a sweep with active jobs ("
                         f"{', '.join(sorted(active))}); cancel it first with `train cancel "
                         f"{root.name}`, or choose another --name")


def slurm_ref(chain: Chain, job_id: str) -> str:
    """How Slurm's commands name a chain's job: a sweep's chunk 1 as ARRAY_TASK (scancel
    of Slurm 22.05 refuses an array task's own job id: "Invalid job id specified")."""
    sweep = chain.record.get("sweep")
    if isinstance(sweep, dict) and chain.ids and job_id == chain.ids[0] and "_" not in job_id:
        array, task = sweep.get("array_job"), sweep.get("task")
        if isinstance(array, str) and isinstance(task, int):
            return task_ref(array, task)
    return job_id


def cancel_sweep(root: Path) -> tuple[list[str], list[UsageError]]:
    """End every task and its successors: the array job (its tasks still pending or
    running) and each chain's queued or running chunks, each chain's cancel recorded
    first. A task whose chain cannot be read (its folder removed, its chain.json cut
    short) still has its array task cancelled; what could not be read comes back too."""
    pairs: list[tuple[SweepTask, Chain]] = []
    unread: list[tuple[SweepTask, UsageError]] = []
    for task in sweep_tasks(root):
        try:
            pairs.append((task, load_chain(root / task.dir)))
        except UsageError as exc:
            unread.append((task, exc))
    states = states_of([c for _, c in pairs])
    cancelled: list[str] = []
    for _task, chain in pairs:
        active = [i for i in chain.ids if states.get(i, {}).get("state") in ACTIVE_STATES]
        if not active:
            continue
        with open(chain.run_dir / contract.CHAIN_EVENTS, "a", encoding="utf-8") as fh:
            fh.write(f"{int(time.time())} 0 {chain.ids[0]} {contract.EV_CANCELLED} "
                     "by-user\n")
        cancelled += [slurm_ref(chain, i) for i in active]
    array = load_record(root).get("array_job")
    if unread and isinstance(array, str):
        refs = [task_ref(array, t.index) for t, _ in unread]
        found = array_task_states(refs)
        cancelled += [r for r in refs if found[r]["state"] in ACTIVE_STATES]
    if cancelled:
        _proc.run(["scancel", *cancelled], timeout=60)
    return cancelled, [UsageError(f"task {t.index}: {exc}") for t, exc in unread]


# -- what `train status` prints --------------------------------------------------------
def format_sweep_status(st: dict[str, Any], tasks: bool = False) -> list[str]:
    """One line for the sweep (tasks per chain state), one more per task with --tasks."""
    chains = st["chains"]
    counts = ", ".join(f"{state} {n}" for state, n in st["counts"].items())
    array = f"array job {st['array_job']}" if st.get("array_job") else "separate chains"
    throttle = f", at most {st['throttle']} at once" if st.get("throttle") else ""
    done = f"; done {st['done']}/{st['total']}" if st.get("total") else ""
    lines = [f"sweep {st['name']}: {len(chains)} tasks  {counts}  ({array}{throttle}; "
             f"{st.get('chunks_run', 0)} chunks run{done})"]
    if not tasks:
        return [*lines, f"  `train status {st['name']} --tasks` for one line per task, "
                        f"`train summary {st['name']}` for the results"]
    flag = st.get("flag", "seeds")
    for c in chains:
        what = f"seed {c['label']}" if flag == "seeds" else f"{flag}={c.get('value')}"
        chunks = c.get("chunks") or []
        running = [x for x in chunks if x["state"] == "RUNNING"]
        last = (running or chunks or [None])[-1]
        job = f"chunk {last['chunk']} job {last['job_id']} {last['state']}" if last else \
            "no job"
        progress = f"; done {c['done']}/{c['total']}" if c.get("total") else ""
        lines.append(f"  task {c.get('task')} ({what}): {c['state']}, {job}{progress}  "
                     f"{c['run_dir']}")
    return lines
