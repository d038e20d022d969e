"""Learning: the demo trained on this machine against a scripted beacon-clicking policy and
a random one, on the same evaluation games. Goal: >= 90% of the scripted mean episode reward
within 5 minutes of wall-clock time on 2 CPU cores (evaluation time included)."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, results_file, short, write_section
from train.workloads import runner
from train.workloads.config import RunConfig
from train.workloads.dqn.agent import random_available_action
from train.workloads.dqn.trainer import _EVAL_STREAM, run_episode
from train.workloads.envs.beacon import BeaconEnv
from train.workloads.runtime.results import plot_learning_curves

BUDGET = 300.0
CHUNK = 2 if short() else 10  # (the short mode trains one chunk)
EVAL_EPISODES = 2 if short() else 10


def reference_rewards(cfg: RunConfig, seed: int) -> tuple[float, float]:
    env = BeaconEnv(cfg.res, cfg.episode_steps, [seed, _EVAL_STREAM])
    scripted = np.mean([run_episode(env, lambda o: env.scripted_action())
                        for _ in range(EVAL_EPISODES)])
    rng = np.random.default_rng(0)
    env = BeaconEnv(cfg.res, cfg.episode_steps, [seed, _EVAL_STREAM])
    rand = np.mean([run_episode(env, lambda o: random_available_action(o.available, cfg.res,
                                                                       rng))
                    for _ in range(EVAL_EPISODES)])
    return float(scripted), float(rand)


def learn(res: int, seed: int, work: Path) -> dict[str, object]:
    out = work / f"res{res}"
    points: list[tuple[int, float, float]] = []
    elapsed = 0.0
    episodes = 0
    base = RunConfig(res=res, seeds=(seed,), eval_episodes=EVAL_EPISODES, eval_epsilon=0.0,
                     out=str(out), log_every=1e9)
    scripted, rand = reference_rewards(base, seed)
    reached_at: tuple[int, float] | None = None
    while elapsed < BUDGET:
        episodes += CHUNK
        cfg = RunConfig(**{**base.to_dict(), "seeds": (seed,), "episodes": episodes,
                           "time_budget": BUDGET - elapsed})
        start = time.monotonic()
        runner.run(cfg)
        elapsed += time.monotonic() - start
        evaluation = json.loads((out / "eval" / "test_results.json").read_text())[str(seed)]
        done = evaluation["trained_episodes"]
        points.append((done, elapsed, evaluation["mean_reward"]))
        if reached_at is None and evaluation["mean_reward"] >= 0.9 * scripted:
            reached_at = (done, elapsed)
        if done < episodes or short():  # the short mode: one chunk
            break
    rewards = json.loads((out / f"seed_{seed}" / "episodes.json").read_text())["rewards"]
    return {"res": res, "scripted": scripted, "random": rand, "points": points,
            "reached": reached_at, "train_rewards": rewards}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(2)
    rows, curves, refs = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for res in (16,):
            r = learn(res, 4, Path(tmp))
            final = r["points"][-1]  # type: ignore[index]
            reached = r["reached"]
            reached_text = (f"episode {reached[0]}, {reached[1]:.0f} s" if reached  # type: ignore[index]
                            else "not within the budget")
            rows.append(f"| {res} | {r['random']:.2f} | {r['scripted']:.2f} | "
                        f"{final[2]:.2f} ({final[0]} episodes, {final[1]:.0f} s) | "
                        f"{final[2] / r['scripted']:.2f} | {reached_text} |")
            curves[f"res {res} training"] = r["train_rewards"]
            refs[f"res {res} scripted"] = r["scripted"]
            refs[f"res {res} 90% of scripted"] = 0.9 * r["scripted"]
            points = "\n".join(f"| {p[0]} | {p[1]:.0f} | {p[2]:.2f} |"
                               for p in r["points"])  # type: ignore[union-attr]
        plot_learning_curves(Path(tmp) / "curve.png", curves, "demo learning curve", refs)
        shutil.copy(Path(tmp) / "curve.png", results_file().with_name("learning_curve.png"))
    body = "\n".join([
        "## Learning (goal: >= 90% of the scripted policy's reward within 5 minutes)",
        "",
        f"Machine: {machine()}. Default demo settings, seed 4, trained in chunks of "
        f"{CHUNK} episodes (resume is exact, so chunking does not change training), each "
        f"followed by {EVAL_EPISODES} greedy evaluation episodes on fixed games; the clock "
        "includes start-up, checkpoints and evaluation.",
        "",
        "| res | random | scripted | learned (final) | learned / scripted | reached 90% at |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Evaluation after each chunk (res 16):",
        "",
        "| episodes | wall s | eval mean reward |",
        "|---|---|---|",
        points,
        "",
        "![learning curve](learning_curve.png)",
    ])
    write_section("learning", body)


if __name__ == "__main__":
    main()
