"""What a chain's events say of each chunk: how it ended, in words (--json keeps the
events' names), chunks that redo the same work, and where the chain's time went and what
it cost (from the run folder; Slurm's state and the clock only for what is live)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from train.batch import contract
from train.client.slurm.queue import ACTIVE_STATES, _is_number
from train.common.errors import install_hint

# Events whose detail ends with "DONE TOTAL".
_WITH_PROGRESS = (contract.EV_STOPPED, contract.EV_REQUEUED, contract.EV_COMPLETE,
                  contract.EV_NO_PROGRESS, contract.EV_INCOMPLETE, contract.EV_UNSAVED,
                  contract.EV_OVERRAN)
# Events that end one run of a chunk's job (`overran` is followed by one of them).
_ENDS = (contract.EV_STOPPED, contract.EV_REQUEUED, contract.EV_COMPLETE,
         contract.EV_FAILED, contract.EV_NO_PROGRESS, contract.EV_INCOMPLETE,
         contract.EV_UNSAVED, contract.EV_TIMEOUT, contract.EV_TERMINATED)
# a stop the next chunk (or the requeued job) goes on from
_CARRIED = (contract.EV_STOPPED, contract.EV_REQUEUED)
RESUME_EXAMPLE = ("--resume-args '--resume_from_checkpoint {newest:out/checkpoint-*}' (Hugging "
                  "Face Trainer) or '--ckpt_path {newest:checkpoints/*.ckpt}' (Lightning)")
UNKNOWN_PROGRESS = "no progress file, and no save names its step"
SAVE_FIX = "save more often than once a chunk, or give a longer --time"

Event = Mapping[str, Any]


def integer(value: Any) -> int | None:
    """An integer of a chain's record; None where it is missing or not an integer (a
    record edited by hand, or not written by `train submit`)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def resources(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's resources (what the job asked for), {} where it has none."""
    res = record.get("resources")
    return res if isinstance(res, dict) else {}


def split_progress(detail: str | None) -> tuple[int, int] | None:
    """An event's closing "DONE TOTAL", or None."""
    parts = (detail or "").split()
    if len(parts) >= 2 and _is_number(parts[-1]) and _is_number(parts[-2]):
        return int(parts[-2]), int(parts[-1])
    return None


def known_progress(detail: str | None) -> tuple[int, int] | None:
    """split_progress, None also for 0 0 (the batch shell's "not known")."""
    got = split_progress(detail)
    return None if got == (0, 0) else got


def progress_words(detail: str | None) -> str | None:
    """An event's "DONE TOTAL" as `train status` says it: DONE/TOTAL, `step DONE` where the
    total is unknown (a Lightning checkpoint's name), None where the tool could read none
    (0 0: neither a progress file nor a save naming its step)."""
    got = known_progress(detail)
    if got is None:
        return None
    return f"{got[0]}/{got[1]}" if got[1] else f"step {got[0]}"


def resume_fix(record: Mapping[str, Any]) -> str:
    given = record.get("resume_args")
    if isinstance(given, str) and given:
        return f"it was given --resume-args {given!r}: check that it goes on from them"
    return f"a program that resumes only when told needs {RESUME_EXAMPLE}"


@dataclass(frozen=True)
class Run:
    """One run of a chunk's job: from its `started` to the event that ended it (None while
    it runs, or where nothing was recorded), and what came between."""

    chunk: int
    job_id: str
    start: str | None  # the started event's detail: "RESTARTS DONE TOTAL"
    end: Event | None
    between: tuple[Event, ...]
    at: int  # the started event's time


def runs(events: Sequence[Event]) -> list[Run]:
    """The chain's runs in the order they started."""
    opened: list[tuple[Event, list[Event], list[Event | None]]] = []  # started, between, end
    current: dict[str, int] = {}  # job id -> its open run's place in `opened`
    for e in events:
        job = e["job_id"]
        if e["event"] == contract.EV_STARTED:
            current[job] = len(opened)  # (started again with no end recorded: a requeue)
            opened.append((e, [], [None]))
        elif job in current:
            _started, between, end = opened[current[job]]
            if e["event"] in _ENDS:
                end[0] = e
                del current[job]
            else:
                between.append(e)
    return [Run(int(s["chunk"]), s["job_id"], s["detail"], end[0], tuple(between),
                int(s["time"]))
            for s, between, end in opened]


def _at(detail: str | None) -> str:
    said = progress_words(detail)
    return f" (at {said})" if said else ""


def _end_words(record: Mapping[str, Any], run: Run) -> str | None:
    """How one run ended, in words."""
    if run.end is None:
        return None
    event, detail = run.end["event"], run.end["detail"]
    requeue = bool(record.get("requeue"))
    if event == contract.EV_STOPPED:
        return f"stopped after a save{_at(detail)}; chunk {run.chunk + 1} goes on from it"
    if event == contract.EV_REQUEUED:
        return f"stopped after a save{_at(detail)}; the job was requeued to go on from it"
    if event == contract.EV_COMPLETE:
        if progress_words(detail) is None and record.get("entry") in ("command", "navsim"):
            return (f"exited 0 before any stop signal, and nothing reported progress "
                    f"({UNKNOWN_PROGRESS}): taken as the end of the work")
        return f"finished the work{_at(detail)}"
    if event == contract.EV_FAILED:
        code, _, node = (detail or "?").partition(" ")
        return f"failed: exit code {code}" + (f" on node {node.strip()}" if node.strip()
                                              else "")
    if event == contract.EV_NO_PROGRESS:
        return (f"made no progress{_at(detail)}: it ended no further than it began; the "
                "chain stopped")
    if event == contract.EV_INCOMPLETE:
        failed = [e for e in run.between if e["event"] == contract.EV_EXTEND_FAILED]
        if failed:
            return (f"stopped after a save{_at(detail)}, but its next chunk could not be "
                    f"queued (sbatch: {(failed[-1]['detail'] or '?')[:200]})")
        unit = "run" if requeue else "chunk"
        bound = record.get("max_chunks")
        return (f"stopped after a save{_at(detail)}, the last {unit} "
                f"{f'--max-chunks {bound}' if isinstance(bound, int) else 'its bound'} "
                "allows")
    if event == contract.EV_UNSAVED:
        return (f"{contract.UNSAVED_TEXT}{_at(detail)}: the chain ended; submitted again, it "
                f"goes on at chunk {run.chunk + 1}")
    if event == contract.EV_TIMEOUT:
        return "reached its walltime without stopping at the stop signal"
    # terminated: a TERM before the walltime
    return (f"ended by a TERM {detail} s after it started, before its walltime (scancel, "
            "preemption or a requeue)")


def chunk_words(record: Mapping[str, Any], job_id: str, events: Sequence[Event]) -> str | None:
    """A chunk's end in words (every run of its job, in order), from the chain's events;
    None while it runs or where its events say nothing of an end."""
    said = []
    for run in runs(events):
        if run.job_id != job_id:
            continue
        words = _end_words(record, run)  # (an overrun: status says it in a note)
        if words:
            said.append(words)
    if any(e["event"] == contract.EV_CANCELLED and e["job_id"] == job_id for e in events):
        said.append("the chain was cancelled with `train cancel`")
    return "; then ".join(said) or None


@dataclass(frozen=True)
class Redone:
    """Chunks that redo the same work: where (the chunk that shows it), whether the
    progress shows it (known) or only cannot rule it out, and in words with the fix."""

    chunk: int
    job_id: str
    known: bool
    text: str


def _done(run: Run) -> int | None:
    got = known_progress(run.start)
    return None if got is None else got[0]


def redone(record: Mapping[str, Any], events: Sequence[Event]) -> Redone | None:
    """Where the chain's events show a chunk starting over from a save an earlier chunk
    already went on from: a chunk that began no further than the one before it began
    (after a stop that counted as checkpointed), or one that went on from a save and ended
    without adding work. Where the progress is not known, a chain of --stop-mode kill that
    reached its bound after checkpointed stops is named too: the tool cannot tell whether
    its chunks went on from one another, and a larger --max-chunks could loop for ever."""
    done_runs = runs(events)
    # (requeue mode: one job run again and again)
    name = [f"run {i + 1}" if record.get("requeue") else f"chunk {r.chunk}"
            for i, r in enumerate(done_runs)]
    for i, (prev, cur) in enumerate(itertools.pairwise(done_runs)):
        if prev.end is None or prev.end["event"] not in _CARRIED:
            continue
        before, now = _done(prev), _done(cur)
        at = progress_words(cur.start)
        if before is not None and now is not None and now <= before:
            return Redone(cur.chunk, cur.job_id, True, (
                f"{name[i + 1]} began at {at}, no further than {name[i]} began: the save "
                f"it went on from holds none of {name[i]}'s work, so every chunk starts "
                "over from the same save and redoes it (the program saves less often than "
                "once a chunk; with --stop-mode kill the work since its last save is lost "
                f"at each stop): {SAVE_FIX}"))
        if cur.end is not None and cur.end["event"] == contract.EV_NO_PROGRESS and now \
                and record.get("entry") in ("command", "navsim"):  # (`train run` resumes)
            causes = [("the program saves less often than once a chunk, so every chunk "
                       "starts over from the same save and loses its work at the stop "
                       f"({SAVE_FIX})"),
                      f"it started over from zero ({resume_fix(record)})"]
            if not record.get("resume_args"):  # (told nothing, it likely did not resume)
                causes.reverse()
            return Redone(cur.chunk, cur.job_id, True, (
                f"{name[i + 1]} went on from where {name[i]} stopped (at {at}) and ended "
                f"no further: either {causes[0]}, or {causes[1]}"))
    stops = [r for r in done_runs if r.end is not None and r.end["event"] in (
        *_CARRIED, contract.EV_INCOMPLETE)]
    last = done_runs[-1] if done_runs else None
    if (record.get("stop_mode") == "kill" and len(stops) >= 2 and last is not None
            and last.end is not None and last.end["event"] == contract.EV_INCOMPLETE
            and not any(e["event"] == contract.EV_EXTEND_FAILED for e in last.between)
            and all(known_progress(r.start) is None and known_progress(r.end["detail"])
                    is None for r in stops if r.end is not None)):
        return Redone(last.chunk, last.job_id, False, (
            f"its progress is not known to the tool ({UNKNOWN_PROGRESS}), so neither is "
            "whether each chunk went on from the one before: with --stop-mode kill, a "
            "program that saves less often than once a chunk starts over from the same "
            "save in every chunk, for ever. Check in the job logs that each chunk resumed "
            "beyond where the one before did before submitting again with a larger "
            f"--max-chunks; where it did not, {SAVE_FIX}"))
    return None


# -- where the time went ---------------------------------------------------------------
PICTURE = "chunks.png"
_clock = time.time  # (the tests set it)
Row = dict[str, Any]


def gpus(record: Row) -> int | None:
    """Nodes x GPUs per node (chain.json's resources); None where they are not recorded."""
    got = [integer(resources(record).get(key)) for key in ("nodes", "gpus_per_node")]
    whole = [v for v in got if v is not None and v >= 0]
    return whole[0] * whole[1] if len(whole) == 2 else None


def _submitted(record: Row) -> int | None:
    """chain.json's submit time ("%Y-%m-%dT%H:%M:%S%z", as submission writes it)."""
    try:
        return int(datetime.strptime(str(record.get("submitted")),
                                     "%Y-%m-%dT%H:%M:%S%z").timestamp())
    except ValueError:
        return None


def _limit(done: list[Run], record: Row) -> tuple[int | None, int | None]:
    """The chunk's time limit and what -t asked, in seconds: its newest `limit` event, or
    (a chain without a floor, a run folder older than the event) the job record's
    walltime."""
    for run in reversed(done):
        for e in run.between:
            parts = (e["detail"] or "").split()
            if e["event"] == contract.EV_LIMIT and len(parts) == 2 \
                    and all(map(_is_number, parts)):
                return int(parts[0]), int(parts[1])
    job = record.get("job")
    value = integer(job.get("walltime_seconds") if isinstance(job, dict) else None) \
        or integer(record.get("walltime_seconds"))
    return value, value


def _end(run: Run) -> int:
    """A run's last event (a chain's `cancelled` is the chain's, not the run's)."""
    said = [e for e in (*run.between, run.end) if e is not None
            and e["event"] != contract.EV_CANCELLED]
    return int(said[-1]["time"]) if said else run.at


def add_times(record: Row, chunks: list[Row], events: list[Row]) -> Row:
    """Each chunk row gains its `runs` (when queued, started and ended: Unix times, a live
    one's end now, a waiting one's start None), the seconds it waited and ran, its limit,
    what -t asked and its GPU-hours; the chain's totals come back. A chunk waits from when
    it could start: submitted, and the chunk before it ended (its dependency); a requeued
    job waits again from its run's end."""
    now = int(_clock())
    count = gpus(record)
    by_job: dict[str, list[Run]] = {}
    for run in runs(events):
        by_job.setdefault(run.job_id, []).append(run)
    extended = {e["detail"]: e["time"] for e in events
                if e["event"] == contract.EV_EXTENDED}
    ready: int | None = None  # when the chunk before ended
    for i, c in enumerate(chunks):
        done = by_job.get(c["job_id"], [])
        live = c["state"] in ACTIVE_STATES
        submit = extended.get(c["job_id"], _submitted(record) if i == 0 else None)
        known = [t for t in (submit, ready) if t is not None]
        queued = max(known) if known else None
        spans: list[Row] = []
        for k, run in enumerate(done):
            running = live and c["state"] != "PENDING" and k == len(done) - 1
            # a run lies between when it was queued and now (a junk time, a node's clock
            # off, is no run of years)
            started = min(now, max(run.at, queued or run.at))
            end = now if running and run.end is None else min(now, max(started, _end(run)))
            spans.append({"queued": queued, "started": started, "ended": end})
            queued = end
        if live and (c["state"] == "PENDING" or not done):
            spans.append({"queued": queued, "started": None, "ended": None})
        waits = [max(0, (s["started"] or now) - s["queued"]) for s in spans
                 if s["queued"] is not None]
        ran = sum(max(0, s["ended"] - s["started"]) for s in spans if s["started"] is not None)
        limit, asked = _limit(done, record)
        c.update(runs=spans, waited_seconds=sum(waits) if len(waits) == len(spans)
                 and spans else None, ran_seconds=ran, limit_seconds=limit,
                 requested_seconds=asked,
                 gpu_hours=None if count is None else count * ran / 3600)
        ready = spans[-1]["ended"] if spans and spans[-1]["ended"] is not None else ready
    progress = [[e["time"], *got] for e in events if e["event"] in (
        contract.EV_STARTED, *_WITH_PROGRESS) and (got := known_progress(e["detail"]))]
    total = add_up(chunks)
    return {**total, "gpus": count, "live": any(c["state"] in ACTIVE_STATES for c in chunks),
            "gpu_hours": None if count is None else count * total["ran_seconds"] / 3600,
            "as_of": now, "progress": progress}


def add_up(given: Sequence[Row | None]) -> Row:
    """Waited and ran seconds and GPU-hours of chunks (or of a sweep's chains' totals);
    GPU-hours None where any is not known."""
    rows = [r for r in given if r]
    hours = [r.get("gpu_hours") for r in rows]
    counts = {r.get("gpus") for r in rows}
    return {"waited_seconds": sum(r.get("waited_seconds") or 0 for r in rows),
            "ran_seconds": sum(r.get("ran_seconds") or 0 for r in rows),
            "gpu_hours": None if None in hours else sum(hours),
            "gpus": counts.pop() if len(counts) == 1 else None,
            "live": any(r.get("live") for r in rows)}


def duration(seconds: float) -> str:
    """45s, 2m05s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def _cost(hours: float | None, count: int | None) -> str:
    if count == 0:
        return "no GPUs"
    if hours is None:
        return "GPU-hours not known (chain.json records no GPUs per node)"
    return f"{hours:.2f} GPU-h" + (f" ({count} GPUs)" if count else "")


def total_line(t: Row, over: str = "") -> str:
    """The chain's (or sweep's) time and cost on one line."""
    so_far = " so far" if t.get("live") else ""
    return (f"time: waited {duration(t['waited_seconds'])} in the queue, ran "
            f"{duration(t['ran_seconds'])}{over}{so_far}; {_cost(t['gpu_hours'], t['gpus'])}")


def chunk_line(c: Row) -> str:
    """A chunk's wait, time run against its limit, and GPU-hours."""
    if not c.get("runs"):
        return "time: it did not run"
    waited = c.get("waited_seconds")
    text = f"time: waited {'?' if waited is None else duration(waited)}"
    if any(s["started"] is not None for s in c["runs"]):
        text += f", ran {duration(c['ran_seconds'])}"
        limit, asked = c.get("limit_seconds"), c.get("requested_seconds")
        if limit:
            text += f" of a {duration(limit)} limit"
        if limit and asked and limit < asked:
            text += f" (started short of -t {duration(asked)})"
        if c.get("gpu_hours"):
            text += f", {c['gpu_hours']:.2f} GPU-h"
    return text + (" so far" if c["state"] in ACTIVE_STATES else "")


