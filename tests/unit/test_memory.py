from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train.common.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF
from train.common.errors import PreallocationError
from train.workloads.config import RunConfig
from train.workloads.dqn.agent import DQNAgent
from train.workloads.envs.spec import ObsSpec
from train.workloads.runtime.memory import (
    apply_allocator_settings,
    device_memory,
    preallocate,
    training_state_bytes,
)
from train.workloads.runtime.precision import select_precision


def test_tuned_allocator_settings_applied_when_unset(caplog: pytest.LogCaptureFixture) -> None:
    env: dict[str, str] = {}
    with caplog.at_level("INFO"):
        assert apply_allocator_settings(env) == TUNED_ALLOC_CONF
    assert env[ALLOC_CONF_VAR] == TUNED_ALLOC_CONF
    assert TUNED_ALLOC_CONF == ("expandable_segments:True,garbage_collection_threshold:0.7,"
                                "max_split_size_mb:128")
    assert "tuned default" in caplog.text


def test_user_allocator_settings_kept(caplog: pytest.LogCaptureFixture) -> None:
    env = {ALLOC_CONF_VAR: "max_split_size_mb:64"}
    with caplog.at_level("INFO"):
        assert apply_allocator_settings(env) == "max_split_size_mb:64"
    assert env[ALLOC_CONF_VAR] == "max_split_size_mb:64"
    assert "set by the user" in caplog.text


def _agent(batch: int = 8) -> DQNAgent:
    torch.manual_seed(0)
    cfg = RunConfig(res=8, batch_size=batch, learning_starts=batch, replay_size=64)
    return DQNAgent(ObsSpec(8), cfg, torch.device("cpu"), select_precision("fp32", "cpu"))


def test_dummy_step_allocates_adam_state_and_changes_nothing() -> None:
    agent = _agent()
    fresh = _agent()
    assert not agent.optimizer.state
    agent.dummy_step()
    assert len(agent.optimizer.state) == len(list(agent.policy.parameters()))
    for p, q in zip(agent.policy.parameters(), fresh.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    # one real update after preallocation equals one update of a fresh optimizer
    batch = agent.dummy_batch(8)
    batch.update(action=torch.arange(8) % 2, reward=torch.ones(8),
                 terminal=torch.zeros(8, dtype=torch.bool),
                 next_available=torch.ones(8, 3, dtype=torch.bool))
    batch["screen"][:, 0, 2, 2] = 1
    agent.update(batch)
    fresh.update(batch)
    for p, q in zip(agent.policy.parameters(), fresh.policy.parameters(), strict=True):
        assert torch.equal(p, q)


def test_preallocation_oom_gives_a_clear_message() -> None:
    agent = _agent()

    def failing_step() -> None:
        agent.dummy_step()
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 66.00 MiB")

    needed = training_state_bytes(agent.policy.parameters())
    with pytest.raises(PreallocationError) as err:
        preallocate(failing_step, device=torch.device("cpu"), state_bytes=needed,
                    what="optimizer state and a batch of 8 at res 8")
    text = str(err.value)
    assert "out of memory" in text and "preallocating optimizer state" in text
    assert f"{needed / 2**20:.1f} MiB" in text
    assert "MiB is free" in text and "--batch-size" in text
    assert "Tried to allocate 66.00 MiB" in text
    assert err.value.exit_code == 3


def test_preallocation_success_report() -> None:
    agent = _agent()
    report = preallocate(agent.dummy_step, device=torch.device("cpu"), state_bytes=1,
                         what="x")
    assert report.seconds >= 0 and report.peak_bytes == 0


def test_training_state_bytes_counts_four_copies() -> None:
    p = torch.nn.Parameter(torch.zeros(10))
    assert training_state_bytes([p]) == 4 * 10 * 4


def test_host_memory_reported_on_cpu() -> None:
    free, total = device_memory(torch.device("cpu"))
    assert 0 < free <= total


@pytest.mark.gpu
def test_real_cuda_preallocation_failure_is_clear() -> None:
    device = torch.device("cuda", 0)
    free, _ = torch.cuda.mem_get_info(device)
    hog = torch.empty(int(free - 64 * 2**20), dtype=torch.uint8, device=device)
    try:
        cfg = RunConfig(res=64, batch_size=4096, learning_starts=4096, replay_size=4096)
        agent = DQNAgent(ObsSpec(64), cfg, device, select_precision("auto", "cuda", (8, 0)))
        with pytest.raises(PreallocationError) as err:
            preallocate(agent.dummy_step, device=device, what="optimizer state",
                        state_bytes=training_state_bytes(agent.policy.parameters()))
        assert "MiB is free" in str(err.value)
        assert torch.cuda.get_device_name(device) in str(err.value)
    finally:
        del hog
        torch.cuda.empty_cache()


@pytest.mark.gpu
def test_real_cuda_preallocation_succeeds_and_reports_peak() -> None:
    device = torch.device("cuda", 0)
    cfg = RunConfig(res=32, batch_size=32)
    agent = DQNAgent(ObsSpec(32), cfg, device, select_precision("auto", "cuda",
                                                                 torch.cuda.get_device_capability()))
    report = preallocate(agent.dummy_step, device=device, what="optimizer state",
                         state_bytes=training_state_bytes(agent.policy.parameters()))
    assert report.peak_bytes > report.state_bytes // 4
    assert len(agent.optimizer.state) > 0


def _cgroup(root: Path, rel: str, files: dict[str, str]) -> None:
    directory = root / rel
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text + "\n")


