"""Seed sweeps: one chain per seed, submitted together, running in parallel.

`train submit --sweep-seeds "4 6 8" -- demo ...` makes runs/NAME a sweep: its record
(`sweep.json`) and one chain directory per seed (`seed-4/`, ...), each an ordinary chain
(`train run ... --seeds 4`) with its own chunks. They share the results CSV beside them
(runs/NAME/results.csv, one row per finished seed). `train status NAME` shows the sweep
and each chain; `train summary NAME` writes the curves' mean and spread across seeds.
No heavy imports here except in `summarize` (the plot needs the runtime).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from train.errors import ConfigError, UsageError
from train.jsonio import write_json_atomic
from train.slurm.contract import SWEEP_RECORD
from train.slurm.job import JobSpec

SUMMARY_CSV = "summary.csv"
SUMMARY_PLOT = "summary.png"


def seed_dir(seed: int) -> str:
    return f"seed-{seed}"


def split(spec: JobSpec) -> tuple[Path, list[tuple[int, JobSpec]]]:
    """The sweep's root directory and one chain spec per seed."""
    if spec.entry != "train":
        raise ConfigError("sweep_seeds", "sweeps are for `train run` workloads; run your "
                          "own program's seeds as separate jobs")
    if any(a == "--seeds" or a.startswith("--seeds=") for a in spec.workload):
        raise ConfigError("sweep_seeds", "give the seeds once: --sweep-seeds runs one chain "
                          "per seed (remove --seeds from the workload)")
    from train.config import MAX_SEED

    if len(spec.sweep_seeds) != len(set(spec.sweep_seeds)) or \
            any(s < 0 or s > MAX_SEED for s in spec.sweep_seeds):
        raise ConfigError("sweep_seeds", f"must be distinct integers from 0 to {MAX_SEED}, "
                          f"got {list(spec.sweep_seeds)}")
    root = Path(os.path.abspath(spec.out or os.path.join("runs", spec.name)))
    specs = []
    for seed in spec.sweep_seeds:
        suffix = f"-s{seed}"  # kept whole: the chains' job names must differ
        specs.append((seed, dataclasses.replace(
            spec, name=spec.name[:64 - len(suffix)] + suffix, out=str(root / seed_dir(seed)),
            sweep_seeds=(), workload=(*spec.workload, "--seeds", str(seed)))))
    return root, specs


def write_record(root: Path, name: str, chains: list[dict[str, Any]]) -> None:
    write_json_atomic(root / SWEEP_RECORD, {"name": name, "chains": chains})


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


def chain_paths(root: Path) -> list[tuple[int, Path]]:
    """(seed, chain directory) per chain; a moved sweep finds its chains where it is."""
    out = []
    for i, chain in enumerate(load_record(root)["chains"], 1):
        seed = chain.get("seed") if isinstance(chain, dict) else None
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"sweep: {root / SWEEP_RECORD}: chain {i} has no integer seed")
        out.append((seed, root / seed_dir(seed)))
    return out


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


def format_sweep(st: dict[str, Any], chain_lines: list[list[str]]) -> list[str]:
    counts = ", ".join(f"{n} {s}" for s, n in st["counts"].items())
    head = [f"{st['name']}: sweep of {len(st['chains'])} seeds, {st['state']} ({counts})",
            f"  done {st['done']}/{st['total']} episodes over all seeds; "
            f"`train summary {st['name']}` for the curves across seeds"]
    return head + ["  " + line for lines in chain_lines for line in lines]


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


def summarize(root: Path, smooth: int = 25) -> tuple[Path, Path, list[str]]:
    """Mean and spread of the seeds' learning curves (episode rewards, a moving average of
    `smooth` episodes), per episode over the seeds that reached it: summary.csv and
    summary.png in the sweep's directory. Returns (csv, plot, notes on seeds left out)."""
    if smooth < 1:
        raise UsageError(f"summary: --smooth must be at least 1, got {smooth}")
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[int, list[float]] = {}
    notes: list[str] = []
    for seed, run_dir in chain_paths(root):
        found = _rewards(run_dir / f"seed_{seed}" / "episodes.json")
        if isinstance(found, str):
            notes.append(f"seed {seed} left out: {found}")
        else:
            curves[seed] = found
    if not curves:
        raise UsageError(f"summary: no seed of {root.name} has finished an episode yet")
    window = max(1, min(smooth, *(len(c) for c in curves.values())))
    kernel = np.ones(window) / window
    smoothed = {seed: np.convolve(np.array(c), kernel, mode="valid")
                for seed, c in curves.items()}
    longest = max(len(v) for v in smoothed.values())
    episodes, means, stds, counts = [], [], [], []
    for i in range(longest):  # episode window + i, over the seeds that reached it
        values = np.array([v[i] for v in smoothed.values() if i < len(v)])
        episodes.append(window + i)
        means.append(float(values.mean()))
        stds.append(float(values.std()))
        counts.append(len(values))
    lines = ["episode,mean_reward,std_reward,seeds"]
    lines += [f"{e},{m:.6g},{s:.6g},{n}" for e, m, s, n in zip(episodes, means, stds, counts,
                                                               strict=True)]
    csv, plot = root / SUMMARY_CSV, root / SUMMARY_PLOT
    mean, std = np.array(means), np.array(stds)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(episodes, mean, label=f"mean of {len(curves)} seeds")
    ax.fill_between(episodes, mean - std, mean + std, alpha=0.3, label="± 1 std")
    ax.set_xlabel("episode")
    ax.set_ylabel(f"reward (moving average of {window})")
    ax.set_title(f"{root.name}: seeds {', '.join(map(str, sorted(curves)))}")
    ax.legend()
    try:
        tmp = csv.with_name(f".{SUMMARY_CSV}.tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.replace(csv)
        fig.savefig(plot, dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise UsageError(f"summary: cannot write into {root}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    if window < smooth:
        notes.append(f"moving average over {window} episodes (the shortest seed has that "
                     "many)")
    return csv, plot, notes
