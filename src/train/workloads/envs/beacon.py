"""A pure NumPy analog of pysc2's MoveToBeacon mini-game.

Same observation and action layout as pysc2 (see `spec.py`): one marine and one beacon on
a res x res screen; the marine must be selected before it can be moved; moving it onto the
beacon scores +1 and the beacon respawns elsewhere; an episode lasts a fixed number of
agent steps. The game is deterministic given its seed, and its whole state (including its
random generator) round-trips through `state_dict`, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from train.workloads.envs.spec import (
    MOVE_SCREEN,
    PLAYER_RELATIVE_NEUTRAL,
    PLAYER_RELATIVE_SELF,
    SELECT_ARMY,
    Observation,
    decode_action,
    nonspatial_features,
)

# player vector: id, minerals, vespene, food used/cap/army/workers, idle workers, army count,
# warp gates, larva; the mini-game has one marine and no economy.
_PLAYER = np.array([1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0], dtype=np.float32)


class BeaconEnv:
    """MoveToBeacon on a res x res grid; `step` returns (obs, reward, terminal, over)."""

    def __init__(self, res: int, episode_steps: int, seed: int | list[int]) -> None:
        if res < 4:
            raise ValueError(f"res must be at least 4, got {res}")
        self.res = res
        self.episode_steps = episode_steps
        self.radius = max(1, res // 16)
        self.speed = max(1.0, res / 6.0)
        self._rng = np.random.default_rng(seed)
        self._marine = np.zeros(2)
        self._beacon = np.zeros(2, dtype=np.int64)
        self._target: np.ndarray | None = None
        self._selected = False
        self._t = 0
        offsets = np.arange(-self.radius, self.radius + 1)
        dy, dx = np.meshgrid(offsets, offsets, indexing="ij")
        inside = dx * dx + dy * dy <= self.radius * self.radius
        self._disc = np.stack([dx[inside], dy[inside]], axis=1)

    # -- game rules -------------------------------------------------------------------
    def reset(self) -> Observation:
        self._t = 0
        self._selected = False
        self._target = None
        self._marine = self._rng.integers(0, self.res, size=2).astype(np.float64) + 0.5
        self._spawn_beacon()
        return self._observe()

    def _spawn_beacon(self) -> None:
        lo, hi = self.radius, self.res - self.radius
        far = 2 * self.radius + 1
        cells = np.stack(np.meshgrid(np.arange(lo, hi), np.arange(lo, hi)), -1).reshape(-1, 2)
        distance = np.linalg.norm(cells + 0.5 - self._marine, axis=1)
        if not (distance > far).any():
            # small maps (res 4) have no cell that far from the marine: the farthest one
            self._beacon = cells[int(np.argmax(distance))]
            return
        while True:  # the same draws as always where a far cell exists
            beacon = self._rng.integers(lo, hi, size=2)
            if np.linalg.norm(beacon + 0.5 - self._marine) > far:
                self._beacon = beacon
                return

    def available(self) -> np.ndarray:
        return np.array([True, True, self._selected])

    def step(self, action: int) -> tuple[Observation, float, bool, bool]:
        function, point = decode_action(int(action), self.res)
        if not self.available()[function]:
            raise ValueError(f"action {action} is not available (select the army first)")
        if function == SELECT_ARMY:
            self._selected = True
        elif function == MOVE_SCREEN and point is not None:
            self._target = np.array(point, dtype=np.float64) + 0.5
        if self._target is not None:  # the marine walks toward its target
            delta = self._target - self._marine
            dist = math.hypot(delta[0], delta[1])
            if dist <= self.speed:
                self._marine = self._target.copy()
            else:
                self._marine = self._marine + delta * (self.speed / dist)
        reward = 0.0
        if np.linalg.norm(self._marine - (self._beacon + 0.5)) <= self.radius + 0.5:
            reward = 1.0
            self._spawn_beacon()
        self._t += 1
        return self._observe(), reward, False, self._t >= self.episode_steps

    # -- observations -----------------------------------------------------------------
    def _observe(self) -> Observation:
        res = self.res
        player_relative, density, selected = np.zeros((3, res, res), dtype=np.uint8)
        cells = self._disc + self._beacon
        player_relative[cells[:, 1], cells[:, 0]] = PLAYER_RELATIVE_NEUTRAL
        density[cells[:, 1], cells[:, 0]] += 1
        mx, my = np.clip(np.floor(self._marine).astype(np.int64), 0, res - 1)
        player_relative[my, mx] = PLAYER_RELATIVE_SELF
        density[my, mx] += 1
        if self._selected:
            selected[my, mx] = 1
        camera = np.ones((res, res), dtype=np.uint8)
        available = self.available()
        return Observation(
            screen=np.stack([player_relative, selected, density]),
            minimap=np.stack([player_relative, selected, camera]),
            nonspatial=nonspatial_features(_PLAYER, available),
            available=available,
        )

    def scripted_action(self) -> int:
        """The hand-written policy the benchmarks compare against: select, then click it."""
        if not self._selected:
            return SELECT_ARMY
        bx, by = self._beacon
        return int(2 + by * self.res + bx)

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "marine": self._marine.copy(),
            "beacon": self._beacon.copy(),
            "target": None if self._target is None else self._target.copy(),
            "selected": self._selected,
            "t": self._t,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["rng"]
        self._marine = np.array(state["marine"], dtype=np.float64)
        self._beacon = np.array(state["beacon"], dtype=np.int64)
        target = state["target"]
        self._target = None if target is None else np.array(target, dtype=np.float64)
        self._selected = bool(state["selected"])
        self._t = int(state["t"])

    def close(self) -> None:
        pass
