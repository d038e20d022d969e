"""pysc2's observation and action layout, as the agent sees it.

Observations follow pysc2's feature layers: a stack of screen layers, a stack of minimap
layers (both res x res, small integers) and non-spatial features (the `player` vector and
the available-actions mask). The action space is pysc2's function calls the mini-game
needs: no-op, select army, and move on screen at (x, y) over the res x res grid, flattened
to one index: 0 = no-op, 1 = select army, 2 + y * res + x = move to (x, y).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

# Feature layers taken from pysc2 and the scale that maps each to [0, 1].
SCREEN_LAYERS: tuple[tuple[str, int], ...] = (
    ("player_relative", 4),  # 0 background, 1 self, 2 ally, 3 neutral, 4 enemy
    ("selected", 1),
    ("unit_density", 4),
)
MINIMAP_LAYERS: tuple[tuple[str, int], ...] = (
    ("player_relative", 4),
    ("selected", 1),
    ("camera", 1),
)
# pysc2 function ids: no_op, select_army, Move_screen.
FUNCTION_IDS: tuple[int, ...] = (0, 7, 331)
NOOP, SELECT_ARMY, MOVE_SCREEN = 0, 1, 2
PLAYER_FEATURES = 11  # the length of pysc2's `player` vector

PLAYER_RELATIVE_SELF = 1
PLAYER_RELATIVE_NEUTRAL = 3


@dataclass(frozen=True)
class ObsSpec:
    res: int
    screen_channels: ClassVar[int] = len(SCREEN_LAYERS)
    minimap_channels: ClassVar[int] = len(MINIMAP_LAYERS)
    nonspatial_dim: ClassVar[int] = len(FUNCTION_IDS) + PLAYER_FEATURES

    @property
    def n_actions(self) -> int:
        return 2 + self.res * self.res


@dataclass
class Observation:
    screen: npt.NDArray[np.uint8]  # (screen_channels, res, res)
    minimap: npt.NDArray[np.uint8]  # (minimap_channels, res, res)
    nonspatial: npt.NDArray[np.float32]  # (nonspatial_dim,)
    available: npt.NDArray[np.bool_]  # (3,) over no-op, select army, move


def nonspatial_features(player: npt.ArrayLike, available: npt.NDArray[np.bool_]
                        ) -> npt.NDArray[np.float32]:
    """Available-actions mask followed by log-scaled `player` counters."""
    player_arr = np.asarray(player, dtype=np.float32)
    if player_arr.shape != (PLAYER_FEATURES,):
        raise ValueError(f"player vector must have {PLAYER_FEATURES} entries, "
                         f"got shape {player_arr.shape}")
    return np.concatenate([available.astype(np.float32), np.log1p(np.maximum(player_arr, 0))])


def decode_action(action: int, res: int) -> tuple[int, tuple[int, int] | None]:
    """Flat action index -> (function index, (x, y) for moves)."""
    if action < 0 or action >= 2 + res * res:
        raise ValueError(f"action {action} is outside 0..{1 + res * res}")
    if action < 2:
        return action, None
    cell = action - 2
    return MOVE_SCREEN, (cell % res, cell // res)


def encode_move(x: int, y: int, res: int) -> int:
    return 2 + y * res + x
