from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from train.common.errors import CheckpointError, ResourceError, UsageError
from train.node.distributed import DistContext, init_distributed
from train.node.signals import StopController
from train.workloads.config import RunConfig
from train.workloads.dqn import trainer
from train.workloads.runtime.precision import select_precision
from train.workloads.runtime.results import Progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal() -> None:
    stream = Tty()
    bar = Progress(10, 0, "seed 4", 30.0, stream=stream)
    bar.update(10, reward=3.0)
    text = stream.getvalue()
    assert text.startswith("\rseed 4 [") and "10/10" in text and "#" * 24 in text
    assert text.endswith("\n")


def test_plain_lines_in_batch_logs_are_rate_limited() -> None:
    stream = io.StringIO()
    log = Progress(100, 0, "seed 4", 3600.0, stream=stream)
    for i in range(1, 100):
        log.update(i)
    log.update(100)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # the first update and the final one
    assert "episode 100/100" in lines[-1] and "\r" not in stream.getvalue()


class DivergedRanks(DistContext):
    """Pretends a second rank ended with other parameters (a DDP desync)."""

    def all_gather_object(self, obj: Any) -> list[Any]:
        if isinstance(obj, str) and len(obj) == 64:
            return [obj, "0" * 64]
        return [obj]


def test_parameters_differing_across_ranks_fail_the_run(tmp_path: Path) -> None:
    cfg = RunConfig(res=8, episode_steps=8, episodes=1, batch_size=4, learning_starts=4,
                    replay_size=16, eval_episodes=0, out=str(tmp_path / "r"))
    ctx = DivergedRanks(device=torch.device("cpu"))
    with pytest.raises(CheckpointError, match="parameters differ across ranks"):
        trainer.train(cfg, ctx, select_precision("fp32", "cpu"), StopController(None))


def test_partial_torchrun_environment_names_the_missing_variable() -> None:
    with pytest.raises(UsageError, match="LOCAL_RANK is missing"):
        init_distributed("cpu", {"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(UsageError, match="RANK=3 is outside"):
        init_distributed("cpu", {"RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(UsageError, match="WORLD_SIZE must be an integer"):
        init_distributed("cpu", {"RANK": "0", "WORLD_SIZE": "two", "LOCAL_RANK": "0"})


def test_a_world_of_one_runs_without_a_process_group() -> None:
    # what `train launch --mode single` (and `torchrun --nproc-per-node 1`) gives `train run`
    ctx = init_distributed("cpu", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                                   "OMP_NUM_THREADS": "1"})
    assert ctx.world_size == 1 and not torch.distributed.is_initialized()


def test_cuda_requested_without_gpu_is_a_resource_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ResourceError, match="--device cuda: CUDA is unusable"):
        init_distributed("cuda", {})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_carry_the_time_left_at_the_recent_rate() -> None:
    from train.workloads.runtime.results import RATE_WINDOW, format_duration

    clock, stream = Clock(), io.StringIO()
    log = Progress(200, 0, "seed 4", 0.0, stream=stream, clock=clock)
    # the first episodes are fast (nothing to learn from yet), the rest 2 s each
    for i in range(1, 21):
        clock.now += 0.01
        log.update(i)
    for i in range(21, 21 + RATE_WINDOW):
        clock.now += 2.0
        log.update(i)
    lines = stream.getvalue().splitlines()
    last = lines[-1]
    # 0.5 ep/s over the last RATE_WINDOW episodes (the fast first ones left behind)
    done = 20 + RATE_WINDOW
    eta = format_duration((200 - done) * 2.0)
    assert f"episode {done}/200 (0.50 ep/s, ETA {eta})" in last, last
    # no ETA from the first episode alone; every later line before the end has one
    assert "ETA" not in lines[0] and all(", ETA " in line for line in lines[1:]), lines
    log.update(200)
    assert "ETA" not in stream.getvalue().splitlines()[-1]  # done: no time left to show
    assert [format_duration(s) for s in (0, 45, 125, 3600, 3725, 90000)] == [
        "0s", "45s", "2m05s", "1h00m", "1h02m", "25h00m"]


def test_the_bar_shows_the_eta_too() -> None:
    clock, stream = Clock(), Tty()
    bar = Progress(10, 4, "seed 4", 30.0, stream=stream, clock=clock)  # a resumed run
    clock.now += 6.0
    bar.update(6)
    assert "6/10 0.33 ep/s, ETA 12s" in stream.getvalue()
