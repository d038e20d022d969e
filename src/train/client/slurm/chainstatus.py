"""A chain's status: its state and, in words, what happened (from the chunks' events and
Slurm's states), its progress and rate, the GPU watch's summary, and `train status` lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from train.batch import contract
from train.batch.saves import chunks_left, file_progress, read_text
from train.client import gpuwatch_reader as gpuwatch
from train.client.slurm import chaincost, queue
from train.client.slurm.chain import _DECISIVE, EVENTS_LIMIT, Chain, parse_events
from train.client.slurm.chaincost import (
    _WITH_PROGRESS,
    UNKNOWN_PROGRESS,
    Redone,
    chunk_words,
    integer,
    known_progress,
    progress_words,
    redone,
    resume_fix,
    runs,
    split_progress,
)
from train.client.slurm.queue import ACTIVE_STATES

# Final Slurm states that end a chunk, whatever its batch shell could record.
_ENDING_STATES = {
    "NODE_FAIL": "node failure: its node stopped answering Slurm; submit the same job "
                 "again to resume from the last checkpoint",
    "OUT_OF_MEMORY": "out of host memory: the job went over its --mem (fewer --workers, or "
                     "more --mem)",
    "TIMEOUT": "walltime TIMEOUT: the step did not stop at the walltime signal; raise "
               "--signal-margin",
    "BOOT_FAIL": "its node failed to boot; submit the same job again",
    "DEADLINE": "its deadline passed",
    "PREEMPTED": "preempted and not requeued; submit the same job again",
    "FAILED": "failed",
    "CANCELLED": "cancelled by Slurm or with scancel",
}
def progress_rate(events: Sequence[dict[str, Any]]) -> float | None:
    """Work units per second of chunk wall time (start-up included), from each run's
    `started` and the first event that names its progress after it; None before a chunk
    has ended."""
    work = seconds = 0
    for run in runs(events):
        said = next((e for e in (*run.between, run.end)
                     if e is not None and e["event"] in _WITH_PROGRESS), None)
        start = split_progress(run.start)
        end = split_progress(said["detail"]) if said is not None else None
        if start is not None and end is not None and said is not None:
            work += max(0, end[0] - start[0])
            seconds += max(0, said["time"] - run.at)
    if seconds <= 0:
        return None
    return work / seconds


def _used(chain: Chain, chunks: list[dict[str, Any]], events: list[dict[str, Any]]) -> int:
    """What counts against --max-chunks: chunks that started, or in requeue mode (one job
    run again and again) its runs."""
    if chain.record.get("requeue"):
        return sum(1 for e in events if e["event"] == contract.EV_STARTED)
    return sum(1 for c in chunks if contract.EV_STARTED in c["events"])


Outcome = tuple[str, str]  # the chain's state, and in words what happened
Chunks = list[dict[str, Any]]
Events = list[dict[str, Any]]


def _outcome(chain: Chain, chunks: Chunks, events: Events, again: Redone | None
             ) -> Outcome:
    """The chain's state and, in words, what happened: the first of these that applies,
    from what ended the chain for good to what is still in the queue."""
    kinds = {e["event"] for e in events}
    active = [c for c in chunks if c["state"] in ACTIVE_STATES]
    if contract.EV_COMPLETE in kinds or (
            (chain.run_dir / contract.COMPLETE_MARKER).exists() and not active):
        return "complete", _complete_words(chain, events)
    if contract.EV_CANCELLED in kinds:
        return "cancelled", "cancelled with `train cancel`"
    last = next((e for e in reversed(events) if e["event"] in _DECISIVE), None)
    decided: set[str] = set()
    if last is not None:
        said = _said_by_last_event(chain, chunks, last, again)
        if said is not None:
            return said
        if last["event"] != contract.EV_STARTED:
            decided.add(last["job_id"])
    return (_ended_in_slurm(chunks, decided) or _held(chain, chunks)
            or _stopped_without_successor(chunks, last, active)
            or _in_queue(chain, chunks, events, active))


def _complete_words(chain: Chain, events: Events) -> str:
    """The work is done, or (a command that exited 0 before any stop signal where nothing
    reported progress) what is known: the tool takes such an exit as the end of the work."""
    done = next((e for e in reversed(events) if e["event"] == contract.EV_COMPLETE), None)
    if done is None:
        return "the work is done"
    where = f"chunk {done['chunk']} (job {done['job_id']})"
    at = progress_words(done["detail"])
    if at is None and chain.record.get("entry") in ("command", "navsim"):
        return (f"{where} exited 0 before any stop signal, and nothing reported progress "
                f"({UNKNOWN_PROGRESS}): the chain takes that as the end of the work; "
                f"`train logs {chain.record['name']} --job {done['job_id']}` shows what "
                "the program did")
    return f"the work is done{f' (at {at})' if at else ''}"


def _said_by_last_event(chain: Chain, chunks: Chunks, last: dict[str, Any],
                        again: Redone | None) -> Outcome | None:
    """What the chain's last decisive event says, where it ends the chain (`again`: the
    chunks redo the same work, as the events show)."""
    by_job = {c["job_id"]: c for c in chunks}
    chunk = by_job.get(last["job_id"], {"chunk": last["chunk"], "state": "UNKNOWN"})
    where = f"chunk {chunk['chunk']} (job {last['job_id']})"
    event, detail = last["event"], last["detail"] or ""
    logs = f"`train logs {chain.record['name']} --err --job {last['job_id']}`"
    if event == contract.EV_FAILED:
        # "CODE [NODE]": the first failing task's own code, and its node
        code, _, node = detail.partition(" ")
        on = f" on node {node.strip()}" if node.strip() else ""
        return "failed", f"{where} failed: its step exited with code {code}{on}; see {logs}"
    if event == contract.EV_TIMEOUT:
        return "failed", _timeout_words(chain, where, detail, logs)
    if event == contract.EV_NO_PROGRESS and chain.record.get("entry") not in (
            "command", "navsim"):  # (`train run` resumes by itself)
        return "stalled", (f"{where} ended without adding work (done/total now "
                           f"{detail.replace(' ', '/')}), so the chain stopped; see {logs}")
    if event == contract.EV_NO_PROGRESS and again is not None \
            and again.job_id == last["job_id"]:
        return "stalled", f"{where} made no progress: {again.text}; see {logs}"
    if event == contract.EV_NO_PROGRESS:
        at = progress_words(detail) or "0"
        return "stalled", (f"{where} made no progress: its work done at the end ({at}) is "
                           "not above where it began, so the program started over from "
                           "zero (it does not resume) or did no work; the chain stopped. "
                           f"{resume_fix(chain.record)}; see {logs}")
    if event == contract.EV_UNSAVED:
        return "stalled", (f"{where} {contract.UNSAVED_TEXT} (the program's progress "
                           "file, the run folder and its save paths show nothing saved "
                           "since the chunk began), so the chain stopped; submit the "
                           "same job again (a longer --time if the program saves too "
                           "late for it): the new chain goes on at chunk "
                           f"{chunk['chunk'] + 1}; see {logs}")
    if event == contract.EV_INCOMPLETE:
        unit = "run" if chain.record.get("requeue") else "chunk"
        said = progress_words(detail)
        at = f"at {said}" if said else ("before the work was done (its progress is not "
                                        "known to the tool)")
        size = " x --time of chunk time" if _in_time(chain) else f" {unit}(s)"
        bound = f"the bound of {chain.record.get('max_chunks')}{size} was reached {at}"
        if again is not None:  # more chunks would redo the same work
            bound = bound if again.known else bound.partition(" before the work")[0]
            return "incomplete", f"{bound}; {again.text}"
        return "incomplete", (f"{bound}; submit the same job again with a larger "
                              "--max-chunks to continue from the last save")
    if event == contract.EV_TERMINATED and chunk["state"] not in ACTIVE_STATES:
        if chunk["state"] == "CANCELLED":
            return "cancelled", f"{where} was cancelled (scancel) after {detail} s"
        text = _ENDING_STATES.get(chunk["state"], f"ended {chunk['state']}")
        return "failed", f"{where} was terminated after {detail} s: {text}"
    return None


def _timeout_words(chain: Chain, where: str, detail: str, logs: str) -> str:
    """A chunk ended at its walltime: past the stop signal, or past the overrun bound
    (the engine's "ELAPSED bound")."""
    margin = chain.record.get("signal_margin")
    if detail.split()[-1:] == [contract.OVERRUN_BOUND_WORD]:
        return (f"{where} ran past its stop signal into the walltime once more: the chain "
                f"had gone on from its last save after {contract.OVERRUN_BOUND} such "
                "overruns already (the bound), so it stopped. The program takes longer to "
                f"stop than --signal-margin ({margin} s) gives it (an evaluation or a save "
                f"after the signal): raise --signal-margin, or make it stop sooner; see {logs}")
    return (f"{where} reached its walltime: the step did not stop at the walltime signal "
            f"{margin} s before it (it ignores USR1, or checkpointing takes longer); raise "
            f"--signal-margin, or make the program stop on USR1; see {logs}")


def _ended_in_slurm(chunks: Chunks, decided: set[str]) -> Outcome | None:
    """A chunk Slurm ended (node failure, out of memory, ...) that its events do not
    explain."""
    for c in chunks:
        if c["state"] in _ENDING_STATES and c["job_id"] not in decided and (
                contract.EV_STARTED in c["events"] or c["state"] != "CANCELLED"):
            where = f"chunk {c['chunk']} (job {c['job_id']})"
            state = "cancelled" if c["state"] == "CANCELLED" else "failed"
            return state, f"{where} ended {c['state']}: {_ENDING_STATES[c['state']]}"
    return None


def _held(chain: Chain, chunks: Chunks) -> Outcome | None:
    """A chunk left held: `train submit` stopped before releasing it."""
    held = [c for c in chunks if c["state"] == "PENDING"
            and str(c.get("reason") or "").startswith("JobHeld")]
    if not held:
        return None
    c = held[0]
    return "held", (f"chunk {c['chunk']} (job {c['job_id']}) is held ({c['reason']}): "
                    f"`train submit` stopped before releasing it; `train cancel "
                    f"{chain.record['name']}` and submit again, or `scontrol release` it")


def _stopped_without_successor(chunks: Chunks, last: dict[str, Any] | None,
                               active: Chunks) -> Outcome | None:
    """A chunk stopped to be continued, and no successor ran."""
    if last is None or last["event"] not in (contract.EV_STOPPED, contract.EV_REQUEUED) \
            or active:
        return None
    after = [c for c in chunks if c["chunk"] > last["chunk"]]
    gone = f"chunk {after[0]['chunk']} (job {after[0]['job_id']}) ended " \
           f"{after[0]['state']} before it ran" if after else "no next chunk was queued"
    at = progress_words(last["detail"])
    return "ended", (f"{gone}, so the chain stopped{f' at {at}' if at else ''}; submit the "
                     "same job again to continue from the last save")


def _in_queue(chain: Chain, chunks: Chunks, events: Events, active: Chunks) -> Outcome:
    """Running, pending, or (nothing queued or running) ended."""
    running = [c["chunk"] for c in chunks if c["state"] == "RUNNING"]
    if running:
        if chain.record.get("requeue"):
            return "running", f"run {_used(chain, chunks, events)} of at most " \
                              f"{chain.record.get('max_chunks')} (requeue mode) is running"
        if _in_time(chain):  # (chunks that started short add to the count)
            return "running", f"chunk {running[-1]} is running"
        return "running", f"chunk {running[-1]} of at most {chain.record.get('max_chunks')} " \
                          "is running"
    if active:
        return "pending", "waiting in the queue"
    return "ended", "no chunk is queued or running"


def _allowed(chain: Chain, chunks: Chunks, used: int) -> int:
    """Chunks the bound allows after those that started: for a chain with a floor, the
    bound's time their limits left (chunks started short leave more), in chunks of
    --time."""
    bound = integer(chain.record.get("max_chunks")) or 0
    wall = integer(chain.record.get("walltime_seconds"))
    if not (_in_time(chain) and wall and wall > 0):
        return bound - used
    spent = sum(c.get("limit_seconds") or wall for c in chunks
                if contract.EV_STARTED in c["events"])
    return chunks_left(bound, wall, spent)


def _in_time(chain: Chain) -> bool:
    """A chain with a floor (--time-min) counts its bound in time, not chunks."""
    job = chain.record.get("job")
    return isinstance(job, dict) and bool(job.get("time_min_seconds"))


def read_events(chain: Chain) -> Events:
    """The run folder's events, of this chain and the earlier ones a resubmission left
    there (the end of the file: a few lines a chunk, so 1 MiB is thousands of chunks)."""
    return parse_events(read_text(str(chain.run_dir / contract.CHAIN_EVENTS), EVENTS_LIMIT,
                                  tail=True))


def chain_events(every: Events, chunks: list[tuple[int, str]]) -> Events:
    """One chain's part of the run folder's events (a resubmission's chain goes on in the
    same chain.events): those of its chunks' jobs."""
    ids = {job_id for _, job_id in chunks}
    return [e for e in every if e["job_id"] in ids]


def chain_status(chain: Chain, states: dict[str, dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """The chain as a whole, its progress, and each chunk's SLURM state and events.
    `states`: the jobs' states when already asked for (one query for many chains)."""
    earlier_ids = [i for kept in chain.earlier for _, i in kept.chunks]
    if states is None:
        states = queue.job_states([*chain.ids, *earlier_ids])
    every = read_events(chain)
    events = chain_events(every, chain.chunks)
    chunks = _chunk_rows(chain.record, chain.chunks, states, events)
    earlier = [{"first_job": kept.first_job, "chunks": _chunk_rows(
        kept.record, kept.chunks, states, chain_events(every, kept.chunks))}
        for kept in chain.earlier]
    again = redone(chain.record, events)
    state, cause = _outcome(chain, chunks, events, again)
    progress = file_progress(str(chain.run_dir)) or _saved_progress(events)
    rate = progress_rate(events)
    used = _used(chain, chunks, events)
    status: dict[str, Any] = {
        "name": chain.record["name"], "cluster": chain.record.get("cluster"),
        "run_dir": str(chain.run_dir), "state": state, "cause": cause,
        "max_chunks": chain.record.get("max_chunks"), "chunks_used": used,
        "bound_in_time": _in_time(chain),
        "unit": "run" if chain.record.get("requeue") else "chunk",
        "done": progress[0] if progress else None,
        "total": progress[1] if progress else None,
        "rate_per_second": rate, "eta_seconds": None, "chunks_left_estimate": None,
        "warning": None, "chunks": chunks, "earlier_chains": earlier,
        "time": chaincost.add_times(chain.record, chunks, events),
        "gpu": gpuwatch.summary(chain.run_dir, *gpuwatch.idle_settings(chain.record)),
        "redone": asdict(again) if again is not None else None,
        "overran": [f"chunk {e['chunk']} ran into its walltime after the stop signal; the "
                    f"tool ended it and the chain went on from the save before "
                    f"({(e['detail'] or '?').split()[0]} of at most "
                    f"{contract.OVERRUN_BOUND} times in a chain)"
                    for e in events if e["event"] == contract.EV_OVERRAN],
    }
    if progress and rate and state not in ("complete", "cancelled", "failed"):
        eta = max(0, progress[1] - progress[0]) / rate
        status["eta_seconds"] = round(eta)
        budget = integer(chain.record.get("time_budget_seconds")) or integer(
            chain.record.get("walltime_seconds"))
        if budget and budget > 0 and eta > 0:
            left = max(1, -(-int(eta) // budget))
            status["chunks_left_estimate"] = left
            bound = integer(chain.record.get("max_chunks")) or 0
            remaining = _allowed(chain, chunks, used) + (1 if state == "running" else 0)
            if state in ("running", "pending") and left > remaining:
                status["warning"] = (f"at this rate the work needs about {left} more "
                                     f"{status['unit']}(s), more than the {remaining} left "
                                     f"under --max-chunks {bound}: it will end incomplete")
            elif state in ("incomplete", "ended", "stalled") and again is None:
                status["warning"] = (f"to finish, submit the same job again with "
                                     f"--max-chunks {left} or more")
    return status


def _chunk_rows(record: dict[str, Any], pairs: list[tuple[int, str]],
                states: dict[str, dict[str, Any]], events: Events) -> Chunks:
    """Each chunk's Slurm state, its events' names and, in words, how it ended."""
    rows = []
    limit = integer(record.get("walltime_seconds")) or 0
    for number, job_id in pairs:
        s = states.get(job_id, {"state": "UNKNOWN"})
        waits = s["state"] == "PENDING" and queue.is_reserved(s.get("reason"))
        rows.append({"chunk": number, "job_id": job_id, "state": s["state"],
                     "reason": s.get("reason"), "exit": s.get("exit"),
                     "expected_start": s.get("start"),
                     "maintenance": queue.blocking(s.get("start"), limit)
                     if waits else None,
                     "events": [e["event"] for e in events if e["job_id"] == job_id],
                     "ended": chunk_words(record, job_id, events)})
    return rows


def _saved_progress(events: Events) -> tuple[int, int] | None:
    """Where there is no progress file: the last progress the chunks' events name (what
    the program's saves showed the batch shell), if any."""
    return next((got for e in reversed(events) if e["event"] in _WITH_PROGRESS
                 and (got := known_progress(e["detail"])) is not None), None)


def format_status(st: dict[str, Any], times: bool = False) -> list[str]:
    """`train status` lines for one chain (`times`: each chunk's time and cost too)."""
    lines = [f"{st['name']} ({st['cluster']}): {st['state']}  {st['run_dir']}",
             f"  {st['cause']}"]
    bound = f" of at most {st['max_chunks']}" if isinstance(st["max_chunks"], int) else ""
    used = f"{st['chunks_used']}{bound} {st['unit']}(s) used"
    if bound and st.get("bound_in_time"):
        used = (f"{st['chunks_used']} {st['unit']}(s) used (the bound: {st['max_chunks']} x "
                "--time of chunk time limits)")
    if st["total"]:
        text = (f"  progress: {st['done']}/{st['total']} "
                f"({100 * st['done'] // st['total']}%), {used}")
        if st["eta_seconds"] is not None:
            text += (f"; about {st['eta_seconds'] / 3600:.1f} h left at "
                     f"{st['rate_per_second']:.3g}/s")
            if st["chunks_left_estimate"]:
                text += f" (~{st['chunks_left_estimate']} more {st['unit']}(s))"
        lines.append(text)
    elif st.get("done"):
        lines.append(f"  progress: step {st['done']} (as the program's last save names "
                     f"it), {used}")
    else:
        lines.append(f"  progress: not known ({UNKNOWN_PROGRESS}), {used}")
    lines += [f"  {chaincost.total_line(st['time'])}"] if st.get("time") else []
    lines += [f"  note: {text}" for text in st.get("overran") or ()]
    again = st.get("redone")
    if again and again["text"] not in st["cause"]:
        lines.append(f"  note: {again['text']}")
    for node, g in sorted((st.get("gpu") or {}).items()):
        idle = f"; {g['idle_description']}" if g.get("idle_description") else ""
        lines.append(f"  gpu {node}: {g['gpus']} GPU(s), utilisation mean "
                     f"{g['mean_util']:.0f}%, latest {g['latest_util']:.0f}% "
                     f"({g['samples']} samples){idle}")
    if st["warning"]:
        lines.append(f"  note: {st['warning']}")
    lines += _chunk_lines(st["chunks"], "  ", times)
    for chain in st.get("earlier_chains") or ():
        lines.append(f"  earlier chain of this run folder (first job {chain['first_job']}):")
        lines += _chunk_lines(chain["chunks"], "    ")
    return lines


def _chunk_lines(chunks: Chunks, indent: str, times: bool = False) -> list[str]:
    """A line per chunk: its job, Slurm's state and how it ended, in words (--json keeps
    the events' names); for a waiting chunk why it waits, and until when; its time."""
    lines = []
    for c in chunks:
        extra = f" ({c['reason']})" if c.get("reason") not in (None, "None") else ""
        ended = f": {c['ended']}" if c.get("ended") else ""
        lines.append(f"{indent}chunk {c['chunk']}: job {c['job_id']} {c['state']}{extra}"
                     f"{ended}")
        if c["state"] == "PENDING":  # (train.client.slurm.queue)
            why = queue.words(c.get("reason"), c.get("maintenance"))
            start = queue.expected_start(c.get("expected_start"))
            lines += [f"{indent}  waiting: {why}"] if why else []
            lines.append(f"{indent}  expected start: "
                         f"{start or 'Slurm gives no estimate yet'}")
        lines += [f"{indent}  {chaincost.chunk_line(c)}"] if times else []
    return lines
