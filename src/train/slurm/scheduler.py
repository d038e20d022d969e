"""Talking to SLURM: submit chains, read job states, cancel. Parsers are pure functions.

A chain of K chunks is submitted held (`--hold`), each chunk depending on the previous with
`afterok`; the ids are recorded in the run directory and only then released, so a chunk
that finishes early can always find and cancel the ones after it, and a failure while
submitting cancels what was already submitted: nothing is left half-submitted.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train import _proc
from train.errors import TrainError, UsageError
from train.jsonio import write_json_atomic
from train.slurm.job import ResolvedJob, chunk_names
from train.slurm.render import RenderContext, render

log = logging.getLogger(__name__)

ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
                 "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
_ACCOUNTING_OFF = "accounting storage is disabled"


class SchedulerError(TrainError):
    """SLURM refused or failed a request."""


# -- pure parsers ---------------------------------------------------------------------
def parse_sbatch_id(stdout: str) -> str:
    """`sbatch --parsable` prints 'ID' or 'ID;CLUSTER'."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = text.split(";")[0].strip()
    if not job_id.isdigit():
        raise SchedulerError(f"cannot read a job id from sbatch output {stdout!r}")
    return job_id


def parse_squeue_json(text: str) -> dict[str, dict[str, Any]]:
    """squeue --json -> {job id: {state, reason, nodes}} (state strings or lists)."""
    data = json.loads(text)
    out: dict[str, dict[str, Any]] = {}
    for job in data.get("jobs", []):
        state = job.get("job_state")
        if isinstance(state, list):
            state = state[0] if state else "UNKNOWN"
        out[str(job["job_id"])] = {"state": str(state or "UNKNOWN"),
                                   "reason": job.get("state_reason"),
                                   "nodes": job.get("nodes")}
    return out


def parse_sacct(text: str) -> dict[str, dict[str, Any]]:
    """`sacct -P -n -o JobID,State,ExitCode` (also with -c) -> {job id: {state, exit}}.

    Job steps (ids with a dot) are skipped; 'CANCELLED by 0' becomes CANCELLED.
    """
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0] or "." in parts[0]:
            continue
        job_id = parts[0].split("_")[0]
        if not job_id.isdigit():
            continue
        out[job_id] = {"state": parts[1].split()[0] if parts[1] else "UNKNOWN",
                       "exit": parts[2]}
    return out


_EVENT_RE = re.compile(r"^(\d+) (\d+) (\d+) (\w+)(?: (.*))?$")


def parse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        match = _EVENT_RE.match(line.strip())
        if match:
            ts, chunk, job, event, detail = match.groups()
            events.append({"time": int(ts), "chunk": int(chunk), "job_id": job,
                           "event": event, "detail": detail})
    return events


