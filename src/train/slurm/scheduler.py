"""Talking to SLURM: submit chains, read job states, cancel. Parsers are pure functions.

A chain is one script run by every chunk. `train submit` renders it and submits chunk 1
held; the chain's record (chain.json, and chain.ids with one line per chunk) is written,
and only then the job is released, so nothing runs before its record exists and a failure
while submitting leaves nothing behind. Each chunk then submits its successor itself (see
job-lib.sh), so the login node can be left and at most two jobs of a chain are queued.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train import _proc
from train.errors import ResourceError, TrainError, UsageError
from train.jsonio import read_bounded, write_json_atomic
from train.slurm import contract, reasons, submitcheck
from train.slurm.job import ResolvedJob
from train.slurm.render import render
from train.yamlio import shown

log = logging.getLogger(__name__)

ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
                 "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
_ACCOUNTING_OFF = "accounting storage is disabled"
RECORD_LIMIT = 1 << 20  # chain.json and chain.ids: a few KiB when train submit writes them
EVENTS_LIMIT = 1 << 20  # the end of chain.events that status reads
QUERY_BATCH = 1000  # job ids per squeue/sacct call (19 bytes each, far under ARG_MAX)


class SchedulerError(TrainError):
    """SLURM refused or failed a request."""


# -- pure parsers ---------------------------------------------------------------------
# A job id, chunk number or Unix time: ASCII digits (str.isdigit() also takes '²', which
# int() refuses), short enough for int() (it refuses more than 4300 digits).
_NUMBER = re.compile(r"[0-9]{1,18}")


def _is_number(text: str) -> bool:
    return _NUMBER.fullmatch(text) is not None


def _is_job_ref(text: str) -> bool:
    """A job id, or ARRAY_TASK: a sweep's array task before it starts (it then records
    its own job id, see job-lib.sh's train_array_task)."""
    array, sep, task = text.partition("_")
    return _is_number(array) and (not sep or _is_number(task))


