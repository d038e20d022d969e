"""A sweep as one Slurm job array whose task I runs chunk 1 of the I-th chain; from there
each task is a chain like any other (its chunk 1 records its own job id in its chain.ids
when it starts: until then chain.ids names it ARRAY_TASK). A throttled sweep's tasks run
in requeue mode (sweep.requeue_mode), so Slurm's throttle bounds every run of every task.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from train.batch import contract
from train.batch.engine import ENGINE_DIR
from train.client.slurm import chaincost
from train.client.slurm.chain import Chain, load_chain, record_cancel, record_problem
from train.client.slurm.chainstatus import chain_status
from train.client.slurm.queue import ACTIVE_STATES, _is_number, array_task_states, ref_states
from train.client.slurm.render import folder_to_make, render, sbatch_options, sbatch_value
from train.client.slurm.resolve import ResolvedJob
from train.client.slurm.submission import (
    _set_aside,
    chain_record,
    first_chunk,
    install_engine,
    submit_held,
    undo_submission,
)
from train.client.slurm.sweep import (
    SweepTask,
    aggregate,
    load_record,
    read_tasks,
    record_flag,
    whole,
    write_record,
)
from train.common import _proc
from train.common.errors import ResourceError, TrainError, UsageError
from train.common.jsonio import write_json_atomic

ARRAY_SCRIPT = "array.sbatch"  # in the sweep's JOBS_DIR
_OWN_OPTIONS = ("--job-name=", "--output=", "--error=")


def array_spec(count: int, throttle: int | None) -> str:
    """sbatch's --array value: tasks 0 to count-1, at most `throttle` at once."""
    return f"0-{count - 1}" + (f"%{throttle}" if throttle else "")


def array_script(name: str, root: Path, tasks: list[tuple[SweepTask, ResolvedJob]],
                 throttle: int | None, firsts: list[int] | None = None) -> str:
    """The array job's script: the first task's resources, one task per chain; task I
    runs chunk 1 of chain I (its own script, its log in its own folder), or the chunk
    firsts[I] where the task's earlier chain stopped unsaved (its count goes on)."""
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
        *_start_lines(firsts or [1] * len(tasks)), ""])


def _start_lines(firsts: list[int]) -> list[str]:
    """How a task starts its chain: at chunk 1, or each at its own first chunk."""
    script = f'"$dir/{contract.JOBS_DIR}/{contract.JOB_SCRIPT}"'
    if all(f == 1 for f in firsts):
        return [f"exec bash {script} 1"]
    return ["TASK_FIRST=(" + " ".join(map(str, firsts)) + ")",
            "first=${TASK_FIRST[$SLURM_ARRAY_TASK_ID]}",
            f'exec bash {script} "$first" "$first"']


def task_ref(array_id: str, index: int) -> str:
    return f"{array_id}_{index}"


def _write_scripts(tasks: list[tuple[SweepTask, ResolvedJob]], texts: list[str],
                   previous: list[Chain | None], written: list[Path],
                   moved: list[tuple[Path, Path]]) -> None:
    """Each task's folder (logs/ before Slurm opens them) and its chain's script; an ended
    chain's record and script and an earlier run's COMPLETE marker kept aside
    (chain-FIRSTJOB.*): the task's new chain goes on from the run's checkpoint."""
    for (_, job), text, old in zip(tasks, texts, previous, strict=True):
        run_dir = Path(job.run_dir)
        (run_dir / contract.LOG_DIR).mkdir(parents=True, exist_ok=True)
        (run_dir / contract.JOBS_DIR).mkdir(exist_ok=True)
        own = folder_to_make(job)  # --chdir {task_dir}: the task's own folder
        if own is not None:
            own.mkdir(parents=True, exist_ok=True)
        script = run_dir / contract.JOBS_DIR / contract.JOB_SCRIPT
        tag = None if old is None else old.ids[0] if old.ids else "old"
        _set_aside(run_dir, tag, script, str(int(time.time())), moved)
        script.write_text(text, encoding="utf-8")
        written.append(script)
        install_engine(run_dir, moved)


def _keep(path: Path, kept: Path, moved: list[tuple[Path, Path]]) -> None:
    """An earlier sweep's file, moved to `kept` (put back if the submission fails)."""
    if path.is_file():
        path.replace(kept)
        moved.append((kept, path))


