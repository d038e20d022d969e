"""`train doctor`: what happened to each chunk of a run, the cause with its evidence (log
file and line), and the fix as the flags to change.

It reads what the chain left: its record (chain.json), events (chain.events), the job
logs, Slurm's state and exit code of each job (squeue, then sacct, or the job completion
log where there is no accounting: `job_states`), the run's status.json and the GPU
utilisation samples. Logs are streamed, never read whole: each is searched for the rules'
literal needles (with grep -F where the system has it, else in blocks), and only the
lines that hold one are matched against the rules' patterns, so a gigabyte of log costs
about a second and flat memory.

Each cause is one rule (RULES, LogRule for log messages; the Slurm-state and event rules in
`_state_findings`). A run with no finding is healthy (exit 0); any finding is exit 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from train.errors import TrainError, UsageError, first_line
from train.jsonio import read_bounded
from train.runtime.hostmem import DEFAULT_WORKER_MEM_MB
from train.slurm import contract
from train.slurm.scheduler import (
    ACTIVE_STATES,
    Chain,
    chain_dirs,
    chain_status,
    find_run,
    idle_settings,
    load_chain,
    parse_events,
)

MAX_LINE = 400  # evidence lines are cut to this many characters
READ_LINE = 1 << 16  # of a longer line only its first 64 KiB are matched
TAIL_BYTES = 64 * 1024  # the end of an error log shown for an unknown failure
_KEEP = 3  # evidence lines kept per rule and file: the first and the last ones


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int  # 1-based; 0 where unknown (in the tail of a log searched in head and tail)
    text: str
    offset: int | None = None  # where the line starts in the file, where line is unknown

    def as_dict(self) -> dict[str, Any]:
        out = {"file": self.file, "line": self.line, "text": self.text}
        return out if self.offset is None else {**out, "offset": self.offset}

    @property
    def where(self) -> str:
        """file:line, or file (byte N) where only the line's offset is known."""
        if self.line:
            return f"{self.file}:{self.line}"
        return self.file if self.offset is None else f"{self.file} (byte {self.offset})"


@dataclass
class Finding:
    cause: str
    title: str  # what happened, in a few words
    fix: str  # what to change: flags and values where they are known
    chunk: int | None = None
    job_id: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "title": self.title, "detail": self.detail,
                "fix": self.fix, "chunk": self.chunk, "job_id": self.job_id,
                "evidence": [e.as_dict() for e in self.evidence]}


@dataclass(frozen=True)
class LogRule:
    """A cause recognised by a message in a job log.

    `needles`: literal substrings that select candidate lines (long and distinctive: they
    are what the fast search looks for); `pattern`: refines a candidate line (None: every
    candidate counts). `source`: where the message's format comes from.
    """

    cause: str
    needles: tuple[str, ...]
    pattern: re.Pattern[str] | None
    source: str


# A line's own prefix before a message: torch's "[rank1]:", torchrun --tee's "[default1]:"
# (the local rank), srun --label's "1: ", Open MPI's "[1,0]<stderr>:". An exception counts
# where it starts the line (after such a prefix): "Warning: ImportError: apex not
# installed" or a path ".../MemoryError_logs/" is not one.
_LEAD = r"^\s*(?:\[(?:rank ?|default)\d+\]:?\s*|\d+:\s+|\[[\d,]+\]<std\w+>:\s*)?"


def _exception(*names: str) -> str:
    """A pattern for a line that is one of these exceptions (module prefixes allowed)."""
    return _LEAD + r"(?:[\w.]+\.)?(?:" + "|".join(names) + r")\b(?::|$)"


def _banner(reason: str) -> str:
    """slurmstepd's own line when it ends a job or step (src/slurmd/slurmstepd/req.c)."""
    return r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO " + reason


