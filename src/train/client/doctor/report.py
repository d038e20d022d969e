"""What `train doctor` prints: a chain's report as text, and the table of every run
(`train status --all`: overview, one row per run, and format_overview)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from train.client.doctor.diagnosis import Report, ask_slurm, diagnose
from train.client.slurm.chain import Chain, chain_dirs, load_chain, unreadable_runs
from train.client.slurm.chainstatus import chain_status
from train.common.errors import UsageError

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
    if not runs_root.is_dir():
        raise UsageError(f"runs: {runs_root} is not a directory (give --runs the directory "
                         "that holds the runs)")
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
