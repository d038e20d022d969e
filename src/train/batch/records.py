"""What the chain engine reads of a chain's records and Slurm's answers: the ids file,
the queue (a successor submitted before), the tasks' end records (the first failure), the
overruns so far. Pure functions, unit-tested without Slurm; standard library only, valid
Python 3.6 (see train.batch.engine).
"""

import math
import signal
from typing import List, Optional, Sequence, Tuple

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
        if parts[0] == STARTED:  # killed with its wrapper: no end recorded
            unended.append(parts[2] if all(c.isalnum() or c in "._-" for c in parts[2])
                           else "")
            continue
        code, node = saves._number(parts[0]), parts[2]
        try:
            at = float(parts[1])
        except ValueError:
            continue
        if code is None or code == 0 or code > 255 or math.isnan(at):
            continue
        sig = saves._number(parts[3]) if len(parts) > 3 else None
        if not all(c.isalnum() or c in "._-" for c in node):
            node = ""
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


def overruns(ids_text: str, events_text: str) -> int:
    """How many chunks of this chain (the jobs of its ids file) overran their walltime
    after the stop signal and went on."""
    mine = {job for _, job in parse_ids(ids_text)}
    count = 0
    for line in events_text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[3] == contract.EV_OVERRAN and parts[2] in mine:
            count += 1
    return count


def read_text(path: str, limit: int = 4 * 1024 * 1024) -> str:
    data = saves.read_small(path, limit)
    return "" if data is None else data.decode("utf-8", "replace")
