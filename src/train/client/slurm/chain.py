"""A chain's record on disk: chain.json, chain.ids and chain.events in its run folder,
how a run is found by name or job id, where its logs are, and `train cancel`."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.batch import contract
from train.batch.saves import parse_ids, read_small, read_text
from train.client.slurm import queue
from train.client.slurm.queue import ACTIVE_STATES, _is_job_ref
from train.common import _proc
from train.common.errors import UsageError
from train.common.jsonio import read_json_object
from train.common.yamlio import shown

RECORD_LIMIT = 1 << 20  # chain.json and chain.ids: a few KiB when train submit writes them
EVENTS_LIMIT = 1 << 20  # the end of chain.events that status reads

# (a job id, or ARRAY_TASK where `train cancel` ended a sweep's task before it started)
_EVENT_RE = re.compile(r"^([0-9]{1,18}) ([0-9]{1,18}) ([0-9]{1,18}(?:_[0-9]{1,18})?) "
                       r"([a-z_]+)(?: (.*))?$")


def parse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        match = _EVENT_RE.match(line.strip())
        if match:
            ts, chunk, job, event, detail = match.groups()
            events.append({"time": int(ts), "chunk": int(chunk), "job_id": job,
                           "event": event, "detail": detail})
    return events


# Events after which a chunk's batch shell has nothing more to say.
_DECISIVE = (contract.EV_STARTED, contract.EV_STOPPED, contract.EV_REQUEUED,
             contract.EV_FAILED, contract.EV_TIMEOUT, contract.EV_TERMINATED,
             contract.EV_NO_PROGRESS, contract.EV_INCOMPLETE, contract.EV_UNSAVED)


@dataclass(frozen=True)
class Earlier:
    """An earlier chain of the run folder: its first job, record ({} where unreadable) and
    chunks."""

    first_job: str
    record: dict[str, Any]
    chunks: list[tuple[int, str]]


@dataclass
class Chain:
    run_dir: Path
    record: dict[str, Any]
    chunks: list[tuple[int, str]]  # (chunk, job id)
    # the run folder's earlier chains, oldest first, as a resubmission keeps them
    # (chain-FIRSTJOB.json and .ids: train.client.slurm.submission)
    earlier: list[Earlier] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        return [job_id for _, job_id in self.chunks]


EARLIER_LIMIT = 50  # the newest earlier chains read: years of resubmissions


def earlier_chains(run_dir: Path) -> list[Earlier]:
    """The earlier chains of the run folder, oldest first (their first job's id orders
    them); one whose kept ids list no chunk is left out."""
    kept = []
    try:
        for path in run_dir.glob(f"chain-*{Path(contract.CHAIN_IDS).suffix}"):
            tag = path.stem[len("chain-"):]
            if _is_job_ref(tag) and _is_file(path):
                kept.append((tag, path))
    except OSError:
        return []
    kept.sort(key=lambda item: [int(n) for n in item[0].split("_")])
    out = []
    for tag, path in kept[-EARLIER_LIMIT:]:
        chunks = parse_ids(read_text(str(path), RECORD_LIMIT))
        if chunks:
            out.append(Earlier(tag, read_json_object(path.with_suffix(
                Path(contract.CHAIN_RECORD).suffix), RECORD_LIMIT), chunks))
    return out


def load_chain(run_dir: Path) -> Chain:
    path = run_dir / contract.CHAIN_RECORD
    data = read_small(str(path), RECORD_LIMIT + 1)  # never a FIFO, a device or a huge file
    if data is None:
        raise UsageError(f"run: no chain recorded in {run_dir} (no "
                         f"{contract.CHAIN_RECORD}, or it is not a regular file)")
    if len(data) > RECORD_LIMIT:
        raise UsageError(f"run: {path} is over {RECORD_LIMIT >> 20} MiB: not a chain record")
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested too deep
        raise UsageError(f"run: {path} is not valid JSON ({str(exc)[:120]}); it was not "
                         "written by `train submit`, or was cut short") from None
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        raise UsageError(f"run: {path} does not hold a chain record")
    path = run_dir / contract.CHAIN_IDS
    ids = read_small(str(path), RECORD_LIMIT)
    chunks = parse_ids((ids or b"").decode("utf-8", "replace"))
    # missing or empty: no job yet; anything else without one leaves the jobs unknown
    if not chunks and (ids.strip() if ids is not None else os.path.lexists(path)):
        what = "no readable regular file" if ids is None else "no line of CHUNK JOBID"
        raise UsageError(f"run: {path} is unreadable or damaged ({what}): the chain's jobs "
                         "are not known (`squeue --me` lists yours)")
    return Chain(run_dir, record, chunks, earlier_chains(run_dir))


def _is_file(path: Path) -> bool:
    """path.is_file(), False also where the name cannot be looked up (too long: an
    OSError that pathlib passes on)."""
    try:
        return path.is_file()
    except OSError:
        return False


def record_problem(run_dir: Path, field: str = "run") -> str | None:
    """What is wrong with a run folder whose record (chain.json, sweep.json) is there but
    no regular file (a FIFO, a folder, a device, a dangling link): records are read from
    regular files only, and such a folder is said, not passed over."""
    if any(_is_file(run_dir / name) for name in contract.RUN_RECORDS):
        return None
    for name in contract.RUN_RECORDS:
        path = run_dir / name
        try:
            mode = path.lstat().st_mode
        except (OSError, ValueError):  # (missing, a name too long or holding NUL)
            continue
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else
                "a link to no regular file" if stat.S_ISLNK(mode) else "no regular file")
        try:
            chains = sorted(f"{run_dir.name}/{p.parent.name}"
                            for p in run_dir.glob(f"*/{contract.CHAIN_RECORD}") if _is_file(p))
        except OSError:
            chains = []
        return (f"{field}: {path} is {kind}, not the record `train submit` writes: it is not "
                "read" + (f"; the chains in that folder are still read one by one: "
                          f"{_few(chains)}" if chains else ""))
    return None


def unreadable_runs(runs_root: Path) -> list[tuple[Path, str]]:
    """The run folders directly under runs_root whose record is no regular file, and why
    (chain_dirs passes them over)."""
    try:
        folders = sorted(p for p in runs_root.iterdir() if p.is_dir())
    except OSError:
        return []
    return [(p, why) for p in folders if (why := record_problem(p)) is not None]


def chain_dirs(runs_root: Path) -> list[Path]:
    """Every chain under runs_root, a sweep's chains (one level deeper) included."""
    try:
        if not runs_root.is_dir():
            return []
        found = [p.parent for p in runs_root.glob(f"*/{contract.CHAIN_RECORD}")
                 if _is_file(p)]
        found += [p.parent for p in runs_root.glob(f"*/*/{contract.CHAIN_RECORD}")
                  if _is_file(p) and _is_file(p.parent.parent / contract.SWEEP_RECORD)]
    except OSError:  # a name too long, a folder that cannot be listed
        return []
    return sorted(found)


