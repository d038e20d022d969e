"""Talking to SLURM: submit chains, read job states, cancel. Parsers are pure functions.

A chain is one script run by every chunk. `train submit` renders it and submits chunk 1
held; the chain's record (chain.json, and chain.ids with one line per chunk) is written,
and only then the job is released, so nothing runs before its record exists and a failure
while submitting leaves nothing behind. Each chunk then submits its successor itself (see
job-lib.sh), so the login node can be left and at most two jobs of a chain are queued.

The work is split by concern: `queue` asks Slurm about jobs (and parses its output),
`chain` reads a chain's record and finds runs, `submission` submits a chain, and
`chainstatus` says what state a chain is in. This module keeps the names callers import
from it, and cancels a chain.
"""

from __future__ import annotations

import time

from train.batch import contract
from train.client.slurm import queue
from train.client.slurm.chain import (
    EVENTS_LIMIT,
    RECORD_LIMIT,
    Chain,
    chain_dirs,
    find_run,
    load_chain,
    log_path,
    parse_events,
    parse_ids,
)
from train.client.slurm.chainstatus import chain_status, format_status, idle_settings, progress_rate
from train.client.slurm.queue import (
    ACTIVE_STATES,
    QUERY_BATCH,
    SchedulerError,
    job_states,
    parse_sacct,
    parse_sbatch_id,
    parse_squeue_json,
)
from train.client.slurm.submission import chain_record, first_chunk, submit_chain
from train.common import _proc

__all__ = ["ACTIVE_STATES", "EVENTS_LIMIT", "QUERY_BATCH", "RECORD_LIMIT", "Chain",
           "SchedulerError", "cancel_chain", "chain_dirs", "chain_record", "chain_status",
           "find_run", "first_chunk", "format_status", "idle_settings", "job_states",
           "load_chain", "log_path", "parse_events", "parse_ids", "parse_sacct",
           "parse_sbatch_id", "parse_squeue_json", "progress_rate", "submit_chain"]


def cancel_chain(chain: Chain) -> list[str]:
    """Cancel every queued or running chunk. The event is recorded first, so what the
    chunks' batch shells record as they die reads as the consequence; a chain with nothing
    left to cancel keeps the record of how it ended."""
    states = queue.job_states(chain.ids)
    active = [i for i in chain.ids if states.get(i, {}).get("state") in ACTIVE_STATES]
    if active:
        with open(chain.run_dir / contract.CHAIN_EVENTS, "a", encoding="utf-8") as fh:
            fh.write(f"{int(time.time())} 0 {chain.ids[0]} {contract.EV_CANCELLED} "
                     "by-user\n")
        _proc.run(["scancel", *active], timeout=60)
    return active