# -- queries --------------------------------------------------------------------------
def job_states(ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """States of these jobs: squeue for jobs it still knows, sacct for the rest, and the
    job completion log (`sacct -c`) where accounting storage is disabled."""
    if not ids:
        return {}
    states: dict[str, dict[str, Any]] = {}
    try:
        proc = _proc.run(["squeue", "--json", "--jobs", ",".join(ids)], check=False)
        if proc.returncode == 0:
            states.update({k: v for k, v in parse_squeue_json(proc.stdout).items()
                           if k in ids})
    except (_proc.ProcError, ValueError) as exc:
        log.debug("squeue failed: %s", exc)
    missing = [i for i in ids if i not in states]
    if missing:
        argv = ["sacct", "-P", "-n", "-o", "JobID,State,ExitCode", "-j", ",".join(missing)]
        proc = _proc.run(argv, check=False)
        if _ACCOUNTING_OFF in (proc.stdout + proc.stderr):
            proc = _proc.run(["sacct", "-c", *argv[1:]], check=False)
        found = parse_sacct(proc.stdout)
        for job_id in missing:
            states[job_id] = found.get(job_id, {"state": "UNKNOWN"})
    return states


# -- chains ---------------------------------------------------------------------------
@dataclass
class Chain:
    run_dir: Path
    record: dict[str, Any]

    @property
    def ids(self) -> list[str]:
        return [c["job_id"] for c in self.record["chunks"]]


def load_chain(run_dir: Path) -> Chain:
    path = run_dir / "chain.json"
    try:
        return Chain(run_dir, json.loads(path.read_text(encoding="utf-8")))
    except OSError:
        raise UsageError(f"run: no chain recorded in {run_dir} (no chain.json)") from None


def find_run(ref: str, runs_root: Path) -> Path:
    """A run directory by name (runs_root/NAME) or by any of its job ids."""
    direct = Path(ref) if "/" in ref else runs_root / ref
    if (direct / "chain.json").is_file():
        return direct
    if ref.isdigit() and runs_root.is_dir():
        for path in sorted(runs_root.glob("*/chain.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if ref in [c["job_id"] for c in record.get("chunks", [])]:
                return path.parent
    known = sorted(p.parent.name for p in runs_root.glob("*/chain.json")) \
        if runs_root.is_dir() else []
    raise UsageError(f"run: no run named or holding job {ref!r} under {runs_root}; "
                     f"known runs: {', '.join(known) or 'none'}")


def submit_chain(job: ResolvedJob, run_dir: Path, library: str) -> Chain:
    """Render every chunk, submit them held and chained, record, then release."""
    run_dir = run_dir.resolve()
    ctx = RenderContext(run_dir=str(run_dir), library=library)
    scripts = [render(job, i, ctx) for i in range(1, job.spec.chunks + 1)]
    if (run_dir / "chain.json").is_file():
        previous = load_chain(run_dir)
        active = [i for i, s in job_states(previous.ids).items()
                  if s["state"] in ACTIVE_STATES]
        if active:
            raise UsageError(f"run: {run_dir.name} already has an active chain (jobs "
                             f"{', '.join(active)}); cancel it first with `train cancel "
                             f"{run_dir.name}`")
        previous_path = run_dir / f"chain-{previous.ids[0]}.json"
        (run_dir / "chain.json").replace(previous_path)
    jobs_dir = run_dir / "jobs"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    jobs_dir.mkdir(exist_ok=True)
    names = chunk_names(job.spec)
    paths = []
    for i, text in enumerate(scripts, start=1):
        path = jobs_dir / f"{names[i - 1]}.sbatch"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    ids: list[str] = []
    try:
        for path in paths:
            argv = ["sbatch", "--parsable", "--hold"]
            if ids:
                argv.append(f"--dependency=afterok:{ids[-1]}")
            argv.append(str(path))
            ids.append(parse_sbatch_id(_proc.run(argv, timeout=120).stdout))
        (run_dir / "chain.ids").write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
        record = {
            "name": job.spec.name,
            "cluster": job.profile.name,
            "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "requeue": job.spec.requeue,
            "run_dir": str(run_dir),
            "chunks": [{"chunk": i, "name": names[i - 1], "job_id": job_id,
                        "script": str(paths[i - 1])}
                       for i, job_id in enumerate(ids, start=1)],
        }
        write_json_atomic(run_dir / "chain.json", record)
        _proc.run(["scontrol", "release", ",".join(ids)], timeout=60)
    except BaseException:
        if ids:
            _proc.run(["scancel", *ids], check=False)
        for name in ("chain.ids", "chain.json"):
            (run_dir / name).unlink(missing_ok=True)
        raise
    return Chain(run_dir, record)


def chain_status(chain: Chain) -> dict[str, Any]:
    """The chain as a whole plus each chunk's SLURM state and recorded events."""
    states = job_states(chain.ids)
    events_path = chain.run_dir / "chain.events"
    events = parse_events(events_path.read_text(encoding="utf-8")) \
        if events_path.is_file() else []
    chunk_ids = set(chain.ids)
    events = [e for e in events if e["job_id"] in chunk_ids]
    chunks = []
    for c in chain.record["chunks"]:
        s = states.get(c["job_id"], {"state": "UNKNOWN"})
        chunks.append({**c, "state": s["state"], "reason": s.get("reason"),
                       "exit": s.get("exit"),
                       "events": [e["event"] for e in events if e["job_id"] == c["job_id"]]})
    kinds = {e["event"] for e in events}
    if "failed" in kinds:
        overall = "failed"
    elif "complete" in kinds or ((chain.run_dir / "COMPLETE").exists() and not any(
            c["state"] in ACTIVE_STATES for c in chunks)):
        overall = "complete"
    elif "cancelled" in kinds:
        overall = "cancelled"
    elif any(c["state"] == "RUNNING" for c in chunks):
        overall = "running"
    elif any(c["state"] in ACTIVE_STATES for c in chunks):
        overall = "pending"
    elif "incomplete" in kinds:
        overall = "incomplete"
    else:
        overall = "ended"
    return {"name": chain.record["name"], "cluster": chain.record["cluster"],
            "run_dir": str(chain.run_dir), "state": overall, "chunks": chunks}


def cancel_chain(chain: Chain) -> list[str]:
    states = job_states(chain.ids)
    active = [i for i in chain.ids if states.get(i, {}).get("state") in ACTIVE_STATES]
    if active:
        _proc.run(["scancel", *active], timeout=60)
    with open(chain.run_dir / "chain.events", "a", encoding="utf-8") as fh:
        fh.write(f"{int(time.time())} 0 {chain.ids[0]} cancelled by-user\n")
    return active


def log_path(chain: Chain, job_id: str | None, err: bool) -> Path:
    """The log of the given job, or of the newest chunk that has one."""
    suffix = "err" if err else "out"
    chunks: Iterable[dict[str, Any]] = chain.record["chunks"]
    if job_id is not None:
        chunks = [c for c in chunks if c["job_id"] == job_id]
    candidates = [chain.run_dir / "logs" / f"{c['name']}-{c['job_id']}.{suffix}"
                  for c in chunks]
    existing = [p for p in candidates if p.exists()]
    if existing:
        return existing[-1]
    if candidates:
        return candidates[0]
    raise UsageError(f"run: job {job_id} is not part of {chain.run_dir.name}")
