"""The DQN agent: epsilon-greedy acting with action masking, and the learning update.

Update: Huber loss between Q(s, a) and r + gamma * max_a' Q_target(s', a') over the actions
available in s', rewards clamped to [-5, 5], gradients clipped to norm 1.0, Adam. Autocast
covers the forward passes only; a GradScaler (fp16 only) covers backward and step only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from train.workloads.config import RunConfig
from train.workloads.dqn.network import QNetwork, action_mask
from train.workloads.dqn.replay import zero_arrays
from train.workloads.envs.spec import MOVE_SCREEN, Observation, ObsSpec
from train.workloads.runtime.precision import PrecisionPolicy, masked_fill_unavailable

REWARD_CLAMP = 5.0
GRAD_CLIP = 1.0


def random_available_action(available: np.ndarray, res: int, rng: np.random.Generator) -> int:
    """Uniform over available functions, then uniform over the screen for a move."""
    function = int(rng.choice(np.flatnonzero(available)))
    if function != MOVE_SCREEN:
        return function
    x, y = rng.integers(0, res, size=2)
    return int(2 + y * res + x)


class DQNAgent:
    def __init__(self, spec: ObsSpec, cfg: RunConfig, device: torch.device,
                 precision: PrecisionPolicy,
                 wrap: Callable[[nn.Module], nn.Module] | None = None) -> None:
        self.spec = spec
        self.device = device
        self.precision = precision
        self.cfg = cfg
        self.policy = QNetwork(spec).to(device)
        self.target = copy.deepcopy(self.policy).requires_grad_(False).eval()
        # DDP (when given) wraps the net used for training; acting and evaluation run the
        # plain module under no_grad, where no gradient synchronisation is involved.
        self.train_net = wrap(self.policy) if wrap is not None else self.policy
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr)
        self.scaler = precision.make_scaler()
        self.updates = 0

    # -- acting -----------------------------------------------------------------------
    def act(self, obs: Observation, epsilon: float, rng: np.random.Generator) -> int:
        if rng.random() < epsilon:
            return random_available_action(obs.available, self.spec.res, rng)
        screen, minimap, nonspatial, available = (
            torch.from_numpy(a).to(self.device)[None]
            for a in (obs.screen, obs.minimap, obs.nonspatial, obs.available))
        with torch.no_grad(), self.precision.autocast():
            q = self.policy(screen, minimap, nonspatial)
        return int(masked_fill_unavailable(q, action_mask(available, self.spec.res))
                   .argmax(dim=1).item())

    # -- learning ---------------------------------------------------------------------
    def to_batch(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(v).to(self.device, non_blocking=True)
                for k, v in arrays.items()}

    def update(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient step; returns the detached loss (no host sync)."""
        with self.precision.autocast():
            q = self.train_net(b["screen"], b["minimap"], b["nonspatial"])
            q_taken = q.gather(1, b["action"][:, None]).squeeze(1)
            with torch.no_grad():
                q_next = self.target(b["next_screen"], b["next_minimap"], b["next_nonspatial"])
                q_next = masked_fill_unavailable(q_next,
                                                 action_mask(b["next_available"], self.spec.res))
                best_next = q_next.max(dim=1).values
        discount = self.cfg.gamma * (~b["terminal"]).float()
        target = b["reward"].clamp(-REWARD_CLAMP, REWARD_CLAMP) + discount * best_next.float()
        loss = F.smooth_l1_loss(q_taken.float(), target)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.policy.parameters(), GRAD_CLIP)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            nn.utils.clip_grad_norm_(self.policy.parameters(), GRAD_CLIP)
            self.optimizer.step()
        self.updates += 1
        if self.updates % self.cfg.target_update == 0:
            self.target.load_state_dict(self.policy.state_dict())
        return loss.detach()

    def dummy_batch(self, batch_size: int) -> dict[str, torch.Tensor]:
        return self.to_batch(zero_arrays(batch_size, self.spec))

    def dummy_step(self) -> None:
        """Allocate Adam's state and a full batch's activations, changing nothing: then the
        state is reset in place to a fresh optimizer's, keeping the memory."""
        b = self.dummy_batch(self.cfg.batch_size)
        with self.precision.autocast():
            q = self.train_net(b["screen"], b["minimap"], b["nonspatial"])
            with torch.no_grad():
                self.target(b["next_screen"], b["next_minimap"], b["next_nonspatial"])
        loss = q.float().sum() * 0.0
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        saved = [p.detach().clone() for p in self.policy.parameters()]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, before in zip(self.policy.parameters(), saved, strict=True):
                p.copy_(before)
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        value.zero_()

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.updates = int(state["updates"])
