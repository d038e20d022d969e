"""Asking SLURM about jobs: the parsers of sbatch, squeue and sacct output (pure
functions) and `job_states`, which asks squeue, then sacct, for a list of job ids."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Sequence
from typing import Any

from train.client.slurm import reasons
from train.common import _proc
from train.common.errors import ResourceError, TrainError

log = logging.getLogger(__name__)

ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
                 "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
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
    its own job id, see train.batch.chunk's array_task)."""
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
                            # as squeue's %r: the description where Slurm gives one
                            # ("ReqNodeNotAvail, Reserved for maintenance")
                            "reason": job.get("state_description") or job.get("state_reason"),
                            "nodes": job.get("nodes"),
                            # the expected start (`squeue --start`) of a pending job
                            "start": reasons.start_seconds(job.get("start_time"))
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
