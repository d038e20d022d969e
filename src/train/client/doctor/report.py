"""`train doctor`'s report on one chain: which run (resolve), what Slurm says of its jobs,
and per chunk what happened and the rules' findings (chunks.py), gathered in a Report;
the report as text, and the table of every run (`train status --all`: overview, one row
per run, and format_overview)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.batch import contract
from train.client.doctor.chunks import _chunk_findings, _exit_code, idle_gpus
from train.client.doctor.findings import Finding, _finding
from train.client.slurm import queue
from train.client.slurm.chain import Chain, chain_dirs, find_run, load_chain, unreadable_runs
from train.client.slurm.chaincost import Redone, chunk_words, redone
from train.client.slurm.chainstatus import chain_events, chain_status, read_events
from train.common.errors import TrainError, UsageError, first_line
from train.common.jsonio import read_json_object


@dataclass
class Report:
    name: str
    run_dir: str
    state: str  # the chain's state (train status)
    cause: str  # train status's sentence
    chunks: list[dict[str, Any]]
    findings: list[Finding]
    training: dict[str, Any]  # status.json of the run, where there is one
    notes: list[str] = field(default_factory=list)  # what was not searched, overruns

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


def ask_slurm(ids: Sequence[str]) -> tuple[dict[str, dict[str, Any]], str]:
    """The jobs' states, or none and why: without Slurm (a login node where it does not
    answer, a copy of the run elsewhere) the chain's events and logs still tell most."""
    try:
        return queue.job_states(list(ids)), ""
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
    notes += st.get("overran") or []  # (status's note: the chunks' lines do not say it)
    findings: list[Finding] = []
    chunks_out = []
    events = chain_events(read_events(chain), chain.chunks)  # (not an earlier chain's)
    again = redone(chain.record, events)
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
        found = _chain_findings(chain, c, _chunk_findings(chain, c, logs, scan, full, notes),
                                again, cancelled_by_us or st.get("state") == "complete")
        findings += found
        chunks_out.append({
            "chunk": c["chunk"], "job_id": c["job_id"], "state": c.get("state"),
            "exit": _exit_code(c), "events": list(c.get("events") or []),
            "logs": [str(p) for p in logs],
            "what": c.get("ended") or chunk_words(chain.record, c["job_id"], events)
            or _state_words(str(c.get("state")), c),
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
    # {} for anything but a JSON object of at most 1 MiB; NaN and Infinity read as null:
    # --json output stays strict JSON
    training = read_json_object(chain.run_dir / "status.json", 1 << 20,
                                parse_constant=lambda _name: None)
    return Report(str(st.get("name", chain.record.get("name"))), str(chain.run_dir),
                  str(st.get("state")), str(st.get("cause")), chunks_out, findings, training,
                  notes)


def _chain_findings(chain: Chain, c: Mapping[str, Any], found: list[Finding],
                    again: Redone | None, ended_as_asked: bool) -> list[Finding]:
    """A chunk's findings with what the chain's events say of it: the chunks redo the same
    work (in place of an unknown failure of a chunk that made no progress), it stopped
    before any save, or scancel (not `train cancel`, not after the work was done)."""
    events = c.get("events") or []
    if again is not None and again.job_id == c["job_id"]:
        found = [_finding(chain, "repeated_work" if again.known else "resume_unverified",
                          c["chunk"], c["job_id"], detail=again.text),
                 *(f for f in found if f.cause != "unknown")]
    if contract.EV_UNSAVED in events and not found:
        found.append(_finding(chain, "unsaved", c["chunk"], c["job_id"],
                              detail=contract.UNSAVED_TEXT))
    if str(c.get("state")) == "CANCELLED" and not found and not ended_as_asked \
            and contract.EV_STARTED in events:
        found.append(_finding(chain, "cancelled", c["chunk"], c["job_id"],
                              detail="Slurm state CANCELLED"))
    return found


def _state_words(state: str, chunk: Mapping[str, Any]) -> str:
    """A chunk whose events say nothing of its end, as Slurm's state says it."""
    if state in queue.ACTIVE_STATES:
        reason = chunk.get("reason")
        return f"{state.lower()}" + (f" ({reason})" if reason not in (None, "None") else "")
    return f"ended {state}" if state != "UNKNOWN" else "state unknown to Slurm"


def resolve(ref: str | None, runs_root: Path) -> Chain:
    """A run by name, path or job id; the newest run under runs_root without one."""
    run_dir = find_run(ref, runs_root) if ref is not None else newest_run(runs_root)
    if (run_dir / contract.SWEEP_RECORD).is_file() and not (
            run_dir / contract.CHAIN_RECORD).is_file():
        from train.client.slurm.sweep import not_a_chain

        raise not_a_chain("run", run_dir.name, run_dir)
    return load_chain(run_dir)


# -- the report as text ---------------------------------------------------------------
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
    for f in report.findings:
        where = f"chunk {f.chunk}, job {f.job_id}: " if f.chunk is not None else ""
        lines.append(f"cause: {where}{f.title} [{f.cause}]")
        if f.detail:
            lines.append(f"  {f.detail}")
        for ev in f.evidence:
            lines.append(f"  evidence: {ev.where}: {ev.text}")
        lines.append(f"  fix: {f.fix}")
    return [clean(line) for line in lines]


# -- every run at once (`train status --all`) -------------------------------------------
def overview(runs_root: Path) -> list[dict[str, Any]]:
    """One row per run under runs_root: state, progress, GPU utilisation and the doctor's
    one-line verdict. Slurm is asked once for every run's jobs; the logs are not scanned
    (only the end of a failed chunk's error log is read)."""
    chains: list[Chain | tuple[Path, str]] = []
    for run_dir in chain_dirs(runs_root):
        try:
            chains.append(load_chain(run_dir))
        except UsageError as exc:  # one broken record does not hide the others
            chains.append((run_dir, str(exc)))
    chains += unreadable_runs(runs_root)
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
