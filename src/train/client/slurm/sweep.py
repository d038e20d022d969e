"""Seed sweeps: one chain per seed, submitted together, running in parallel.

`train submit --sweep-seeds "4 6 8" -- demo ...` makes runs/NAME a sweep: its record
(`sweep.json`) and one chain directory per seed (`seed-4/`, ...), each an ordinary chain
(`train run ... --seeds 4`) with its own chunks. They share the results CSV beside them
(runs/NAME/results.csv, one row per finished seed). `train status NAME` shows the sweep
and each chain; `train summary NAME` prints a table of the seeds (episodes, final
evaluation, state; mean +- std of the final evaluations) and writes the curves' mean and
spread across seeds.
Nothing here needs the training runtime: the plot is drawn where matplotlib is installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from train.batch.contract import COMPLETE_MARKER, SWEEP_RECORD
from train.client.slurm.job import JobSpec, ResolvedJob
from train.client.slurm.sweepargs import check_command, task_changes
from train.common.errors import ConfigError, UsageError
from train.common.jsonio import write_json_atomic

SUMMARY_CSV = "summary.csv"
# Slurm's default MaxArraySize (its array indices run from 0 to MaxArraySize - 1)
DEFAULT_MAX_ARRAY_SIZE = 1001
# what each task of a command's sweep finds in its environment
SWEEP_INDEX_VAR = "TRAIN_SWEEP_INDEX"
SWEEP_VALUE_VAR = "TRAIN_SWEEP_VALUE"
SUMMARY_PLOT = "summary.png"


def seed_dir(seed: int) -> str:
    return f"seed-{seed}"


@dataclasses.dataclass(frozen=True)
class SweepTask:
    """One task of a sweep: its index in the job array, the value it runs with, the seed
    its `train run` trains (None for a command), and its folder under the sweep's."""

    index: int
    value: str
    seed: int | None
    dir: str

    @property
    def label(self) -> str:
        return str(self.seed) if self.dir == seed_dir(self.seed or 0) else self.value


def sweep_field(spec: JobSpec) -> str:
    return "sweep" if spec.sweep else "sweep_seeds"


def _values(spec: JobSpec) -> tuple[str, list[str]]:
    """The swept flag's name (`seeds` for --sweep-seeds) and its values, checked."""
    from train.workloads.config import MAX_SEED

    if spec.sweep and spec.sweep_seeds:
        raise ConfigError("sweep", "give --sweep or --sweep-seeds, not both")
    if spec.sweep_seeds:
        if len(spec.sweep_seeds) != len(set(spec.sweep_seeds)) or \
                any(s < 0 or s > MAX_SEED for s in spec.sweep_seeds):
            raise ConfigError("sweep_seeds", f"must be distinct integers from 0 to {MAX_SEED}, "
                              f"got {list(spec.sweep_seeds)}")
        return "seeds", [str(s) for s in spec.sweep_seeds]
    name, sep, text = (spec.sweep or "").partition("=")
    name = name.strip().lstrip("-").replace("_", "-")
    values = [v.strip() for v in text.split(",")]
    if not sep or not re.fullmatch(r"[a-z][a-z0-9-]{0,40}", name) or not all(values) or \
            any(c in text for c in "\n\r\0"):
        raise ConfigError("sweep", f"must be NAME=V1,V2,... (a `train run` flag without its "
                          f"dashes, e.g. lr=1e-3,5e-4; for a command any name), got "
                          f"{spec.sweep!r}")
    if len(values) != len(set(values)):
        raise ConfigError("sweep", f"the values must differ, got {text!r}")
    if name == "seeds":
        raise ConfigError("sweep", "sweep seeds with --sweep-seeds \"4 6 8\"")
    return name, values


def swept_flag(spec: JobSpec) -> str:
    """The flag the sweep sets per task (`seeds` for --sweep-seeds)."""
    return _values(spec)[0]


def requeue_mode(spec: JobSpec) -> bool:
    """Whether the sweep's tasks run in requeue mode: asked for (--requeue), or a throttled
    sweep. Slurm counts a requeued array task against the array's throttle again, never a
    task's successors (jobs of their own, outside the array): only when each task requeues
    itself after a checkpointed stop does --sweep-throttle bound every chunk of every task.
    Unthrottled sweeps chain each task with successor jobs, as single chains do."""
    return spec.requeue or spec.sweep_throttle is not None


