"""The resumable training loop: seeds one after another, episodes, checkpoints, results.

Resume is exact: everything that influences training (networks, optimizer, scaler, replay
buffer, counters, the game's state and every random generator) is in the checkpoint, and
nothing depends on the run's total episode count, so N episodes resumed to 2N equal 2N
episodes in one go. Evaluation uses its own game and generator, so it cannot perturb
training. Checkpoints fall on episode boundaries.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from train.common.errors import CheckpointError, UsageError, first_line
from train.common.jsonio import read_json_object, write_json_atomic
from train.node.distributed import DistContext
from train.node.signals import StopController
from train.workloads.config import RunConfig
from train.workloads.dqn.agent import DQNAgent
from train.workloads.dqn.replay import ReplayBuffer
from train.workloads.envs.beacon import BeaconEnv
from train.workloads.envs.pysc2_env import Pysc2Env
from train.workloads.envs.spec import ObsSpec
from train.workloads.runrecord import batch_fallback
from train.workloads.runtime.checkpoint import CheckpointManager
from train.workloads.runtime.memory import preallocate, training_state_bytes
from train.workloads.runtime.precision import PrecisionPolicy
from train.workloads.runtime.results import Progress, RunSummary

log = logging.getLogger(__name__)

# Offsets that give each rank, and evaluation, generators independent of training's.
_EVAL_STREAM = 7919


def epsilon_at(cfg: RunConfig, step: int) -> float:
    frac = min(1.0, step / cfg.eps_decay_steps)
    return cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac


def param_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()


# How often (in agent steps) a training episode asks whether it must be cut: one process
# asks at every step (a clock read); under DDP the ranks agree every few steps in lockstep
# (one small all-gather beside each step's gradient all-reduce).
STOP_CHECK_STEPS_DDP = 4


class EpisodeCut(Exception):
    """Raised from a step when a stop cannot wait for the episode's end."""


def run_episode(env: BeaconEnv | Pysc2Env, policy: Callable[[Any], int],
                on_step: Callable[[Any, int, float, bool, Any], None] | None = None) -> float:
    """One episode's summed reward; `on_step` may end it early (EpisodeCut)."""
    obs = env.reset()
    total = 0.0
    while True:
        action = policy(obs)
        next_obs, reward, terminal, over = env.step(action)
        if on_step is not None:
            on_step(obs, action, reward, terminal, next_obs)
        total += reward
        obs = next_obs
        if terminal or over:
            return total


