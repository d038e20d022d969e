"""`train summary` of a command's sweep: each task's final metrics, from the first of
these found in its folder (a bad file is named and the next looked at): TRAIN_METRICS_FILE
(`metrics.json`, a JSON object the program writes at its end: its numbers, NaN and
Infinity kept), Hugging Face's `all_results.json` there or below, or the newest Lightning
`metrics.csv` up to three folders down (each column's last value: its rows are sparse).
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from train.batch.contract import CHAIN_RECORD, METRICS_FILE
from train.batch.saves import read_small
from train.client.slurm.sweep import load_record, read_json, read_tasks, record_flag
from train.client.slurm.sweepsummary import file_state, format_number, mean_std
from train.common._proc import printable
from train.common.jsonio import read_json_object

JSON_LIMIT = 1 << 20  # a metrics object is small
CSV_LIMIT = 16 << 20  # Lightning's CSV of a long run: its end is what counts
SHOWN = 8  # metrics in the table at most (the rest are left out, said in a note)
# the table's order: the losses, then the task's own metric (accuracy, perplexity, ...),
# the rest, and last what measures the run rather than the model (Hugging Face's Trainer
# writes eval_runtime, *_samples_per_second and epoch beside its losses, names sorted)
FIRST = ("eval_loss", "train_loss", "loss")
_TASK_METRIC = re.compile(
    r"(?:^|[_\-/. ])(?:accuracy|acc|perplexity|ppl|f1|bleu|rouge\w*|exact_match|em|auc|"
    r"auroc|precision|recall|wer|cer|mse|mae|rmse|iou|miou|map|top\d+|reward|return|score)"
    r"(?:$|[_\-/. ])", re.IGNORECASE)
_RUN_MEASURE = re.compile(r"(?:runtime|per_second|^epoch)$", re.IGNORECASE)
_DEPTH = 3  # folders below the task's that are searched
_FOLDERS = 200  # folders looked into at most, per task


@dataclass
class TaskMetrics:
    """One task's final metrics (or why there are none)."""

    label: str
    state: str
    values: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _name(key: object) -> str:
    """A metric's name as shown: one line, no control characters or escapes, 40 at most."""
    return " ".join(printable(str(key)).split())[:40]