RENDEZVOUS_DONE = "rendezvous_complete"
RANK_ZERO_BANNER = "rank_zero_banner"
# Ordered by how decisive a message is: when one log holds several, the first rule that
# matched explains the failure and the others are listed as well.
RULES: tuple[LogRule, ...] = (
    LogRule("host_oom", ("oom_kill event", "oom-kill event", "Exceeded job memory limit",
                         "MemoryError", "Cannot allocate memory"),
            re.compile(r"oom[_-]kill event|Exceeded job memory limit|Cannot allocate memory|"
                       + _exception("MemoryError")),
            "slurmstepd (task/cgroup): 'Detected N oom_kill events in StepId=J.S. "
            "Some of the step tasks have been OOM Killed.'; older: 'Exceeded job memory "
            "limit'; Python under a memory limit: 'MemoryError'; ENOMEM: 'Cannot allocate "
            "memory'"),
    LogRule("gpu_oom", ("CUDA out of memory", "OutOfMemoryError", "while preallocating",
                        "CUBLAS_STATUS_ALLOC_FAILED", "HIP out of memory"),
            re.compile(r"(?:CUDA|HIP) out of memory|while preallocating|"
                       r"CUBLAS_STATUS_ALLOC_FAILED|" + _exception("OutOfMemoryError")),
            "torch: 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "...'; ours: PreallocationError 'out of memory on cuda:0 ... while "
            "preallocating ...'"),
    LogRule("rendezvous", ("clients joined", "RendezvousTimeoutError",
                           "RendezvousClosedError", "waiting for clients",
                           "Initializing distributed:"),
            None, "torch c10d TCPStore: 'Timed out after N seconds waiting for clients. "
            "K/W clients joined.'; torch elastic: RendezvousTimeoutError; Lightning: "
            "'Initializing distributed: GLOBAL_RANK: r, MEMBER: m/W'"),
    LogRule("collective_timeout", ("collective operation timeout", "Watchdog caught",
                                   "ms for recv operation", "NCCL communicator was aborted",
                                   "ProcessGroupNCCL's watchdog"),
            None, "torch ProcessGroupNCCL: '[Rank r] Watchdog caught collective operation "
            "timeout: WorkNCCL(...) ran for N milliseconds before timing out'; gloo: "
            "'Timed out waiting Nms for recv operation to complete'"),
    LogRule("walltime", ("DUE TO TIME LIMIT",), re.compile(_banner("TIME LIMIT")),
            "slurmstepd: '*** JOB J ON NODE CANCELLED AT T DUE TO TIME LIMIT ***'"),
    LogRule("preempted", ("DUE TO PREEMPTION",), re.compile(_banner("PREEMPTION")),
            "slurmstepd: '*** JOB J ON NODE CANCELLED AT T DUE TO PREEMPTION ***'"),
    LogRule("node_failure", ("DUE TO NODE FAILURE", "Node failure on"),
            re.compile(_banner("NODE FAILURE") + r"|srun: error: Node failure on"),
            "slurmstepd: '... DUE TO NODE FAILURE ***'; srun: 'srun: error: Node failure "
            "on NODE'"),
    LogRule("nonfinite", ("without overflow", "non-finite", "nan or inf", "inf or nan",
                          "returned nan values", "loss is nan", "Loss is NaN"),
            re.compile(r"to type at::Half without overflow|is non-finite|"
                       r"non-finite (?:loss|value)|(?i:\bloss (?:is|=|:) ?nan\b)|"
                       r"returned nan values|(?:found|detected) (?:nan or inf|inf or nan)",
                       re.IGNORECASE),
            "torch: 'RuntimeError: value cannot be converted to type at::Half without "
            "overflow' (a -1e9 mask in fp16), clip_grad_norm_: 'the total norm ... is "
            "non-finite'; anomaly mode: 'Function X returned nan values'; Lightning/user "
            "loops: 'loss is nan', 'detected inf or nan'"),
    LogRule("cuda_driver", ("driver on your system is too old",
                            "driver version is insufficient",
                            "the NVIDIA driver is too old", "cudaErrorInsufficientDriver"),
            None, "torch: 'The NVIDIA driver on your system is too old (found version N)'; "
            "CUDA runtime: 'CUDA driver version is insufficient for CUDA runtime version'; "
            "ours: 'CUDA is unusable: the NVIDIA driver is too old for this torch'"),
    LogRule("missing_payload", ("needs the StarCraft II binary", "StarCraft II binary",
                                "MoveToBeacon", "OPENSCENE_DATA_ROOT",
                                "NAVSIM_DEVKIT_ROOT", "needs pysc2"),
            re.compile(r"train: error|Error\b|error:|No such file|not found|does not exist|"
                       r"is broken|has no "),
            "ours (EnvironmentUnavailable): 'workload sc2 needs the StarCraft II "
            "binary: SC2PATH=...'; NAVSIM: a KeyError or missing path naming "
            "OPENSCENE_DATA_ROOT / NAVSIM_DEVKIT_ROOT"),
    LogRule("module_missing", ("module(s) are unknown", "Lmod has detected the following",
                               "Unable to locate a modulefile", "module: command not found"),
            None, "Lmod: 'Lmod has detected the following error: The following module(s) "
            "are unknown: \"x\"'; Environment Modules: 'ERROR: Unable to locate a "
            "modulefile for 'x''"),
    LogRule("image_unopenable", ("could not open image", "FATAL:   container creation failed",
                                 "FATAL:   Unable to handle", "FATAL:   image format",
                                 "is not a valid SIF", "No such image:"),
            None, "Apptainer: 'FATAL:   could not open image /p/x.sif: ...', 'FATAL:   "
            "Unable to handle docker://... uri'; Docker: 'No such image: NAME'"),
    LogRule("program_missing", ("execve():", ": command not found", "exec format error"),
            re.compile(r"execve\(\)|(?<!module): command not found|exec format error"),
            "srun: 'srun: error: NODE: task 0: execve(): PROG: No such file or directory'; "
            "bash: 'PROG: command not found'"),
    LogRule("import_error", ("ModuleNotFoundError", "ImportError"),
            re.compile(_exception("ModuleNotFoundError", "ImportError")),
            "Python: 'ModuleNotFoundError: No module named 'x'', 'ImportError: cannot "
            "import name ...', 'ImportError: libX.so: cannot open shared object file'"),
    LogRule("stop_signal_unhandled", ("died of the stop signal",
                                      "reached a worker that has no handler"),
            None, "ours: the batch shell's 'the program died of the stop signal USR1: it "
            "needs a handler ...'; train launch under torchrun: 'the stop signal USR1 "
            "reached a worker that has no handler for it'"),
    LogRule("disk_full", ("No space left on device", "Disk quota exceeded",
                          "[Errno 28]", "[Errno 122]"),
            None, "the kernel's ENOSPC and EDQUOT as Python and tools print them"),
    LogRule("train_error", ("train: error: ",), None,
            "ours: the CLI's one-line error for bad input or a missing resource"),
    # not a cause: Lightning's banner, printed by global rank 0 only; every process of a
    # multi-process job printing it means each trained alone (ranks_alone)
    LogRule(RANK_ZERO_BANNER, ("GPU available: ",),
            re.compile(r"GPU available: (?:True|False)\b"),
            "Lightning (trainer/connectors/accelerator_connector.py, rank_zero_info): 'GPU "
            "available: True (cuda), used: True'"),
    # not a cause: the group met (a partial count of member lines is then no finding)
    LogRule(RENDEZVOUS_DONE, ("All distributed processes registered",
                              "Rendezvous complete for workers"), None,
            "Lightning (lightning_fabric/utilities/distributed.py, rank 0 only): 'All "
            "distributed processes registered. Starting with W processes'; torch elastic "
            "agent: '[default] Rendezvous complete for workers. Result: ...'"),
)
RULES_BY_CAUSE = {r.cause: r for r in RULES}
_ALL_NEEDLES = tuple(sorted({n for r in RULES for n in r.needles}))
_MEMBER_RE = re.compile(r"GLOBAL_RANK: (\d+), MEMBER: (\d+)/(\d+)")
_JOINED_RE = re.compile(r"(\d+)/(\d+) clients joined")
_EXCEPTION_RE = re.compile(_LEAD + r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))"
                           r"(?:: ?(.*))?$")


@dataclass
class Hits:
    """What one rule found in one file: the first and the last few lines, and a count."""

    count: int = 0
    first: list[Evidence] = field(default_factory=list)
    last: deque[Evidence] = field(default_factory=lambda: deque(maxlen=_KEEP))

    def add(self, ev: Evidence) -> None:
        self.count += 1
        if len(self.first) < _KEEP:
            self.first.append(ev)
        else:
            self.last.append(ev)

    def evidence(self) -> list[Evidence]:
        return [*self.first, *self.last]


def _grep(needles: Sequence[str], path: Path | None) -> subprocess.Popen[bytes]:
    """grep -F for the needles in `path`, or in its stdin (a pipe) where path is None;
    each output line is LINE:OFFSET:TEXT."""
    argv = ["grep", "-a", "-n", "-b", "-F"]
    for needle in needles:
        argv += ["-e", needle]
    if path is not None:
        argv += ["--", str(path)]
    env = {**os.environ, "LC_ALL": "C"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            stdin=subprocess.PIPE if path is None else subprocess.DEVNULL)


# (line number or None where unknown, the line, its offset in the file or None)
Line = tuple[int | None, str, int | None]


def _grep_output(proc: subprocess.Popen[bytes],
                 place: Callable[[int, int], tuple[int | None, int | None]]
                 ) -> Iterator[Line]:
    """grep's lines as (line, text, offset), `place` turning grep's line number and byte
    offset into the file's. Read at most 64 KiB at a time: a matched line of any length
    costs no more memory. grep is killed when the reader stops early."""
    assert proc.stdout is not None
    try:
        at_start = True
        while True:
            raw = proc.stdout.readline(READ_LINE)
            if not raw:
                break
            if at_start:  # else the rest of a line longer than one read: skipped
                number, _, rest = raw.partition(b":")
                offset, _, text = rest.partition(b":")
                if number.isdigit() and offset.isdigit():
                    line, at = place(int(number), int(offset))
                    yield line, text.rstrip(b"\r\n")[:READ_LINE].decode(
                        "utf-8", "replace"), at
            at_start = raw.endswith(b"\n")
    finally:
        proc.kill()
        proc.wait()


