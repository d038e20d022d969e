"""The rules over one chunk (one Slurm job of the chain): Slurm's state first (it is
certain), then the signal that ended the step, then the log rules' causes, the exception
that ended the chunk leading (behind torchrun's ChildFailedError: the failed rank's own); a
failed chunk with none of these is `unknown`, its error log's end shown."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.batch import contract
from train.client.doctor import logread
from train.client.doctor.findings import Evidence, Finding, Hits, _finding
from train.client.gpuwatch_reader import idle_findings, idle_settings
from train.client.slurm.chain import Chain
from train.client.slurm.chaincost import integer, resources

_STATE_CAUSES = {"OUT_OF_MEMORY": "host_oom", "TIMEOUT": "walltime",
                 "PREEMPTED": "preempted", "NODE_FAIL": "node_failure",
                 "BOOT_FAIL": "node_failure"}
# the log rules' causes, most decisive first (the group's meeting and Lightning's banner
# are evidence for other findings, no causes)
_LOG_PRIORITY = [r.cause for r in logread.RULES
                 if r.cause not in (logread.RENDEZVOUS_DONE, logread.RANK_ZERO_BANNER)]


def _exit_code(chunk: Mapping[str, Any]) -> str | None:
    value = chunk.get("exit")
    return str(value) if value not in (None, "") else None


def _chunk_failed(chunk: Mapping[str, Any], events: Sequence[str]) -> bool:
    if chunk.get("state") in {*_STATE_CAUSES, "FAILED", "DEADLINE"}:
        return True
    return any(e in events for e in (contract.EV_FAILED, contract.EV_TIMEOUT,
                                     contract.EV_NO_PROGRESS))


def _log_order(ev: Evidence) -> tuple[int, int]:
    """Where a line stands in its file: the head's by line number, then the tail's by
    offset (a log searched in head and tail)."""
    return (0, ev.line) if ev.line else (1, ev.offset or 0)


def _after_meeting(done: Hits | None, hits: Hits) -> Hits:
    """The rendezvous lines after the last 'the group met' line of their file (where no
    file says the group met: all of them; a file without such a line where another has
    one: none, as the output and error logs are not ordered with each other). Lines the
    meeting follows are left out: members announce themselves before the group is
    complete. A job requeued (--requeue) appends each run to one log, where an earlier
    run's meeting says nothing of the later run's rendezvous."""
    met: dict[str, tuple[int, int]] = {}
    for ev in done.evidence() if done is not None else []:
        met[ev.file] = max(met.get(ev.file, _log_order(ev)), _log_order(ev))
    if not met:
        return hits
    left = Hits()
    for ev in hits.evidence():
        if ev.file in met and _log_order(ev) > met[ev.file]:
            left.add(ev)
    return left


def _rendezvous_partial(hits: Hits) -> str:
    """'3 of 8 ranks joined' from the members or clients the log names, else ''."""
    seen: set[int] = set()
    world = 0
    for ev in hits.evidence():
        m = logread._MEMBER_RE.search(ev.text)
        if m:
            seen.add(int(m.group(1)))
            world = max(world, int(m.group(3)))
        j = logread._JOINED_RE.search(ev.text)
        if j:
            return f"{j.group(1)} of {j.group(2)} ranks joined"
    if world and len(seen) < world and hits.count < world:
        return f"{hits.count} of {world} ranks announced themselves"
    return ""


def _scan_chunk(logs: Sequence[Path], scan: bool, full: bool, notes: list[str]
                ) -> dict[str, Hits]:
    """The rules' hits over a chunk's logs: each searched (scan; its head and tail only
    when large, unless full: a note says so) or the error log's end."""
    merged: dict[str, Hits] = {}
    for log in logs:
        if scan:
            result = logread.scan_log(log, full=full)
            found = result.hits
            if not result.whole:
                notes.append(f"{log}: searched its first {logread.HEAD_BYTES >> 20} MiB "
                             f"and last {logread.TAIL_BYTES_SCANNED >> 20} MiB, not the "
                             f"{result.skipped_bytes >> 20} MiB between (--full searches "
                             "every byte)")
        elif log.suffix == ".err":
            found = logread.scan_lines(log, logread.read_tail(log))
        else:
            continue
        for cause, hits in found.items():
            into = merged.setdefault(cause, Hits())
            for ev in hits.evidence():
                into.add(ev)
            into.count += hits.count - len(hits.evidence())
    return merged