def split(spec: JobSpec, max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
          ) -> tuple[Path, list[tuple[SweepTask, JobSpec]]]:
    """The sweep's root directory and one chain spec per task of its job array."""
    field = sweep_field(spec)
    if spec.entry == "navsim":
        raise ConfigError(field, "sweeps are for `train run` workloads and commands (entry "
                          "train or command)")
    flag, values = _values(spec)
    if len(values) > max_array_size:
        raise ConfigError(field, f"{len(values)} tasks are more than the cluster's job "
                          f"array size limit of {max_array_size} (max_array_size in its "
                          "profile; Slurm's MaxArraySize): split the sweep")
    if spec.sweep_throttle is not None and spec.sweep_throttle > len(values):
        raise ConfigError("sweep_throttle", f"must be 1 to {len(values)} (the sweep's "
                          f"tasks), got {spec.sweep_throttle}: a larger one throttles nothing")
    given = f"--{flag}"
    if spec.entry == "train" and any(a == given or a.startswith(given + "=")
                                     for a in spec.workload):
        raise ConfigError(field, f"give the {flag} once: the sweep sets {given} for each "
                          f"task (remove {given} from the workload)")
    if spec.entry == "command":
        check_command(spec.workload, "workload")
    root = Path(os.path.abspath(spec.out or os.path.join("runs", spec.name)))
    out = []
    for index, value in enumerate(values):
        seed = int(value) if flag == "seeds" else None
        where = seed_dir(seed) if seed is not None else f"task-{index}"
        suffix = f"-s{seed}" if seed is not None else f"-t{index}"  # the names must differ
        changes: dict[str, Any] = {"name": spec.name[:64 - len(suffix)] + suffix,
                                   "out": str(root / where), "sweep_seeds": (), "sweep": None,
                                   "requeue": requeue_mode(spec)}
        if spec.entry == "train":
            changes["workload"] = (*spec.workload, given, value)
            if seed is None:
                seed = _train_seed(spec.workload)
        else:  # a command: its {value}, {index} and {task_dir} (train.client.slurm.sweepargs)
            changes.update(task_changes(spec.workload, spec.resume_args, spec.save_path,
                                        index, value, str(root / where)))
        out.append((SweepTask(index, value, seed, where), dataclasses.replace(spec, **changes)))
    return root, out


def task_job(task: SweepTask, job: ResolvedJob) -> ResolvedJob:
    """The task's resolved job: every process of its chain (each chunk) finds its index
    and value in TRAIN_SWEEP_INDEX and TRAIN_SWEEP_VALUE (names a job may not set)."""
    values = (*job.env_values, (SWEEP_INDEX_VAR, str(task.index)),
              (SWEEP_VALUE_VAR, task.value))
    return dataclasses.replace(job, env_values=values)


def _train_seed(workload: tuple[str, ...]) -> int | None:
    """The first seed a `train run` workload trains (where its flags can be read)."""
    from train.workloads.config import run_config_from_argv

    try:
        seeds = run_config_from_argv(list(workload)).seeds
    except (ConfigError, UsageError, SystemExit):
        return None
    return seeds[0] if seeds else None


def write_record(root: Path, name: str, tasks: list[SweepTask], flag: str = "seeds",
                 **extra: Any) -> None:
    chains = [{"index": t.index, "value": t.value, "seed": t.seed, "dir": t.dir}
              for t in tasks]
    write_json_atomic(root / SWEEP_RECORD, {"name": name, "flag": flag, **extra,
                                            "chains": chains})


def load_record(root: Path) -> dict[str, Any]:
    path = root / SWEEP_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"sweep: cannot read {path}: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("chains"), list):
        raise UsageError(f"sweep: {path} does not hold a sweep record")
    return record


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_RECORD).is_file()


