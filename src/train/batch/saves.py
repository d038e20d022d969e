"""What the chain engine reads of a run: what it saved (the progress the program recorded,
or its framework's saves show; the newest match of a {newest:GLOB} placeholder, the resume
arguments with those expanded; when the program last saved), the chain's records (the job
record, the ids file, the tasks' end records, the overruns so far) and Slurm's answers (the
queue, a time limit); `train status` and `train submit` read the run with the same rules.
Nothing of the user's is evaluated: a pattern is only globbed, a match is one argument.
"""

import contextlib
import fnmatch
import glob
import json
import math
import os
import re
import signal
import stat
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from train.batch import contract

# {newest:GLOB}: GLOB runs to the first closing brace
_NEWEST = re.compile(r"\{newest:([^}]*)\}")
Progress = Tuple[int, int]  # work units: (done, total); total 0 where it is not known
_STEP = re.compile(r"step=([0-9]+)")
_LAST_NUMBER = re.compile(r"([0-9]+)[^0-9]*$")
_JOB_REF = re.compile(r"[0-9]{1,18}(_[0-9]{1,18})?")  # a job id, or ARRAY_TASK
STATE_FILE = "trainer_state.json"  # the Hugging Face Trainer's, written last into a save
_STATE_LIMIT = 256 * 1024 * 1024  # a log_history beyond reason


def read_small(path: str, limit: int = 256, tail: bool = False) -> Optional[bytes]:
    """At most `limit` bytes of a regular file (its last with `tail`); None for anything
    else (a FIFO, a device or a folder is never opened for long: the open does not wait,
    nor the read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if tail and info.st_size > limit:
            os.lseek(fd, info.st_size - limit, os.SEEK_SET)
        parts = []  # to the limit or the end: a read may return less (FUSE, over 2 GiB)
        while limit > 0:
            part = os.read(fd, min(limit, 1 << 20))
            if not part:
                break
            parts.append(part)
            limit -= len(part)
        return b"".join(parts)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_small(path: str, text: str, append: bool = False) -> Optional[str]:
    """Write (or append) to a regular file of the run, never through a link and never
    waiting on a FIFO a program put there; None when done, else why not."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | (
        os.O_APPEND if append else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        return "{}: {}".format(path, exc.strerror or exc)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "{} is not a regular file".format(path)
        if not append:
            os.ftruncate(fd, 0)
        os.write(fd, text.encode("utf-8"))
    except OSError as exc:
        return "{}: {}".format(path, exc.strerror or exc)
    finally:
        os.close(fd)
    return None


