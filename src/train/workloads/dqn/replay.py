"""A fixed-capacity ring replay buffer in preallocated NumPy arrays.

Observations are stored as uint8 feature layers (as pysc2 delivers them), so a 20,000
transition buffer at res 32 takes about 120 MB rather than 500 MB of float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from train.workloads.envs.spec import Observation, ObsSpec


def _layout(capacity: int, spec: ObsSpec) -> dict[str, tuple[tuple[int, ...], Any]]:
    res = spec.res
    obs: dict[str, tuple[tuple[int, ...], Any]] = {
        "screen": ((spec.screen_channels, res, res), np.uint8),
        "minimap": ((spec.minimap_channels, res, res), np.uint8),
        "nonspatial": ((spec.nonspatial_dim,), np.float32),
        "available": ((3,), np.bool_),
    }
    out = {prefix + name: ((capacity, *shape), dtype) for prefix in ("", "next_")
           for name, (shape, dtype) in obs.items()}
    out.update({"action": ((capacity,), np.int64), "reward": ((capacity,), np.float32),
                "terminal": ((capacity,), np.bool_)})
    return out


def zero_arrays(capacity: int, spec: ObsSpec) -> dict[str, np.ndarray]:
    """The buffer's arrays, zeros (the agent's dummy batch is one of `capacity` rows)."""
    return {name: np.zeros(shape, dtype=dtype)
            for name, (shape, dtype) in _layout(capacity, spec).items()}


class ReplayBuffer:
    @staticmethod
    def bytes_needed(capacity: int, spec: ObsSpec) -> int:
        """Host memory a full buffer takes (checked before a run starts)."""
        return sum(int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
                   for shape, dtype in _layout(capacity, spec).values())

    def __init__(self, capacity: int, spec: ObsSpec) -> None:
        self.capacity = capacity
        self.arrays = zero_arrays(capacity, spec)
        self.ptr = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs: Observation, action: int, reward: float, terminal: bool,
            next_obs: Observation) -> None:
        i = self.ptr
        a = self.arrays
        for name, value in vars(obs).items():  # the Observation's fields
            a[name][i] = value
            a["next_" + name][i] = getattr(next_obs, name)
        a["action"][i] = action
        a["reward"][i] = reward
        a["terminal"][i] = terminal
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        idx = rng.integers(0, self.size, size=batch_size)
        return {name: arr[idx] for name, arr in self.arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        """Views of the filled part; callers that keep it past the next `add` must copy."""
        return {"ptr": self.ptr, "size": self.size, "capacity": self.capacity,
                "arrays": {k: v[: self.size] for k, v in self.arrays.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"replay capacity {state['capacity']} in the checkpoint differs "
                             f"from replay_size {self.capacity}")
        size = int(state["size"])
        for name, arr in self.arrays.items():
            arr[:size] = state["arrays"][name]
        self.size = size
        self.ptr = int(state["ptr"])
