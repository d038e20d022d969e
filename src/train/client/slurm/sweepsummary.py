"""`train summary` of a sweep: a line per task (episodes, final evaluation, state), the
mean +- std of the final evaluations, and the tasks' learning curves' mean and spread
(summary.csv; summary.png where matplotlib is installed). Numbers too large to add up
(a mean or spread that overflows) are said, never printed as inf or nan."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from train.batch.contract import COMPLETE_MARKER
from train.client.slurm.sweep import load_record, read_json, read_tasks, record_flag
from train.common.errors import UsageError, install_hint
from train.common.safewrite import write_atomic

SUMMARY_CSV = "summary.csv"
SUMMARY_PLOT = "summary.png"


FILE_LIMIT = 64 << 20  # episodes.json, test_results.json: far more than a run writes


def _rewards(path: Path) -> list[float] | str:
    """A seed's episode rewards, or why they cannot be used."""
    try:
        found = read_json(path, FILE_LIMIT)
        if found is None:
            return "no episodes yet"
        rewards = found["rewards"]
    except (ValueError, KeyError, TypeError):
        return f"{path} is not an episode record"
    if not isinstance(rewards, list) or not all(
            isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
            for r in rewards):
        return f"{path}: rewards are not a list of finite numbers"
    return [float(r) for r in rewards] if rewards else "no episodes yet"


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """One seed's line of the summary table."""

    seed: str  # the task's label: its seed, or the value it runs with
    episodes: int | None  # finished training episodes (None: no readable record)
    evaluation: float | None  # mean reward of the final evaluation (None: not evaluated)
    state: str