def sweep_tasks(root: Path) -> list[SweepTask]:
    """The sweep's tasks from its record; a moved sweep finds its chains where it is."""
    out = []
    for i, found in enumerate(load_record(root)["chains"]):
        chain = found if isinstance(found, dict) else {}
        seed, where = chain.get("seed"), chain.get("dir")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            seed = None
        if where is None and seed is not None:  # a record of before the job arrays
            where = seed_dir(seed)
        if not isinstance(where, str) or not re.fullmatch(r"(seed|task)-[0-9]{1,18}", where):
            raise UsageError(f"sweep: {root / SWEEP_RECORD}: chain {i + 1} has no folder")
        value = chain.get("value", seed)
        out.append(SweepTask(int(chain.get("index", i)), str(value), seed, where))
    return out


def chain_paths(root: Path) -> list[tuple[str, Path]]:
    """(label, chain directory) per task of the sweep."""
    return [(t.label, root / t.dir) for t in sweep_tasks(root)]


def not_a_chain(field: str, ref: str, root: Path) -> UsageError:
    """The error for a command that reads one chain, given a whole sweep: its chains."""
    return UsageError(f"{field}: {ref} is a sweep; name one of its chains: "
                      + ", ".join(f"{ref}/{p.name}" for _, p in chain_paths(root)))


