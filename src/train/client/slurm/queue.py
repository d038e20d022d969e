"""Asking SLURM about jobs: the parsers of sbatch, squeue and sacct output (pure
functions), `job_states`, which asks squeue, then sacct, for a list of job ids, and why a
job waits, in words a newcomer reads: its pending reason (squeue's REASON) and its
expected start (the backfill scheduler's estimate, `squeue --start`)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from train.common import _proc
from train.common.errors import ResourceError, TrainError

log = logging.getLogger(__name__)

ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
                 "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
QUERY_BATCH = 1000  # job ids per squeue/sacct call (19 bytes each, far under ARG_MAX)


# -- pure parsers ---------------------------------------------------------------------
# A job id, chunk number or Unix time: ASCII digits (str.isdigit() also takes '²', which
# int() refuses), short enough for int() (it refuses more than 4300 digits).
_NUMBER = re.compile(r"[0-9]{1,18}")


def _is_number(text: str) -> bool:
    return _NUMBER.fullmatch(text) is not None


def _is_job_ref(text: str) -> bool:
    """A job id, or ARRAY_TASK: a sweep's array task before it starts (it then records
    its own job id, see train.batch.chunk's array_task)."""
    array, sep, task = text.partition("_")
    return _is_number(array) and (not sep or _is_number(task))


