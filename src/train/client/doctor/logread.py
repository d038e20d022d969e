"""Reading job logs without reading them whole: the rules' literal needles are searched
for with grep -F where the system has it (else in blocks of whole lines), and only the
lines that hold one are matched against the rules' patterns. A log over WHOLE_LIMIT is
searched in its head and tail only, unless --full. Also the end of a log (read_tail) and
its last Python exception.

WHOLE_LIMIT, HEAD_BYTES and TAIL_BYTES_SCANNED are read here at each call: a test or a
benchmark that scales them sets them on this module."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from train.client.doctor.findings import Evidence, Hits
from train.client.doctor.rules import _ALL_NEEDLES, _EXCEPTION_RE, RULES, LogRule
from train.common.jsonio import read_bounded

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


def candidate_lines(path: Path, needles: Sequence[str] = _ALL_NEEDLES
                    ) -> Iterator[Line]:
    if not shutil.which("grep"):
        yield from _candidate_lines_python(path, needles)
        return
    with _grep(needles, path) as proc:
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