def check_state(state: dict[str, Any]) -> None:
    """The shape SeedRun.save writes, checked before anything is restored from it (a file
    with a valid checksum may still be someone else's): TypeError or KeyError if not."""
    def need(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise TypeError(f"{what} is {type(value).__name__}, not what the trainer writes")
        return value

    for key in ("seed", "episode", "step", "world_size"):
        if need(state.get(key), int, key) < 0:
            raise ValueError(f"{key} is negative")
    need(state.get("identity"), dict, "identity")
    need(state.get("agent"), dict, "agent")
    history = need(state.get("history"), dict, "history")
    for key in ("rewards", "losses"):
        for value in need(history.get(key), list, f"history.{key}"):
            need(value, (int, float), f"a value of history.{key}")
    ranks = need(state.get("ranks"), list, "ranks")
    if len(ranks) != state["world_size"]:
        raise ValueError(f"{len(ranks)} rank states for a world size of {state['world_size']}")
    for i, rank in enumerate(ranks):
        need(rank, dict, f"ranks[{i}]")
        for key in ("replay", "env", "rng", "numpy_rng", "python_rng"):
            if key not in rank:
                raise KeyError(f"ranks[{i}] has no {key}")
        need(rank.get("torch_cpu_rng"), torch.Tensor, f"ranks[{i}].torch_cpu_rng")


class SeedRun:
    """One seed on this rank: builds the agent, restores, trains, evaluates."""

    def __init__(self, cfg: RunConfig, seed: int, ctx: DistContext,
                 precision: PrecisionPolicy) -> None:
        self.cfg = cfg
        self.seed = seed
        self.ctx = ctx
        self.dir = cfg.out_dir / f"seed_{seed}"
        random.seed(seed * 1000 + ctx.rank)
        np.random.seed(seed * 1000 + ctx.rank)
        torch.manual_seed(seed)  # the same initial weights on every rank
        self.spec = ObsSpec(cfg.res)
        self.env: BeaconEnv | Pysc2Env
        if cfg.workload == "sc2":
            self.env = Pysc2Env(cfg.res, cfg.step_mul, seed * 1000 + ctx.rank,
                                mock=cfg.sc2_env == "mock")
        else:
            self.env = BeaconEnv(cfg.res, cfg.episode_steps, [seed, ctx.rank])
        self.rng = np.random.default_rng([seed, ctx.rank])
        wrap = None
        if ctx.distributed:
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            wrap = lambda m: DistributedDataParallel(m, device_ids=ids)  # noqa: E731
        self.agent = DQNAgent(self.spec, cfg, ctx.device, precision, wrap)
        self.replay = ReplayBuffer(cfg.replay_size, self.spec)
        self.episode = 0
        self.step = 0
        self.rewards: list[float] = []
        self.losses: list[float] = []
        # the current episode's training losses, summed on the device (read at its end)
        self._loss_sum = torch.zeros((), device=ctx.device)
        self._loss_count = 0
        self.checkpoints = CheckpointManager(self.dir / "checkpoints")
        self.batch_fallback = False  # see restore()

    # -- checkpoint state -------------------------------------------------------------
    def _local_state(self) -> dict[str, Any]:
        cuda = self.ctx.device.type == "cuda"
        return {
            "replay": self.replay.state_dict(),
            "env": self.env.state_dict(),
            "rng": self.rng.bit_generator.state,
            "torch_cpu_rng": torch.get_rng_state(),
            "torch_cuda_rng": torch.cuda.get_rng_state(self.ctx.device) if cuda else None,
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        }

    def _restore_local(self, state: dict[str, Any]) -> None:
        self.replay.load_state_dict(state["replay"])
        self.env.load_state_dict(state["env"])
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_cpu_rng"])
        if self.ctx.device.type == "cuda" and state["torch_cuda_rng"] is not None:
            torch.cuda.set_rng_state(state["torch_cuda_rng"], self.ctx.device)
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])

    def save(self) -> None:
        ranks = self.ctx.gather_to_main(self._local_state())
        if not self.ctx.is_main:
            return
        self.checkpoints.save({
            "seed": self.seed,
            "episode": self.episode,
            "step": self.step,
            "world_size": self.ctx.world_size,
            "identity": self.cfg.identity(),
            "batch_fallback": self.batch_fallback,
            "agent": self.agent.state_dict(),
            "history": {"rewards": self.rewards, "losses": self.losses},
            "ranks": ranks,
        }, self.episode)

    def restore(self) -> bool:
        """Load the newest complete checkpoint, if any; True when resumed."""
        state = self.checkpoints.load_latest(check_state, set_aside=self.ctx.is_main)
        if state is None:
            return False
        self.batch_fallback = batch_fallback(self.cfg, state)
        exempt = {"batch_size"} if self.batch_fallback else set()
        mismatched = {k: (v, state["identity"].get(k)) for k, v in self.cfg.identity().items()
                      if state["identity"].get(k) != v and k not in exempt}
        if mismatched:
            detail = "; ".join(f"{k}: checkpoint {old!r}, now {new!r}"
                               for k, (new, old) in sorted(mismatched.items()))
            raise UsageError(f"{sorted(mismatched)[0]}: differs from the run being resumed in "
                             f"{self.dir} ({detail}); use the original settings or a new --out")
        if state["world_size"] != self.ctx.world_size:
            raise UsageError(f"WORLD_SIZE: the checkpoint in {self.dir} was written by "
                             f"{state['world_size']} processes, this run has "
                             f"{self.ctx.world_size}; resume with the same number")
        try:
            self.agent.load_state_dict(state["agent"])
            self._restore_local(state["ranks"][self.ctx.rank])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
            raise CheckpointError(f"the newest checkpoint in {self.checkpoints.directory} "
                                  f"does not fit this run: {first_line(exc)}; move it away "
                                  "to resume from the one before") from None
        self.episode = int(state["episode"])
        self.step = int(state["step"])
        self.rewards = [float(r) for r in state["history"]["rewards"]]
        self.losses = [float(x) for x in state["history"]["losses"]]
        return True

    # -- training ---------------------------------------------------------------------
    def train(self, stopper: StopController) -> bool:
        """Train up to cfg.episodes; False when stopped early (checkpoint written)."""
        cfg = self.cfg
        progress = Progress(cfg.episodes, self.episode, f"seed {self.seed}", cfg.log_every,
                            enabled=self.ctx.is_main)
        on_step = functools.partial(self._step, stopper)
        # a stop asked for during start-up (the walltime signal) ends the chunk before its
        # first episode: the last checkpoint already holds everything
        stopped = self.episode < cfg.episodes and self.ctx.any(stopper.reason is not None)
        try:
            while self.episode < cfg.episodes and not stopped:
                started = time.monotonic()
                self._loss_sum.zero_()
                self._loss_count = 0
                try:
                    reward = run_episode(
                        self.env,
                        lambda obs: self.agent.act(obs, epsilon_at(cfg, self.step), self.rng),
                        on_step)
                except EpisodeCut:
                    # the episode is not counted (a resumed run starts it afresh); its steps,
                    # updates and replay are kept in the checkpoint
                    log.warning("episode %d cut after %.0f s (%s); checkpointing at step "
                                "%d", self.episode + 1, time.monotonic() - started,
                                stopper.reason, self.step)
                    stopped = True
                    self.save()
                    break
                stopped = self._end_episode(stopper, progress, reward, started)
        finally:
            progress.close()
            self.checkpoints.wait()
        # the last episode finished while a stop was asked for: the work is done all the same
        return self.episode >= cfg.episodes

    def _step(self, stopper: StopController, obs: Any, action: int, reward: float,
              terminal: bool, nxt: Any) -> None:
        cfg = self.cfg
        self.replay.add(obs, action, reward, terminal, nxt)
        self.step += 1
        if len(self.replay) >= cfg.learning_starts and self.step % cfg.train_every == 0:
            batch = self.agent.to_batch(self.replay.sample(cfg.batch_size, self.rng))
            self._loss_sum += self.agent.update(batch)
            self._loss_count += 1
            if self.agent.updates == 1:
                log.info("first training step done at unix time %.3f", time.time())
        # every rank has taken the same number of steps here, so they agree in lockstep
        if not self.ctx.distributed:
            if stopper.overdue():
                raise EpisodeCut
        elif self.step % STOP_CHECK_STEPS_DDP == 0 and self.ctx.any(stopper.overdue()):
            stopper.request_stop("a stop on another rank")  # (kept if this rank's own)
            raise EpisodeCut

    def _end_episode(self, stopper: StopController, progress: Progress, reward: float,
                     started: float) -> bool:
        """Count a finished episode (its reward averaged over the ranks), checkpoint when
        due; True when the ranks agree to stop."""
        cfg = self.cfg
        self.episode += 1
        rewards = self.ctx.all_gather_object(reward)
        self.rewards.append(float(np.mean(rewards)))
        self.losses.append(float(self._loss_sum.item()) / self._loss_count
                           if self._loss_count else float("nan"))
        stopper.episode_finished(time.monotonic() - started)
        stopped = self.ctx.any(stopper.should_stop())
        if stopped:
            stopper.request_stop("a stop on another rank")  # (kept if this rank's)
        progress.update(self.episode, reward=self.rewards[-1],
                        eps=epsilon_at(cfg, self.step))
        if stopped or self.episode % cfg.checkpoint_every == 0 \
                or self.episode >= cfg.episodes:
            self.save()
        return stopped

    def evaluate(self) -> dict[str, Any]:
        """Episodes with a fixed game seed and generator: the same weights, the same result."""
        cfg = self.cfg
        env = self.env  # sc2: a second game instance is too heavy; the game is not seedable
        if cfg.workload == "demo":
            env = BeaconEnv(cfg.res, cfg.episode_steps, [self.seed, _EVAL_STREAM])
        rng = np.random.default_rng([self.seed, _EVAL_STREAM])
        rewards = [run_episode(env, lambda obs: self.agent.act(obs, cfg.eval_epsilon, rng))
                   for _ in range(cfg.eval_episodes)]
        result: dict[str, Any] = {
            "seed": self.seed,
            "trained_episodes": self.episode,
            "eval_epsilon": cfg.eval_epsilon,
            "episode_rewards": rewards,
            "mean_reward": float(np.mean(rewards)) if rewards else None,
            "std_reward": float(np.std(rewards)) if rewards else None,
        }
        if cfg.workload == "demo" and rewards:
            # the yardstick: the hand-written policy on the same evaluation games
            ref = BeaconEnv(cfg.res, cfg.episode_steps, [self.seed, _EVAL_STREAM])
            scripted = [run_episode(ref, lambda obs: ref.scripted_action())
                        for _ in range(cfg.eval_episodes)]
            result["scripted_mean_reward"] = float(np.mean(scripted))
        return result


