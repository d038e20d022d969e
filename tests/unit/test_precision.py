from __future__ import annotations

import numpy as np
import pytest
import torch

from train.common.errors import ConfigError
from train.workloads.config import RunConfig
from train.workloads.dqn.agent import DQNAgent
from train.workloads.dqn.network import QNetwork, action_mask
from train.workloads.dqn.replay import ReplayBuffer
from train.workloads.envs.beacon import BeaconEnv
from train.workloads.envs.spec import ObsSpec
from train.workloads.runtime.precision import (
    mask_fill_value,
    masked_fill_unavailable,
    select_precision,
)


@pytest.mark.parametrize(("cap", "expected"), [((7, 0), "fp16"), ((8, 0), "bf16"),
                                               ((9, 0), "bf16"), ((6, 1), "fp16"),
                                               ((8, 9), "bf16")])
def test_auto_picks_by_compute_capability(cap: tuple[int, int], expected: str) -> None:
    policy = select_precision("auto", "cuda", cap)
    assert policy.name == expected
    assert policy.device_type == "cuda"


def test_auto_on_cpu_is_fp32_without_autocast_or_scaler() -> None:
    policy = select_precision("auto", "cpu")
    assert policy.name == "fp32"
    assert policy.make_scaler() is None
    with policy.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_bf16_on_old_gpu_is_an_error_naming_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        select_precision("bf16", "cuda", (7, 0), "Tesla V100")
    assert err.value.field == "precision"
    assert "Tesla V100" in str(err.value) and "7.0" in str(err.value)


def test_autocast_only_changes_forward_dtype() -> None:
    policy = select_precision("bf16", "cpu")
    lin = torch.nn.Linear(4, 4)
    with policy.autocast():
        out = lin(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16
    assert lin.weight.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mask_fill_value_is_finite_with_headroom(dtype: torch.dtype) -> None:
    fill = torch.tensor(mask_fill_value(dtype), dtype=dtype)
    assert torch.isfinite(fill)
    # a discount, a reward and a sum of two masked values stay finite too
    assert torch.isfinite(fill * 0.99 + 5).all()
    assert torch.isfinite(fill + fill).all()
    assert mask_fill_value(dtype) < -1000


def test_the_old_constant_overflows_fp16() -> None:
    # the field-notes bug this module prevents
    assert torch.isinf(torch.tensor(-1e9, dtype=torch.float16))


def test_fp16_masking_yields_no_inf_or_nan_in_q_values() -> None:
    torch.manual_seed(0)
    spec = ObsSpec(8)
    net = QNetwork(spec)
    env = BeaconEnv(8, 16, 0)
    obs = env.reset()  # army not selected: all move actions are masked
    assert not obs.available[2]
    policy = select_precision("fp16", "cpu")
    with torch.no_grad(), policy.autocast():
        q = net(torch.from_numpy(obs.screen)[None], torch.from_numpy(obs.minimap)[None],
                torch.from_numpy(obs.nonspatial)[None])
    assert q.dtype == torch.float16
    masked = masked_fill_unavailable(q, action_mask(torch.from_numpy(obs.available)[None], 8))
    assert masked.dtype == torch.float16
    assert torch.isfinite(masked).all()
    assert int(masked.argmax()) in (0, 1)
    # a half-precision network end to end (what autocast does on older GPUs)
    half = net.half()
    with torch.no_grad():
        q16 = half(torch.from_numpy(obs.screen)[None], torch.from_numpy(obs.minimap)[None],
                   torch.from_numpy(obs.nonspatial)[None].half())
    masked16 = masked_fill_unavailable(q16, action_mask(torch.from_numpy(obs.available)[None],
                                                        8))
    assert torch.isfinite(masked16).all()
    assert torch.isfinite(masked16.max(dim=1).values * 0.99).all()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_updates_stay_finite(precision: str) -> None:
    torch.manual_seed(1)
    cfg = RunConfig(res=8, batch_size=8, learning_starts=8, replay_size=64)
    spec = ObsSpec(8)
    policy = select_precision(precision, "cpu")
    agent = DQNAgent(spec, cfg, torch.device("cpu"), policy)
    assert (agent.scaler is not None) == (precision == "fp16")
    env = BeaconEnv(8, 16, 3)
    replay = ReplayBuffer(64, spec)
    rng = np.random.default_rng(0)
    obs = env.reset()
    for _ in range(40):
        action = agent.act(obs, 0.5, rng)
        nxt, reward, terminal, _ = env.step(action)
        replay.add(obs, action, reward, terminal, nxt)
        obs = nxt
    before = [p.detach().clone() for p in agent.policy.parameters()]
    for _ in range(5):
        loss = agent.update(agent.to_batch(replay.sample(8, rng)))
        assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in agent.policy.parameters())
    after = list(agent.policy.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(p.dtype == torch.float32 for p in agent.policy.parameters())


def test_precision_and_job_submission_share_one_bf16_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import train.common.gpus
    from train.workloads.runtime import precision

    # the same rule, per GPU type the profiles name
    for cap in train.common.gpus.COMPUTE_CAPABILITY.values():
        expected = "bf16" if train.common.gpus.bf16_capable(cap) else "fp16"
        assert select_precision("auto", "cuda", cap).name == expected
    # and the same definition: changing it changes the trainer's choice
    monkeypatch.setattr(precision, "bf16_capable", lambda cap: False)
    assert select_precision("auto", "cuda", (9, 0)).name == "fp16"
    with pytest.raises(ConfigError, match=r">= 8\.0"):
        select_precision("bf16", "cuda", (9, 0), "H100")