def _numbers(found: object) -> dict[str, float]:
    """The object's numbers by name: NaN and Infinity kept (a diverged loss, as json.dump
    writes it), an integer too large for a float left out."""
    values: dict[str, float] = {}
    for key, value in (found.items() if isinstance(found, dict) else ()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            with contextlib.suppress(OverflowError):
                values.setdefault(_name(key), float(value))
    return values


def _json_metrics(path: Path, problems: list[str]) -> dict[str, float] | None:
    try:
        found = read_json(path, JSON_LIMIT)
    except ValueError as exc:
        problems.append(f"{path}: not a JSON object of metrics ({str(exc)[:80]})")
        return None
    if found is None:
        if os.path.lexists(path):  # a FIFO, a folder, a link to a device: named
            problems.append(f"{path}: not a regular file (a JSON object of metrics is)")
        return None
    values = _numbers(found)
    if not values:
        problems.append(f"{path}: holds no numbers (a JSON object, e.g. {{\"loss\": 0.4}})")
        return None
    return values


def _csv_metrics(path: Path, problems: list[str]) -> dict[str, float] | None:
    """Each column's last number; the file's header and its last CSV_LIMIT bytes."""
    head = read_small(str(path), 64 << 10)
    data = read_small(str(path), CSV_LIMIT, tail=True)
    if head is None or data is None:
        return None
    try:
        header = next(csv.reader(io.StringIO(head.decode("utf-8", "replace"))))
        # (the first line: the header, or a row cut by the tail's start)
        rows = data.decode("utf-8", "replace").splitlines()[1:]
        values: dict[str, float] = {}
        for row in csv.reader(rows):
            for name, text in zip(header, row, strict=False):
                try:
                    number = float(text)
                except ValueError:
                    continue
                if name not in ("step", "epoch"):
                    values[_name(name)] = number
    except (csv.Error, StopIteration) as exc:
        problems.append(f"{path}: not a CSV of metrics ({str(exc)[:80]})")
        return None
    return values or None


def _folders(root: Path) -> Iterator[Path]:
    """The task's folder and those below it, breadth first, bounded (no links followed)."""
    level, seen = [root], 0
    for _ in range(_DEPTH + 1):
        below: list[Path] = []
        for folder in level:
            seen += 1
            if seen > _FOLDERS:
                return
            yield folder
            try:
                below += sorted(p for p in folder.iterdir()
                                if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
        level = below


def task_metrics(run_dir: Path, label: str, state: str) -> TaskMetrics:
    """The task's final metrics, from the first source that has them."""
    out = TaskMetrics(label, state)
    folders = list(_folders(run_dir))
    for path in (run_dir / METRICS_FILE, *(f / "all_results.json" for f in folders)):
        out.values = _json_metrics(path, out.problems) or {}
        if out.values:
            return out
    newest: tuple[int, Path] | None = None
    for folder in folders:
        path = folder / "metrics.csv"
        try:
            stamp = path.stat().st_mtime_ns if path.is_file() else None
        except OSError:
            continue
        if stamp is not None and (newest is None or stamp > newest[0]):
            newest = (stamp, path)
    if newest is not None:
        out.values = _csv_metrics(newest[1], out.problems) or {}
    return out


def _rank(name: str) -> int:
    lower = name.lower()
    if lower in FIRST:
        return FIRST.index(lower)
    if _RUN_MEASURE.search(lower):
        return len(FIRST) + 3
    if "loss" in lower:
        return len(FIRST)
    return len(FIRST) + (1 if _TASK_METRIC.search(lower) else 2)


def metric_order(names: list[str]) -> list[str]:
    """The metrics as the table shows them (FIRST, other losses, the task's own metric, the
    rest, the run's measures: runtime, samples/steps per second, epoch); found order
    within each."""
    return sorted(names, key=_rank)


def format_metrics(name: str, flag: str, tasks: list[TaskMetrics]) -> tuple[list[str],
                                                                              list[str]]:
    """The table (a line per task: its value or seed, each metric, its state; for a seed
    sweep, mean +- std across the seeds) and notes."""
    names = metric_order(list(dict.fromkeys(k for t in tasks for k in t.values)))
    notes = [p for t in tasks for p in t.problems]
    if len(names) > SHOWN:
        notes.append(f"{len(names) - SHOWN} more metric(s) left out of the table: "
                     + ", ".join(names[SHOWN:]))
        names = names[:SHOWN]
    column = "seed" if flag == "seeds" else flag[:12]
    widths = [max(10, len(n)) for n in names]
    lines = [f"{name}: sweep of {len(tasks)} " + ("seed(s)" if flag == "seeds"
                                                   else f"values of --{flag}"),
             f"  {column:>12}  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths,
                                                                          strict=True))
             + "  state"]
    for t in tasks:
        cells = [f"{t.values[n]:.4g}" if n in t.values else "-" for n in names]
        lines.append(f"  {t.label:>12}  " + "  ".join(f"{c:>{w}}" for c, w in
                                                     zip(cells, widths, strict=True))
                     + f"  {t.state}")
    if not names:
        lines.append(f"  no metrics yet: a task's program writes them as a JSON object to "
                     f"$TRAIN_METRICS_FILE ({METRICS_FILE} in its folder); all_results.json "
                     "(Hugging Face's Trainer) or Lightning's metrics.csv under the task's "
                     "folder are read too")
    elif flag == "seeds":
        for n in names:
            lines.append(_mean_line(n, [t.values[n] for t in tasks if n in t.values],
                                    len(tasks)))
    return lines, notes


def _mean_line(name: str, found: list[float], seeds: int) -> str:
    """A metric's mean +- std over the seeds that have a finite value; the NaN and
    Infinity ones (diverged) said as left out."""
    finite = [v for v in found if math.isfinite(v)]
    odd = [f"{v:.4g}" for v in found if not math.isfinite(v)]
    left = f"; left out: {', '.join(odd)}" if odd else ""
    if not finite:
        return f"  {name}: no finite value in {seeds} seed(s){left}"
    mean, std = mean_std(finite)
    spread = f" +- {format_number(std)}" if std is not None else " (one seed, no spread)"
    return (f"  {name} over {len(finite)} of {seeds} seed(s): {format_number(mean)}"
            f"{spread}{left}")


def is_command_sweep(root: Path) -> bool:
    """Whether the sweep's tasks run a command (their chain records say entry command)."""
    for task in read_tasks(root)[0]:
        record = read_json_object(root / task.dir / CHAIN_RECORD, JSON_LIMIT)
        if isinstance(record.get("entry"), str):
            return bool(record["entry"] == "command")
    return False


def summarize_metrics(root: Path, states: dict[str, str] | None = None,
                      left_out: list[str] | None = None) -> tuple[list[str], list[str]]:
    """A command sweep's table of final metrics (every task), and notes; `left_out`
    gets a line naming each entry of the sweep's record that is not a task."""
    flag = record_flag(load_record(root))
    found, bad = read_tasks(root)
    if left_out is not None:
        left_out += bad
    tasks = [task_metrics(root / t.dir, t.label,
                          (states or {}).get(t.label) or file_state(root / t.dir))
             for t in found]
    return format_metrics(root.name, flag, tasks)