# log causes that are a problem even in a chunk that ended well or still runs
_ALWAYS = ("nonfinite", "disk_full", "collective_timeout")  # (a GPU OOM may be recovered)


_CRASHES = {signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGSEGV}


def _signal_of(exit_code: str) -> int | None:
    """The signal that ended a step: sacct's 'CODE:SIGNAL', or a shell's 128+N."""
    code, _, sig = exit_code.partition(":")
    if sig.isdigit() and int(sig) > 0:
        return int(sig)
    if code.isdigit() and 128 < int(code) < 160:
        return int(code) - 128
    return None


def _state_detail(state: str, exit_code: str) -> str:
    return f"Slurm state {state}" + (f", exit {exit_code}" if exit_code else "")


@dataclass
class _Chunk:
    """One chunk as the rules see it: its Slurm state and exit code, the batch shell's
    events, its logs' hits (a cause Slurm's state explains is taken out) and error log."""

    chain: Chain
    number: int | None
    job_id: str | None
    state: str
    exit_code: str
    events: list[str]
    failed: bool
    hits: dict[str, Hits]
    err: Path | None

    @property
    def ended_early(self) -> bool:
        return self.failed or self.state == "CANCELLED" or contract.EV_TERMINATED in self.events

    def finding(self, cause: str, hits: Hits | None = None, detail: str = "") -> Finding:
        return _finding(self.chain, cause, self.number, self.job_id, hits, detail)


def _chunk_findings(chain: Chain, c: Mapping[str, Any], logs: Sequence[Path],
                    scan: bool, full: bool, notes: list[str]) -> list[Finding]:
    events = list(c.get("events") or [])
    failed = _chunk_failed(c, events)
    ch = _Chunk(chain, c["chunk"], c["job_id"], str(c.get("state") or "UNKNOWN"),
                _exit_code(c) or "", events, failed,
                _scan_chunk(logs, scan, full, notes) if (scan or failed) else {},
                next((p for p in logs if p.suffix == ".err"), None))
    out: list[Finding] = []
    # Slurm's own verdict first: it is certain
    state_cause = _state_cause(ch)
    if state_cause is not None:
        out.append(ch.finding(state_cause, ch.hits.pop(state_cause, None),
                              _state_detail(ch.state, ch.exit_code)))
    if ch.state == "PENDING" and "DependencyNeverSatisfied" in str(c.get("reason") or ""):
        out.append(ch.finding("dependency_never", detail=f"squeue reason {c.get('reason')}"))
    exc = _ending_exception(ch, state_cause, out)
    _add_log_findings(ch, exc, out)
    runs = max(1, events.count(contract.EV_STARTED))  # a requeued job's runs share its log
    alone = _ranks_alone(chain, ch.hits.get(logread.RANK_ZERO_BANNER), runs)
    if alone:
        out.append(ch.finding("ranks_alone", ch.hits.get(logread.RANK_ZERO_BANNER), alone))
    if failed and not out:
        out.append(_unknown_failure(ch))
    return out


def _state_cause(ch: _Chunk) -> str | None:
    """The cause Slurm's state says (a walltime the batch shell saw counts as one); a
    cancelled job's from slurmstepd's banner in its log."""
    cause = _STATE_CAUSES.get(ch.state)
    if cause is None and contract.EV_TIMEOUT in ch.events:
        cause = "walltime"
    if cause is None and ch.state == "CANCELLED":
        cause = next((c for c in ("walltime", "preempted", "node_failure") if c in ch.hits),
                     None)
    return cause