def parse_sbatch_id(stdout: str) -> str:
    """`sbatch --parsable` prints 'ID' or 'ID;CLUSTER'."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = text.split(";")[0].strip()
    if not _is_number(job_id):
        raise SchedulerError(f"cannot read a job id from sbatch output {stdout!r}")
    return job_id


def parse_squeue_json(text: str) -> dict[str, dict[str, Any]]:
    """squeue --json -> {job id: {state, reason, nodes}} (state strings or lists)."""
    try:
        data = json.loads(text)  # ValueError (JSONDecodeError) for text that is not JSON
    except RecursionError:  # nested deeper than the decoder's stack
        raise ValueError("squeue --json: its output nests too deeply") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        raise ValueError("squeue --json: no 'jobs' list in its output")
    out: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if not isinstance(job, dict) or "job_id" not in job:
            raise ValueError(f"squeue --json: a job entry without job_id: {str(job)[:80]}")
        state = job.get("job_state")
        if isinstance(state, list):  # 24.11: the base state, then flags; still completing
            state = "COMPLETING" if "COMPLETING" in state else state[0] if state else "UNKNOWN"
        job_id = job["job_id"]
        if isinstance(job_id, dict):  # newer Slurm: {"set": true, "number": N}
            job_id = job_id.get("number")
        out[str(job_id)] = {"state": str(state or "UNKNOWN"),
                            "reason": job.get("state_reason"), "nodes": job.get("nodes"),
                            # the expected start (`squeue --start`) of a pending job
                            "start": reasons.start_seconds(job.get("start_time"))
                            if str(state) == "PENDING" else None}
    return out


def parse_sacct(text: str) -> dict[str, dict[str, Any]]:
    """`sacct -P -n -o JobIDRaw,State,ExitCode` (also with -c) -> {job id: {state, exit}}.

    Job steps (ids with a dot) are skipped; 'CANCELLED by 0' becomes CANCELLED.
    """
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0] or "." in parts[0]:
            continue
        job_id = parts[0].split("_")[0]
        if not _is_number(job_id):
            continue
        words = parts[1].split()
        out[job_id] = {"state": words[0] if words else "UNKNOWN", "exit": parts[2]}
    return out


# (a job id, or ARRAY_TASK where `train cancel` ended a sweep's task before it started)
_EVENT_RE = re.compile(r"^([0-9]{1,18}) ([0-9]{1,18}) ([0-9]{1,18}(?:_[0-9]{1,18})?) "
                       r"([a-z_]+)(?: (.*))?$")


def parse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        match = _EVENT_RE.match(line.strip())
        if match:
            ts, chunk, job, event, detail = match.groups()
            events.append({"time": int(ts), "chunk": int(chunk), "job_id": job,
                           "event": event, "detail": detail})
    return events


# -- queries --------------------------------------------------------------------------
def job_states(ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """States of these jobs: squeue for jobs it still knows, sacct for the rest, and the
    job completion log (`sacct -c`) where accounting storage is disabled."""
    if not ids:
        return {}
    if len(ids) > QUERY_BATCH:  # argv has a size limit (E2BIG): ask in batches
        out: dict[str, dict[str, Any]] = {}
        for at in range(0, len(ids), QUERY_BATCH):
            out.update(job_states(ids[at:at + QUERY_BATCH]))
        return out
    states: dict[str, dict[str, Any]] = {}
    squeue_error = ""
    try:
        proc = _proc.run(["squeue", "--json", "--jobs", ",".join(ids)], check=False)
        if proc.returncode == 0:
            states.update({k: v for k, v in parse_squeue_json(proc.stdout).items()
                           if k in ids})
        else:  # also for jobs squeue no longer knows: then sacct answers
            squeue_error = proc.stderr.strip()
    except (_proc.ProcError, ValueError) as exc:
        squeue_error = str(exc)
        log.debug("squeue failed: %s", exc)
    missing = [i for i in ids if i not in states]
    if missing:
        argv = ["sacct", "-P", "-n", "-o", "JobIDRaw,State,ExitCode", "-j",
                ",".join(missing)]
        try:
            proc = _proc.run(argv, check=False)
            if _ACCOUNTING_OFF in (proc.stdout + proc.stderr):
                proc = _proc.run(["sacct", "-c", *argv[1:]], check=False)
        except _proc.ProcError as exc:  # not on PATH (not a login node), or hung
            raise ResourceError(f"cannot ask Slurm about jobs {', '.join(missing)}: "
                                f"{exc}") from None
        if proc.returncode != 0 and squeue_error:
            # neither answered: the jobs' states are not known, and must not read as ended
            raise ResourceError(f"cannot reach Slurm: squeue: {squeue_error or '?'}; sacct: "
                                f"{proc.stderr.strip() or proc.returncode}")
        found = parse_sacct(proc.stdout)
        for job_id in missing:
            states[job_id] = found.get(job_id, {"state": "UNKNOWN"})
    return states


# -- chains ---------------------------------------------------------------------------
# Final Slurm states that end a chunk, whatever its batch shell could record.
_ENDING_STATES = {
    "NODE_FAIL": "node failure: its node stopped answering Slurm; submit the same job "
                 "again to resume from the last checkpoint",
    "OUT_OF_MEMORY": "out of host memory: the job went over its --mem (fewer --workers, or "
                     "more --mem)",
    "TIMEOUT": "walltime TIMEOUT: the step did not stop at the walltime signal; raise "
               "--signal-margin",
    "BOOT_FAIL": "its node failed to boot; submit the same job again",
    "DEADLINE": "its deadline passed",
    "PREEMPTED": "preempted and not requeued; submit the same job again",
    "FAILED": "failed",
    "CANCELLED": "cancelled by Slurm or with scancel",
}
# Events after which a chunk's batch shell has nothing more to say.
_DECISIVE = (contract.EV_STARTED, contract.EV_STOPPED, contract.EV_REQUEUED,
             contract.EV_FAILED, contract.EV_TIMEOUT, contract.EV_TERMINATED,
             contract.EV_NO_PROGRESS, contract.EV_INCOMPLETE, contract.EV_UNSAVED)
# Events whose detail ends with "DONE TOTAL".
_WITH_PROGRESS = (contract.EV_STOPPED, contract.EV_REQUEUED, contract.EV_COMPLETE,
                  contract.EV_NO_PROGRESS, contract.EV_INCOMPLETE, contract.EV_UNSAVED)


def parse_ids(text: str) -> list[tuple[int, str]]:
    """chain.ids -> [(chunk, job id)], in chunk order; malformed lines are skipped."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and _is_number(parts[0]) and _is_job_ref(parts[1]) \
                and int(parts[0]) > 0:
            out.setdefault(int(parts[0]), parts[1])
    return sorted(out.items())