def train(cfg: RunConfig, ctx: DistContext, precision: PrecisionPolicy,
          stopper: StopController) -> RunSummary:
    """Train every seed in turn; returns what happened (results written by rank 0)."""
    outcomes: dict[str, dict[str, Any]] = {}
    for seed in cfg.seeds:
        done = read_json_object(cfg.out_dir / f"seed_{seed}" / "summary.json", None)
        if done.get("complete") and int(done.get("episodes", 0)) >= cfg.episodes:
            log.info("seed %d already complete (%d episodes); skipping", seed,
                     done["episodes"])
            outcomes[str(seed)] = {"episodes": int(done["episodes"]), "complete": True}
            continue
        outcomes[str(seed)] = _train_seed(cfg, seed, ctx, precision, stopper)
        if not outcomes[str(seed)]["complete"]:
            return RunSummary(False, stopper.reason, outcomes)
    return RunSummary(True, None, outcomes)


def _train_seed(cfg: RunConfig, seed: int, ctx: DistContext, precision: PrecisionPolicy,
                stopper: StopController) -> dict[str, Any]:
    run = SeedRun(cfg, seed, ctx, precision)
    try:
        what = f"optimizer state and a batch of {cfg.batch_size} at res {cfg.res}"
        preallocate(run.agent.dummy_step, device=ctx.device, what=what,
                    state_bytes=training_state_bytes(run.agent.policy.parameters()))
        if ctx.is_main:
            run.checkpoints.prepare()
        if cfg.resume == "auto":
            if run.restore():
                log.info("seed %d resumed at episode %d (step %d)", seed, run.episode,
                         run.step)
        elif run.checkpoints.complete():
            raise UsageError(f"resume: {run.checkpoints.directory} already holds "
                             "checkpoints and --resume is never; use --resume auto or a new "
                             "--out")
        complete = run.train(stopper)
        digests = ctx.all_gather_object(param_digest(run.agent.policy))
        if len(set(digests)) != 1:
            raise CheckpointError(f"parameters differ across ranks after training: {digests}")
        if ctx.is_main:
            # a stopped chunk must leave at once: the chunk that finishes evaluates
            evaluation = run.evaluate() if cfg.eval_episodes and complete else None
            _write_seed_results(cfg, run, complete, evaluation, digests)
        return {"episodes": run.episode, "complete": complete}
    finally:
        run.env.close()


