"""Where a chain's time went and what it cost: each chunk's wait in the queue and time run,
from the run folder (chain.json's submit time, the events: `extended` submits the next
chunk, `started`, `limit`, and a run's last event ends it), with Slurm's state and the
clock only for what is live; GPU-hours (nodes x GPUs per node x time run); the lines
`train status` prints; and the picture of the chain, chunks.png, where matplotlib is
installed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from train.batch import contract
from train.client.slurm.chunkends import _WITH_PROGRESS, Run, known_progress, runs
from train.client.slurm.queue import ACTIVE_STATES, _is_number

PICTURE = "chunks.png"
_clock = time.time  # (the tests set it)
Row = dict[str, Any]


def gpus(record: Row) -> int | None:
    """Nodes x GPUs per node (chain.json's resources); None where they are not recorded."""
    res = record.get("resources")
    got = [res.get(key) if isinstance(res, dict) else None
           for key in ("nodes", "gpus_per_node")]
    whole = [v for v in got if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
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
    for value in (job.get("walltime_seconds") if isinstance(job, dict) else None,
                  record.get("walltime_seconds")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value, value
    return None, None


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
        from train.common.errors import install_hint

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
