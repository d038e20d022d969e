"""The log rules (each cause the doctor recognises by a message in a job log: the literal
needles that select candidate lines, the pattern that refines them, where the message's
format comes from), and reading job logs for them without reading them whole: the needles
are searched for with grep -F where the system has it (else in blocks of whole lines), and
only the lines that hold one are matched against the rules' patterns. A log over
WHOLE_LIMIT is searched in its head and tail only, unless --full.

WHOLE_LIMIT, HEAD_BYTES and TAIL_BYTES_SCANNED are read here at each call: a test or a
benchmark that scales them sets them on this module."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from train.batch.task import NV_NO_DRIVER
from train.client.doctor.findings import Evidence, Hits
from train.common.jsonio import read_bounded


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
    # before image_unopenable: Apptainer says "container creation failed" for both
    LogRule("bind_missing", ("mount source", "bind source path does not exist"),
            re.compile(r"mount source \S+ doesn't exist|bind source path does not exist"),
            "Apptainer 1.1-1.4: 'FATAL:   container creation failed: mount hook function "
            "failure: mount /depot->/depot error: while mounting /depot: mount source "
            "/depot doesn't exist'; Docker: 'invalid mount config for type \"bind\": bind "
            "source path does not exist: /depot'"),
    LogRule("nv_no_driver", (NV_NO_DRIVER,), None,
            "ours (client/container.py's apptainer task wrapper; Apptainer 1.4 starts --nv "
            "without a word): 'train: apptainer --nv on NODE: " + NV_NO_DRIVER
            + " (/dev/nvidiactl is missing): the program sees no GPU'"),
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
    # libstdc++'s std::terminate with no exception: a C++ thread object destroyed while
    # it runs, as gloo's teardown does when a peer has left first (after the work)
    LogRule("teardown_abort", ("terminate called without an active exception",), None,
            "libstdc++ (__verbose_terminate_handler): 'terminate called without an active "
            "exception', then SIGABRT; torch's gloo at the process group's teardown "
            "(torch 2.13, CPU jobs: docs/your-program.md, \"A known trap on CPU (gloo)\")"),
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
_ALL_NEEDLES = tuple(sorted({n for r in RULES for n in r.needles}))
_MEMBER_RE = re.compile(r"GLOBAL_RANK: (\d+), MEMBER: (\d+)/(\d+)")
_JOINED_RE = re.compile(r"(\d+)/(\d+) clients joined")
_EXCEPTION_RE = re.compile(_LEAD + r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))"
                           r"(?:: ?(.*))?$")

MAX_LINE = 400  # evidence lines are cut to this many characters
READ_LINE = 1 << 16  # of a longer line only its first 64 KiB are matched
TAIL_BYTES = 64 * 1024  # the end of an error log shown for an unknown failure


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


def _feed_all(path: Path, regions: Sequence[tuple[int, int]],
              sinks: list[IO[bytes]]) -> None:
    """Bytes [start, end) of each region of `path`, read once, into every grep's stdin."""
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


def candidate_lines(path: Path) -> Iterator[Line]:
    """The lines of `path` that hold a needle: grep's, or the same without grep."""
    if not shutil.which("grep"):
        yield from _candidate_lines_python(path, _ALL_NEEDLES)
        return
    with _grep(_ALL_NEEDLES, path) as proc:
        yield from _grep_output(proc, _placer(()))


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
    hits: dict[str, Hits]
    whole: bool = True
    skipped_bytes: int = 0


def scan_log(path: Path, full: bool = False) -> Scan:
    """Every rule's hits in one log, streamed (a large one's head and tail unless `full`:
    what ended a job is at its end, start-up trouble at its start; the middle of a
    gigabyte log is progress lines)."""
    try:
        if not path.is_file():
            return Scan({})
        size = path.stat().st_size
    except OSError:
        return Scan({})
    if not shutil.which("grep"):
        return Scan(scan_lines(path, _candidate_lines_python(path, _ALL_NEEDLES)))
    regions: list[tuple[int, int]] = []
    if size > WHOLE_LIMIT and not full:
        regions = _regions(path, size)
    skipped = regions[1][0] - regions[0][1] if regions else 0
    return Scan(_grep_scan(path, regions), whole=skipped == 0, skipped_bytes=skipped)


def _placer(regions: Sequence[tuple[int, int]]
            ) -> Callable[[int, int], tuple[int | None, int | None]]:
    """A head line keeps its number, a tail line gets its offset in the file (no regions:
    the whole file, every line by its number)."""

    def place(number: int, offset: int) -> tuple[int | None, int | None]:
        if not regions or offset < regions[0][1]:
            return number, None
        return None, regions[1][0] + offset - regions[0][1]

    return place


def _grep_scan(path: Path, regions: Sequence[tuple[int, int]]) -> dict[str, Hits]:
    """The rules' hits from one grep per CPU (at most two), each for a share of the rules,
    in threads; a failure in a thread is raised here."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    groups = _groups(RULES, min(2, cpus))
    procs = [_grep(sorted({n for r in g for n in r.needles}), None if regions else path)
             for g in groups]
    found: list[dict[str, Hits]] = [{} for _ in groups]
    failures: list[BaseException] = []
    place = _placer(regions)

    def scan(i: int, group: list[LogRule]) -> None:
        try:
            found[i] = scan_lines(path, _grep_output(procs[i], place), group)
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
    return {cause: hits for part in found for cause, hits in part.items()}


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
    """The last lines of a file (at most `size` bytes); line numbers only where the whole
    file was read (counting them would read it all)."""
    data = read_bounded(path, size + 1, tail=True) or b""  # (one more byte: was it cut?)
    lines = data[-size:].decode("utf-8", "replace").splitlines()
    if len(data) > size:
        return [(None, line) for line in lines[1:]]  # the first one is cut
    return [(i + 1, line) for i, line in enumerate(lines)]


def last_exception(path: Path) -> Evidence | None:
    """The last Python exception line ('XError: message') near the end of a log."""
    for number, line in reversed(read_tail(path)):
        if _EXCEPTION_RE.match(line.strip()):
            return Evidence(str(path), number or 0, line.strip()[:MAX_LINE])
    return None
