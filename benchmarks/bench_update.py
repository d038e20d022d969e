"""Trainer update throughput against a minimal hand-written DQN update on the same network
and batch, in the same process. Goal: ratio (trainer / baseline) >= 0.97."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, median, short, timed, write_section
from train.workloads.config import RunConfig
from train.workloads.dqn.agent import DQNAgent
from train.workloads.dqn.network import QNetwork
from train.workloads.dqn.replay import ReplayBuffer
from train.workloads.envs.beacon import BeaconEnv
from train.workloads.envs.spec import ObsSpec
from train.workloads.runtime.precision import select_precision


def make_batch(res: int, batch: int) -> dict[str, np.ndarray]:
    spec = ObsSpec(res)
    env = BeaconEnv(res, 64, 0)
    fill = 4 * batch if short() else 2048
    replay = ReplayBuffer(fill, spec)
    rng = np.random.default_rng(0)
    obs = env.reset()
    for _ in range(fill):
        action = env.scripted_action() if rng.random() < 0.5 else 0
        nxt, r, t, over = env.step(action)
        replay.add(obs, action, r, t, nxt)
        obs = env.reset() if over else nxt
    return replay.sample(batch, rng)


def baseline_update(net: QNetwork, target: QNetwork, opt: torch.optim.Optimizer,
                    b: dict[str, torch.Tensor], res: int, gamma: float) -> torch.Tensor:
    """What one would write by hand: no policy objects, no autocast, no scaler branches."""
    q = net(b["screen"], b["minimap"], b["nonspatial"])
    q_taken = q.gather(1, b["action"][:, None]).squeeze(1)
    with torch.no_grad():
        q_next = target(b["next_screen"], b["next_minimap"], b["next_nonspatial"])
        avail = b["next_available"]
        mask = torch.cat([avail[:, :2], avail[:, 2:3].expand(-1, res * res)], dim=1)
        best = q_next.masked_fill(~mask, -1e9).max(dim=1).values
    y = b["reward"].clamp(-5, 5) + gamma * (~b["terminal"]).float() * best
    loss = F.smooth_l1_loss(q_taken, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return loss.detach()


def measure(res: int, batch: int, rounds: int = 15, steps: int = 30) -> tuple[float, float]:
    torch.manual_seed(0)
    cfg = RunConfig(res=res, batch_size=batch, learning_starts=batch, replay_size=batch,
                    target_update=10**9)
    device = torch.device("cpu")
    agent = DQNAgent(ObsSpec(res), cfg, device, select_precision("fp32", "cpu"))
    net = copy.deepcopy(agent.policy)
    target = copy.deepcopy(agent.target)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    b = agent.to_batch(make_batch(res, batch))

    def ours() -> None:
        for _ in range(steps):
            agent.update(b)

    def base() -> None:
        for _ in range(steps):
            baseline_update(net, target, opt, b, res, cfg.gamma)

    ours()
    base()  # warm-up
    t_ours, t_base = [], []
    for i in range(rounds):  # interleaved, alternating order, to cancel drift
        if i % 2:
            t_ours.append(timed(ours))
            t_base.append(timed(base))
        else:
            t_base.append(timed(base))
            t_ours.append(timed(ours))
    return steps / median(t_ours), steps / median(t_base)


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    shapes = ((16, 32),) if short() else ((16, 32), (32, 32), (32, 128))
    for res, batch in shapes:
        ours, base = measure(res, batch, *((2, 2) if short() else ()))
        rows.append(f"| {res} | {batch} | {ours:.1f} | {base:.1f} | {ours / base:.3f} |")
    body = "\n".join([
        "## Trainer update throughput (goal: >= 0.97x the hand-written loop)",
        "",
        f"Machine: {machine()}; fp32 on CPU, 2 threads; median of 15 interleaved rounds of "
        "30 updates each, same network weights and batch.",
        "",
        "| res | batch | trainer updates/s | hand-written updates/s | ratio |",
        "|---|---|---|---|---|",
        *rows,
    ])
    write_section("update", body)


if __name__ == "__main__":
    main()