def aggregate(name: str, root: Path, statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's own state from its chains' (the worst first)."""
    states = [s.get("state", "unknown") for s in statuses]
    order = ("failed", "unreadable", "cancelled", "stalled", "incomplete", "ended", "held",
             "running", "pending", "complete")
    state = next((s for s in order if s in states), states[0] if states else "empty")
    done = sum(int(s.get("done") or 0) for s in statuses)
    total = sum(int(s.get("total") or 0) for s in statuses)
    return {"name": name, "run_dir": str(root), "sweep": True, "state": state,
            "done": done, "total": total,
            "counts": {s: states.count(s) for s in dict.fromkeys(states)},
            "chains": statuses}


def _rewards(path: Path) -> list[float] | str:
    """A seed's episode rewards, or why they cannot be used."""
    import math

    try:
        rewards = json.loads(path.read_text(encoding="utf-8"))["rewards"]
    except OSError:
        return "no episodes yet"
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
    import math

    try:
        found = json.loads((run_dir / "eval" / "test_results.json").read_text(
            encoding="utf-8")).get(str(seed))
    except (OSError, ValueError, AttributeError):
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


def seed_results(root: Path, states: dict[str, str] | None = None) -> list[SeedResult]:
    """Every seed of the sweep: episodes, final evaluation and state (`states`: the chains'
    states where Slurm was asked; otherwise from the run folders)."""
    out = []
    for task in sweep_tasks(root):
        run_dir = root / task.dir
        found = _rewards(run_dir / f"seed_{task.seed}" / "episodes.json")
        episodes = len(found) if isinstance(found, list) else (
            0 if found == "no episodes yet" else None)
        state = (states or {}).get(task.label) or file_state(run_dir)
        out.append(SeedResult(task.label, episodes, _evaluation(run_dir, task.seed), state))
    return out


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    import statistics

    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def format_table(name: str, seeds: list[SeedResult], flag: str = "seeds") -> list[str]:
    """The text summary: a line per task (its seed, or the value of the swept flag), then
    mean +- std of the final evaluations."""
    what = "seed(s)" if flag == "seeds" else f"values of --{flag}"
    column = "seed" if flag == "seeds" else flag[:12]
    lines = [f"{name}: sweep of {len(seeds)} {what}",
             f"  {column:>7}  {'episodes':>8}  {'final eval':>10}  state"]
    for s in seeds:
        episodes = "?" if s.episodes is None else str(s.episodes)
        evaluation = "-" if s.evaluation is None else f"{s.evaluation:.4g}"
        lines.append(f"  {s.seed:>7}  {episodes:>8}  {evaluation:>10}  {s.state}")
    evaluated = [s.evaluation for s in seeds if s.evaluation is not None]
    if not evaluated:
        lines.append("  final evaluation: none yet (a seed is evaluated when it has trained "
                     "all its episodes)")
        return lines
    mean, std = mean_std(evaluated)
    spread = f" +- {std:.4g} (mean +- std" if std is not None else " (one seed, no spread"
    lines.append(f"  final evaluation over {len(evaluated)} of {len(seeds)} seed(s): "
                 f"{mean:.4g}{spread})")
    return lines


def _moving_average(values: list[float], window: int) -> list[float]:
    """Means of each `window` consecutive values (numpy's 'valid' convolution)."""
    out, total = [], sum(values[:window])
    out.append(total / window)
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        out.append(total / window)
    return out


def _spread(curves: list[list[float]], window: int, longest: int
            ) -> tuple[list[int], list[float], list[float], list[int]]:
    """Per episode (window + i): the mean, the population std (one curve: 0) and the
    number of the curves that reached it."""
    episodes, means, stds, counts = [], [], [], []
    for i in range(longest):
        values = [v[i] for v in curves if i < len(v)]
        mean = sum(values) / len(values)
        episodes.append(window + i)
        means.append(mean)
        stds.append((sum((x - mean) ** 2 for x in values) / len(values)) ** 0.5)
        counts.append(len(values))
    return episodes, means, stds, counts


# fewer points than this on the longest curve: no plot (a line needs two points)
MIN_PLOT_POINTS = 2


@dataclasses.dataclass
class Summary:
    table: list[str]
    csv: Path | None = None
    plot: Path | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def summarize(root: Path, smooth: int = 25, states: dict[str, str] | None = None
              ) -> Summary:
    """The sweep's text table (every seed's episodes, final evaluation and state; mean +-
    std of the final evaluations), and the mean and spread of the seeds' learning curves
    (episode rewards, a moving average of `smooth` episodes) per episode over the seeds
    that reached it: summary.csv always, summary.png where matplotlib is installed and the
    curves have points to draw. Needs neither numpy nor matplotlib for the table and CSV."""
    if smooth < 1:
        raise UsageError(f"summary: --smooth must be at least 1, got {smooth}")
    seeds = seed_results(root, states)
    summary = Summary(format_table(root.name, seeds,
                                   str(load_record(root).get("flag") or "seeds")))
    curves: dict[str, list[float]] = {}
    for task in sweep_tasks(root):
        seed = task.label
        found = _rewards(root / task.dir / f"seed_{task.seed}" / "episodes.json")
        if isinstance(found, str):
            summary.notes.append(f"seed {seed} left out of the curves: {found}")
        else:
            curves[seed] = found
    if not curves:
        summary.notes.append(f"no seed of {root.name} has finished an episode yet: no "
                             "curves to write")
        return summary
    window = max(1, min(smooth, *(len(c) for c in curves.values())))
    smoothed = {seed: _moving_average(c, window) for seed, c in curves.items()}
    longest = max(len(v) for v in smoothed.values())
    episodes, means, stds, counts = _spread(list(smoothed.values()), window, longest)
    lines = ["episode,mean_reward,std_reward,seeds"]
    lines += [f"{e},{m:.6g},{s:.6g},{n}" for e, m, s, n in zip(episodes, means, stds, counts,
                                                               strict=True)]
    csv = root / SUMMARY_CSV
    try:
        tmp = csv.with_name(f".{SUMMARY_CSV}.tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.replace(csv)
    except OSError as exc:
        raise UsageError(f"summary: cannot write into {root}: {exc.strerror or exc}") from None
    summary.csv = csv
    if window < smooth:
        summary.notes.append(f"moving average over {window} episodes (the shortest seed has "
                             "that many)")
    if longest < MIN_PLOT_POINTS:
        summary.notes.append(f"no plot: the curves have {longest} point(s) (a moving average "
                             f"of {window} over the seeds' episodes); it is drawn once they "
                             f"have {MIN_PLOT_POINTS}")
        return summary
    try:
        import matplotlib
    except ImportError:
        from train.common.errors import install_hint

        summary.notes.append(f"no plot: matplotlib is not installed here (the login-node "
                             f"client); the table and {SUMMARY_CSV} have the numbers; for "
                             f"{SUMMARY_PLOT}, {install_hint('run')}")
        return summary
    matplotlib.use("Agg")
    plot = _plot(root, list(curves), window, episodes, means, stds)
    summary.plot = plot
    return summary


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