# torch's elastic agent (torchrun) ends with its own exception around a rank's failure,
# then a summary (torch/distributed/elastic/multiprocessing/errors/error_handler.py and
# __init__.py): "Root Cause (first observed failure):" and, per rank, "rank : R
# (local_rank: L)", "exitcode : N (pid: P)" (negative: the signal), "traceback : ..."
# (the rank's own traceback where it wrote an error file: @record; else a link)
_WRAPPER_RE = re.compile(logread._exception("ChildFailedError"))
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
    lines = logread.read_tail(path)
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
            elif logread._EXCEPTION_RE.match(text) and not _WRAPPER_RE.match(text):
                own = Evidence(str(path), number or 0, text[:logread.MAX_LINE])
    where = f"rank {rank} (local_rank {local})" if rank is not None else ""
    if own is not None:
        return RootCause(own, where, sig)
    # the agent's own traceback starts at the last "Traceback" before its exception
    end = next((i for i in range(wrap - 1, -1, -1)
                if lines[i][1].strip().startswith("Traceback (most recent call last)")), wrap)
    found = [(n, line.strip()) for n, line in lines[:end]
             if logread._EXCEPTION_RE.match(line.strip()) and not _WRAPPER_RE.match(line.strip())]
    prefixed = [(n, t, _PREFIX_RE.match(t)) for n, t in found]
    if rank is not None and any(m for _, _, m in prefixed):
        found = [(n, t) for n, t, m in prefixed if m and int(m.group(2)) == (
            rank if m.group(1).startswith("rank") else local)] or found
    if not found:
        return RootCause(None, where, sig)
    known = [(n, t) for n, t in found if logread.scan_lines(path, [(n, t)])]
    number, text = known[0] if known else found[-1]
    return RootCause(Evidence(str(path), number or 0, text[:logread.MAX_LINE]), where, sig)


def _ending_exception(ch: _Chunk, state_cause: str | None, out: list[Finding]
                      ) -> Evidence | None:
    """The last exception of a failed chunk's error log, which is what ended it (torchrun's
    wrapper stands for a rank's failure: that rank's own exception, or the signal that
    ended the rank); the signal that ended the step added to `out` as a finding: a SIGKILL
    no memory cause explains, or a native crash."""
    sig = _signal_of(ch.exit_code) if ch.failed else None
    ended = f"exit code {ch.exit_code}: the step"
    exc = logread.last_exception(ch.err) if ch.failed and ch.err is not None else None
    if exc is not None and ch.err is not None and _WRAPPER_RE.match(exc.text):
        root = launcher_root_cause(ch.err)
        if root is not None:
            exc = root.exception
            if exc is None and root.signal is not None and sig is None:
                sig = root.signal
                ended = f"torchrun's root cause, {root.rank or 'a rank'},"
    if sig == 9 and "host_oom" not in ch.hits and state_cause != "host_oom":
        out.append(ch.finding("sigkill", detail=f"{ended} was killed with SIGKILL"))
    elif sig == 6 and "teardown_abort" in ch.hits:  # the program's end, not a crash in it
        out.append(ch.finding("teardown_abort", ch.hits.pop("teardown_abort"),
                              f"{ended} died of SIGABRT"))
    elif sig in _CRASHES:
        out.append(ch.finding("native_crash",
                              detail=f"{ended} died of {signal.Signals(sig).name}"))
    return exc


