"""Submitting a chain: render its script, submit chunk 1 held, write the chain's record,
then release it; any failure before the release undoes what this submission did."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from train.batch import contract
from train.batch.engine import ENGINE_DIR, install
from train.batch.saves import read_text
from train.client.slurm.chain import _DECISIVE, EVENTS_LIMIT, Chain, parse_events
from train.client.slurm.checks import sbatchenv
from train.client.slurm.checks.rundir import check_not_active
from train.client.slurm.queue import _is_number, parse_sbatch_id
from train.client.slurm.render import folder_to_make, job_record, render
from train.client.slurm.resolve import ResolvedJob
from train.common import _proc
from train.common.errors import ResourceError, TrainError
from train.common.jsonio import write_json_atomic

log = logging.getLogger(__name__)


def first_chunk(previous: Chain | None) -> int:
    """The chunk a new chain of the run starts at: 1, or, where the earlier chain's last
    chunk stopped before any save, the one after it (so TRAIN_CHUNK goes on counting)."""
    if previous is None or not previous.ids:
        return 1
    text = read_text(str(previous.run_dir / contract.CHAIN_EVENTS), EVENTS_LIMIT, tail=True)
    ids = set(previous.ids)
    last = next((e for e in reversed(parse_events(text))
                 if e["job_id"] in ids and e["event"] in _DECISIVE), None)
    if last is None or last["event"] != contract.EV_UNSAVED:
        return 1
    return int(last["chunk"]) + 1


def _cancel_unreplied(command: str) -> bool:
    """An sbatch that failed or was interrupted after the controller took the job (its
    reply lost: "Socket timed out", sbatch ended at its timeout, or TERM, HUP or Ctrl-C
    to `train submit` while a busy controller had not answered) left chunk 1 held in the
    queue, where no chain knows it. This submission's script name is unique (it holds
    train's pid): the user's pending job (or job array) running exactly `command` is that
    job, and is cancelled. False where Slurm could not be asked or no such job was seen
    (the caller says what to look for)."""
    try:
        out = _proc.run(["squeue", "--noheader", "--user", str(os.getuid()), "--states",
                         "PENDING", "--format", "%i %o"], timeout=60,
                        env=sbatchenv.sbatch_environment()).stdout
    except _proc.ProcError:
        return False
    found = False
    for line in out.splitlines():
        job_id, _, queued = line.strip().partition(" ")
        job_id = job_id.partition("_")[0]  # a job array pending whole: ID_[0-3%2]
        if queued.strip() == command and _is_number(job_id):
            log.warning("sbatch did not answer, but Slurm had queued the job (%s): "
                        "cancelling it", job_id)
            _proc.run(["scancel", job_id], check=False)
            found = True
    return found


def submit_chain(job: ResolvedJob) -> Chain:
    """The module's steps; a failure before the release (a signal too) is undone
    (undo_submission). An earlier chain's record, ids and script are kept as chain-FIRSTJOB.*.
    """
    run_dir = Path(job.run_dir)
    text = render(job)
    if shutil.which("sbatch") is None:
        raise ResourceError("sbatch is not on PATH: `train submit` runs on a cluster's login "
                            "node (`train render` prints the script anywhere)")
    previous = check_not_active(run_dir)
    first = first_chunk(previous)
    tag = (previous.ids[0] if previous.ids else "old") if previous else None
    jobs_dir = run_dir / contract.JOBS_DIR
    script = jobs_dir / contract.JOB_SCRIPT
    own = folder_to_make(job)  # a --chdir inside the run folder
    missing = [*reversed([p for p in run_dir.parents if not p.exists()]), run_dir,
               run_dir / contract.LOG_DIR, jobs_dir,
               *(reversed([own, *own.parents]) if own else ())]
    created = list(dict.fromkeys(d for d in missing if not d.exists()))  # parents first
    # Slurm opens the log files before the script runs: their directory must exist
    (run_dir / contract.LOG_DIR).mkdir(parents=True, exist_ok=True)
    jobs_dir.mkdir(exist_ok=True)
    if own is not None:
        own.mkdir(parents=True, exist_ok=True)
    pending = jobs_dir / f".{contract.JOB_SCRIPT}.{os.getpid()}"
    pending.write_text(text, encoding="utf-8")
    written = [pending]  # by this submission, at their final paths
    moved: list[tuple[Path, Path]] = []  # an earlier chain's files: (kept as, original)
    job_id: str | None = None
    cleared: Path | None = None  # an earlier run's COMPLETE marker, kept until released
    old_engine: Path | None = None
    engine_fresh = not os.path.lexists(run_dir / ENGINE_DIR)
    try:
        # the chunk number, and the chain's first chunk where it is not 1 (sbatch reads the
        # script now: where the file goes afterwards does not matter)
        job_id = submit_held(pending, ["1"] if first == 1 else [str(first), str(first)])
        cleared = _set_aside(run_dir, tag, script, job_id, moved)
        old_engine = install_engine(run_dir, moved)
        pending.replace(script)
        written = [script, run_dir / contract.CHAIN_IDS, run_dir / contract.CHAIN_RECORD]
        (run_dir / contract.CHAIN_IDS).write_text(f"{first} {job_id}\n", encoding="utf-8")
        record = chain_record(job, job_id, first, script)
        write_json_atomic(run_dir / contract.CHAIN_RECORD, record)
        _proc.run(["scontrol", "release", job_id], timeout=60)
    except BaseException:
        if engine_fresh:
            shutil.rmtree(run_dir / ENGINE_DIR, ignore_errors=True)
        undo_submission(job_id, written, moved, created)
        raise
    if cleared is not None:
        with contextlib.suppress(OSError):  # (a folder of that name stays aside)
            cleared.unlink(missing_ok=True)
    if old_engine is not None:
        shutil.rmtree(old_engine, ignore_errors=True)
    return Chain(run_dir, record, [(first, job_id)])


def install_engine(run_dir: Path, moved: list[tuple[Path, Path]]) -> Path | None:
    """The chain engine copied into the run folder: the chain runs this copy whatever
    happens to the client. An earlier chain's copy (ended: check_not_active) is moved
    aside (returned, and added to `moved`) until the submission is released; the caller
    removes a copy where there was none before, should the submission fail."""
    target = run_dir / ENGINE_DIR
    old = None
    if os.path.lexists(target):
        old = target.with_name(f"{ENGINE_DIR}.old-{os.getpid()}")
        target.replace(old)
        moved.append((old, target))
    install(str(run_dir))
    return old


def submit_held(script: Path, args: list[str]) -> str:
    """sbatch --hold of this submission's own script (its path holds train's pid) without
    SBATCH_* variables (sbatchenv); the job id. A job queued by an sbatch that failed or was
    interrupted is cancelled (_cancel_unreplied) before the error or the interrupt goes on."""
    command = " ".join([str(script), *args])
    try:
        out = _proc.run(["sbatch", "--parsable", "--hold", str(script), *args], timeout=120,
                        env=sbatchenv.sbatch_environment()).stdout
    except _proc.ProcError:
        _cancel_unreplied(command)
        raise
    except BaseException:  # interrupted before sbatch answered: it may have queued the job
        _cancel_or_say(command, "sbatch was interrupted before it answered")
        raise
    try:
        return parse_sbatch_id(out)
    except TrainError:  # (a site's wrapper that prints its own words): queued, most likely
        _cancel_or_say(command, "sbatch answered without a job id")
        raise


def _cancel_or_say(command: str, what: str) -> None:
    """The job an sbatch without a usable answer may have queued, cancelled; or the user
    told what to look for (Slurm not answering, or a second interrupt during the search)."""
    found = False
    try:
        found = _cancel_unreplied(command)
    finally:
        if not found:
            log.warning("%s; if Slurm took the job anyway, it is held in the queue (it never "
                        "starts) running %s: find its id with `squeue --me --states PENDING "
                        "--format '%%i %%o'` and cancel it with `scancel ID`", what, command)


def _set_aside(run_dir: Path, tag: str | None, script: Path, job_id: str,
               moved: list[tuple[Path, Path]]) -> Path | None:
    """An earlier chain's record and script kept as chain-TAG.*, and an earlier run's
    COMPLETE marker moved aside (returned); each move is added to `moved`."""
    if tag is not None:
        for path in [run_dir / contract.CHAIN_RECORD, run_dir / contract.CHAIN_IDS, script]:
            if path.exists():
                kept = path.with_name(f"chain-{tag}{path.suffix}")
                path.replace(kept)
                moved.append((kept, path))
    marker = run_dir / contract.COMPLETE_MARKER
    if not os.path.lexists(marker):
        return None
    # an earlier run's: it would end this chain at chunk 1
    cleared = marker.with_name(f".{contract.COMPLETE_MARKER}-{job_id}")
    marker.replace(cleared)
    moved.append((cleared, marker))
    return cleared


def undo_submission(job_id: str | None, written: list[Path], moved: list[tuple[Path, Path]],
          created: list[Path]) -> None:
    """A failed submission, undone: its job cancelled, its files removed, an earlier
    chain's files put back, and the folders it made removed where empty."""
    if job_id is not None:
        _proc.run(["scancel", job_id], check=False)
    for path in written:
        path.unlink(missing_ok=True)
    for kept, original in moved:
        if original.is_dir() and not original.is_symlink():  # (the engine's new copy)
            shutil.rmtree(original)
        kept.replace(original)
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: never anything of an earlier run


def chain_record(job: ResolvedJob, job_id: str, first: int, script: Path
                 ) -> dict[str, Any]:
    """What chain.json holds: the chain's bounds and the job's resources."""
    return {
        "name": job.spec.name,
        "cluster": job.profile.name,
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "first_job": job_id,
        "max_chunks": job.chunks,
        "first_chunk": first,
        "requeue": job.spec.requeue,
        "entry": job.spec.entry,
        "walltime_seconds": job.minutes * 60,
        "time_budget_seconds": job.time_budget_seconds,
        "signal_margin": job.margin,
        "stop_signal": job.stop,
        "stop_mode": job.spec.stop_mode,  # (kill: a chunk's work since the last save is lost)
        "resume_args": job.spec.resume_args,  # (what a chain that made no progress lacked)
        "run_dir": str(job.run_dir),
        "script": str(script),
        "resources": job.resources(),  # for `train doctor`'s fixes
        "job": job_record(job),  # what the chain engine runs (train.batch.chunk)
    }