def submit_sweep(name: str, flag: str, root: Path, tasks: list[tuple[SweepTask, ResolvedJob]],
                 throttle: int | None) -> str:
    """Write every task's chain script and the array script, submit the array held,
    record the sweep and each task's chain, then release. Whole or not at all: a failure
    before the release cancels the array and removes what was written, and puts an
    earlier sweep's record and scripts back. A task's chain goes on counting chunks from
    its earlier chain's (submission.first_chunk), as a single chain does."""
    if shutil.which("sbatch") is None:
        raise ResourceError("sbatch is not on PATH: `train submit` runs on a cluster's login "
                            "node (`train render` prints the scripts anywhere)")
    earlier = check_sweep_root(root)
    previous = [load_chain(Path(job.run_dir)) if (Path(job.run_dir) / contract.CHAIN_RECORD)
                .is_file() else None for _, job in tasks]
    firsts = [first_chunk(p) for p in previous]
    texts = [render(job) for _, job in tasks]
    created = [d for d in (*reversed(root.parents), root) if not d.exists()]
    written: list[Path] = []
    moved: list[tuple[Path, Path]] = []
    array_id: str | None = None
    try:
        _write_scripts(tasks, texts, previous, written, moved)
        (root / contract.LOG_DIR).mkdir(exist_ok=True)
        (root / contract.JOBS_DIR).mkdir(exist_ok=True)
        launcher = root / contract.JOBS_DIR / ARRAY_SCRIPT
        pending = launcher.with_name(f".{ARRAY_SCRIPT}.{os.getpid()}")  # its own name
        pending.write_text(array_script(name, root, tasks, throttle, firsts), encoding="utf-8")
        written.append(pending)
        array_id = submit_held(pending, [])
        _keep(launcher, launcher.with_name(f"array-{earlier or 'old'}.sbatch"), moved)
        pending.replace(launcher)
        written[-1] = launcher
        record = root / contract.SWEEP_RECORD
        if record.is_file():  # (write_record reads the folders it bound)
            kept = record.with_name(f".{contract.SWEEP_RECORD}.{os.getpid()}")
            shutil.copyfile(record, kept)
            moved.append((kept, record))
        write_record(root, name, [t for t, _ in tasks], flag, array_job=array_id,
                     throttle=throttle)
        written.append(record)
        for (task, job), first in zip(tasks, firsts, strict=True):
            _record_task(Path(job.run_dir), job, task_ref(array_id, task.index), first,
                         {"array_job": array_id, "task": task.index}, written)
        _proc.run(["scontrol", "release", array_id], timeout=60)
    except BaseException:
        undo_submission(array_id, written, moved, [])
        if created:  # the sweep's folder is this submission's: all of it goes
            shutil.rmtree(root, ignore_errors=True)
        for folder in reversed(created[:-1]):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    for kept, _ in moved:  # (the earlier sweep's record copy; the rest stays aside)
        if kept.name.startswith(f".{contract.SWEEP_RECORD}."):
            kept.unlink(missing_ok=True)
        elif kept.name.startswith(f"{ENGINE_DIR}.old-"):  # an ended chain's engine
            shutil.rmtree(kept, ignore_errors=True)
    return array_id


def _record_task(run_dir: Path, job: ResolvedJob, ref: str, first: int,
                 sweep: dict[str, Any], written: list[Path]) -> None:
    """A task's chain.ids (its array task, at its first chunk) and chain.json."""
    ids = run_dir / contract.CHAIN_IDS
    ids.write_text(f"{first} {ref}\n", encoding="utf-8")
    written.append(ids)
    script = run_dir / contract.JOBS_DIR / contract.JOB_SCRIPT
    write_json_atomic(run_dir / contract.CHAIN_RECORD,
                      {**chain_record(job, ref, first, script), "sweep": sweep})
    written.append(run_dir / contract.CHAIN_RECORD)


# -- states ---------------------------------------------------------------------------
def _task_chain(root: Path, task: SweepTask, array: object) -> Chain:
    """A task's chain; one whose chain.ids names no job (emptied, removed) is its array
    task ARRAY_TASK, which Slurm still knows (and `train cancel` must reach)."""
    chain = load_chain(root / task.dir)
    if chain.ids:
        return chain
    array, index = _array_task(chain) or (array, task.index)
    first = chain.record.get("first_chunk")
    if isinstance(array, str) and _is_number(array):
        chain.chunks = [(first if whole(first) and first > 0 else 1, task_ref(array, index))]
    return chain