def _evaluation(run_dir: Path, seed: int | None) -> float | None:
    """The mean reward of the seed's final evaluation (`train run` writes it when the seed
    has trained all its episodes), or None."""
    try:
        found = read_json(run_dir / "eval" / "test_results.json", FILE_LIMIT).get(str(seed))
    except (ValueError, AttributeError):
        return None
    value = found.get("mean_reward") if isinstance(found, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def file_state(run_dir: Path) -> str:
    """A chain's state from its run folder alone (where Slurm cannot be asked)."""
    if (run_dir / COMPLETE_MARKER).exists():
        return "complete"
    return "incomplete" if run_dir.is_dir() else "not started"


def mean_std(values: list[float], ddof: int = 1) -> tuple[float, float | None]:
    """Mean and standard deviation (sample: ddof 1, None for a single value; population:
    ddof 0) of finite values, computed on the values scaled to at most 1 so that no sum
    overflows; a result too large for a float is inf (format_number says so)."""
    scale = max((abs(v) for v in values), default=0.0) or 1.0
    scaled = [v / scale for v in values]
    mean = math.fsum(scaled) / max(1, len(scaled))
    if len(values) <= ddof:
        return mean * scale, None
    var = math.fsum((x - mean) ** 2 for x in scaled) / (len(scaled) - ddof)
    return mean * scale, math.sqrt(var) * scale


def format_number(value: float) -> str:
    """A number for the table; one too large for a float said in words."""
    return f"{value:.4g}" if math.isfinite(value) else "too large (over 1.8e308)"


def format_table(name: str, seeds: list[SeedResult], flag: str = "seeds") -> list[str]:
    """The text summary: a line per task (its seed, or the value of the swept flag), then
    mean +- std of the final evaluations."""
    what = "seed(s)" if flag == "seeds" else f"values of --{flag}"
    column = "seed" if flag == "seeds" else flag[:12]
    lines = [f"{name}: sweep of {len(seeds)} {what}",
             f"  {column:>7}  {'episodes':>8}  {'final eval':>10}  state"]
    for s in seeds:
        episodes = "?" if s.episodes is None else str(s.episodes)
        evaluation = "-" if s.evaluation is None else format_number(s.evaluation)
        lines.append(f"  {s.seed:>7}  {episodes:>8}  {evaluation:>10}  {s.state}")
    evaluated = [s.evaluation for s in seeds if s.evaluation is not None]
    if not evaluated:
        lines.append("  final evaluation: none yet (a seed is evaluated when it has trained "
                     "all its episodes)")
        return lines
    mean, std = mean_std(evaluated)
    spread = f" +- {format_number(std)} (mean +- std" if std is not None else \
        " (one seed, no spread"
    lines.append(f"  final evaluation over {len(evaluated)} of {len(seeds)} seed(s): "
                 f"{format_number(mean)}{spread})")
    return lines


def _moving_average(values: list[float], window: int) -> list[float]:
    """Means of each `window` consecutive values (numpy's 'valid' convolution), summed
    as values scaled to at most 1 (finite values never overflow)."""
    scale = max((abs(v) for v in values), default=0.0) or 1.0
    scaled = [v / scale for v in values]
    out, total = [], math.fsum(scaled[:window])
    out.append(total / window * scale)
    for i in range(window, len(scaled)):
        total += scaled[i] - scaled[i - window]
        out.append(total / window * scale)
    return out


def _spread(curves: list[list[float]], window: int, longest: int
            ) -> tuple[list[int], list[float], list[float], list[int]]:
    """Per episode (window + i): the mean, the population std (one curve: 0) and the
    number of the curves that reached it."""
    episodes, means, stds, counts = [], [], [], []
    for i in range(longest):
        values = [v[i] for v in curves if i < len(v)]
        mean, std = mean_std(values, ddof=0)
        episodes.append(window + i)
        means.append(mean)
        stds.append(std or 0.0)
        counts.append(len(values))
    return episodes, means, stds, counts


# fewer points than this on the longest curve: no plot (a line needs two points)
MIN_PLOT_POINTS = 2
# a band reaching this far is not drawn: matplotlib's ticks overflow near float's limit
PLOT_LIMIT = 1e300


@dataclasses.dataclass
class Summary:
    table: list[str]
    csv: Path | None = None
    plot: Path | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    left_out: list[str] = dataclasses.field(default_factory=list)  # record entries


def summarize(root: Path, smooth: int = 25, states: dict[str, str] | None = None
              ) -> Summary:
    """The sweep's text table (every seed's episodes, final evaluation and state; mean +-
    std of the final evaluations), and the mean and spread of the seeds' learning curves
    (episode rewards, a moving average of `smooth` episodes) per episode over the seeds
    that reached it: summary.csv always, summary.png where matplotlib is installed and the
    curves have points to draw. Needs neither numpy nor matplotlib for the table and CSV.
    An entry of the sweep's record that is not a task is named in a note."""
    if smooth < 1:
        raise UsageError(f"summary: --smooth must be at least 1, got {smooth}")
    tasks, bad = read_tasks(root)
    summary = Summary([], left_out=bad)
    seeds = []
    curves: dict[str, list[float]] = {}
    for task in tasks:  # (`states`: the chains' where Slurm was asked, else the folders')
        run_dir = root / task.dir
        found = _rewards(run_dir / f"seed_{task.seed}" / "episodes.json")
        count = len(found) if isinstance(found, list) else 0 if found == "no episodes yet" else None
        state = (states or {}).get(task.label) or file_state(run_dir)
        seeds.append(SeedResult(task.label, count, _evaluation(run_dir, task.seed), state))
        if isinstance(found, str):
            summary.notes.append(f"seed {task.label} left out of the curves: {found}")
        else:
            curves[task.label] = found
    summary.table = format_table(root.name, seeds, record_flag(load_record(root)))
    if not curves:
        summary.notes.append(f"no seed of {root.name} has finished an episode yet: no "
                             "curves to write")
        return summary
    window = max(1, min(smooth, *(len(c) for c in curves.values())))
    if window < smooth:
        summary.notes.append(f"moving average over {window} episodes (the shortest seed has "
                             "that many)")
    smoothed = {seed: _moving_average(c, window) for seed, c in curves.items()}
    longest = max(len(v) for v in smoothed.values())
    episodes, means, stds, counts = _spread(list(smoothed.values()), window, longest)
    summary.csv = _write_csv(root, episodes, means, stds, counts, summary.notes)
    if longest < MIN_PLOT_POINTS:
        summary.notes.append(f"no plot: the curves have {longest} point(s) (a moving average "
                             f"of {window} over the seeds' episodes); it is drawn once they "
                             f"have {MIN_PLOT_POINTS}")
        return summary
    if not all(abs(x) < PLOT_LIMIT for m, s in zip(means, stds, strict=True)
               for x in (m - s, m + s)):
        summary.notes.append(f"no plot: the curves' mean +- std reaches {PLOT_LIMIT:g} or "
                             f"more (too large to draw) at some episodes; {SUMMARY_CSV} "
                             "has the numbers")
        return summary
    try:
        import matplotlib
    except ImportError:
        summary.notes.append(f"no plot: matplotlib is not installed here (the login-node "
                             f"client); the table and {SUMMARY_CSV} have the numbers; for "
                             f"{SUMMARY_PLOT}, {install_hint('run')}")
        return summary
    matplotlib.use("Agg")
    summary.plot = _plot(root, list(curves), window, episodes, means, stds)
    return summary


def _write_csv(root: Path, episodes: list[int], means: list[float], stds: list[float],
               counts: list[int], notes: list[str]) -> Path:
    """summary.csv; a number too large for a float is left empty (and a note says so)."""
    def cell(x: float) -> str:
        return f"{x:.6g}" if math.isfinite(x) else ""

    lines = ["episode,mean_reward,std_reward,seeds"]
    lines += [f"{e},{cell(m)},{cell(s)},{n}" for e, m, s, n in zip(episodes, means, stds,
                                                                   counts, strict=True)]
    empty = sum(1 for x in (*means, *stds) if not math.isfinite(x))
    if empty:
        notes.append(f"{SUMMARY_CSV}: {empty} mean or std value(s) too large for a float "
                     "(over 1.8e308) are left empty")
    csv = root / SUMMARY_CSV
    try:
        write_atomic(csv, "\n".join(lines) + "\n")
    except OSError as exc:
        raise UsageError(f"summary: cannot write into {root}: {exc.strerror or exc}") from None
    return csv


def _plot(root: Path, labels: list[str], window: int, episodes: list[int],
          means: list[float], stds: list[float]) -> Path:
    """summary.png: the mean curve across the sweep's tasks with a one-std band."""
    import matplotlib.pyplot as plt

    plot = root / SUMMARY_PLOT
    lower = [m - s for m, s in zip(means, stds, strict=True)]
    upper = [m + s for m, s in zip(means, stds, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 4))
    marker = "o" if len(episodes) < 20 else None  # a few points stay visible
    ax.plot(episodes, means, marker=marker, label=f"mean of {len(labels)} seeds")
    ax.fill_between(episodes, lower, upper, alpha=0.3, label="± 1 std")
    ax.set_xlabel("episode")
    ax.set_ylabel(f"reward (moving average of {window})")
    ax.set_title(f"{root.name}: {', '.join(labels)}")
    ax.legend()
    try:
        fig.savefig(plot, dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise UsageError(f"summary: cannot write into {root}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return plot