@dataclass
class Chain:
    run_dir: Path
    record: dict[str, Any]
    chunks: list[tuple[int, str]]  # (chunk, job id)

    @property
    def ids(self) -> list[str]:
        return [job_id for _, job_id in self.chunks]


def load_chain(run_dir: Path) -> Chain:
    path = run_dir / contract.CHAIN_RECORD
    data = read_bounded(path, RECORD_LIMIT + 1)  # never a FIFO, a device or a huge file
    if data is None:
        raise UsageError(f"run: no chain recorded in {run_dir} (no "
                         f"{contract.CHAIN_RECORD}, or it is not a regular file)")
    if len(data) > RECORD_LIMIT:
        raise UsageError(f"run: {path} is over {RECORD_LIMIT >> 20} MiB: not a chain record")
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested too deep
        raise UsageError(f"run: {path} is not valid JSON ({str(exc)[:120]}); it was not "
                         "written by `train submit`, or was cut short") from None
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        raise UsageError(f"run: {path} does not hold a chain record")
    return Chain(run_dir, record, parse_ids(_read_text(run_dir / contract.CHAIN_IDS)))


def _read_text(path: Path, limit: int = RECORD_LIMIT, tail: bool = False) -> str:
    """A run file's text, bounded ('' for what is missing or not a regular file)."""
    data = read_bounded(path, limit, tail=tail)
    return "" if data is None else data.decode("utf-8", "replace")


def _is_file(path: Path) -> bool:
    """path.is_file(), False also where the name cannot be looked up (too long: an
    OSError that pathlib passes on)."""
    try:
        return path.is_file()
    except OSError:
        return False


def chain_dirs(runs_root: Path) -> list[Path]:
    """Every chain under runs_root, a sweep's chains (one level deeper) included."""
    try:
        if not runs_root.is_dir():
            return []
        found = [p.parent for p in runs_root.glob(f"*/{contract.CHAIN_RECORD}")
                 if _is_file(p)]
        found += [p.parent for p in runs_root.glob(f"*/*/{contract.CHAIN_RECORD}")
                  if _is_file(p) and _is_file(p.parent.parent / contract.SWEEP_RECORD)]
    except OSError:  # a name too long, a folder that cannot be listed
        return []
    return sorted(found)


def find_run(ref: str, runs_root: Path) -> Path:
    """A run directory by name (runs_root/NAME), by path, or by any of its job ids."""
    direct = Path(ref) if "/" in ref else runs_root / ref
    if "/" in ref and not os.path.exists(direct):  # (False for a name too long)
        direct = runs_root / ref  # NAME/seed-4: a sweep's chain
    if _is_file(direct / contract.CHAIN_RECORD) or _is_file(direct / contract.SWEEP_RECORD):
        return direct
    if _is_number(ref):
        for run_dir in chain_dirs(runs_root):
            text = _read_text(run_dir / contract.CHAIN_IDS)
            if ref in [job_id for _, job_id in parse_ids(text)]:
                return run_dir
    known = [p.name for p in chain_dirs(runs_root)]
    raise UsageError(f"run: no run named or holding job {shown(ref)} under {runs_root}; "
                     f"known runs: {', '.join(known) or 'none'} (a chain submitted with "
                     "--out lives there: give that directory, or --runs its parent)")