def _write_seed_results(cfg: RunConfig, run: SeedRun, complete: bool,
                        evaluation: dict[str, Any] | None, digests: list[str]) -> None:
    """The seed's own files; its central CSV row comes later (`append_result_rows`)."""
    seed_dir = run.dir
    write_json_atomic(seed_dir / "episodes.json",
                      {"seed": run.seed, "rewards": run.rewards, "losses": [
                          None if np.isnan(x) else x for x in run.losses]})
    eval_path = cfg.out_dir / "eval" / "test_results.json"
    if evaluation is not None:
        write_json_atomic(eval_path, {**read_json_object(eval_path, None),
                                      str(run.seed): evaluation})
    previous = read_json_object(seed_dir / "summary.json", None)
    summary: dict[str, Any] = {
        "seed": run.seed,
        "episodes": run.episode,
        "target_episodes": cfg.episodes,
        "complete": complete,
        "param_digest": digests[0],
        "ranks_checked": len(digests),
        # CSV bookkeeping (rows appended; csv_episodes: the finished total that has its
        # row) belongs to append_result_rows: carried over unchanged
        "csv_rows": int(previous.get("csv_rows", 0)),
    }
    if "csv_episodes" in previous:
        summary["csv_episodes"] = previous["csv_episodes"]
    write_json_atomic(seed_dir / "summary.json", summary)
