from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from train.common.errors import EnvironmentUnavailable
from train.workloads.dqn.agent import random_available_action
from train.workloads.dqn.replay import ReplayBuffer
from train.workloads.dqn.trainer import run_episode
from train.workloads.envs import pysc2_env
from train.workloads.envs.beacon import BeaconEnv
from train.workloads.envs.spec import (
    FUNCTION_IDS,
    MOVE_SCREEN,
    ObsSpec,
    decode_action,
    encode_move,
)


def test_action_encoding_roundtrip() -> None:
    assert decode_action(0, 8) == (0, None)
    assert decode_action(1, 8) == (1, None)
    assert decode_action(encode_move(3, 5, 8), 8) == (MOVE_SCREEN, (3, 5))
    with pytest.raises(ValueError):
        decode_action(2 + 64, 8)
    assert ObsSpec(8).n_actions == 66


def test_observation_layout_matches_spec() -> None:
    env = BeaconEnv(16, 10, 0)
    obs = env.reset()
    spec = ObsSpec(16)
    assert obs.screen.shape == (spec.screen_channels, 16, 16) and obs.screen.dtype == np.uint8
    assert obs.minimap.shape == (spec.minimap_channels, 16, 16)
    assert obs.nonspatial.shape == (spec.nonspatial_dim,)
    assert obs.available.tolist() == [True, True, False]
    assert (obs.screen[0] == 1).sum() == 1  # one marine (self)
    assert (obs.screen[0] == 3).sum() >= 1  # the beacon (neutral)


def test_move_needs_selection_and_beacon_scores() -> None:
    env = BeaconEnv(16, 100, 1)
    env.reset()
    with pytest.raises(ValueError, match="not available"):
        env.step(encode_move(0, 0, 16))
    obs, reward, terminal, over = env.step(1)  # select army
    assert obs.available[2] and reward == 0 and not terminal and not over
    assert obs.screen[1].sum() == 1
    total = 0.0
    for _ in range(10):
        _, reward, _, _ = env.step(env.scripted_action())
        total += reward
    assert total >= 2  # reached the beacon, it respawned, reached again


def test_episode_has_fixed_length() -> None:
    env = BeaconEnv(8, 12, 2)
    steps = []
    run_episode(env, lambda obs: 0, lambda *a: steps.append(a))
    assert len(steps) == 12


def test_scripted_beats_random_by_far() -> None:
    env = BeaconEnv(16, 64, 3)
    rng = np.random.default_rng(0)
    scripted = np.mean([run_episode(env, lambda o: env.scripted_action()) for _ in range(5)])
    rand = np.mean([run_episode(env, lambda o: random_available_action(o.available, 16, rng))
                    for _ in range(5)])
    assert scripted > 15 and rand < 5


def test_state_roundtrip_continues_identically() -> None:
    a = BeaconEnv(8, 50, 4)
    a.reset()
    for _ in range(5):
        a.step(a.scripted_action())
    b = BeaconEnv(8, 50, 999)
    b.load_state_dict(a.state_dict())
    for _ in range(30):
        action = a.scripted_action()
        assert action == b.scripted_action()
        oa, ra, _, _ = a.step(action)
        ob, rb, _, _ = b.step(action)
        assert ra == rb and np.array_equal(oa.screen, ob.screen)
    assert np.array_equal(a.reset().screen, b.reset().screen)


def test_replay_ring_and_state_roundtrip() -> None:
    spec = ObsSpec(8)
    env = BeaconEnv(8, 100, 5)
    replay = ReplayBuffer(10, spec)
    obs = env.reset()
    for i in range(15):
        nxt, r, t, _ = env.step(i % 2)
        replay.add(obs, i % 2, r, t, nxt)
        obs = nxt
    assert len(replay) == 10 and replay.ptr == 5
    copy = ReplayBuffer(10, spec)
    copy.load_state_dict(replay.state_dict())
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    a, b = replay.sample(4, rng_a), copy.sample(4, rng_b)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="replay_size"):
        ReplayBuffer(11, spec).load_state_dict(replay.state_dict())


def test_pysc2_observation_conversion() -> None:
    res = 8
    screen = {"player_relative": np.full((res, res), 3), "selected": np.zeros((res, res)),
              "unit_density": np.ones((res, res))}
    minimap = {"player_relative": np.zeros((res, res)), "selected": np.zeros((res, res)),
               "camera": np.ones((res, res))}
    obs = {"feature_screen": screen, "feature_minimap": minimap,
           "available_actions": np.array([0, 1, 2, 3, 7, 331, 453]),
           "player": np.arange(11)}
    converted = pysc2_env.observation_from_timestep(obs, res)
    assert converted.available.tolist() == [True, True, True]
    assert converted.screen.dtype == np.uint8 and converted.screen[0].max() == 3
    assert converted.nonspatial.shape == (len(FUNCTION_IDS) + 11,)
    obs["available_actions"] = np.array([0, 7])
    assert pysc2_env.observation_from_timestep(obs, res).available.tolist() == [True, True,
                                                                                False]
    with pytest.raises(ValueError, match="expected"):
        pysc2_env.observation_from_timestep(obs, 16)


def test_sc2_missing_names_sc2path(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentUnavailable, match="SC2PATH"):
        pysc2_env.check_available({"SC2PATH": str(tmp_path)})
    assert pysc2_env.sc2_path({"SC2PATH": str(tmp_path)}) == tmp_path


def test_smallest_map_places_the_beacon_without_looping() -> None:
    """res 4 (the smallest allowed) has no cell far enough from every marine position: the
    beacon goes to the farthest cell instead of the spawn loop never ending."""
    from train.workloads.envs.beacon import BeaconEnv

    env = BeaconEnv(4, 4, [1, 0])
    for _ in range(50):
        obs = env.reset()
        assert obs.screen.shape[1:] == (4, 4)