def draw(st: Row) -> tuple[Path | None, str | None]:
    """chunks.png in the run folder: each chunk's waits (grey) and runs (blue) over time,
    and the progress the events name; (None, why) where it is not drawn."""
    t = st["time"]
    spans = [(c["chunk"], s) for c in st["chunks"] for s in c.get("runs") or ()
             if s["queued"] is not None or s["started"] is not None]
    if not spans:
        return None, "no picture: no chunk's submit or start is known yet"
    try:
        import matplotlib
    except ImportError:
        return None, (f"no picture: matplotlib is not installed here (the login-node "
                      f"client); for {PICTURE}, {install_hint('run')}")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = min(s["queued"] if s["queued"] is not None else s["started"] for _, s in spans)
    last = max(t["as_of"] if s["ended"] is None else s["ended"] for _, s in spans)
    unit, scale = ("h", 3600) if last - t0 > 3 * 3600 else ("min", 60)
    fig, ax = plt.subplots(figsize=(8, 2 + 0.3 * len(st["chunks"])))
    for chunk, s in spans:
        start = t["as_of"] if s["started"] is None else s["started"]
        if s["queued"] is not None:
            ax.broken_barh([((s["queued"] - t0) / scale, (start - s["queued"]) / scale)],
                           (chunk - 0.4, 0.8), facecolors="lightgrey")
        if s["started"] is not None:
            ax.broken_barh([((start - t0) / scale, (s["ended"] - start) / scale)],
                           (chunk - 0.4, 0.8), facecolors="tab:blue")
    ax.set(xlabel=f"{unit} since the chain was submitted", ylabel="chunk",
           yticks=sorted({chunk for chunk, _ in spans}),
           title=f"{st['name']}: {total_line(t)}")
    ax.legend(handles=[Patch(color="lightgrey", label="waiting"),
                       Patch(color="tab:blue", label="running")], loc="upper left")
    shown = [p for p in t["progress"] if p[2] > 0]
    if shown:
        right = ax.twinx()
        right.plot([(p[0] - t0) / scale for p in shown], [100 * p[1] / p[2] for p in shown],
                   "k.-", label="progress")
        right.set(ylabel="progress (%)", ylim=(0, 105))
    path = Path(st["run_dir"]) / PICTURE
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as exc:
        return None, f"no picture: cannot write {path}: {exc.strerror or exc}"
    finally:
        plt.close(fig)
    return path, None
