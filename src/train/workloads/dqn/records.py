"""What a training run leaves per seed and for the run, read back: the seeds' outcomes, the
progress count the batch shell reads, and the central CSV rows (appended by rank 0 after
the completion record, so nothing here fails a chunk)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from train.common.jsonio import read_json_object, write_json_atomic
from train.workloads.config import RunConfig
from train.workloads.runtime import results


@dataclass
class SeedOutcome:
    seed: int
    episodes: int
    complete: bool
    rewards: list[float] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None
    digest: str = ""


@dataclass
class RunSummary:
    complete: bool
    stop_reason: str | None
    seeds: list[SeedOutcome]


def work_done(cfg: RunConfig, summary: RunSummary) -> int:
    """Episodes trained over all seeds, each seed counted up to the target (progress DONE)."""
    trained = {s.seed: s.episodes for s in summary.seeds}
    done = 0
    for seed in cfg.seeds:
        episodes = trained.get(seed)
        if episodes is None:  # not reached in this chunk: what an earlier chunk recorded
            recorded = read_json_object(cfg.out_dir / f"seed_{seed}" / "summary.json",
                                        None).get("episodes")
            episodes = recorded if isinstance(recorded, int) else 0
        done += min(max(episodes, 0), cfg.episodes)
    return done


def _result_row(cfg: RunConfig, seed: int, summary: dict[str, Any]) -> dict[str, Any]:
    episodes = int(summary["episodes"])
    history = read_json_object(cfg.out_dir / f"seed_{seed}" / "episodes.json", None)
    rewards = history.get("rewards") or []
    ev = read_json_object(cfg.out_dir / "eval" / "test_results.json", None).get(str(seed))
    if not isinstance(ev, dict) or ev.get("trained_episodes") != episodes:
        ev = {}  # the chunk that finished the seed did not evaluate these weights
    last = rewards[-20:] or [float("nan")]
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "run": str(cfg.out_dir),
        "workload": cfg.workload,
        "seed": seed,
        "res": cfg.res,
        "episodes": episodes,
        "batch_size": cfg.batch_size,
        "train_reward_last20": float(np.mean(last)),
        "eval_mean_reward": ev.get("mean_reward"),
        "eval_std_reward": ev.get("std_reward"),
        "world_size": summary.get("ranks_checked"),
    }


def append_result_rows(cfg: RunConfig) -> list[str]:
    """A central CSV row for each finished seed that has none for its finished total
    (summary.json's csv_episodes): each problem is a warning, and a rerun appends a row that
    failed, never one twice."""
    warnings: list[str] = []
    path = cfg.results_csv_path
    for seed in cfg.seeds:
        summary_path = cfg.out_dir / f"seed_{seed}" / "summary.json"
        summary = read_json_object(summary_path, None)
        if not summary.get("complete") or summary.get("csv_episodes") == summary.get(
                "episodes"):
            continue
        what = f"the row for seed {seed} ({summary.get('episodes')} episodes)"
        try:
            # keyed by run, seed and total: never twice, even if killed before the record
            locked = results.append_csv_row(path, _result_row(cfg, seed, summary),
                                            key=("run", "seed", "episodes"))
        except OSError as exc:
            warnings.append(f"results_csv: could not append {what} to {path}: {exc}; the "
                            "same command appends it when run again")
            continue
        if not locked:
            warnings.append(f"results_csv: the file system of {path} refuses flock; {what} "
                            "was appended without the lock, in one O_APPEND write")
        summary["csv_rows"] = int(summary.get("csv_rows", 0)) + 1
        summary["csv_episodes"] = summary["episodes"]
        try:
            write_json_atomic(summary_path, summary)
        except OSError as exc:
            warnings.append(f"results_csv: {what} was appended to {path} but not recorded "
                            f"in {summary_path} ({exc}); a rerun appends it again")
    return warnings