def _check_not_active(run_dir: Path) -> Chain | None:
    """The directory's earlier chain, if any; an error while any of it is queued or
    running. Nothing is written."""
    if (run_dir / contract.SWEEP_RECORD).is_file():
        raise UsageError(f"name: {run_dir.name} is a seed sweep; choose another --name (or "
                         "--out) for a single chain")
    if not (run_dir / contract.CHAIN_RECORD).is_file():
        return None
    previous = load_chain(run_dir)
    active = [i for i, s in job_states(previous.ids).items() if s["state"] in ACTIVE_STATES]
    if active:
        ref = run_dir.name
        if (run_dir.parent / contract.SWEEP_RECORD).is_file():
            ref = f"{run_dir.parent.name}/{run_dir.name}"  # a sweep's chain
        raise UsageError(f"name: {ref} already has an active chain (jobs "
                         f"{', '.join(sorted(active))}); cancel it first with `train cancel "
                         f"{ref}`, or choose another --name")
    return previous


_CHAIN_FILES = (contract.CHAIN_RECORD, contract.CHAIN_IDS)


def first_chunk(previous: Chain | None) -> int:
    """The chunk a new chain of the run starts at: 1, or, where the earlier chain's last
    chunk stopped before any save, the one after it (so TRAIN_CHUNK goes on counting)."""
    if previous is None or not previous.ids:
        return 1
    text = _read_text(previous.run_dir / contract.CHAIN_EVENTS, EVENTS_LIMIT, tail=True)
    ids = set(previous.ids)
    last = next((e for e in reversed(parse_events(text))
                 if e["job_id"] in ids and e["event"] in _DECISIVE), None)
    if last is None or last["event"] != contract.EV_UNSAVED:
        return 1
    return int(last["chunk"]) + 1


def _cancel_unreplied(command: str) -> None:
    """An sbatch that failed after the controller took the job (its reply lost: "Socket
    timed out", or sbatch ended at its timeout) left chunk 1 held in the queue, where no
    chain knows it. This submission's script name is unique (it holds train's pid): the
    user's pending job running exactly `command` is that job, and is cancelled. Nothing
    is said where Slurm cannot be asked: the error that follows is sbatch's."""
    try:
        out = _proc.run(["squeue", "--noheader", "--user", str(os.getuid()), "--states",
                         "PENDING", "--format", "%i %o"], timeout=60,
                        env=submitcheck.sbatch_environment()).stdout
    except _proc.ProcError:
        return
    for line in out.splitlines():
        job_id, _, queued = line.strip().partition(" ")
        if queued.strip() == command and _is_number(job_id):
            log.warning("sbatch failed, but Slurm had queued the job (%s): cancelling it",
                        job_id)
            _proc.run(["scancel", job_id], check=False)