def _candidate_lines_grep(path: Path, needles: Sequence[str]) -> Iterator[Line]:
    """(line number, line, None) of every line of the file holding a needle, from grep -F
    (streamed)."""
    with _grep(needles, path) as proc:
        yield from _grep_output(proc, lambda number, _offset: (number, None))


def _feed_all(path: Path, regions: Sequence[tuple[int, int]],
              sinks: list[IO[bytes]]) -> None:
    """Bytes [start, end) of each region of `path`, read once, into every sink (the greps'
    stdins, one per group of rules), then close them. A sink whose grep left early (it was
    killed) is dropped."""
    live = list(sinks)
    try:
        with open(path, "rb") as fh:
            for start, end in regions:
                fh.seek(start)
                left = end - start
                while left > 0 and live:
                    block = fh.read(min(left, 1 << 20))
                    if not block:
                        break
                    for sink in list(live):
                        try:
                            sink.write(block)
                        except (OSError, ValueError):
                            live.remove(sink)
                    left -= len(block)
    except OSError:  # the file went away
        pass
    finally:
        for sink in sinks:
            with contextlib.suppress(OSError, ValueError):
                sink.close()


def _candidate_lines_python(path: Path, needles: Sequence[str],
                            block: int = 8 << 20) -> Iterator[Line]:
    """The same without grep: blocks of whole lines, searched for each needle."""
    encoded = [n.encode() for n in needles]
    with open(path, "rb") as fh:
        carry = b""
        first_line = 1
        while True:
            data = fh.read(block)
            if not data and not carry:
                return
            if data:
                data = carry + data
                cut = data.rfind(b"\n") + 1
                if cut == 0 and len(data) < 4 * block:  # one very long line: read on
                    carry = data
                    continue
                chunk, carry = (data[:cut], data[cut:]) if cut else (data, b"")
            else:
                chunk, carry = carry, b""
            starts = set()
            for needle in encoded:
                at = chunk.find(needle)
                while at >= 0:
                    start = chunk.rfind(b"\n", 0, at) + 1
                    starts.add(start)
                    end = chunk.find(b"\n", at)
                    at = chunk.find(needle, end + 1) if end >= 0 else -1
            for start in sorted(starts):
                end = chunk.find(b"\n", start)
                line = chunk[start:end if end >= 0 else len(chunk)]
                number = first_line + chunk.count(b"\n", 0, start)
                yield number, line[:READ_LINE].decode("utf-8", "replace"), None
            first_line += chunk.count(b"\n")


def candidate_lines(path: Path, needles: Sequence[str] = _ALL_NEEDLES
                    ) -> Iterator[Line]:
    if shutil.which("grep"):
        yield from _candidate_lines_grep(path, needles)
    else:
        yield from _candidate_lines_python(path, needles)


def _groups(rules: Sequence[LogRule], count: int) -> list[list[LogRule]]:
    """The rules in `count` groups of about as many needles each (grep's time grows with
    the number of fixed strings: two greps of half the needles each, on two cores, take
    about half the time of one)."""
    groups: list[list[LogRule]] = [[] for _ in range(max(1, count))]
    sizes = [0] * len(groups)
    for rule in sorted(rules, key=lambda r: -len(r.needles)):
        i = sizes.index(min(sizes))
        groups[i].append(rule)
        sizes[i] += len(rule.needles)
    return [g for g in groups if g]


WHOLE_LIMIT = 256 * 2**20  # logs up to this size are searched whole
HEAD_BYTES = 32 * 2**20  # larger ones: their start (start-up: rendezvous, imports, images)
TAIL_BYTES_SCANNED = 128 * 2**20  # and their end (what ended the job), unless --full


_PROBE = 64 * 1024  # a line end is looked for in steps of this many bytes
_PROBE_MAX = 1 << 20  # and no further: a line longer than this is cut there


def _line_end(fh: IO[bytes], at: int, backward: bool) -> int:
    """The offset just after the line end nearest `at`: before it (backward) or from it
    on; `at` itself where none is within _PROBE_MAX. Reads only what it looks at."""
    for step in range(_PROBE, _PROBE_MAX + 1, _PROBE):
        if backward:
            fh.seek(max(0, at - step))
            block = fh.read(min(_PROBE, at - max(0, at - step)))
            cut = block.rfind(b"\n")
            if cut >= 0:
                return max(0, at - step) + cut + 1
            if at - step <= 0:
                return at
        else:
            fh.seek(at + step - _PROBE)
            block = fh.read(_PROBE)
            cut = block.find(b"\n")
            if cut >= 0:
                return at + step - _PROBE + cut + 1
            if len(block) < _PROBE:
                return at
    return at


def _regions(path: Path, size: int) -> list[tuple[int, int]]:
    """A large log's head and tail, cut at line ends: [(start, end)]. Nothing between them
    is read (their line numbers are not counted: a tail line is placed by its offset)."""
    with open(path, "rb") as fh:
        head_end = _line_end(fh, HEAD_BYTES, backward=True)
        tail_start = _line_end(fh, size - TAIL_BYTES_SCANNED, backward=False)
    return [(0, head_end), (tail_start, size)]


@dataclass
class Scan:
    """What a log search covered: the whole file, or its head and tail."""

    hits: dict[str, Hits]
    whole: bool = True
    skipped_bytes: int = 0


def scan_log(path: Path, rules: Sequence[LogRule] = RULES, full: bool = False) -> Scan:
    """Every rule's hits in one log, streamed. Logs over WHOLE_LIMIT are searched in their
    first HEAD_BYTES and last TAIL_BYTES_SCANNED (what ended a job is at its end, start-up
    trouble at its start; the middle of a gigabyte log is progress lines) unless `full`.
    With grep: one grep per CPU (at most two) for a share of the rules."""
    try:
        if not path.is_file():
            return Scan({})
        size = path.stat().st_size
    except OSError:
        return Scan({})
    if not shutil.which("grep"):
        needles = tuple(sorted({n for r in rules for n in r.needles}))
        return Scan(scan_lines(path, _candidate_lines_python(path, needles), rules))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    groups = _groups(rules, min(2, cpus))
    regions: list[tuple[int, int]] = []
    if size > WHOLE_LIMIT and not full:
        regions = _regions(path, size)
    skipped = regions[1][0] - regions[0][1] if regions else 0
    procs = [_grep(sorted({n for r in g for n in r.needles}), None if regions else path)
             for g in groups]
    found: list[dict[str, Hits]] = [{} for _ in groups]
    failures: list[BaseException] = []

    def place(number: int, offset: int) -> tuple[int | None, int | None]:
        """grep's line and offset in the head-then-tail stream as the file's: the head's
        lines keep their numbers, a tail line has its offset in the file."""
        if offset < regions[0][1]:
            return number, None
        return None, regions[1][0] + offset - regions[0][1]

    def scan(i: int, group: list[LogRule]) -> None:
        try:
            lines = _grep_output(procs[i], place if regions else
                                 (lambda number, _offset: (number, None)))
            found[i] = scan_lines(path, lines, group)
        except BaseException as exc:  # re-raised below, in the caller's thread
            failures.append(exc)

    threads = [threading.Thread(target=scan, args=(i, g), daemon=True)
               for i, g in enumerate(groups)]
    if regions:  # one reader for every grep: each searched byte is read once
        sinks = [p.stdin for p in procs if p.stdin is not None]
        threads.append(threading.Thread(target=_feed_all, args=(path, regions, sinks),
                                        daemon=True))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
    if failures:
        raise failures[0]
    return Scan({cause: hits for part in found for cause, hits in part.items()},
                whole=skipped == 0, skipped_bytes=skipped)


