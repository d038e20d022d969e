"""What a run has saved, read from its files: the progress the program recorded (or its
framework's saves show), the newest match of a {newest:GLOB} placeholder, the resume
arguments with those expanded, and when the program last saved. The chain engine applies
these on the batch host, `train status` and `train submit` on the login node: one rule
each, in one place. Nothing of the user's is evaluated: a pattern is only globbed, a
match is one argument.
"""

import contextlib
import fnmatch
import glob
import json
import os
import re
import stat
from typing import Iterable, List, Optional, Sequence, Set, Tuple

from train.batch import contract

# {newest:GLOB}: GLOB runs to the first closing brace
_NEWEST = re.compile(r"\{newest:([^}]*)\}")
Progress = Tuple[int, int]  # work units: (done, total); total 0 where it is not known
_STEP = re.compile(r"step=([0-9]+)")
_LAST_NUMBER = re.compile(r"([0-9]+)[^0-9]*$")
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
        return os.read(fd, limit)
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


def state_progress(path: str) -> Optional[Progress]:
    """(global_step, max_steps) of a Trainer's trainer_state.json; None on anything else."""
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


def save_progress(path: str) -> Optional[Progress]:
    """The progress one save shows: a Trainer checkpoint (or output) folder, or a file
    named with its step (Lightning's epoch=E-step=S.ckpt: total not known)."""
    if os.path.isdir(path):
        return state_progress(os.path.join(path, STATE_FILE))
    name = os.path.basename(path.rstrip("/"))
    if _STEP.search(name) is None:
        return None
    number = name_number(name)
    return None if number is None else (number, 0)


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


def progress(run_dir: str, resume_args: Sequence[str], save_paths: Sequence[str],
             base: str) -> Optional[Progress]:
    """The work done so far: as the program last recorded it in the progress file, else
    as its saves show it; None where neither says."""
    return file_progress(run_dir) or framework_progress(resume_args, save_paths, base)


def progress_words(got: Optional[Progress]) -> str:
    if got is None:
        return "progress not known: no progress file, and no save of the program names its step"
    if got[1] > 0:
        return "at {}/{}".format(*got)
    return "at step {}".format(got[0])


def detail(got: Optional[Progress]) -> str:
    """An event's "DONE TOTAL" (0 0: not known)."""
    return "{} {}".format(*(got or (0, 0)))


def _skipped(name: str, skips: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in skips)


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
                 if not _skipped(n, skips)]
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