def parse_sbatch_id(stdout: str) -> str:
    """`sbatch --parsable` prints 'ID' or 'ID;CLUSTER'."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = text.split(";")[0].strip()
    if not _is_number(job_id):
        raise TrainError(f"cannot read a job id from sbatch output {stdout!r}")
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
                            # as squeue's %r: the description where Slurm gives one
                            # ("ReqNodeNotAvail, Reserved for maintenance")
                            "reason": job.get("state_description") or job.get("state_reason"),
                            "nodes": job.get("nodes"),
                            # the expected start (`squeue --start`) of a pending job
                            "start": start_seconds(job.get("start_time"))
                            if str(state) == "PENDING" else None}
    return out


def parse_sacct(text: str, tasks: bool = False) -> dict[str, dict[str, Any]]:
    """`sacct -P -n -o JobIDRaw,State,ExitCode` (also with -c) -> {job id: {state, exit}};
    with `tasks`, `-o JobID,...` -> {ARRAY_TASK or job id: ...}.

    Job steps (ids with a dot) are skipped; 'CANCELLED by 0' becomes CANCELLED.
    """
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0] or "." in parts[0]:
            continue
        job_id = parts[0] if tasks else parts[0].split("_")[0]
        if not (_is_job_ref if tasks else _is_number)(job_id):
            continue
        words = parts[1].split()
        out[job_id] = {"state": words[0] if words else "UNKNOWN", "exit": parts[2]}
    return out



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
        try:
            proc = _sacct("JobIDRaw", missing)
        except _proc.ProcError as exc:  # not on PATH (not a login node), or hung
            raise ResourceError(f"cannot reach Slurm: sacct: {_proc.tail(str(exc))}") from None
        if proc.returncode != 0 and squeue_error:
            # neither answered: the jobs' states are not known, and must not read as ended
            raise ResourceError(f"cannot reach Slurm: squeue: {_proc.tail(squeue_error)}; "
                                f"sacct: {_proc.tail(proc.stderr) or proc.returncode}")
        found = parse_sacct(proc.stdout)
        for job_id in missing:
            states[job_id] = found.get(job_id, {"state": "UNKNOWN"})
    return states


def _sacct(job_field: str, ids: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """sacct on these jobs, or the job completion log (`sacct -c`) where accounting
    storage is disabled."""
    argv = ["sacct", "-P", "-n", "-o", f"{job_field},State,ExitCode", "-j", ",".join(ids)]
    proc = _proc.run(argv, check=False)
    if "accounting storage is disabled" in proc.stdout + proc.stderr:
        proc = _proc.run(["sacct", "-c", *argv[1:]], check=False)
    return proc


def array_task_states(refs: Sequence[str]) -> dict[str, dict[str, Any]]:
    """States of array tasks named ARRAY_TASK (a sweep's tasks not started yet, or started
    since the chain.ids was read): squeue --array, then sacct; UNKNOWN where neither knows
    the task. Where neither answers at all, a ResourceError ("cannot reach Slurm"): a
    state Slurm could not give must never read as ended."""
    out: dict[str, dict[str, Any]] = {}
    arrays = sorted({r.partition("_")[0] for r in refs})
    if not arrays:
        return out
    try:
        proc = _proc.run(["squeue", "--array", "--noheader", "--jobs", ",".join(arrays),
                          "--format", "%i|%T|%r"], check=False)
        squeue_error = "" if proc.returncode == 0 else (proc.stderr or f"exit {proc.returncode}")
    except _proc.ProcError as exc:
        proc, squeue_error = None, str(exc)
    for line in proc.stdout.splitlines() if proc is not None and not squeue_error else []:
        ref, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if ref in refs:
            out[ref] = {"state": state or "UNKNOWN", "reason": reason or None}
    missing = [r for r in refs if r not in out]
    if missing:
        answer = ""
        try:
            proc = _sacct("JobID", missing)
            sacct_error = "" if proc.returncode == 0 else (proc.stderr or
                                                           f"exit {proc.returncode}")
            answer = proc.stdout
        except _proc.ProcError as exc:
            sacct_error = str(exc)
        if squeue_error and sacct_error:
            raise ResourceError(f"cannot reach Slurm: squeue: {_proc.tail(squeue_error)}; "
                                f"sacct: {_proc.tail(sacct_error)}")
        found = parse_sacct(answer, tasks=True) if not sacct_error else {}
        out.update({ref: found[ref] for ref in missing if ref in found})
    for ref in refs:
        out.setdefault(ref, {"state": "UNKNOWN"})
    return out


def ref_states(ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """States of job ids and ARRAY_TASK refs together (a sweep's chains hold both)."""
    states = job_states([i for i in ids if "_" not in i])
    states.update(array_task_states([i for i in ids if "_" in i]))
    return states


# -- why a job waits ------------------------------------------------------------------
# Slurm's reason -> what it means for the user (the reasons a chain's chunks meet)
WORDS = {
    "Priority": "other jobs come first (higher priority); it starts when its turn comes",
    "Resources": "it is next, waiting for enough nodes, GPUs or memory to become free",
    "Dependency": "waiting for the chunk before it to end (a chain's next chunk)",
    "DependencyNeverSatisfied": "the job it depends on ended in a way that never lets it "
                                "run: cancel it",
    "JobHeldUser": "held by you or by train (scontrol release JOBID lets it go)",
    "JobHeldAdmin": "held by an administrator: ask the site's support",
    "BeginTime": "asked to start later (--begin)",
    "QOSMaxGRESPerUser": "your QOS allows no more GPUs at once: it starts when one of your "
                         "other jobs ends",
    "QOSMaxJobsPerUserLimit": "your QOS allows no more running jobs: it starts when one of "
                              "your other jobs ends",
    "QOSMaxSubmitJobPerUserLimit": "your QOS allows no more queued jobs",
    "QOSMaxWallDurationPerJobLimit": "its time is over the QOS's limit: it will never start;"
                                     " cancel it and submit with a shorter --time",
    "QOSGrpGRES": "the QOS's GPUs (shared by its users) are all in use",
    "QOSGrpCpuLimit": "the QOS's CPUs (shared by its users) are all in use",
    "AssocGrpGRES": "your account's GPUs are all in use (by you or your group)",
    "AssocGrpCpuLimit": "your account's CPUs are all in use (by you or your group)",
    "AssocMaxJobsLimit": "your account allows no more running jobs",
    "AssocGrpBillingMinutes": "your account's allocation (billing minutes) is used up: ask "
                              "its owner",
    "PartitionTimeLimit": "its time is over the partition's limit: it will never start; "
                          "cancel it and submit with a shorter --time",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows: it will never "
                          "start",
    "PartitionDown": "the partition is down: it waits until the site brings it back",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved (maintenance?)",
    "ReqNodeNotAvail, May be reserved for other job": "a reservation (not the job's) holds "
                                                      "nodes it needs during its time: it "
                                                      "starts once they are free",
    "Reservation": "waiting for its reservation to begin",
    "BadConstraints": "no node has what it asks for: it will never start",
    "NodeDown": "a node it needs is down",
    "launch failed requeued held": "its start failed and Slurm held it: see train doctor",
}


# squeue's reasons for a job whose time crosses a reservation on nodes it needs (%r;
# squeue --json's state_description), the same on Slurm 22.05, 24.11 and 26.05: a
# maintenance of all of them, before and while it runs, and one of some of them (or
# another reservation)
MAINTENANCE = "Reserved for maintenance"
RESERVED = (MAINTENANCE, "May be reserved for other job")


def is_reserved(reason: Any) -> bool:
    return any(text in str(reason or "") for text in RESERVED)


def words(reason: Any, maintenance: str | None = None) -> str | None:
    """The reason in plain words; None for no reason (a job that is not waiting).
    `maintenance`: the reservation it waits for, where known ('NAME (until DATE)')."""
    if reason in (None, "", "None"):
        return None
    text = str(reason)
    if maintenance or MAINTENANCE in text:
        return (f"the site's maintenance {maintenance or 'reservation'} holds the nodes it "
                "needs and its time limit crosses it: Slurm starts it once the maintenance "
                "ends (nothing to do: the chain goes on then)")
    # "ReqNodeNotAvail, UnavailableNodes:n1": the reason, then its detail
    return WORDS.get(text) or WORDS.get(text.partition(",")[0]) or \
        f"Slurm's reason {text} (see `man squeue`, JOB REASON CODES)"


def start_seconds(value: Any) -> int | None:
    """squeue --json's start_time of a pending job (a number, or {"set": .., "number": N}
    from Slurm 23.02 on) -> Unix seconds; None where Slurm has no estimate (0)."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def expected_start(seconds: int | None, now: float | None = None) -> str | None:
    """Unix seconds as 'DATE HH:MM UTC (in about N h)'; None for no estimate."""
    if seconds is None:
        return None
    try:
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):  # past the year 9999: no estimate
        return None
    wait = seconds - (time.time() if now is None else now)
    if wait <= 60:
        return f"{at} (now, at the next scheduling pass)"
    hours = wait / 3600
    return f"{at} (in about {hours:.1f} h)" if hours >= 1 else \
        f"{at} (in about {round(wait / 60)} min)"
