"""The real StarCraft II mini-game through pysc2, behind the same interface as the demo.

Only importable pieces of pysc2 are touched inside `Pysc2Env`; `check_available` fails at
once, naming SC2PATH, when pysc2 or the game is missing, so a misconfigured job dies in its
first second instead of after the queue wait.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from train.errors import EnvironmentUnavailable
from train.workloads.envs.spec import (
    FUNCTION_IDS,
    MINIMAP_LAYERS,
    MOVE_SCREEN,
    SCREEN_LAYERS,
    SELECT_ARMY,
    Observation,
    ObsSpec,
    decode_action,
    nonspatial_features,
)

MAP_NAME = "MoveToBeacon"


def sc2_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("SC2PATH") or Path.home() / "StarCraftII")


def check_available(environ: dict[str, str] | None = None) -> Path:
    """Return the game directory, or raise EnvironmentUnavailable saying what is missing."""
    path = sc2_path(environ)
    try:
        import pysc2  # noqa: F401
    except ImportError:
        raise EnvironmentUnavailable(
            "workload sc2 needs pysc2 and the StarCraft II binary: pysc2 is not installed. "
            "Use the sc2 container image, or pip install pysc2 and set SC2PATH to the game "
            f"directory (now {path})."
        ) from None
    versions = path / "Versions"
    if not versions.is_dir() or not any(versions.glob("Base*")):
        raise EnvironmentUnavailable(
            f"workload sc2 needs the StarCraft II binary: SC2PATH={path} has no "
            "Versions/Base*/SC2_x64. Set SC2PATH to the game directory (the sc2 image sets it)."
        )
    if not (path / "Maps").is_dir():
        raise EnvironmentUnavailable(f"SC2PATH={path} has no Maps/ directory with the "
                                     "mini-game maps")
    return path


def observation_from_timestep(obs: Any, res: int) -> Observation:
    """Convert a pysc2 TimeStep.observation into the agent's layout."""
    screen = np.stack([np.asarray(obs["feature_screen"][name]) for name, _ in SCREEN_LAYERS])
    minimap = np.stack([np.asarray(obs["feature_minimap"][name])
                        for name, _ in MINIMAP_LAYERS])
    if screen.shape[1:] != (res, res) or minimap.shape[1:] != (res, res):
        raise ValueError(f"pysc2 returned layers of shape {screen.shape[1:]} / "
                         f"{minimap.shape[1:]}, expected ({res}, {res})")
    offered = {int(a) for a in np.asarray(obs["available_actions"]).ravel()}
    available = np.array([fid in offered for fid in FUNCTION_IDS])
    return Observation(
        screen=np.clip(screen, 0, 255).astype(np.uint8),
        minimap=np.clip(minimap, 0, 255).astype(np.uint8),
        nonspatial=nonspatial_features(obs["player"], available),
        available=available,
    )


class Pysc2Env:
    """MoveToBeacon in the real game; `step` returns (obs, reward, terminal, over)."""

    def __init__(self, res: int, step_mul: int, seed: int) -> None:
        check_available()
        from absl import flags
        from pysc2.env import sc2_env
        from pysc2.lib import actions, features

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        self.spec = ObsSpec(res)
        self.res = res
        self._actions = actions
        self._env = sc2_env.SC2Env(
            map_name=MAP_NAME,
            players=[sc2_env.Agent(sc2_env.Race.terran)],
            agent_interface_format=features.AgentInterfaceFormat(
                feature_dimensions=features.Dimensions(screen=res, minimap=res)),
            step_mul=step_mul,
            random_seed=seed,
            visualize=False,
        )

    def reset(self) -> Observation:
        return observation_from_timestep(self._env.reset()[0].observation, self.res)

    def step(self, action: int) -> tuple[Observation, float, bool, bool]:
        function, point = decode_action(int(action), self.res)
        fid = FUNCTION_IDS[function]
        if function == SELECT_ARMY:
            call = self._actions.FunctionCall(fid, [[0]])
        elif function == MOVE_SCREEN and point is not None:
            call = self._actions.FunctionCall(fid, [[0], [point[0], point[1]]])
        else:
            call = self._actions.FunctionCall(fid, [])
        ts = self._env.step([call])[0]
        # The mini-game ends on its time limit, which is not a terminal state for bootstrapping.
        return (observation_from_timestep(ts.observation, self.res), float(ts.reward), False,
                bool(ts.last()))

    def state_dict(self) -> dict[str, Any]:
        # The game's internal state cannot be saved; checkpoints fall on episode boundaries
        # and the next episode starts from a fresh game reset.
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see state_dict)."""

    def close(self) -> None:
        self._env.close()
