"""The site's maintenance reservations (`scontrol show reservation -o`, flag MAINT): one
parser for `train clusters probe` (the maintenances ahead), `train submit` (one inside the
chain's span, and what the chain will do) and `train status` (the one a chunk waits for).
A job whose time limit crosses a maintenance on its nodes does not start until it ends;
one with `--time-min` may start shorter, so as to end before it."""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from train.client.clusters.units import format_time
from train.common import _proc

if TYPE_CHECKING:
    from train.client.slurm.resolve import ResolvedJob

SHOW = ("scontrol", "show", "reservation", "-o")
TIMEOUT = 15.0
# a key of a `-o` line (a value may hold spaces: Comment=...)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")


@dataclass(frozen=True)
class Reservation:
    name: str
    start: int  # Unix seconds
    end: int
    nodes: str  # Slurm's node list: n[1-2]
    flags: tuple[str, ...]

    @property
    def maintenance(self) -> bool:
        return "MAINT" in self.flags

    def words(self, now: float) -> str:
        """'NAME on nodes N, from DATE UTC (in about 3 h) to DATE UTC'."""
        ahead = self.start - now
        when = "under way" if ahead <= 0 else f"in about {ahead / 3600:.1f} h" \
            if ahead >= 3600 else f"in about {max(1, round(ahead / 60))} min"
        return (f"{self.name} on nodes {self.nodes}, from {at(self.start)} ({when}) to "
                f"{at(self.end)}")


def at(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _seconds(text: str, what: str) -> int:
    """scontrol's time (the login node's local time, as scontrol prints it)."""
    try:
        return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        raise ValueError(f"{what} {text[:40]!r} is not a time as scontrol prints one "
                         "(YYYY-MM-DDTHH:MM:SS)") from None


def parse_reservations(text: str) -> list[Reservation]:
    """`scontrol show reservation -o` -> one Reservation a line; a line without
    ReservationName ('No reservations in the system') is none. A ValueError names a line
    whose times do not read."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        keys = list(_KEY.finditer(line))
        fields: dict[str, str] = {}
        for i, m in enumerate(keys):
            # the first of a key is Slurm's: one later stands in free text (Comment=...)
            fields.setdefault(m.group(1), line[m.end():keys[i + 1].start()
                                               if i + 1 < len(keys) else len(line)].strip())
        if "ReservationName" not in fields:
            continue
        try:
            out.append(Reservation(
                name=fields["ReservationName"],
                start=_seconds(fields.get("StartTime", ""), "StartTime"),
                end=_seconds(fields.get("EndTime", ""), "EndTime"),
                nodes=fields.get("Nodes", ""),
                flags=tuple(f for f in fields.get("Flags", "").split(",") if f)))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return out


def standard_times(environ: Mapping[str, str] | None) -> dict[str, str]:
    """The environment to ask scontrol in: a user's SLURM_TIME_FORMAT (relative, or a
    strftime format) changes how it prints times, and the parser reads Slurm's standard."""
    return {**(os.environ if environ is None else environ), "SLURM_TIME_FORMAT": "standard"}


def read(environ: Mapping[str, str] | None = None) -> list[Reservation] | None:
    """The site's reservations; None where scontrol is missing, fails, hangs or prints
    what the parser refuses (the callers then say nothing of maintenance)."""
    try:
        proc = _proc.run(SHOW, timeout=TIMEOUT, check=False, env=standard_times(environ),
                         skip_hung=True)
        return parse_reservations(proc.stdout) if proc.returncode == 0 else None
    except (_proc.ProcError, OSError, ValueError):
        return None


def ahead(found: Iterable[Reservation], start: float, end: float) -> list[Reservation]:
    """The maintenances that overlap [start, end], earliest first."""
    return sorted((r for r in found if r.maintenance and r.end > start and r.start < end),
                  key=lambda r: r.start)


def touches(resv: Reservation, partition: str | None,
             environ: Mapping[str, str] | None) -> bool:
    """Whether the maintenance holds a node of the partition (of any node without one);
    sinfo lists the partition's nodes among the reservation's."""
    if "ALL_NODES" in resv.flags or resv.nodes == "ALL":
        return True
    argv = ["sinfo", "-h", "-N", "-o", "%N", "-n", resv.nodes,
            *(["-p", partition] if partition else [])]
    try:
        proc = _proc.run(argv, timeout=TIMEOUT, check=False, env=environ, skip_hung=True)
    except (_proc.ProcError, OSError):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def touching(job: ResolvedJob, environ: Mapping[str, str] | None, now: float,
             until: float) -> list[Reservation]:
    """The maintenances between now and `until` that hold a node the job may run on
    (nothing where scontrol or sinfo cannot be asked)."""
    return [r for r in ahead(read(environ) or (), now, until)
            if touches(r, job.partition, environ)]


def note(resv: Reservation, *, now: float, walltime: int, chunks: int,
         floor: int) -> str:
    """What submit says of a maintenance inside the chain's span (seconds throughout)."""
    head = (f"the site's maintenance {resv.words(now)} falls within this "
            f"{'chain' if chunks > 1 else 'job'}'s span (from now to at most {chunks} x "
            f"--time {format_time(walltime // 60)}, queue waits not counted) on nodes it "
            "may run on: ")
    # a chunk ready after START - LIMIT crosses it: it waits until the end
    wait = resv.end - max(now, resv.start - walltime)
    waits = (f"a chunk whose --time crosses it does not start until it ends "
             f"({at(resv.end)}): it may wait up to {wait / 3600:.1f} h")
    if floor <= 0 or chunks < 2 or resv.start <= now:  # (under way: nothing ends before it)
        return head + waits
    fit = resv.end - max(now, resv.start - floor)
    return head + (f"a chunk may start shorter than --time (down to its floor, --time-min "
                   f"{format_time(floor // 60)}) so as to end before it, stops at its stop "
                   "signal with a save, and the next chunk goes on after the maintenance; "
                   "one ready too late for even the floor waits until it ends: up to "
                   f"{fit / 3600:.1f} h")


def submit_notes(job: ResolvedJob, environ: Mapping[str, str] | None = None,
                 now: float | None = None) -> list[str]:
    """`train submit`'s notes on the maintenances ahead of the chain (nothing where
    scontrol or sinfo cannot be asked)."""
    now = time.time() if now is None else now
    walltime = job.minutes * 60
    # the chain's span, as a bound: every chunk at its full --time, no queue wait
    return [note(r, now=now, walltime=walltime, chunks=job.chunks, floor=job.time_min * 60)
            for r in touching(job, environ, now, now + job.chunks * walltime)]


@functools.cache
def _known() -> tuple[Reservation, ...]:
    """The reservations, asked once a command: a sweep's tasks (or every run `train status`
    shows) wait for the same maintenance."""
    return tuple(read() or ())


def blocking(expected_start: int | None, walltime: int,
             now: float | None = None) -> str | None:
    """The maintenance a pending job waits for, as 'NAME (until DATE UTC)': of those its
    time limit crosses, the one whose end is its expected start, else the first; None
    where none is known."""
    now = time.time() if now is None else now
    found = ahead(_known(), now, now + walltime)
    resv = next((r for r in found if r.end == expected_start), found[0] if found else None)
    return None if resv is None else f"{resv.name} (until {at(resv.end)})"
