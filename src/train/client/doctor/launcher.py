"""torchrun's ChildFailedError: the failed rank behind it and that rank's own exception,
from the end of the error log."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from train.client.doctor.evidence import Evidence
from train.client.doctor.logread import MAX_LINE, read_tail, scan_lines
from train.client.doctor.rules import _EXCEPTION_RE, _exception

# torch's elastic agent (torchrun) ends with its own exception around a rank's failure,
# then a summary (torch/distributed/elastic/multiprocessing/errors/error_handler.py and
# __init__.py): "Root Cause (first observed failure):" and, per rank, "rank : R
# (local_rank: L)", "exitcode : N (pid: P)" (negative: the signal), "traceback : ..."
# (the rank's own traceback where it wrote an error file: @record; else a link)
_WRAPPER_RE = re.compile(_exception("ChildFailedError"))
_ROOT_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: (\d+)\)")
_ROOT_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_PREFIX_RE = re.compile(r"^\s*\[(rank ?|default)(\d+)\]")


@dataclass(frozen=True)
class RootCause:
    """The failed rank behind torchrun's ChildFailedError."""

    exception: Evidence | None  # the rank's own exception line, where the log has it
    rank: str  # "rank 1 (local_rank 1)", "" where the summary was not found
    signal: int | None  # the signal that ended the rank (its exitcode -N)


def launcher_root_cause(path: Path) -> RootCause | None:
    """Where the end of a log is torchrun's ChildFailedError: the rank that failed and its
    exception. The rank's traceback in the summary (an error file: torch timed the failures)
    wins; else the workers' exception lines before the agent's traceback, the root rank's
    where lines carry rank prefixes: the first that a rule recognises (the first rank to
    fail prints first; the others fail after it, e.g. 'Connection closed by peer'), else
    the last. Without error files torch's root cause is a guess (a tie in time goes to the
    lowest rank), so a rule-recognised exception of another rank still counts. None where
    the log does not end in the wrapper."""
    lines = read_tail(path)
    wrap = next((i for i in range(len(lines) - 1, -1, -1)
                 if _WRAPPER_RE.match(lines[i][1].strip())), None)
    if wrap is None:
        return None
    rank = local = None
    sig = None
    own: Evidence | None = None
    in_root = False
    for number, line in lines[wrap + 1:]:
        text = line.strip()
        if text.startswith("Root Cause"):
            in_root = True
        elif in_root and text.startswith("====="):
            break
        elif in_root:
            if m := _ROOT_RANK_RE.match(line):
                rank, local = int(m.group(1)), int(m.group(2))
            elif (m := _ROOT_EXIT_RE.match(line)) and int(m.group(1)) < 0:
                sig = -int(m.group(1))
            elif _EXCEPTION_RE.match(text) and not _WRAPPER_RE.match(text):
                own = Evidence(str(path), number or 0, text[:MAX_LINE])
    where = f"rank {rank} (local_rank {local})" if rank is not None else ""
    if own is not None:
        return RootCause(own, where, sig)
    # the agent's own traceback starts at the last "Traceback" before its exception
    end = next((i for i in range(wrap - 1, -1, -1)
                if lines[i][1].strip().startswith("Traceback (most recent call last)")), wrap)
    found = [(n, line.strip()) for n, line in lines[:end]
             if _EXCEPTION_RE.match(line.strip()) and not _WRAPPER_RE.match(line.strip())]
    prefixed = [(n, t, _PREFIX_RE.match(t)) for n, t in found]
    if rank is not None and any(m for _, _, m in prefixed):
        found = [(n, t) for n, t, m in prefixed if m and int(m.group(2)) == (
            rank if m.group(1).startswith("rank") else local)] or found
    if not found:
        return RootCause(None, where, sig)
    known = [(n, t) for n, t in found if scan_lines(path, [(n, t)])]
    number, text = known[0] if known else found[-1]
    return RootCause(Evidence(str(path), number or 0, text[:MAX_LINE]), where, sig)