def test_cgroup_v2_limit_of_the_job_above_the_step(tmp_path: Path) -> None:
    """Slurm's layout: the job's --mem on job_7, the task in job_7/step_0/user/task_0."""
    from train.common.hostmem import cgroup_memory_left

    gib = 2**30
    _cgroup(tmp_path, "system.slice/slurmstepd.scope/job_7",
            {"memory.max": str(8 * gib), "memory.current": str(3 * gib)})
    _cgroup(tmp_path, "system.slice/slurmstepd.scope/job_7/step_0/user/task_0",
            {"memory.max": "max", "memory.current": str(gib)})
    text = "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n"
    assert cgroup_memory_left(text, tmp_path) == 5 * gib
    assert cgroup_memory_left("0::/\n", tmp_path) is None  # no limit anywhere
    assert cgroup_memory_left("0::/elsewhere/x\n", tmp_path) is None  # not mounted here


def test_cgroup_v1_memory_controller_and_no_limit(tmp_path: Path) -> None:
    from train.common.hostmem import cgroup_memory_left

    _cgroup(tmp_path / "memory", "slurm/uid_1/job_9",
            {"memory.limit_in_bytes": str(4 * 2**30), "memory.usage_in_bytes": str(2**30)})
    _cgroup(tmp_path / "memory", "slurm/uid_1/job_9/step_batch",
            {"memory.limit_in_bytes": "9223372036854771712",  # v1's "unlimited"
             "memory.usage_in_bytes": "1"})
    text = "12:pids:/x\n4:memory:/slurm/uid_1/job_9/step_batch\n1:name=systemd:/y\n"
    assert cgroup_memory_left(text, tmp_path) == 3 * 2**30
    assert cgroup_memory_left("garbage\n\n::\n", tmp_path) is None


def test_the_memory_check_counts_the_jobs_cgroup_not_the_node(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A replay that fits the node's free memory but not the job's --mem is exit 2."""
    from train.common import hostmem
    from train.common.errors import ConfigError
    from train.workloads import runner
    from train.workloads.config import run_config_from_argv

    cfg = run_config_from_argv(["--out", str(tmp_path / "r"), "--replay-size", "20000",
                                "--res", "32"])
    runner.check_memory(cfg)  # this machine's memory holds it
    monkeypatch.setattr(hostmem, "cgroup_memory_left", lambda: 64 * 2**20)
    with pytest.raises(ConfigError, match=r"replay_size: .* can expect 0\.1 GiB"):
        runner.check_memory(cfg)


@pytest.mark.parametrize(("failure", "host_oom"), [
    ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
     "tried to allocate 4294967296 bytes.", True),
    ("[enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate memory: "
     "you tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)", True),
    ("CUDA out of memory. Tried to allocate 66.00 MiB", True),
    ("shape mismatch", False),
])
def test_the_host_out_of_memory_is_known_by_one_wording_at_preallocation_and_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, host_oom: bool) -> None:
    """torch's CPU allocator's "can't allocate memory" escaped preallocate as a traceback
    (exit 1) where checkpoint.load knew it: one wording serves both."""
    from train.common.errors import CheckpointError
    from train.workloads.runtime import checkpoint

    def step() -> None:
        raise RuntimeError(failure)

    with pytest.raises(PreallocationError if host_oom else RuntimeError) as err:
        preallocate(step, device=torch.device("cpu"), state_bytes=1, what="a batch")
    assert (err.value.exit_code == 3 and failure[:60] in str(err.value)) if host_oom else \
        str(err.value) == failure
    path = tmp_path / "ckpt-00000001.pt"
    checkpoint.save_atomic({"episode": 1}, path)
    monkeypatch.setattr(checkpoint.torch, "load", lambda *_a, **_k: step())
    with pytest.raises(MemoryError if host_oom else CheckpointError, match="could not be "
                       "loaded" if host_oom else "cannot be loaded safely"):
        checkpoint.load(path)