def submit_chain(job: ResolvedJob, library: str) -> Chain:
    """Render the chain's script, submit chunk 1 held, record the chain, then release.

    Until the release, any failure (sbatch refusing, a signal) cancels what was submitted,
    removes what this submission wrote and puts an earlier chain's record back as it was.
    An earlier chain's record is kept as chain-FIRSTJOB.json/.ids, its script likewise.
    """
    run_dir = Path(job.run_dir)
    text = render(job, library)
    import shutil

    if shutil.which("sbatch") is None:
        raise ResourceError("sbatch is not on PATH: `train submit` runs on a cluster's login "
                            "node (`train render` prints the script anywhere)")
    previous = _check_not_active(run_dir)
    first = first_chunk(previous)
    tag = (previous.ids[0] if previous.ids else "old") if previous else None
    jobs_dir = run_dir / contract.JOBS_DIR
    script = jobs_dir / contract.JOB_SCRIPT
    missing = [*reversed([p for p in run_dir.parents if not p.exists()]), run_dir,
               run_dir / contract.LOG_DIR, jobs_dir]
    created = [d for d in missing if not d.exists()]  # parents first
    # Slurm opens the log files before the script runs: their directory must exist
    (run_dir / contract.LOG_DIR).mkdir(parents=True, exist_ok=True)
    jobs_dir.mkdir(exist_ok=True)
    pending = jobs_dir / f".{contract.JOB_SCRIPT}.{os.getpid()}"
    pending.write_text(text, encoding="utf-8")
    written = [pending]  # by this submission, at their final paths
    moved: list[tuple[Path, Path]] = []  # an earlier chain's files: (kept as, original)
    job_id: str | None = None
    cleared: Path | None = None  # an earlier run's COMPLETE marker, kept until released
    try:
        # sbatch reads the script now: where the file goes afterwards does not matter
        # without SBATCH_* variables: they would override chunk 1's #SBATCH lines only
        # the chunk number, and the chain's first chunk where it is not 1
        chunk_args = ["1"] if first == 1 else [str(first), str(first)]
        try:
            job_id = parse_sbatch_id(_proc.run(["sbatch", "--parsable", "--hold",
                                                str(pending), *chunk_args], timeout=120,
                                               env=submitcheck.sbatch_environment()).stdout)
        except _proc.ProcError:
            _cancel_unreplied(" ".join([str(pending), *chunk_args]))
            raise
        if tag is not None:
            for path in [*(run_dir / n for n in _CHAIN_FILES), script]:
                if path.exists():
                    kept = path.with_name(f"chain-{tag}{path.suffix}")
                    path.replace(kept)
                    moved.append((kept, path))
        marker = run_dir / contract.COMPLETE_MARKER
        if os.path.lexists(marker):  # an earlier run's: it would end this chain at chunk 1
            cleared = marker.with_name(f".{contract.COMPLETE_MARKER}-{job_id}")
            marker.replace(cleared)
            moved.append((cleared, marker))
        pending.replace(script)
        written = [script, run_dir / contract.CHAIN_IDS, run_dir / contract.CHAIN_RECORD]
        (run_dir / contract.CHAIN_IDS).write_text(f"{first} {job_id}\n", encoding="utf-8")
        record = chain_record(job, job_id, first, script)
        write_json_atomic(run_dir / contract.CHAIN_RECORD, record)
        _proc.run(["scontrol", "release", job_id], timeout=60)
    except BaseException:
        if job_id is not None:
            _proc.run(["scancel", job_id], check=False)
        for path in written:
            path.unlink(missing_ok=True)
        for kept, original in moved:
            kept.replace(original)
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: never anything of an earlier run
        raise
    if cleared is not None:
        with contextlib.suppress(OSError):  # (a folder of that name stays aside)
            cleared.unlink(missing_ok=True)
    return Chain(run_dir, record, [(first, job_id)])


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
        "run_dir": str(job.run_dir),
        "script": str(script),
        "resources": job.resources(),  # for `train doctor`'s fixes
    }


def _split_progress(detail: str | None) -> tuple[int, int] | None:
    parts = (detail or "").split()
    if len(parts) >= 2 and _is_number(parts[-1]) and _is_number(parts[-2]):
        return int(parts[-2]), int(parts[-1])
    return None


def progress_rate(events: Sequence[dict[str, Any]]) -> float | None:
    """Work units per second of chunk wall time (start-up included), from each run's
    `started` and its closing event; None before a chunk has ended."""
    opened: dict[str, tuple[int, int]] = {}
    work = seconds = 0
    for e in events:
        if e["event"] == contract.EV_STARTED:
            start = _split_progress(e["detail"])
            if start is not None:
                opened[e["job_id"]] = (e["time"], start[0])
        elif e["event"] in _WITH_PROGRESS and e["job_id"] in opened:
            end = _split_progress(e["detail"])
            t0, done0 = opened.pop(e["job_id"])
            if end is not None:
                work += max(0, end[0] - done0)
                seconds += max(0, e["time"] - t0)
    if seconds <= 0:
        return None
    return work / seconds


def _used(chain: Chain, chunks: list[dict[str, Any]], events: list[dict[str, Any]]) -> int:
    """What counts against --max-chunks: chunks that started, or in requeue mode (one job
    run again and again) its runs."""
    if chain.record.get("requeue"):
        return sum(1 for e in events if e["event"] == contract.EV_STARTED)
    return sum(1 for c in chunks if contract.EV_STARTED in c["events"])


