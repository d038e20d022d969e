"""The DQN's run configuration (`train run`): one frozen dataclass whose fields
(train.common.fields.opt) generate the flags, the YAML loader and the validation."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from train.common.errors import ConfigError
from train.common.fields import (
    ArgumentParser,
    add_fields,
    build,
    check_value,
    flags_from,
    load_yaml,
    opt,
)

WORKLOADS = ("demo", "sc2")
MAX_SEED = (2**32 - 1) // 1000 - 1  # numpy's seed is seed x 1000 + rank (< 2**32)


@dataclass(frozen=True)
class RunConfig:
    """Everything `train run` needs; flags override the YAML file, which overrides defaults."""

    workload: str = opt("demo", "What to train: demo (built-in beacon game) or sc2 (pysc2).",
                         kind=str, choices=WORKLOADS)
    res: int = opt(16, "Screen and minimap resolution; move actions form a res x res grid.",
                    kind=int, minimum=4)
    seeds: tuple[int, ...] = opt((4,), 'Seeds run one after another, e.g. "4 6 8".',
                                  kind=tuple)
    episodes: int = opt(200, "Total episodes per seed; a resumed run continues up to it.",
                         kind=int, positive=True, identity=False)
    episode_steps: int = opt(64, "Agent steps per episode of the demo game.",
                              kind=int, positive=True)
    step_mul: int = opt(8, "Game steps per agent step (sc2 only).", kind=int, positive=True)
    sc2_env: str = opt("game", "sc2 only: game (StarCraft II found through SC2PATH) or mock "
                        "(pysc2's own mock environment, no game: checks an image or a "
                        "pipeline end to end, every action through pysc2's conversion).",
                        kind=str, choices=("game", "mock"))
    batch_size: int = opt(32, "Replay minibatch size per update (per process under DDP).",
                           kind=int, positive=True)
    device: str = opt("auto", "auto (cuda when available), cpu or cuda.", kind=str,
                       choices=("auto", "cpu", "cuda"), identity=False)
    precision: str = opt("auto", "auto (bf16 on compute capability >= 8, fp16 + GradScaler "
                          "below, fp32 on CPU), bf16, fp16 or fp32.", kind=str,
                          choices=("auto", "bf16", "fp16", "fp32"), identity=False)
    out: str = opt("runs/demo", "Run directory: config, checkpoints, evaluation, plots.",
                    kind=str, identity=False)
    results_csv: str | None = opt(None, "Central CSV that gets one row per finished seed "
                                   "(default: results.csv beside the run directory).",
                                   kind=str, optional=True, identity=False)
    time_budget: float | None = opt(None, "Seconds this process may train before it "
                                     "checkpoints and exits 0 (e.g. walltime minus a margin).",
                                     kind=float, positive=True, optional=True, identity=False)
    resume: str = opt("auto", "auto: continue from the newest complete checkpoint in out; "
                       "never: refuse to start where checkpoints exist.", kind=str,
                       choices=("auto", "never"), identity=False)
    lr: float = opt(5e-4, "Adam learning rate.", kind=float, positive=True)
    gamma: float = opt(0.9, "Discount factor.", kind=float, minimum=0.0)
    replay_size: int = opt(20000, "Replay buffer capacity in transitions.", kind=int,
                            positive=True)
    learning_starts: int = opt(256, "Transitions collected before the first update.",
                                kind=int, minimum=1)
    train_every: int = opt(1, "Agent steps between updates.", kind=int, positive=True)
    target_update: int = opt(200, "Updates between target network syncs.", kind=int,
                              positive=True)
    eps_start: float = opt(1.0, "Initial exploration rate.", kind=float, minimum=0.0)
    eps_end: float = opt(0.05, "Final exploration rate.", kind=float, minimum=0.0)
    eps_decay_steps: int = opt(4000, "Agent steps over which epsilon decays linearly.",
                                kind=int, positive=True)
    eval_episodes: int = opt(5, "Greedy evaluation episodes at the end of each run chunk.",
                              kind=int, minimum=0, identity=False)
    eval_epsilon: float = opt(0.02, "Exploration rate during evaluation.", kind=float,
                               minimum=0.0, identity=False)
    checkpoint_every: int = opt(25, "Episodes between checkpoints (one is always written "
                                 "when the run stops).", kind=int, positive=True,
                                 identity=False)
    log_every: float = opt(30.0, "Seconds between progress lines in batch logs.",
                            kind=float, positive=True, identity=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value(f, getattr(self, f.name))
        for name in ("gamma", "eps_start", "eps_end", "eval_epsilon"):
            if getattr(self, name) > 1.0:
                raise ConfigError(name, f"must be at most 1.0, got {getattr(self, name)}")
        if not self.seeds:
            raise ConfigError("seeds", "needs at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", f"repeats a seed: {list(self.seeds)}")
        if any(s < 0 for s in self.seeds):
            raise ConfigError("seeds", f"must be non-negative integers, got {list(self.seeds)}")
        if any(s > MAX_SEED for s in self.seeds):
            raise ConfigError("seeds", f"must be at most {MAX_SEED} (each process seeds numpy "
                              f"with seed x 1000 + rank, below 2**32), got {list(self.seeds)}")
        if self.learning_starts < self.batch_size:
            raise ConfigError("learning_starts", f"must be at least batch_size "
                              f"({self.batch_size}), got {self.learning_starts}")
        if self.replay_size < self.learning_starts:
            raise ConfigError("replay_size", f"must be at least learning_starts "
                              f"({self.learning_starts}), got {self.replay_size}")

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    @property
    def results_csv_path(self) -> Path:
        if self.results_csv is not None:
            return Path(self.results_csv)
        return self.out_dir.resolve().parent / "results.csv"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["seeds"] = list(self.seeds)
        return data

    def identity(self) -> dict[str, Any]:
        """The settings a checkpoint must share with the run that resumes it."""
        return {f.name: self.to_dict()[f.name] for f in fields(self) if f.metadata["identity"]}


build_config = functools.partial(build, RunConfig)  # (file_values, flag_values)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", nargs="?", default=None, metavar="WORKLOAD",
                   help=f"one of: {', '.join(WORKLOADS)} (default: demo)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="YAML file with any of the options below")
    add_fields(p, RunConfig, skip=("workload",))


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    file_values = load_yaml(args.config) if args.config is not None else {}
    flags = flags_from(args, RunConfig, skip=("workload",))
    if args.workload is not None:
        flags["workload"] = args.workload
    return build_config(file_values, flags)


def run_config_from_argv(argv: list[str]) -> RunConfig:
    p = ArgumentParser(prog="train run", add_help=False)
    add_run_arguments(p)
    return run_config_from_args(p.parse_args(argv))