def _array_task(chain: Chain) -> tuple[str, int] | None:
    """The array job and task the chain's record names for its chunk 1 (a sweep's)."""
    own = chain.record.get("sweep")
    if isinstance(own, dict) and isinstance(own.get("array_job"), str) and \
            isinstance(own.get("task"), int):
        return own["array_job"], own["task"]
    return None


def record_array(root: Path, record: dict[str, Any]) -> tuple[str | None, str | None]:
    """The array job of the sweep's record (None: a sweep of separate chains, a record of
    before the job arrays), and what is wrong with one that is no job id (hand-edited, cut
    short): said, never read as "separate chains"."""
    array = record.get("array_job")
    if array is None or (isinstance(array, str) and _is_number(array)):
        return array, None
    return None, (f"{root / contract.SWEEP_RECORD}: array_job {repr(array)[:40]} is not a "
                  "job id (digits as text, as train submit writes it): the record is "
                  "damaged, and the array's tasks are reached only through their chains")


def _load(root: Path, record: dict[str, Any]) -> tuple[
        str | None, list[tuple[SweepTask, Chain]], list[tuple[SweepTask, TrainError]], list[str]]:
    """The sweep's array job, its chains, the tasks whose chain cannot be read (why), and
    what in the record is damaged (an array_job that is no job id, entries that are not
    tasks)."""
    array, damaged = record_array(root, record)
    tasks, bad = read_tasks(root, record)
    bad = [damaged, *bad] if damaged else bad
    pairs: list[tuple[SweepTask, Chain]] = []
    unread: list[tuple[SweepTask, TrainError]] = []
    for task in tasks:
        try:
            pairs.append((task, _task_chain(root, task, array)))
        except UsageError as exc:
            unread.append((task, exc))
    return array, pairs, unread, bad


def sweep_status(root: Path) -> dict[str, Any]:
    """The sweep as a whole (aggregate's fields, counts per chain state) and each task's
    chain status; a task whose folder cannot be read, and an entry of the record that is
    not a task, are `unreadable` with their cause. Slurm not answering is an error."""
    record = load_record(root)
    array, pairs, unread, bad = _load(root, record)
    states = ref_states([i for _, c in pairs for i in c.ids])  # (one squeue for all)
    statuses = []
    for task, chain in pairs:
        st = chain_status(chain, states)
        st.update(task=task.index, label=task.label, value=task.value)
        statuses.append(st)
    for task, exc in unread:
        statuses.append({"task": task.index, "label": task.label, "value": task.value,
                         "state": "unreadable", "cause": str(exc),
                         "run_dir": str(root / task.dir), "chunks": []})
    statuses.sort(key=lambda st: int(st["task"]))
    damaged = record_array(root, record)[1]  # (said once, never counted as a task)
    statuses += [{"task": None, "label": "?", "value": None, "state": "unreadable",
                  "cause": line, "run_dir": str(root), "chunks": []}
                 for line in bad if line != damaged]
    name = record.get("name")
    out = aggregate(name if isinstance(name, str) and name else root.name, root, statuses)
    out.update(flag=record_flag(record), array_job=array, array_job_damaged=damaged,
               throttle=record.get("throttle") if whole(record.get("throttle")) else None,
               chunks_run=sum(int(s.get("chunks_used") or 0) for s in statuses),
               time=chaincost.add_up([s.get("time") for s in statuses]))
    return out


def check_sweep_root(root: Path) -> str | None:
    """A sweep may replace an ended sweep, never a single chain or an active sweep (nor
    one whose jobs' states Slurm cannot give). The earlier sweep's array job, if any."""
    if (root / contract.CHAIN_RECORD).is_file():
        raise UsageError(f"name: {root.name} holds a single chain; choose another --name (or "
                         "--out) for a sweep")
    problem = record_problem(root, "name")
    if problem is not None:
        raise UsageError(f"{problem}; choose another --name (or --out)")
    if not (root / contract.SWEEP_RECORD).is_file():
        return None
    record = load_record(root)
    array, damaged = record_array(root, record)
    if damaged:
        raise UsageError(f"name: {damaged}; whether its array still has tasks queued cannot "
                         "be told: correct or remove that array_job (`squeue --me` lists "
                         "your jobs), or choose another --name")
    chains = [_task_chain(root, t, array) for t in read_tasks(root, record)[0]
              if (root / t.dir / contract.CHAIN_RECORD).is_file()]  # (one cut short: none)
    states = ref_states([i for c in chains for i in c.ids])
    active = [i for i, s in states.items() if s["state"] in ACTIVE_STATES]
    if active:
        raise UsageError(f"name: {root.name} is a sweep with active jobs ("
                         f"{', '.join(sorted(active))}); cancel it first with `train cancel "
                         f"{root.name}`, or choose another --name")
    return array