def _outcome(chain: Chain, chunks: list[dict[str, Any]], events: list[dict[str, Any]]
             ) -> tuple[str, str]:
    """The chain's state and, in words, what happened."""
    kinds = {e["event"] for e in events}
    active = [c for c in chunks if c["state"] in ACTIVE_STATES]
    name = chain.record["name"]
    if contract.EV_COMPLETE in kinds or (
            (chain.run_dir / contract.COMPLETE_MARKER).exists() and not active):
        return "complete", "the work is done"
    if contract.EV_CANCELLED in kinds:
        return "cancelled", "cancelled with `train cancel`"
    by_job = {c["job_id"]: c for c in chunks}
    last = next((e for e in reversed(events) if e["event"] in _DECISIVE), None)
    decided: set[str] = set()
    if last is not None:
        chunk = by_job.get(last["job_id"], {"chunk": last["chunk"], "state": "UNKNOWN"})
        where = f"chunk {chunk['chunk']} (job {last['job_id']})"
        event, detail = last["event"], last["detail"] or ""
        logs = f"`train logs {name} --err --job {last['job_id']}`"
        if event == contract.EV_FAILED:
            return "failed", f"{where} failed: its step exited with code {detail}; see {logs}"
        if event == contract.EV_TIMEOUT:
            return "failed", (f"{where} reached its walltime: the step did not stop at the "
                              f"walltime signal {chain.record.get('signal_margin')} s before "
                              "it (it ignores USR1, or checkpointing takes longer); raise "
                              f"--signal-margin, or make the program stop on USR1; see {logs}")
        if event == contract.EV_NO_PROGRESS:
            return "stalled", (f"{where} ended without adding work (done/total now "
                               f"{detail.replace(' ', '/')}), so the chain stopped; see {logs}")
        if event == contract.EV_UNSAVED:
            return "stalled", (f"{where} {contract.UNSAVED_TEXT} (the program's progress "
                               "file, the run folder and its save paths show nothing saved "
                               "since the chunk began), so the chain stopped; submit the "
                               "same job again (a longer --time if the program saves too "
                               "late for it): the new chain goes on at chunk "
                               f"{chunk['chunk'] + 1}; see {logs}")
        if event == contract.EV_INCOMPLETE:
            unit = "run" if chain.record.get("requeue") else "chunk"
            return "incomplete", (f"the bound of {chain.record.get('max_chunks')} {unit}(s) was "
                                  f"reached at {detail.replace(' ', '/')}; submit the same job "
                                  "again with a larger --max-chunks to continue from the "
                                  "checkpoint")
        if event == contract.EV_TERMINATED and chunk["state"] not in ACTIVE_STATES:
            if chunk["state"] == "CANCELLED":
                return "cancelled", f"{where} was cancelled (scancel) after {detail} s"
            text = _ENDING_STATES.get(chunk["state"], f"ended {chunk['state']}")
            return "failed", f"{where} was terminated after {detail} s: {text}"
        if event != contract.EV_STARTED:
            decided.add(last["job_id"])
    for c in chunks:
        if c["state"] in _ENDING_STATES and c["job_id"] not in decided and (
                contract.EV_STARTED in c["events"] or c["state"] != "CANCELLED"):
            where = f"chunk {c['chunk']} (job {c['job_id']})"
            state = "cancelled" if c["state"] == "CANCELLED" else "failed"
            return state, f"{where} ended {c['state']}: {_ENDING_STATES[c['state']]}"
    held = [c for c in chunks if c["state"] == "PENDING"
            and str(c.get("reason") or "").startswith("JobHeld")]
    if held:
        c = held[0]
        return "held", (f"chunk {c['chunk']} (job {c['job_id']}) is held ({c['reason']}): "
                        f"`train submit` stopped before releasing it; `train cancel {name}` "
                        "and submit again, or `scontrol release` it")
    if last is not None and last["event"] in (contract.EV_STOPPED, contract.EV_REQUEUED) \
            and not active:
        after = [c for c in chunks if c["chunk"] > last["chunk"]]
        gone = f"chunk {after[0]['chunk']} (job {after[0]['job_id']}) ended " \
               f"{after[0]['state']} before it ran" if after else "no next chunk was queued"
        return "ended", (f"{gone}, so the chain stopped at "
                         f"{(last['detail'] or '?').replace(' ', '/')}; submit the same job "
                         "again to continue from the checkpoint")
    running = [c["chunk"] for c in chunks if c["state"] == "RUNNING"]
    if running:
        if chain.record.get("requeue"):
            return "running", f"run {_used(chain, chunks, events)} of at most " \
                              f"{chain.record.get('max_chunks')} (requeue mode) is running"
        return "running", f"chunk {running[-1]} of at most {chain.record.get('max_chunks')} " \
                          "is running"
    if active:
        return "pending", "waiting in the queue"
    return "ended", "no chunk is queued or running"