def remove_file(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def is_file(path: str) -> bool:
    """A regular file at the path itself (a link, a FIFO or a folder is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _number(text: str) -> Optional[int]:
    # ASCII digits only, short enough to compare (18 digits: what the records hold)
    if text and len(text) <= 18 and all("0" <= c <= "9" for c in text):
        return int(text)
    return None


def file_progress(run_dir: str) -> Optional[Progress]:
    """The run's progress file ("DONE TOTAL"), or None where it does not read as that."""
    data = read_small(os.path.join(run_dir, contract.PROGRESS_FILE))
    if data is None:
        return None
    parts = data.decode("ascii", "replace").split()
    if len(parts) < 2:
        return None
    done, total = _number(parts[0]), _number(parts[1])
    if done is None or total is None:
        return None
    return done, total


def name_number(name: str) -> Optional[int]:
    """The step in a save's name (step=S, else the last number in it), or None."""
    found = _STEP.search(name) or _LAST_NUMBER.search(name)
    return _number(found.group(1).lstrip("0") or "0") if found else None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def newest(pattern: str, base: str) -> Optional[str]:
    """The newest path matching the glob `pattern` (relative ones from `base`), as the
    pattern names it: by the number in the name where every match has one, else by
    modification time. Where some matches are folders holding trainer_state.json, a
    folder without it (a save cut short) is passed over. None where nothing matches."""
    full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
    matches = [m for m in sorted(glob.glob(full)) if os.path.exists(m)]
    if any(os.path.isfile(os.path.join(m, STATE_FILE)) for m in matches):
        matches = [m for m in matches if os.path.isfile(os.path.join(m, STATE_FILE))]
    if not matches:
        return None
    numbers = [name_number(os.path.basename(m.rstrip("/"))) for m in matches]
    if all(n is not None for n in numbers):
        best = max(zip(numbers, matches), key=lambda nm: (nm[0], _mtime(nm[1])))[1]
    else:
        best = max(matches, key=_mtime)
    # as the pattern names it: relative where it was given relative
    return best if os.path.isabs(pattern) else os.path.relpath(best, base)


def expand(words: Sequence[str], base: str) -> Tuple[Optional[List[str]], str]:
    """The words with every {newest:GLOB} replaced by its newest match; (None, why) where
    one matches nothing."""
    out: List[str] = []
    for word in words:
        parts = _NEWEST.split(word)  # text, GLOB, text, ..., text
        for i in range(1, len(parts), 2):
            match = newest(parts[i], base)
            if match is None:
                return None, "nothing matches {} (in {})".format(parts[i], base)
            parts[i] = match
        out.append("".join(parts))
    return out, ""


def patterns(words: Iterable[str]) -> List[str]:
    """Every {newest:GLOB} pattern of the words, in order."""
    return [pattern for word in words for pattern in _NEWEST.findall(word)]


def save_progress(path: str) -> Optional[Progress]:
    """The progress one save shows: a file named with its step (Lightning's
    epoch=E-step=S.ckpt: total not known), or a Trainer checkpoint (or output) folder's
    trainer_state.json (global_step, max_steps); None on anything else."""
    if not os.path.isdir(path):
        name = os.path.basename(path.rstrip("/"))
        number = name_number(name) if _STEP.search(name) else None
        return None if number is None else (number, 0)
    path = os.path.join(path, STATE_FILE)
    try:
        if os.path.islink(path) or not os.path.isfile(path) \
                or os.path.getsize(path) > _STATE_LIMIT:
            return None
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    done, total = state.get("global_step"), state.get("max_steps", 0)
    if not isinstance(done, int) or isinstance(done, bool) or done < 0:
        return None
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        total = 0
    return done, total


def framework_progress(resume_args: Sequence[str], save_paths: Sequence[str],
                       base: str) -> Optional[Progress]:
    """The furthest progress the program's saves show: the newest match of each
    {newest:GLOB} of its resume arguments, and of each save path the path itself, its
    newest checkpoint-N folder and its newest *step=S*.ckpt file."""
    saves: List[str] = []
    for pattern in patterns(resume_args):
        found = newest(pattern, base)
        if found is not None:
            saves.append(os.path.join(base, found))
    for path in save_paths:
        saves.append(path)
        if os.path.isdir(path):
            for inner in ("checkpoint-*", "*step=*.ckpt"):
                found = newest(inner, path)
                if found is not None:
                    saves.append(os.path.join(path, found))
    shown = [got for got in map(save_progress, saves) if got is not None]
    return max(shown, key=lambda got: got[0]) if shown else None  # (the first of a tie)


def progress_words(got: Optional[Progress]) -> str:
    if got is None:
        return "progress not known: no progress file, and no save of the program names its step"
    if got[1] > 0:
        return "at {}/{}".format(*got)
    return "at step {}".format(got[0])


def detail(got: Optional[Progress]) -> str:
    """An event's "DONE TOTAL" (0 0: not known)."""
    return "{} {}".format(*(got or (0, 0)))


def last_save(run_dir: str, save_paths: Sequence[str], since: float,
              skips: Sequence[str] = contract.SAVE_SCAN_SKIP) -> Optional[float]:
    """The modification time of the newest file saved after `since`: in the run folder
    (but the chain's own files, `skips`, at its top) or under a save path; None where
    there is none. Links are followed (a save folder linked to scratch space, Lightning's
    last.ckpt), each folder once. A save path that holds run folders (`--save-path .`) is
    looked through without them (the tool's own files change in every chunk) and without
    Python's __pycache__."""
    tops: List[str] = []
    with contextlib.suppress(OSError):
        tops += [os.path.join(run_dir, n) for n in sorted(os.listdir(run_dir))
                 if not any(fnmatch.fnmatchcase(n, pattern) for pattern in skips)]
    own = os.path.realpath(run_dir)
    for path in save_paths:
        real = os.path.realpath(path)
        if real != own and not real.startswith(own + os.sep) and os.path.exists(path):
            tops.append(path)
    best: Optional[float] = None
    seen: Set[Tuple[int, int]] = set()
    stack = list(tops)
    while stack:
        path = stack.pop()
        try:
            st = os.stat(path)  # (follows a link)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            if st.st_mtime > since and (best is None or st.st_mtime > best):
                best = st.st_mtime
            continue
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        if os.path.basename(path) == "__pycache__" or os.path.realpath(path) == own:
            continue
        try:
            names = os.listdir(path)
        except OSError:
            continue
        if path not in tops and any(r in names for r in contract.RUN_RECORDS):
            continue  # another run of the tool: its files are not the program's saves
        stack += [os.path.join(path, n) for n in names]
    return best


# a task's record while it runs ("started TIME NODE"): its wrapper replaces it with its end
STARTED = "started"
KILL_CODE = 128 + signal.SIGKILL


def parse_ids(text: str) -> List[Tuple[int, str]]:
    """chain.ids: (chunk, job id) in chunk order, the first id of each chunk, for the engine
    and the login node alike. A line that does not read so (a job id is digits, or a sweep
    task's ARRAY_TASK) is passed over: a damaged file never hands scancel an option."""
    out = {}  # type: Dict[int, str]
    for line in text.splitlines():
        parts = line.split()
        chunk = _number(parts[0]) if len(parts) == 2 else None
        if chunk and _JOB_REF.fullmatch(parts[1]):
            out.setdefault(chunk, parts[1])
    return sorted(out.items())


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
        code = _number(parts[0])
        try:
            at = float(parts[1])
        except ValueError:
            continue
        if code is None or code == 0 or code > 255 or math.isnan(at):
            continue
        sig = _number(parts[3]) if len(parts) > 3 else None
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


def deaf(keep: Optional[int] = None) -> None:
    """A step's process whose work is over ignores the step's signals but `keep`: a late
    copy (Slurm signals them one by one) would kill it as Python exits, handlers reset."""
    for sig in {signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM} - {keep}:
        signal.signal(sig, signal.SIG_IGN)


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
    data = read_small(path, limit, tail)
    return "" if data is None else data.decode("utf-8", "replace")


class Usage(Exception):
    """Bad arguments or a damaged record: said in the log, exit 2."""


def load_job(run_dir: str) -> Dict[str, Any]:
    """The job record that submit wrote (chain.json's "job")."""
    path = os.path.join(run_dir, contract.CHAIN_RECORD)
    data = read_small(path, 16 * 1024 * 1024)
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