def slurm_ref(chain: Chain, job_id: str) -> str:
    """How Slurm's commands name a chain's job: a sweep's chunk 1 as ARRAY_TASK (scancel
    of Slurm 22.05 refuses an array task's own job id: "Invalid job id specified")."""
    own = _array_task(chain)
    if own is not None and chain.ids and job_id == chain.ids[0] and "_" not in job_id:
        return task_ref(*own)
    return job_id


def cancel_sweep(root: Path) -> tuple[list[str], list[UsageError]]:
    """End every task and its successors: the array job (its tasks still pending or
    running) and each chain's queued or running chunks, each chain's cancel recorded
    first. A task whose chain cannot be read (its folder removed, its chain.json cut
    short) or names no job still has its array task cancelled; what could not be read
    comes back too. Slurm not answering is an error (nothing is said cancelled)."""
    array, pairs, unread, bad = _load(root, load_record(root))
    states = ref_states([i for _, c in pairs for i in c.ids])  # (one squeue for all)
    cancelled: list[str] = []
    for _task, chain in pairs:
        cancelled += [slurm_ref(chain, i) for i in record_cancel(chain, states)]
    if unread and array is not None:
        refs = [task_ref(array, t.index) for t, _ in unread]
        found = array_task_states(refs)
        cancelled += [r for r in refs if found[r]["state"] in ACTIVE_STATES]
    if cancelled:
        _proc.run(["scancel", *cancelled], timeout=60)
    return cancelled, [*(UsageError(f"task {t.index}: {exc}") for t, exc in unread),
                       *(UsageError(line) for line in bad)]


# -- what `train status` prints --------------------------------------------------------
def format_sweep_status(st: dict[str, Any], tasks: bool = False) -> list[str]:
    """One line for the sweep (tasks per chain state), one more per task with --tasks."""
    chains = st["chains"]
    counts = ", ".join(f"{state} {n}" for state, n in st["counts"].items())
    array = f"array job {st['array_job']}" if st.get("array_job") else \
        "array job unknown: the record is damaged" if st.get("array_job_damaged") else \
        "separate chains"
    throttle = f", at most {st['throttle']} at once" if st.get("throttle") else ""
    done = f"; done {st['done']}/{st['total']}" if st.get("total") else ""
    lines = [f"sweep {st['name']}: {len(chains)} tasks  {counts}  ({array}{throttle}; "
             f"{st.get('chunks_run', 0)} chunks run{done})"]
    lines += [f"  {chaincost.total_line(st['time'], ' (all tasks together)')}"] \
        if st.get("time") else []
    lines += [f"  unreadable: {st['array_job_damaged']}"] if st.get("array_job_damaged") else []
    flag = st.get("flag", "seeds")
    if not tasks:
        return [*lines, *(_task_line(c, flag) for c in chains if c["state"] == "unreadable"),
                f"  `train status {st['name']} --tasks` for one line per task, "
                f"`train summary {st['name']}` for the results"]
    return [*lines, *(_task_line(c, flag) for c in chains)]


def _task_line(c: dict[str, Any], flag: str) -> str:
    """A task: its state, its chunk running (or its last one), progress and time; one
    (or an entry of the record) that cannot be read, and why."""
    if c.get("task") is None:
        return f"  unreadable: {c['cause']}"
    what = f"seed {c['label']}" if flag == "seeds" else f"{flag}={c.get('value')}"
    if c["state"] == "unreadable":
        return f"  task {c['task']} ({what}): unreadable: {c['cause']}"
    chunks = c.get("chunks") or []
    running = [x for x in chunks if x["state"] == "RUNNING"]
    last = (running or chunks or [None])[-1]
    job = f"chunk {last['chunk']} job {last['job_id']} {last['state']}" if last else "no job"
    progress = f"; done {c['done']}/{c['total']}" if c.get("total") else ""
    spent = f"; {chaincost.total_line(c['time'])}" if c.get("time") else ""
    return (f"  task {c.get('task')} ({what}): {c['state']}, {job}{progress}{spent}  "
            f"{c['run_dir']}")