def _record_int(chain: Chain, key: str) -> int | None:
    """An integer of the chain's record; None where it is missing or not an integer (a
    record edited by hand, or not written by `train submit`)."""
    value = chain.record.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def idle_settings(chain: Chain) -> tuple[float, float]:
    """The job's GPU idle threshold (percent) and minutes, as `train submit` recorded them
    in the chain's resources; the watch's defaults where they are missing or odd."""
    from train.runtime import gpuwatch_reader as gpuwatch

    res = chain.record.get("resources")
    watch = res.get("gpu_watch") if isinstance(res, dict) else None
    given = watch if isinstance(watch, dict) else {}

    def setting(name: str, default: float) -> float:
        value = given.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return default

    return (setting("idle_threshold", gpuwatch.DEFAULT_IDLE_THRESHOLD),
            setting("idle_minutes", gpuwatch.DEFAULT_IDLE_MINUTES))


def _gpu_summary(chain: Chain) -> dict[str, Any]:
    """Per node, the GPU watch's mean and latest utilisation (runtime/gpuwatch.py)."""
    from train.runtime import gpuwatch_reader as gpuwatch

    threshold, minutes = idle_settings(chain)
    try:
        return dict(gpuwatch.summary(chain.run_dir, threshold=threshold, minutes=minutes))
    except (OSError, ValueError):
        return {}