def _add_log_findings(ch: _Chunk, exc: Evidence | None, out: list[Finding]) -> None:
    """The log rules' causes, in RULES' order with the ending exception's own cause first
    (or python_error where no rule knows it); in a chunk that ended well or still runs
    only those of _ALWAYS. `train: error` only where nothing else was found."""
    lead = logread.scan_lines(Path(exc.file), [(exc.line, exc.text)]) if exc is not None else {}
    if exc is not None and not lead:
        f = ch.finding("python_error", detail=exc.text)
        f.evidence = [exc]
        out.append(f)
    for cause in sorted(_LOG_PRIORITY, key=lambda c: c not in lead):  # (a stable sort)
        hits = ch.hits.get(cause) or lead.get(cause)
        if hits is None or (cause == "train_error" and out):
            continue
        if cause in lead and exc is not None and all(e.line != exc.line for e in
                                                     hits.evidence()):
            hits.add(exc)  # the deciding line is always shown
        if cause == "rendezvous":
            found = _rendezvous_finding(ch, hits)
        else:
            found = ch.finding(cause, hits) if ch.ended_early or cause in _ALWAYS else None
        if found is not None:
            out.append(found)


def _rendezvous_finding(ch: _Chunk, hits: Hits) -> Finding | None:
    """Ranks missing from the rendezvous: a partial count where the chunk ended early (or
    torch's own 'K/W clients joined'), else a timeout or closed rendezvous of a failed
    chunk. Member lines are often shown for rank 0 only: where the group says it met,
    their count is no evidence of a missing rank (a requeued job's runs share one log:
    only a meeting after the last rendezvous line counts)."""
    hits = _after_meeting(ch.hits.get(logread.RENDEZVOUS_DONE), hits)
    partial = _rendezvous_partial(hits) if hits.count else ""
    if partial and (ch.ended_early or "clients joined" in partial):
        return ch.finding("rendezvous", hits, partial)
    if ch.failed and any("Timeout" in e.text or "Closed" in e.text for e in hits.evidence()):
        return ch.finding("rendezvous", hits)
    return None


def _unknown_failure(ch: _Chunk) -> Finding:
    """A failed chunk no rule explains: the end of its error log as the evidence."""
    f = ch.finding("failed", detail=_state_detail(ch.state, ch.exit_code))
    f.cause = "unknown"
    tail = logread.read_tail(ch.err)[-6:] if ch.err is not None else []
    f.evidence = [Evidence(str(ch.err), n or 0, logread._excerpt(line, 0)) for n, line in tail]
    if not tail:
        f.fix = ("no error log was written: the job failed before its shell ran "
                 "(`sacct -j JOBID` or `scontrol show job JOBID` says why; a log folder "
                 "the compute nodes cannot write is a common cause)").replace(
                     "JOBID", str(ch.job_id))
    return f


def _ranks_alone(chain: Chain, banners: Hits | None, runs: int) -> str:
    """A multi-process job whose every process printed the rank-zero banner: each was
    global rank 0 of a world of its own (a bare Lightning Trainer() on several nodes
    trains the same model N times, alone). A healthy group prints it once a run (a
    requeued job's runs append to one log); alone, once per process and run."""
    res = resources(chain.record)
    nodes = integer(res.get("nodes")) or 1
    per_node = integer(res.get("processes_per_node")) or integer(res.get("ntasks_per_node")) or 1
    procs = nodes * per_node
    if banners is None or procs < 2 or banners.count < procs * runs:
        return ""
    return (f"each of the job's {procs} processes printed Lightning's rank-zero banner "
            f"('GPU available: ...', {banners.count} times): every one was rank 0 of a "
            "world of its own")


def idle_gpus(chain: Chain) -> list[Finding]:
    """GPUs the utilisation watch saw idle for the job's idle time (its settings are in
    the chain's record; the watch's defaults otherwise)."""
    threshold, minutes = idle_settings(chain.record)
    out = []
    for item in idle_findings(chain.run_dir, threshold, minutes):
        f = _finding(chain, "idle_gpu", None, None, detail=item.describe())
        f.evidence = [Evidence(str(Path(item.file).absolute()), item.first_line,
                               f"GPU {item.gpu}: {item.samples} samples under "
                               f"{threshold:g}% (at most {item.max_util:g}%)")]
        out.append(f)
    return out
