"""The real StarCraft II mini-game through pysc2, behind the same interface as the demo.

pysc2 is touched only inside `Pysc2Env`; `check_available` fails at once (exit 3, nothing
written), naming SC2PATH, when pysc2 does not import or the game is missing or broken, so a
misconfigured job dies in its first second instead of after the queue wait.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from train.common.errors import EnvironmentUnavailable, first_line
from train.workloads.envs.spec import (
    FUNCTION_IDS,
    MINIMAP_LAYERS,
    MOVE_SCREEN,
    NOOP,
    SCREEN_LAYERS,
    SELECT_ARMY,
    Observation,
    decode_action,
    nonspatial_features,
)

MAP_NAME = "MoveToBeacon"
log = logging.getLogger(__name__)


def sc2_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("SC2PATH") or Path.home() / "StarCraftII")


GAME_BINARY = "SC2_x64"
MAP_FILE = Path("mini_games") / f"{MAP_NAME}.SC2Map"


def _import_pysc2(mock: bool) -> None:
    """Import everything a run uses. pysc2 4.0.0 can fail at import for reasons other than
    absence (protobuf newer than its generated code; `random.shuffle(x, fn)` on Python >=
    3.11), so any exception is reported, first line only."""
    try:
        from pysc2.env import sc2_env  # noqa: F401
        from pysc2.lib import actions, features  # noqa: F401

        if mock:
            from pysc2.env import mock_sc2_env  # noqa: F401
            from pysc2.tests import dummy_observation  # noqa: F401
    except ImportError as exc:
        raise EnvironmentUnavailable(
            f"workload sc2 needs pysc2: {exc}. Use the sc2 container image, or pip install "
            "pysc2 (and set SC2PATH to the game directory).") from None
    except Exception as exc:
        first = first_line(exc)
        raise EnvironmentUnavailable(
            f"workload sc2: pysc2 is installed but does not import here "
            f"({type(exc).__name__}: {first}). The sc2 image pins protobuf 3.20.x and patches "
            "pysc2 4.0.0 for Python >= 3.11; use it, or do the same.") from None


def check_available(environ: dict[str, str] | None = None, mock: bool = False) -> Path:
    """Return the game directory, or raise EnvironmentUnavailable (exit 3) saying what is
    missing: pysc2 that imports, and (unless mock) an executable Versions/Base*/SC2_x64 and
    the MoveToBeacon map under SC2PATH."""
    path = sc2_path(environ)
    _import_pysc2(mock)
    if mock:
        return path
    # pysc2 runs the newest build: the largest number among Versions/Base<N>
    builds = [(int(p.name[4:]), p) for p in (path / "Versions").glob("Base*")
              if p.name[4:].isdigit()]
    game = (max(builds)[1] if builds else path / "Versions" / "Base*") / GAME_BINARY
    if not builds or not game.exists():
        raise EnvironmentUnavailable(
            f"workload sc2 needs the StarCraft II binary: SC2PATH={path} has no "
            f"Versions/Base*/{GAME_BINARY} (pysc2 runs {game}). Set SC2PATH "
            "to the game directory (the sc2 image sets it), or --sc2-env mock to test "
            "without the game.")
    if not game.is_file() or game.stat().st_size == 0 or not os.access(game, os.X_OK):
        raise EnvironmentUnavailable(
            f"the StarCraft II binary {game} is broken: it must be a non-empty executable "
            "file. Unpack the game again (the sc2 image checks its sha256).")
    if not (path / "Maps" / MAP_FILE).is_file():
        raise EnvironmentUnavailable(
            f"SC2PATH={path} has no Maps/{MAP_FILE}: unpack pysc2's mini_games.zip into "
            f"{path / 'Maps'}")
    return path


def observation_from_timestep(obs: Any, res: int) -> Observation:
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
    """MoveToBeacon in the real game, or in pysc2's own mock environment (`mock=True`);
    `step` returns (obs, reward, terminal, over).

    In the mock, pysc2 does not convert actions itself, so every action goes through pysc2's
    own `Features.transform_action` (availability and argument checks included) against the
    observation the agent saw; `converted` counts them."""

    def __init__(self, res: int, step_mul: int, seed: int, mock: bool = False) -> None:
        check_available(mock=mock)
        from absl import flags
        from pysc2.env import sc2_env
        from pysc2.lib import actions, features

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        self.res = res
        self.converted = 0
        self._actions = actions
        interface = features.AgentInterfaceFormat(
            feature_dimensions=features.Dimensions(screen=res, minimap=res))
        kwargs: dict[str, Any] = {"map_name": MAP_NAME,
                                  "players": [sc2_env.Agent(sc2_env.Race.terran)],
                                  "agent_interface_format": interface, "step_mul": step_mul,
                                  "random_seed": seed, "visualize": False}
        self._raw: Any = None
        if mock:
            from pysc2.env import mock_sc2_env
            from pysc2.tests import dummy_observation

            self._env = mock_sc2_env.SC2TestEnv(**kwargs)
            self._features = features.features_from_game_info(
                game_info=self._env.game_info[0], agent_interface_format=interface)
            # pysc2's dummy observation (an army of 6) plus the Move ability a selected
            # marine offers, so select_army and Move_screen are both available, as on the map
            raw = dummy_observation.Builder(self._features.observation_spec()).build()
            raw.observation.abilities.add(ability_id=16, requires_point=True)  # Move
            self._raw = raw.observation
            template = self._env.next_timestep[0]
            self._env.next_timestep = [template._replace(
                observation=self._features.transform_obs(raw))]
        else:
            try:
                self._env = sc2_env.SC2Env(**kwargs)
            except Exception as exc:  # pysc2's launch and connect errors have no common base
                first = first_line(exc)
                raise EnvironmentUnavailable(
                    f"the StarCraft II game under SC2PATH={sc2_path()} did not start "
                    f"({type(exc).__name__}: {first}); reinstall it (the sc2 image checks its "
                    "sha256), or --sc2-env mock to test without it") from None

    def reset(self) -> Observation:
        return observation_from_timestep(self._env.reset()[0].observation, self.res)

    def step(self, action: int) -> tuple[Observation, float, bool, bool]:
        function, point = decode_action(int(action), self.res)
        args = {NOOP: [], SELECT_ARMY: [[0]], MOVE_SCREEN: [[0], list(point or ())]}[function]
        call = self._actions.FunctionCall(FUNCTION_IDS[function], args)
        if self._raw is not None:
            # raises ValueError naming the function when pysc2 would refuse it
            self._features.transform_action(self._raw, call, skip_available=False)
            self.converted += 1
        ts = self._env.step([call])[0]
        # The mini-game ends on its time limit, which is not a terminal state for bootstrapping.
        return (observation_from_timestep(ts.observation, self.res), float(ts.reward), False,
                bool(ts.last()))

    def state_dict(self) -> dict[str, Any]:
        # The game's internal state cannot be saved; checkpoints fall on episode boundaries
        # and the next episode starts from a fresh game reset.
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        if self._raw is not None:
            log.info("pysc2 mock environment: %d actions, every one accepted by pysc2's "
                     "transform_action", self.converted)
        self._env.close()
