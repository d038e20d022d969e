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
    if len(spec.sweep_seeds) != len(set(spec.sweep_seeds)) or \
            any(s < 0 for s in spec.sweep_seeds):
        raise ConfigError("sweep_seeds", f"must be distinct non-negative integers, got "
                          f"{list(spec.sweep_seeds)}")
    root = Path(os.path.abspath(spec.out or os.path.join("runs", spec.name)))
    specs = []
    for seed in spec.sweep_seeds:
        specs.append((seed, dataclasses.replace(
            spec, name=f"{spec.name}-s{seed}"[:64], out=str(root / seed_dir(seed)),
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
    return [(int(c["seed"]), Path(c["run_dir"])) for c in load_record(root)["chains"]]


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


def summarize(root: Path, smooth: int = 25) -> tuple[Path, Path, int]:
    """Mean and spread of the seeds' learning curves (episode rewards, a moving average
    of `smooth` episodes): summary.csv and summary.png in the sweep's directory. Returns
    (csv, plot, seeds found). Seeds without any episodes yet are left out."""
    import numpy as np

    curves: dict[int, list[float]] = {}
    for seed, run_dir in chain_paths(root):
        path = run_dir / f"seed_{seed}" / "episodes.json"
        try:
            rewards = json.loads(path.read_text(encoding="utf-8"))["rewards"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if rewards:
            curves[seed] = [float(r) for r in rewards]
    if not curves:
        raise UsageError(f"summary: no seed of {root.name} has finished an episode yet")
    length = min(len(c) for c in curves.values())  # the episodes every seed has
    window = max(1, min(smooth, length))
    kernel = np.ones(window) / window
    smoothed = np.array([np.convolve(np.array(c[:length]), kernel, mode="valid")
                         for c in curves.values()])
    mean, std = smoothed.mean(axis=0), smoothed.std(axis=0)
    episodes = np.arange(window, length + 1)
    csv = root / SUMMARY_CSV
    lines = ["episode,mean_reward,std_reward,seeds"]
    lines += [f"{e},{m:.6g},{s:.6g},{len(curves)}" for e, m, s in zip(episodes, mean, std,
                                                                       strict=True)]
    csv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(episodes, mean, label=f"mean of {len(curves)} seeds")
    ax.fill_between(episodes, mean - std, mean + std, alpha=0.3, label="± 1 std")
    ax.set_xlabel("episode")
    ax.set_ylabel(f"reward (moving average of {window})")
    ax.set_title(f"{root.name}: seeds {', '.join(map(str, sorted(curves)))}")
    ax.legend()
    plot = root / SUMMARY_PLOT
    fig.savefig(plot, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return csv, plot, len(curves)
