"""Why a job waits, in words a newcomer reads: Slurm's pending reasons (squeue's REASON,
`state_reason` in `squeue --json`) and its expected start (`squeue --start`, the
`start_time` of a pending job: the backfill scheduler's estimate)."""

from __future__ import annotations

import time
from typing import Any

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