def find_run(ref: str, runs_root: Path) -> Path:
    """A run directory by name (runs_root/NAME), by path, or by any of its job ids."""
    direct = Path(ref) if "/" in ref else runs_root / ref
    if "/" in ref and not os.path.exists(direct):  # (False for a name too long)
        direct = runs_root / ref  # NAME/seed-4: a sweep's chain
    if _is_file(direct / contract.CHAIN_RECORD) or _is_file(direct / contract.SWEEP_RECORD):
        return direct
    problem = record_problem(direct)
    if problem is not None:
        raise UsageError(problem)
    if _is_job_ref(ref):  # a sweep task not yet started is ARRAY_TASK, as squeue says it
        for run_dir in chain_dirs(runs_root):
            text = read_text(str(run_dir / contract.CHAIN_IDS), RECORD_LIMIT)
            if ref in [job_id for _, job_id in parse_ids(text)]:
                return run_dir
    sweep, _, task = ref.partition("/")
    if task and "/" not in task and _is_file(runs_root / sweep / contract.SWEEP_RECORD):
        from train.client.slurm.sweep import read_tasks

        try:
            tasks = [f"{sweep}/{t.dir}" for t in read_tasks(runs_root / sweep)[0]]
        except UsageError as exc:
            raise UsageError(f"run: the sweep {shown(sweep)} has no task {shown(task)}, and "
                             f"its record cannot be read: {exc}") from None
        raise UsageError(f"run: the sweep {shown(sweep)} has no task {shown(task)}; its "
                         f"tasks: {_few(tasks)}")
    known = [str(p.relative_to(runs_root)) for p in chain_dirs(runs_root)]
    raise UsageError(f"run: no run named or holding job {shown(ref)} under {runs_root}; "
                     f"known runs: {_few(known)} (a chain submitted with --out lives "
                     "there: give that directory, or --runs its parent)")


def _few(names: list[str], limit: int = 10) -> str:
    """The first `limit` names and how many more there are."""
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(n[:80] for n in names[:limit]) + more


def log_path(chain: Chain, job_id: str | None, err: bool) -> Path:
    """The log of the given job, or of the newest chunk that has one."""
    suffix = "err" if err else "out"
    ids = chain.ids if job_id is None else [i for i in chain.ids if i == job_id]
    if not ids:
        raise UsageError(f"job: {job_id} is not part of {chain.run_dir.name}; its jobs: "
                         f"{', '.join(chain.ids) or 'none'}")
    logs = chain.run_dir / contract.LOG_DIR
    found = [p for i in ids for p in sorted(logs.glob(f"*-{i}.{suffix}"))]
    if found:
        return found[-1]
    return logs / f"{chain.record['name']}-{ids[-1]}.{suffix}"


def record_cancel(chain: Chain, states: dict[str, dict[str, Any]]) -> list[str]:
    """The chain's queued or running chunks (by `states`), the cancel recorded first where
    there are any, so what the chunks' batch shells record as they die reads as the
    consequence; a chain with nothing left to cancel keeps the record of how it ended."""
    active = [i for i in chain.ids if states.get(i, {}).get("state") in ACTIVE_STATES]
    if active:
        with open(chain.run_dir / contract.CHAIN_EVENTS, "a", encoding="utf-8") as fh:
            fh.write(f"{int(time.time())} 0 {chain.ids[0]} {contract.EV_CANCELLED} "
                     "by-user\n")
    return active


def cancel_chain(chain: Chain) -> list[str]:
    """`train cancel`: every queued or running chunk (record_cancel), its event first."""
    active = record_cancel(chain, queue.job_states(chain.ids))
    if active:
        _proc.run(["scancel", *active], timeout=60)
    return active