def chain_status(chain: Chain, states: dict[str, dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """The chain as a whole, its progress, and each chunk's SLURM state and events.
    `states`: the jobs' states when already asked for (one query for many chains)."""
    if states is None:
        states = job_states(chain.ids)
    # the end of the events: a few lines a chunk, so 1 MiB is thousands of chunks
    text = _read_text(chain.run_dir / contract.CHAIN_EVENTS, EVENTS_LIMIT, tail=True)
    chunk_ids = set(chain.ids)
    events = [e for e in parse_events(text) if e["job_id"] in chunk_ids]
    chunks = []
    for number, job_id in chain.chunks:
        s = states.get(job_id, {"state": "UNKNOWN"})
        chunks.append({"chunk": number, "job_id": job_id, "state": s["state"],
                       "reason": s.get("reason"), "exit": s.get("exit"),
                       "expected_start": s.get("start"),
                       "events": [e["event"] for e in events if e["job_id"] == job_id]})
    state, cause = _outcome(chain, chunks, events)
    progress = contract.read_progress(chain.run_dir)
    rate = progress_rate(events)
    used = _used(chain, chunks, events)
    status: dict[str, Any] = {
        "name": chain.record["name"], "cluster": chain.record.get("cluster"),
        "run_dir": str(chain.run_dir), "state": state, "cause": cause,
        "max_chunks": chain.record.get("max_chunks"), "chunks_used": used,
        "unit": "run" if chain.record.get("requeue") else "chunk",
        "done": progress[0] if progress else None,
        "total": progress[1] if progress else None,
        "rate_per_second": rate, "eta_seconds": None, "chunks_left_estimate": None,
        "warning": None, "chunks": chunks, "gpu": _gpu_summary(chain),
    }
    if progress and rate and state not in ("complete", "cancelled", "failed"):
        eta = max(0, progress[1] - progress[0]) / rate
        status["eta_seconds"] = round(eta)
        budget = _record_int(chain, "time_budget_seconds") or _record_int(
            chain, "walltime_seconds")
        if budget and budget > 0 and eta > 0:
            left = max(1, -(-int(eta) // budget))
            status["chunks_left_estimate"] = left
            bound = _record_int(chain, "max_chunks") or 0
            remaining = bound - used + (1 if state == "running" else 0)
            if state in ("running", "pending") and left > remaining:
                status["warning"] = (f"at this rate the work needs about {left} more "
                                     f"{status['unit']}(s), more than the {remaining} left "
                                     f"under --max-chunks {bound}: it will end incomplete")
            elif state in ("incomplete", "ended", "stalled"):
                status["warning"] = (f"to finish, submit the same job again with "
                                     f"--max-chunks {left} or more")
    return status


def format_status(st: dict[str, Any]) -> list[str]:
    """`train status` lines for one chain."""
    lines = [f"{st['name']} ({st['cluster']}): {st['state']}  {st['run_dir']}",
             f"  {st['cause']}"]
    if st["total"]:
        text = (f"  progress: {st['done']}/{st['total']} "
                f"({100 * st['done'] // st['total']}%), {st['chunks_used']} of at most "
                f"{st['max_chunks']} {st['unit']}(s) used")
        if st["eta_seconds"] is not None:
            text += (f"; about {st['eta_seconds'] / 3600:.1f} h left at "
                     f"{st['rate_per_second']:.3g}/s")
            if st["chunks_left_estimate"]:
                text += f" (~{st['chunks_left_estimate']} more {st['unit']}(s))"
        lines.append(text)
    for node, g in sorted((st.get("gpu") or {}).items()):
        idle = f"; {g['idle_description']}" if g.get("idle_description") else ""
        lines.append(f"  gpu {node}: {g['gpus']} GPU(s), utilisation mean "
                     f"{g['mean_util']:.0f}%, latest {g['latest_util']:.0f}% "
                     f"({g['samples']} samples){idle}")
    if st["warning"]:
        lines.append(f"  note: {st['warning']}")
    for c in st["chunks"]:
        extra = f" ({c['reason']})" if c.get("reason") not in (None, "None") else ""
        events = ", ".join(c["events"])
        lines.append(f"  chunk {c['chunk']}: job {c['job_id']} {c['state']}{extra}"
                     f"{'  events: ' + events if events else ''}")
        if c["state"] == "PENDING":  # why it waits, and until when (train.slurm.reasons)
            why = reasons.words(c.get("reason"))
            start = reasons.expected_start(c.get("expected_start"))
            lines += [f"    waiting: {why}"] if why else []
            lines.append(f"    expected start: {start or 'Slurm gives no estimate yet'}")
    return lines


def cancel_chain(chain: Chain) -> list[str]:
    """Cancel every queued or running chunk. The event is recorded first, so what the
    chunks' batch shells record as they die reads as the consequence; a chain with nothing
    left to cancel keeps the record of how it ended."""
    states = job_states(chain.ids)
    active = [i for i in chain.ids if states.get(i, {}).get("state") in ACTIVE_STATES]
    if active:
        with open(chain.run_dir / contract.CHAIN_EVENTS, "a", encoding="utf-8") as fh:
            fh.write(f"{int(time.time())} 0 {chain.ids[0]} {contract.EV_CANCELLED} "
                     "by-user\n")
        _proc.run(["scancel", *active], timeout=60)
    return active


def log_path(chain: Chain, job_id: str | None, err: bool) -> Path:
    """The log of the given job, or of the newest chunk that has one."""
    suffix = "err" if err else "out"
    ids = chain.ids if job_id is None else [i for i in chain.ids if i == job_id]
    if not ids:
        raise UsageError(f"job: {job_id} is not part of {chain.run_dir.name}; its jobs: "
                         f"{', '.join(chain.ids) or 'none'}")
    logs = chain.run_dir / contract.LOG_DIR
    found = [p for i in ids for p in sorted(logs.glob(f"*-{i}.{suffix}"))]
    if found:
        return found[-1]
    return logs / f"{chain.record['name']}-{ids[-1]}.{suffix}"