def scan_lines(path: Path, lines: Iterable[tuple[int | None, str] | Line],
               rules: Sequence[LogRule] = RULES) -> dict[str, Hits]:
    """The rules' hits in lines already read (the end of a log): (line number, text) or
    (line number, text, offset in the file)."""
    found: dict[str, Hits] = {}
    for item in lines:
        number, line = item[0], item[1]
        offset = item[2] if len(item) == 3 else None
        for rule in rules:
            at = min((i for i in (line.find(n) for n in rule.needles) if i >= 0),
                     default=-1)
            if at >= 0 and (rule.pattern is None or rule.pattern.search(line)):
                found.setdefault(rule.cause, Hits()).add(
                    Evidence(str(path), number or 0, _excerpt(line, at),
                             None if number else offset))
    return found


def _excerpt(line: str, at: int) -> str:
    """A line as evidence: whole when short, else MAX_LINE characters around `at` (a JSON
    log line of kilobytes keeps the words that matched)."""
    text = line.strip()
    if len(text) <= MAX_LINE:
        return text
    start = max(0, min(at - MAX_LINE // 4, len(line) - MAX_LINE))
    return ("..." if start else "") + line[start:start + MAX_LINE].strip() + "..."


def read_tail(path: Path, size: int = TAIL_BYTES) -> list[tuple[int | None, str]]:
    """The last lines of a file (at most `size` bytes), with line numbers where the whole
    file was read (else None: counting them would read it all)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            length = fh.tell()
            fh.seek(max(0, length - size))
            data = fh.read(size)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if length > size:
        return [(None, line) for line in lines[1:]]  # the first one is cut
    return [(i + 1, line) for i, line in enumerate(lines)]


def last_exception(path: Path) -> Evidence | None:
    """The last Python exception line ('XError: message') near the end of a log."""
    for number, line in reversed(read_tail(path)):
        if _EXCEPTION_RE.match(line.strip()):
            return Evidence(str(path), number or 0, line.strip()[:MAX_LINE])
    return None


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


# -- what a run is made of -------------------------------------------------------------
def newest_run(runs_root: Path) -> Path:
    """The run whose chain was submitted last (chain.json's time)."""
    dirs = chain_dirs(runs_root)
    if not dirs:
        raise UsageError(f"run: no runs under {runs_root} (give a run name, a job id or a "
                         "run directory, or --runs the directory that holds them)")
    return max(dirs, key=lambda d: (d / contract.CHAIN_RECORD).stat().st_mtime)


def _logs_of(chain: Chain, job_id: str) -> list[Path]:
    logs = chain.run_dir.absolute() / contract.LOG_DIR  # evidence usable from anywhere
    try:
        return sorted(p for p in logs.glob(f"*-{job_id}.*")
                      if p.suffix in (".out", ".err") and p.is_file())
    except OSError:
        return []


def _read_json(path: Path) -> dict[str, Any]:
    """A small JSON file of the run (status.json) as a mapping; {} for anything else (not
    a regular file, over 1 MiB, not JSON). NaN and Infinity read as null: --json output
    stays strict JSON."""
    raw = read_bounded(path, 1 << 20)
    try:
        data = json.loads(raw or b"", parse_constant=lambda _name: None)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _resources(chain: Chain) -> dict[str, Any]:
    res = chain.record.get("resources")
    return res if isinstance(res, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gib(mb: int) -> str:
    return f"{mb / 1024:.0f}G" if mb >= 1024 else f"{mb}M"


# -- fixes ----------------------------------------------------------------------------
# a job whose memory is at least this share of its node's has (nearly) the whole node:
# more --mem cannot help it
_NEAR_WHOLE_NODE = 0.9


def _fix_host_oom(chain: Chain, _hits: Hits | None) -> str:
    """Fewer DataLoader workers first where they can be what filled the memory (each
    counted at least at DEFAULT_WORKER_MEM_MB, the field's evidence: the same figure and
    the same arithmetic as the job's up-front check) or where the job already has (nearly)
    its whole node; more --mem only where neither is so. A command's own workers, which
    train does not know, are named first."""
    res = _resources(chain)
    procs, workers = _int(res.get("processes_per_node")), _int(res.get("workers"))
    recorded, mem = _int(res.get("worker_mem_mb")), _int(res.get("mem_mb"))
    node = _int(res.get("node_mem_mb"))
    if not (procs and mem):
        return ("fewer DataLoader workers (--workers) or more host memory (--mem); "
                "`train launch` caps the workers by memory when --worker-mem says what one "
                "needs")
    whole = node is not None and mem >= node * _NEAR_WHOLE_NODE
    on_node = f"the job has {'the whole' if mem >= node else 'nearly the whole'} " \
        f"{_gib(node)} node, so more --mem cannot help" if whole and node else ""
    if workers:
        per = max(recorded or 0, DEFAULT_WORKER_MEM_MB)
        need = procs * workers * per
        why = f"{procs} processes x {workers} DataLoader workers, each counted at {_gib(per)}"
        if recorded is not None and recorded < per:
            why += (f" (not the job's --worker-mem {_gib(recorded)}: the field's 32 workers "
                    "on a 256 GB node were OOM-killed, more than 8G each)")
        if need > mem:
            fit = min(workers - 1, mem // (procs * per))
            text = (f"--workers {fit}: {why}, need {_gib(need)} of the job's {_gib(mem)} "
                    f"per node; {_gib(mem)} // ({procs} x {_gib(per)}) = "
                    f"{mem // (procs * per)} per process fit")
            if fit == 0:
                text += " (--workers 0 loads the data in the training process itself)"
            return text + (f"; {on_node}" if on_node else "; or more --mem")
        if whole:
            return (f"--workers {workers - 1}: {on_node}, and the DataLoader workers are "
                    f"what can give memory back ({why}: {_gib(need)}); then hold less in "
                    "memory (a smaller dataset or replay buffer)")
    up_to = f" (up to the node's {_gib(node)}, or --mem 0 for all of it)" if node else ""
    if not workers and chain.record.get("entry") == "command":
        # the program's own DataLoader (its num_workers), which train neither sets nor
        # counts: the field notes' case, a Lightning script's 8 workers per GPU
        return (f"fewer DataLoader workers in the program (its num_workers: train does not "
                f"set or count them for --entry command; {procs} processes per node x N "
                "workers, each a copy of the dataset's state, often several GB: the field's "
                "8 per GPU on 256 GB nodes were OOM-killed, 2 per GPU fit); "
                + (f"{on_node}" if on_node else f"or more --mem{up_to}"))
    if whole:
        return (f"{on_node}: the training processes themselves fill it (the model, the "
                "replay buffer or the dataset held in memory): hold less in memory, or "
                "nodes with more memory (--partition / --constraint)")
    used = (f"the DataLoader workers take about {_gib(procs * workers * recorded)} of the "
            f"job's {_gib(mem)}, so " if workers and recorded else "")
    return (f"more --mem{up_to}: {used}the model, the replay buffer or the dataset in "
            "memory took the rest")


def _fix_gpu_oom(chain: Chain, hits: Hits | None) -> str:
    res = _resources(chain)
    batch = _int(res.get("batch_size"))
    first_step = hits is not None and any(
        "preallocating" in e.text or "optimizer" in e.text for e in hits.evidence())
    smaller = f"--batch-size {max(1, batch // 2)}" if batch else "a smaller --batch-size"
    text = (f"{smaller}, or --precision bf16/fp16; on a shared GPU, --min-free-mb N with "
            f"--fallback-batch {max(1, batch // 2) if batch else 'B'} waits for memory and "
            "then trains with the smaller batch")
    if first_step:
        return ("it failed at the optimizer's first step (Adam's state is allocated then): "
                + text)
    return text


def _fix_rendezvous(chain: Chain, hits: Hits | None) -> str:
    res = _resources(chain)
    launch, gpus = res.get("launch"), _int(res.get("gpus_per_node"))
    ntasks = _int(res.get("ntasks_per_node"))
    base = ("every rank must be started by srun, one task per GPU with --launch tasks "
            "(--ntasks-per-node = --gpus-per-node) or one task per node with --launch "
            "torchrun; a script run by sbatch alone starts only rank 0")
    if launch == "tasks" and gpus and ntasks and gpus != ntasks:
        return f"--ntasks-per-node {gpus} (one task per GPU; it is {ntasks}); " + base
    return base


_FIXES: dict[str, Callable[[Chain, Hits | None], str]] = {
    "host_oom": _fix_host_oom,
    "gpu_oom": _fix_gpu_oom,
    "rendezvous": _fix_rendezvous,
}
_TITLES_FIXES: dict[str, tuple[str, str]] = {
    "host_oom": ("host out of memory: the kernel's OOM killer ended tasks", ""),
    "gpu_oom": ("GPU out of memory", ""),
    "rendezvous": ("the ranks never all met (rendezvous incomplete)", ""),
    "collective_timeout": (
        "a collective operation timed out (one rank stopped answering)",
        "find the rank that fell behind in its log (a DataLoader stall, a rank that "
        "crashed, uneven work per rank); NCCL_DEBUG=INFO and TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
        "show which; NCCL_SOCKET_IFNAME must name a network every node has"),
    "walltime": (
        "killed at the walltime before checkpointing",
        "raise --signal-margin (the stop signal comes that many seconds before the "
        "walltime; checkpointing must fit in it) or keep --time-budget on; with chunks, a "
        "shorter --time and more --max-chunks lose less"),
    "preempted": (
        "preempted by a higher-priority job",
        "submit the same job again to resume from the last checkpoint; --requeue resumes "
        "in the same job on preemptible partitions"),
    "node_failure": (
        "a node failed under the job",
        "submit the same job again (it resumes from the last checkpoint); add "
        "--exclude NODE if the same node fails again"),
    "nonfinite": (
        "non-finite values (NaN/inf) or an fp16 overflow",
        "--precision bf16 (fp16's range ends at 65504: a -1e9 attention mask or a large "
        "loss overflows) or fp32; a mask fill of torch.finfo(dtype).min instead of -1e9; "
        "a lower --lr"),
    "cuda_driver": (
        "torch's CUDA build is newer than the node's NVIDIA driver",
        "an image built for that driver (containers/base.def: BASE_IMAGE and BASE_LOCK "
        "for an older CUDA), or nodes with a newer driver (--constraint / --partition); "
        "`train doctor --preflight` compares them where the profile records drivers"),
    "missing_payload": (
        "the game or the dataset is missing where the job looked",
        "the sc2 image (it carries the game; SC2PATH), or for NAVSIM --navsim-data DIR on "
        "a file system the compute nodes mount, bound into the container"),
    "module_missing": (
        "a module the job loads does not exist on the node",
        "fix the profile's `modules:` lines (`module avail apptainer` on a compute node "
        "lists what exists), or drop them where the runtime is on the default PATH"),
    "image_unopenable": (
        "the container image could not be opened",
        "build or copy the image to a file system the compute nodes mount (not /tmp), "
        "check its path in --image, and `train doctor --preflight` to try opening it"),
    "import_error": (
        "a Python import failed inside the container",
        "rebuild the image with the package (its lock in containers/requirements/), or "
        "remove what leaks in from the host (PYTHONPATH, a conda env: config.json's "
        "process_env shows them)"),
    "disk_full": (
        "the disk or the quota is full",
        "put --out on scratch (the profile's scratch_root), free space or ask for quota; "
        "a checkpoint keeps only the last two, so a full disk is usually something else "
        "in the same quota"),
    "train_error": ("`train` refused its input or a resource", "see the message: it names "
                    "the field and what is allowed"),
    "dependency_never": (
        "a chunk waits on a dependency that can never be met",
        "`train cancel NAME` and submit the same job again (it resumes from the last "
        "checkpoint); the chunk before it failed or was cancelled"),
    "idle_gpu": (
        "the GPUs sat idle",
        "check that the program uses the GPU (--device cuda) and that the DataLoader keeps "
        "up (--workers); NYU Torch cancels jobs whose GPUs stay idle"),
    "sigkill": (
        "killed with SIGKILL and no message said why",
        "if nobody sent it (scancel --signal=KILL, a stop that outlived KillWait), it was "
        "the kernel's OOM killer: see host_oom's fix (fewer --workers, more --mem)"),
    "native_crash": (
        "the program crashed in native code",
        "a C/C++ library crashed (CUDA, NCCL, a compiled extension): the error log's end "
        "names where; often the image's libraries do not match the node (run with "
        "--runtime apptainer --image, which binds the driver with --nv) or a GPU fault "
        "(`nvidia-smi -q` on that node)"),
    "unsaved": (
        "the chunk was stopped before the program saved anything",
        "the program must save before the stop comes: a longer --time (or a shorter "
        "interval between its saves), and --save-path for where it saves when that is "
        "outside the run folder; submitting the same run again continues at the next "
        "chunk"),
    "ranks_alone": (
        "the processes never joined one group: each trained alone (world size 1)",
        "give the Trainer the job's shape: Trainer(num_nodes=N, devices=GPUS_PER_NODE, "
        "strategy='ddp') as the job has them (with --launch tasks Lightning then takes its "
        "ranks from Slurm); a plain torch script must call "
        "torch.distributed.init_process_group (train launch sets its environment)"),
    "stop_signal_unhandled": (
        "the program died of the walltime stop signal (it has no handler for it)",
        "give the program a handler (on the signal: checkpoint, then exit 0; Lightning "
        "has one under SLURM in --launch tasks), or submit with --stop-signal none and let "
        "the program save by itself before the walltime (README, \"Running a program you "
        "did not write\")"),
    "program_missing": (
        "the program to run was not found",
        "the first word after `--` must exist on the nodes (runtime none) or inside the "
        "image: an absolute path or a name on its PATH"),
    "no_jobs": ("the chain records no job", "chain.ids is missing or unreadable: `train "
                "submit` writes it; submit the same job again"),
    "python_error": ("the program raised an exception", "see the exception and the lines "
                     "before it in the error log"),
    "failed": ("the job failed", "see the end of the error log shown here (`train logs "
               "NAME --err --job JOBID` for all of it)"),
    "cancelled": (
        "cancelled with scancel, not `train cancel`",
        "if you did not cancel it, the site did (an idle-GPU or a fair-share policy: see "
        "`train status` for the GPU utilisation); submit the same job again to continue "
        "from the checkpoint"),
}


def _finding(chain: Chain, cause: str, chunk: int | None, job_id: str | None,
             hits: Hits | None = None, detail: str = "") -> Finding:
    title, fix = _TITLES_FIXES[cause]
    if cause in _FIXES:
        fix = _FIXES[cause](chain, hits)
    return Finding(cause, title, fix, chunk, job_id,
                   hits.evidence() if hits is not None else [], detail)


# -- diagnosis ------------------------------------------------------------------------
@dataclass
class Report:
    name: str
    run_dir: str
    state: str  # the chain's state (train status)
    cause: str  # train status's sentence
    chunks: list[dict[str, Any]]
    findings: list[Finding]
    training: dict[str, Any]  # status.json of the run, where there is one
    notes: list[str] = field(default_factory=list)  # what was not searched

    @property
    def healthy(self) -> bool:
        return not self.findings

    @property
    def verdict(self) -> str:
        if self.findings:
            f = self.findings[0]
            where = f" (chunk {f.chunk})" if f.chunk is not None else ""
            more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
            return f"{f.cause}{where}: {f.title}{more}"
        return f"healthy: {self.state}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "run_dir": self.run_dir, "state": self.state,
                "cause": self.cause, "healthy": self.healthy, "verdict": self.verdict,
                "chunks": self.chunks, "findings": [f.as_dict() for f in self.findings],
                "training": self.training, "notes": self.notes}


_STATE_CAUSES = {"OUT_OF_MEMORY": "host_oom", "TIMEOUT": "walltime",
                 "PREEMPTED": "preempted", "NODE_FAIL": "node_failure",
                 "BOOT_FAIL": "node_failure"}
# log causes that explain a failure by themselves (the others only add to one)
_LOG_PRIORITY = [r.cause for r in RULES]


def _exit_code(chunk: Mapping[str, Any]) -> str | None:
    value = chunk.get("exit")
    return str(value) if value not in (None, "") else None


def _chunk_failed(chunk: Mapping[str, Any], events: Sequence[str]) -> bool:
    if chunk.get("state") in ("FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL",
                              "BOOT_FAIL", "PREEMPTED", "DEADLINE"):
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
        m = _MEMBER_RE.search(ev.text)
        if m:
            seen.add(int(m.group(1)))
            world = max(world, int(m.group(3)))
        j = _JOINED_RE.search(ev.text)
        if j:
            return f"{j.group(1)} of {j.group(2)} ranks joined"
    if world and len(seen) < world and hits.count < world:
        return f"{hits.count} of {world} ranks announced themselves"
    return ""


def _scan_chunk(logs: Sequence[Path], scan: bool, full: bool = False,
                notes: list[str] | None = None) -> dict[str, Hits]:
    """The rules' hits over a chunk's logs: each searched (scan; its head and tail only
    when large, unless full: a note says so) or the error log's end."""
    merged: dict[str, Hits] = {}
    for log in logs:
        if scan:
            result = scan_log(log, full=full)
            found = result.hits
            if not result.whole and notes is not None:
                notes.append(f"{log}: searched its first {HEAD_BYTES >> 20} MiB and last "
                             f"{TAIL_BYTES_SCANNED >> 20} MiB, not the "
                             f"{result.skipped_bytes >> 20} MiB between (--full searches "
                             "every byte)")
        elif log.suffix == ".err":
            found = scan_lines(log, read_tail(log))
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


_SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 15: "SIGTERM"}
_CRASHES = {4, 6, 7, 8, 11}


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


def _chunk_findings(chain: Chain, c: Mapping[str, Any], logs: Sequence[Path],
                    scan: bool, full: bool = False, notes: list[str] | None = None
                    ) -> list[Finding]:
    number, job_id = c["chunk"], c["job_id"]
    events = list(c.get("events") or [])
    state = str(c.get("state") or "UNKNOWN")
    exit_code = _exit_code(c) or ""
    failed = _chunk_failed(c, events)
    ended_early = failed or state == "CANCELLED" or contract.EV_TERMINATED in events
    hits_all = _scan_chunk(logs, scan, full, notes) if (scan or failed) else {}
    err = next((p for p in logs if p.suffix == ".err"), None)
    out: list[Finding] = []
    # Slurm's own verdict first: it is certain
    state_cause = _STATE_CAUSES.get(state)
    if state_cause is None and contract.EV_TIMEOUT in events:
        state_cause = "walltime"
    if state_cause is None and state == "CANCELLED":
        for cause in ("walltime", "preempted", "node_failure"):  # slurmstepd's banner
            if cause in hits_all:
                state_cause = cause
                break
    if state_cause is not None:
        out.append(_finding(chain, state_cause, number, job_id, hits_all.pop(state_cause, None),
                            _state_detail(state, exit_code)))
    if state == "PENDING" and "DependencyNeverSatisfied" in str(c.get("reason") or ""):
        out.append(_finding(chain, "dependency_never", number, job_id,
                            detail=f"squeue reason {c.get('reason')}"))
    sig = _signal_of(exit_code) if failed else None
    ended = f"exit code {exit_code}: the step"
    # the last exception of a failed chunk is what ended it: its cause leads the log's;
    # torchrun's wrapper stands for a rank's failure: that rank's own cause leads
    exc = last_exception(err) if failed and err is not None else None
    if exc is not None and err is not None and _WRAPPER_RE.match(exc.text):
        root = launcher_root_cause(err)
        if root is not None:
            exc = root.exception
            if exc is None and root.signal is not None and sig is None:
                sig = root.signal
                ended = f"torchrun's root cause, {root.rank or 'a rank'},"
    if sig == 9 and "host_oom" not in hits_all and state_cause != "host_oom":
        out.append(_finding(chain, "sigkill", number, job_id, detail=(
            f"{ended} was killed with SIGKILL")))
    elif sig in _CRASHES:
        out.append(_finding(chain, "native_crash", number, job_id, detail=(
            f"{ended} died of {_SIGNALS[sig]}")))
    lead = scan_lines(Path(exc.file), [(exc.line, exc.text)]) if exc is not None else {}
    order = [c for c in _LOG_PRIORITY if c in lead] + [
        c for c in _LOG_PRIORITY if c not in lead]
    if exc is not None and not lead:
        f = _finding(chain, "python_error", number, job_id, detail=exc.text)
        f.evidence = [exc]
        out.append(f)
    for cause in order:
        hits = hits_all.get(cause)
        if hits is None and cause in lead:
            hits = lead[cause]
        if hits is None or (cause == "train_error" and out) or \
                cause in (RENDEZVOUS_DONE, RANK_ZERO_BANNER):
            continue
        if cause in lead and exc is not None and all(e.line != exc.line for e in
                                                     hits.evidence()):
            hits.add(exc)  # the deciding line is always shown
        if cause == "rendezvous":
            # member lines are often shown for rank 0 only: where the group says it met,
            # their count is no evidence of a missing rank
            # (a requeued job's runs share one log: only a meeting after the last
            # rendezvous line counts)
            hits = _after_meeting(hits_all.get(RENDEZVOUS_DONE), hits)
            partial = _rendezvous_partial(hits) if hits.count else ""
            if partial and (ended_early or "clients joined" in partial):
                out.append(_finding(chain, cause, number, job_id, hits, partial))
            elif failed and any("Timeout" in e.text or "Closed" in e.text
                                for e in hits.evidence()):
                out.append(_finding(chain, cause, number, job_id, hits))
            continue
        if ended_early or cause in _ALWAYS:
            out.append(_finding(chain, cause, number, job_id, hits))
    runs = max(1, events.count(contract.EV_STARTED))  # a requeued job's runs share its log
    alone = _ranks_alone(chain, hits_all.get(RANK_ZERO_BANNER), runs)
    if alone:
        out.append(_finding(chain, "ranks_alone", number, job_id,
                            hits_all.get(RANK_ZERO_BANNER), alone))
    if failed and not out:
        f = _finding(chain, "failed", number, job_id, detail=_state_detail(state, exit_code))
        f.cause = "unknown"
        tail = read_tail(err)[-6:] if err is not None else []
        f.evidence = [Evidence(str(err), n or 0, _excerpt(line, 0)) for n, line in tail]
        if not tail:
            f.fix = ("no error log was written: the job failed before its shell ran "
                     "(`sacct -j JOBID` or `scontrol show job JOBID` says why; a log folder "
                     "the compute nodes cannot write is a common cause)").replace(
                         "JOBID", str(job_id))
        out.append(f)
    return out


def _ranks_alone(chain: Chain, banners: Hits | None, runs: int) -> str:
    """A multi-process job whose every process printed the rank-zero banner: each was
    global rank 0 of a world of its own (a bare Lightning Trainer() on several nodes
    trains the same model N times, alone). A healthy group prints it once a run (a
    requeued job's runs append to one log); alone, once per process and run."""
    res = _resources(chain)
    nodes = _int(res.get("nodes")) or 1
    per_node = _int(res.get("processes_per_node")) or _int(res.get("ntasks_per_node")) or 1
    procs = nodes * per_node
    if banners is None or procs < 2 or banners.count < procs * runs:
        return ""
    return (f"each of the job's {procs} processes printed Lightning's rank-zero banner "
            f"('GPU available: ...', {banners.count} times): every one was rank 0 of a "
            "world of its own")


def idle_gpus(chain: Chain) -> list[Finding]:
    """GPUs the utilisation watch saw idle for the job's idle time (its settings are in
    the chain's record; the watch's defaults otherwise)."""
    from train.runtime import gpuwatch

    threshold, minutes = idle_settings(chain)
    try:
        idle = gpuwatch.idle_findings(chain.run_dir, threshold, minutes)
    except (OSError, ValueError):
        return []
    out = []
    for item in idle:
        f = _finding(chain, "idle_gpu", None, None, detail=item.describe())
        f.evidence = [Evidence(str(Path(item.file).absolute()), item.first_line,
                               f"GPU {item.gpu}: {item.samples} samples under "
                               f"{threshold:g}% (at most {item.max_util:g}%)")]
        out.append(f)
    return out


def ask_slurm(ids: Sequence[str]) -> tuple[dict[str, dict[str, Any]], str]:
    """The jobs' states, or none and why: without Slurm (a login node where it does not
    answer, a copy of the run elsewhere) the chain's events and logs still tell most."""
    from train.slurm import scheduler

    try:
        return scheduler.job_states(list(ids)), ""
    except TrainError as exc:
        return {}, (f"Slurm could not be asked ({first_line(exc)}): the states come from "
                    "the chain's own events")


def diagnose(chain: Chain, status: Mapping[str, Any] | None = None, *, scan: bool = True,
             full: bool = False) -> Report:
    """Everything `train doctor` says about one chain. `status`: chain_status's answer
    (asked here when not given); `scan`: read every log whole, streamed (False: only the
    end of failed chunks' error logs, for `train status --all`)."""
    notes: list[str] = []
    if status is None:
        states, note = ask_slurm(chain.ids)
        notes += [note] if note else []
        status = chain_status(chain, states)
    st = dict(status)
    findings: list[Finding] = []
    chunks_out = []
    events = _events(chain)
    # `train cancel` records its event first: such a chain ended as its owner asked
    cancelled_by_us = any(e["event"] == contract.EV_CANCELLED for e in events)
    # the step's exit code as the batch shell saw it (sacct may not be there to say)
    step_exit = {e["job_id"]: e["detail"] for e in events
                 if e["event"] == contract.EV_FAILED and e["detail"]}
    for given in st.get("chunks", []):
        c = dict(given)
        if not _exit_code(c) and c["job_id"] in step_exit:
            c["exit"] = f"{step_exit[c['job_id']].split()[0]}:0"
        logs = _logs_of(chain, c["job_id"])
        found = _chunk_findings(chain, c, logs, scan, full, notes)
        if contract.EV_UNSAVED in (c.get("events") or []) and not found:
            found.append(_finding(chain, "unsaved", c["chunk"], c["job_id"],
                                  detail=contract.UNSAVED_TEXT))
        if str(c.get("state")) == "CANCELLED" and not found and st.get("state") != "complete" \
                and not cancelled_by_us and contract.EV_STARTED in (c.get("events") or []):
            found.append(_finding(chain, "cancelled", c["chunk"], c["job_id"],
                                  detail="Slurm state CANCELLED"))
        findings += found
        chunks_out.append({
            "chunk": c["chunk"], "job_id": c["job_id"], "state": c.get("state"),
            "exit": _exit_code(c), "events": list(c.get("events") or []),
            "logs": [str(p) for p in logs],
            "what": _what_happened(str(c.get("state")), c.get("events") or [], c),
            "causes": [f.cause for f in found]})
    if scan:  # (the table asks the watch's summary instead: it reads only files' ends)
        findings += idle_gpus(chain)  # a finished run's idle hours were still spent
    if not st.get("chunks"):
        findings.append(_finding(chain, "no_jobs", None, None,
                                 detail=f"{contract.CHAIN_IDS} lists no job"))
    if not findings and st.get("state") in ("failed", "stalled", "held"):
        findings.append(Finding("unknown", f"the chain is {st.get('state')}",
                                "see `train status` and `train logs`",
                                detail=str(st.get("cause"))))
    training = _read_json(chain.run_dir / "status.json")
    return Report(str(st.get("name", chain.record.get("name"))), str(chain.run_dir),
                  str(st.get("state")), str(st.get("cause")), chunks_out, findings, training,
                  notes)


def _events(chain: Chain) -> list[dict[str, Any]]:
    """The chain's events (the end of the file: a line per event, so 256 KiB is years)."""
    tail = read_bounded(chain.run_dir / contract.CHAIN_EVENTS, 262144, tail=True)
    return parse_events((tail or b"").decode("utf-8", "replace"))


def _what_happened(state: str, events: Sequence[str], chunk: Mapping[str, Any]) -> str:
    ev = set(events)
    if contract.EV_COMPLETE in ev:
        return "finished the work"
    if contract.EV_STOPPED in ev or contract.EV_REQUEUED in ev:
        return "stopped cleanly at its time budget and checkpointed"
    if contract.EV_FAILED in ev:
        return f"failed (exit {chunk.get('exit') or '?'})"
    if contract.EV_TIMEOUT in ev:
        return "reached its walltime before it stopped"
    if contract.EV_NO_PROGRESS in ev:
        return "ended without adding work"
    if contract.EV_UNSAVED in ev:
        return f"was stopped at its walltime margin, {contract.UNSAVED_TEXT}"
    if state in ACTIVE_STATES:
        reason = chunk.get("reason")
        return f"{state.lower()}" + (f" ({reason})" if reason not in (None, "None") else "")
    if contract.EV_TERMINATED in ev or state == "CANCELLED":
        return f"ended {state}"
    return f"ended {state}" if state != "UNKNOWN" else "state unknown to Slurm"


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def clean(text: object) -> str:
    """Text for a terminal: control characters (escape sequences, carriage returns, line
    breaks) written as \\xNN, so a log line or a run's name cannot rewrite the screen."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def format_report(report: Report) -> list[str]:
    """The report as text; every line through clean() (logs and names are anyone's)."""
    lines = [f"{report.name}: {report.state}  {report.run_dir}", f"  {report.cause}"]
    for c in report.chunks:
        lines.append(f"  chunk {c['chunk']} (job {c['job_id']}): {c['what']}")
    lines += [f"  note: {n}" for n in report.notes]
    if report.healthy:
        lines.append("  no problem found")
        return [clean(line) for line in lines]
    for f in report.findings:
        where = f"chunk {f.chunk}, job {f.job_id}: " if f.chunk is not None else ""
        lines.append(f"cause: {where}{f.title} [{f.cause}]")
        if f.detail:
            lines.append(f"  {f.detail}")
        for ev in f.evidence:
            lines.append(f"  evidence: {ev.where}: {ev.text}")
        lines.append(f"  fix: {f.fix}")
    return [clean(line) for line in lines]


def resolve(ref: str | None, runs_root: Path) -> Chain:
    """A run by name, path or job id; the newest run under runs_root without one."""
    run_dir = find_run(ref, runs_root) if ref is not None else newest_run(runs_root)
    if (run_dir / contract.SWEEP_RECORD).is_file() and not (
            run_dir / contract.CHAIN_RECORD).is_file():
        raise UsageError(f"run: {run_dir.name} is a seed sweep; name one of its chains "
                         f"({run_dir.name}/seed-N)")
    return load_chain(run_dir)


# -- every run at once (`train status --all`) -------------------------------------------
def overview(runs_root: Path) -> list[dict[str, Any]]:
    """One row per run under runs_root: state, progress, GPU utilisation and the doctor's
    one-line verdict. Slurm is asked once for every run's jobs; the logs are not scanned
    (only the end of a failed chunk's error log is read)."""
    if not runs_root.is_dir():
        raise UsageError(f"runs: {runs_root} is not a directory (give --runs the directory "
                         "that holds the runs)")
    chains: list[Chain | tuple[Path, str]] = []
    for run_dir in chain_dirs(runs_root):
        try:
            chains.append(load_chain(run_dir))
        except UsageError as exc:  # one broken record does not hide the others
            chains.append((run_dir, str(exc)))
    ids = [i for c in chains if isinstance(c, Chain) for i in c.ids]
    states, note = ask_slurm(ids)
    rows: list[dict[str, Any]] = []
    for c in chains:
        if not isinstance(c, Chain):
            rows.append({"name": c[0].name, "run_dir": str(c[0]), "state": "unreadable",
                         "done": None, "total": None, "gpu": {}, "verdict": c[1],
                         "healthy": False})
            continue
        st = chain_status(c, states)
        report = diagnose(c, st, scan=False)
        gpu = st.get("gpu") or {}
        verdict = report.verdict
        idle = [str(n) for n, g in sorted(gpu.items()) if isinstance(g, dict) and g.get("idle")]
        if idle and report.healthy:  # the table's idle check: the watch's own summary
            verdict = f"idle_gpu: GPUs idle now on {', '.join(idle)}"
        rows.append({"name": st["name"], "run_dir": str(c.run_dir), "state": st["state"],
                     "done": st["done"], "total": st["total"], "gpu": gpu,
                     "verdict": verdict, "healthy": report.healthy and not idle,
                     "slurm": note or None})
    return rows


def _gpu_text(gpu: Mapping[str, Any]) -> str:
    cells = []
    for node, s in sorted(gpu.items()):
        if not isinstance(s, Mapping):
            continue
        mean, latest = s.get("mean_util"), s.get("latest_util")
        if isinstance(mean, (int, float)) and isinstance(latest, (int, float)):
            cells.append(f"{node} {mean:.0f}%/{latest:.0f}%")
    return ", ".join(cells) or "-"


def format_overview(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The table: NAME STATE PROGRESS GPU(mean/latest per node) VERDICT."""
    table = [("NAME", "STATE", "PROGRESS", "GPU mean/latest", "VERDICT")]
    for r in rows:
        done, total = r.get("done"), r.get("total")
        progress = f"{done}/{total} ({100 * done // total}%)" if isinstance(done, int) \
            and isinstance(total, int) and total > 0 else "-"
        table.append((clean(r["name"]), clean(r["state"]), progress,
                      clean(_gpu_text(r.get("gpu") or {})), clean(r["verdict"])))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    return [" ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True))
            + " " + row[4] for row in table]
