"""What the chain engine reads of a chain's records and Slurm's answers: the ids file,
the queue (a successor submitted before), the tasks' end records (the first failure), the
overruns so far. Pure functions, unit-tested without Slurm.
"""

import json
import math
import os
import signal
from typing import Any, Dict, List, Optional, Sequence, Tuple

from train.batch import contract, saves

# a task's record while it runs ("started TIME NODE"): its wrapper replaces it with its end
STARTED = "started"
KILL_CODE = 128 + signal.SIGKILL


def parse_ids(text: str) -> List[Tuple[int, str]]:
    """chain.ids: (chunk, job id) per line; lines that do not read so are passed over."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and saves._number(parts[0]) is not None:
            out.append((int(parts[0]), parts[1]))
    return out


def successors(queue: str, job: str, script: str) -> List[str]:
    """The queued jobs (squeue's "%i %E %o" lines) that wait on `job` (afterok) and run
    `script`: a chunk's successor is the only one; a job of the user's own that waits on
    the chunk (an evaluation after it) runs another script and is never taken."""
    found = []
    for line in queue.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        dep, cmd = "," + parts[1], parts[2]
        waits = any(d.startswith("afterok:" + job) and not d[len("afterok:" + job):][:1]
                    .isdigit() for d in dep.split(",") if d)
        if waits and (cmd == script or cmd.startswith(script + " ")):
            found.append(parts[0])
    return found


def first_failure(records: Sequence[str]) -> Optional[Tuple[int, str, Optional[int]]]:
    """The task that failed first, from the task wrappers' records ("CODE TIME NODE
    [SIGNAL]" each): (code, node, signal), whatever the code: a rank the OOM killer ended
    (KILL) fails first as much as one that raised. The TERM Slurm sends the other tasks
    comes after the failure; within a second of the first record (the nodes' clocks
    differ a little) a task that did not end of TERM is taken before one that did. None
    where no record says a task failed."""
    failed: List[Tuple[float, int, str, Optional[int]]] = []
    unended = []
    for text in records:
        parts = text.split()
        if len(parts) < 3:
            continue
        node = parts[2] if all(c.isalnum() or c in "._-" for c in parts[2]) else ""
        if parts[0] == STARTED:  # killed with its wrapper: no end recorded
            unended.append(node)
            continue
        code = saves._number(parts[0])
        try:
            at = float(parts[1])
        except ValueError:
            continue
        if code is None or code == 0 or code > 255 or math.isnan(at):
            continue
        sig = saves._number(parts[3]) if len(parts) > 3 else None
        failed.append((at, code, node, sig))
    if unended and all(f[1] == TERM_CODE for f in failed):
        # the rest ended of the TERM Slurm sent after it: the task killed outright (the
        # OOM killer of its cgroup, a KILL of its whole task) failed first
        return KILL_CODE, unended[0], signal.SIGKILL
    if not failed:
        return None
    failed.sort()
    near = [f for f in failed if f[0] <= failed[0][0] + 1.0 and f[1] != TERM_CODE]
    at, code, node, sig = (near or failed)[0]
    return code, node, sig


TERM_CODE = 128 + signal.SIGTERM


def signal_name(number: Optional[int]) -> str:
    try:
        return signal.Signals(number).name if number else ""
    except ValueError:
        return "signal {}".format(number)


def events(text: str, kind: str) -> List[List[str]]:
    """The words of each line of chain.events that records an event of this kind."""
    return [parts for parts in map(str.split, text.splitlines()) if parts[3:4] == [kind]]


def overruns(ids_text: str, events_text: str) -> int:
    """How many chunks of this chain (the jobs of its ids file) overran their walltime
    after the stop signal and went on."""
    mine = {job for _, job in parse_ids(ids_text)}
    return len([p for p in events(events_text, contract.EV_OVERRAN) if p[2] in mine])


def parse_limit(text: str) -> Optional[int]:
    """squeue's %l (a job's time limit: [D-]HH:MM:SS, MM:SS or minutes) in seconds; None
    for UNLIMITED, NOT_SET, INVALID or anything else."""
    days, dash, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if len(parts) > 3 or not all(p.isdigit() for p in parts + ([days] if dash else [])):
        return None
    numbers = [int(p) for p in parts] if len(parts) > 1 else [int(parts[0]), 0]  # minutes
    hours, minutes, secs = [0] * (3 - len(numbers)) + numbers
    seconds = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + secs
    return seconds or None


def time_used(events_text: str, first: int, chunk: int, asked: int) -> int:
    """The time limits of this chain's chunks before this one (from its first): each the
    last limit event of its number, or the whole walltime asked for where none was
    written."""
    limits = {int(p[1]): int(p[4]) for p in events(events_text, contract.EV_LIMIT)
              if len(p) >= 5 and p[1].isdigit() and p[4].isdigit()}
    return sum(limits.get(c, asked) for c in range(first, chunk))


def chunks_left(max_chunks: int, asked: int, used: int) -> int:
    """A chain with a floor: the chunks of --time (`asked` seconds) its bound of
    max_chunks x --time still allows after `used` seconds of chunk time limits."""
    return max(0, -(-(max_chunks * asked - used) // asked))


def read_text(path: str, limit: int = 4 * 1024 * 1024, tail: bool = False) -> str:
    data = saves.read_small(path, limit, tail)
    return "" if data is None else data.decode("utf-8", "replace")


class Usage(Exception):
    """Bad arguments or a damaged record: said in the log, exit 2."""


def load_job(run_dir: str) -> Dict[str, Any]:
    """The job record that submit wrote (chain.json's "job")."""
    path = os.path.join(run_dir, contract.CHAIN_RECORD)
    data = saves.read_small(path, 16 * 1024 * 1024)
    try:
        record = json.loads((data or b"").decode("utf-8"))
        job = record["job"]
    except (ValueError, KeyError, TypeError):
        raise Usage("{} holds no job record (written by `train submit`): submit the job "
                    "with `train submit`".format(path)) from None
    if not isinstance(job, dict):
        raise Usage("{}: its \"job\" is no record: submit the job again".format(path))
    missing = [k for k in JOB_KEYS if k not in job]
    if missing:
        raise Usage("{}: the job record lacks {}: submit the job again with this client's "
                    "`train submit`".format(path, ", ".join(missing)))
    for key, kind in JOB_KEYS.items():
        value = job[key]
        ok = all(isinstance(v, str) for v in value) if kind is list and isinstance(
            value, list) else isinstance(value, kind) and (kind is bool or not isinstance(
                value, bool))
        if not ok:
            raise Usage("{}: the job record's {} is {!r}, not {}: the file was edited; "
                        "submit the job again".format(path, key, value, kind.__name__))
    return dict(job)


# the record's keys the engine reads, and their types (what `train submit` writes)
JOB_KEYS = {"run_dir": str, "max_chunks": int, "walltime_seconds": int, "stop_signal": str,
            "stop_margin": int, "stop_mode": str, "requeue": bool, "requeue_allowed": bool,
            "complete_on_success": bool, "stop_via": str, "step_grace": int,
            "step_ranks": int, "kill_grace": int, "runtime": str, "resume_args": list,
            "save_paths": list, "program_dir": str}
