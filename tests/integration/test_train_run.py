"""`train run` for real: CPU training, resume, signals, bad input, DDP under torchrun."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TINY, run_cli, tiny_flags, train_cmd
from train import runner
from train.config import RunConfig
from train.errors import UsageError
from train.runtime.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow


def _cfg(out: Path, episodes: int, **kw: Any) -> RunConfig:
    return RunConfig(**{**TINY, "out": str(out), "episodes": episodes, "log_every": 60.0,
                        **kw})


def _final(out: Path, seed: int = 4) -> tuple[list[float], list[Any], list[float], dict]:
    history = json.loads((out / f"seed_{seed}" / "episodes.json").read_text())
    evaluation = json.loads((out / "eval" / "test_results.json").read_text())[str(seed)]
    state = CheckpointManager(out / f"seed_{seed}" / "checkpoints").load_latest()
    assert state is not None
    return history["rewards"], history["losses"], evaluation["episode_rewards"], state


def _assert_same_run(a: Path, b: Path) -> None:
    ra, la, ea, sa = _final(a)
    rb, lb, eb, sb = _final(b)
    assert ra == rb
    assert la == lb
    assert ea == eb
    assert sa["episode"] == sb["episode"] and sa["step"] == sb["step"]
    for key in ("policy", "target"):
        pa, pb = sa["agent"][key], sb["agent"][key]
        assert pa.keys() == pb.keys()
        assert all(torch.equal(pa[k], pb[k]) for k in pa), key
    assert sa["agent"]["updates"] == sb["agent"]["updates"] > 0


def test_resume_n_plus_n_is_bit_identical_to_2n(tmp_path: Path) -> None:
    runner.run(_cfg(tmp_path / "straight", 12))
    first = runner.run(_cfg(tmp_path / "chunked", 6))
    assert first.complete
    second = runner.run(_cfg(tmp_path / "chunked", 12))
    assert second.complete
    _assert_same_run(tmp_path / "straight", tmp_path / "chunked")


def test_three_uneven_chunks_are_bit_identical(tmp_path: Path) -> None:
    runner.run(_cfg(tmp_path / "straight", 13))
    for episodes in (2, 9, 13):
        runner.run(_cfg(tmp_path / "chunked", episodes))
    _assert_same_run(tmp_path / "straight", tmp_path / "chunked")
    # the evaluation at the end of each chunk did not perturb training, and it was redone
    evaluation = json.loads((tmp_path / "chunked" / "eval" / "test_results.json").read_text())
    assert evaluation["4"]["trained_episodes"] == 13


def test_changed_identity_setting_refuses_to_resume(tmp_path: Path) -> None:
    runner.run(_cfg(tmp_path / "r", 2))
    with pytest.raises(UsageError, match="lr: differs"):
        runner.run(_cfg(tmp_path / "r", 4, lr=0.1))
    with pytest.raises(UsageError, match="resume"):
        runner.run(_cfg(tmp_path / "r", 4, resume="never"))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_cli_demo_writes_every_result(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "demo"
    proc = run_cli(["run", "demo", "--out", str(out), "--seeds", "4 6", "--episodes", "3",
                    *tiny_flags()], env={"SLURM_JOB_ID": "77", "SLURM_FAKE_TOKEN": "s3cret"})
    assert proc.returncode == 0, proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["seeds"] == [4, 6]
    assert config["environment"]["SLURM_JOB_ID"] == "77"
    assert config["environment"]["SLURM_FAKE_TOKEN"] == "<redacted>"
    assert "s3cret" not in (out / "config.json").read_text()
    assert config["versions"]["torch"] == torch.__version__
    assert config["allocator"].startswith("expandable_segments:True")
    evaluation = json.loads((out / "eval" / "test_results.json").read_text())
    assert set(evaluation) == {"4", "6"}
    assert all(isinstance(r, float) for r in evaluation["4"]["episode_rewards"])
    rows = _rows(tmp_path / "runs" / "results.csv")
    assert [r["seed"] for r in rows] == ["4", "6"]
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    status = json.loads((out / "status.json").read_text())
    assert status["complete"] is True
    assert "episode 3/3" in proc.stderr  # plain progress lines in batch logs

    # an already complete run exits 0 at once and appends nothing
    again = run_cli(["run", "demo", "--out", str(out), "--seeds", "4 6", "--episodes", "3",
                     *tiny_flags()])
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert len(_rows(tmp_path / "runs" / "results.csv")) == 2


def test_time_budget_checkpoints_exits_zero_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    csv_path = tmp_path / "central.csv"
    args = ["run", "--out", str(out), "--results-csv", str(csv_path), *tiny_flags()]
    start = time.monotonic()
    proc = run_cli([*args, "--episodes", "100000", "--time-budget", "4"])
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 60
    status = json.loads((out / "status.json").read_text())
    assert status["complete"] is False
    assert "time budget" in status["stop_reason"]
    done = status["seeds"]["4"]["episodes"]
    assert done > 0
    ckpts = CheckpointManager(out / "seed_4" / "checkpoints").complete()
    assert ckpts and ckpts[-1].name == f"ckpt-{done:08d}.pt"
    assert not csv_path.exists()  # the seed is not finished: no result row yet
    proc = run_cli([*args, "--episodes", str(done + 3)])
    assert proc.returncode == 0, proc.stderr
    assert f"resumed at episode {done}" in proc.stderr
    status = json.loads((out / "status.json").read_text())
    assert status["complete"] is True and status["seeds"]["4"]["episodes"] == done + 3
    assert len(_rows(csv_path)) == 1


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_makes_a_clean_stop(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(train_cmd("run", "--out", str(out), "--episodes", "100000",
                                      *tiny_flags()),
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    ckpt_dir = out / "seed_4" / "checkpoints"
    deadline = time.monotonic() + 120
    while not CheckpointManager(ckpt_dir).complete():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    status = json.loads((out / "status.json").read_text())
    assert status["complete"] is False
    assert status["stop_reason"] == f"received {sig.name}"
    episodes = status["seeds"]["4"]["episodes"]
    assert CheckpointManager(ckpt_dir).complete()[-1].name == f"ckpt-{episodes:08d}.pt"


@pytest.mark.parametrize(("args", "field"), [
    (["run", "atari"], "workload"),
    (["run", "--episodes", "0"], "episodes"),
    (["run", "--batch-size", "-4"], "batch_size"),
    (["run", "--batch-size", "eight"], "batch_size"),
    (["run", "--precision", "fp8"], "precision"),
    (["run", "--seeds", "4 x"], "seeds"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, args: list[str],
                                              field: str) -> None:
    out = tmp_path / "run"
    proc = run_cli([*args, "--out", str(out)], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {field}:" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_config_key_and_unwritable_out(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("episodes: 3\nlearning_rate: 0.1\n")
    proc = run_cli(["run", "--config", str(cfg), "--out", str(tmp_path / "r")])
    assert proc.returncode == 2
    assert "learning_rate: unknown config key; valid keys are:" in proc.stderr
    assert "lr" in proc.stderr
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    proc = run_cli(["run", "--out", str(blocker / "run")])
    assert proc.returncode == 2
    assert "error: out:" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "job.yaml"]


def test_sc2_without_the_game_fails_at_once_naming_sc2path(tmp_path: Path) -> None:
    proc = run_cli(["run", "sc2", "--out", str(tmp_path / "r")],
                   env={"SC2PATH": str(tmp_path / "nogame")})
    assert proc.returncode == 3, proc.stderr
    assert "SC2PATH" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_ddp_two_cpu_processes_keep_identical_parameters(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", "-m", "train", "run", "demo", "--out", str(out),
            *tiny_flags()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for episodes in ("4", "6"):  # the second call resumes every rank from the checkpoint
        proc = subprocess.run([*base, "--episodes", episodes], capture_output=True,
                              text=True, timeout=300, env=env, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "seed_4" / "summary.json").read_text())
    assert summary["ranks_checked"] == 2 and summary["episodes"] == 6
    assert len(summary["param_digest"]) == 64
    assert "backend gloo" in proc.stderr
    assert "resumed at episode 4" in proc.stderr
    state = CheckpointManager(out / "seed_4" / "checkpoints").load_latest()
    assert state is not None and state["world_size"] == 2 and len(state["ranks"]) == 2
    # each rank played its own game: different replay contents, same parameters
    r0, r1 = (s["replay"]["arrays"]["action"] for s in state["ranks"])
    assert not (r0 == r1).all()
    assert not any(k.startswith("module.") for k in state["agent"]["policy"])
    # rank 0 alone writes results: one row per finished total (4, then 6), none from rank 1
    assert [r["episodes"] for r in _rows(tmp_path / "results.csv")] == ["4", "6"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_run_checkpoints_and_resumes(tmp_path: Path, precision: str) -> None:
    out = tmp_path / precision
    flags = [*tiny_flags(device="cuda", res=32), "--precision", precision, "--out", str(out)]
    for episodes in ("4", "8"):
        proc = run_cli(["run", "demo", "--episodes", episodes, *flags])
        assert proc.returncode == 0, proc.stderr
    assert "resumed at episode 4" in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["precision"] == precision
    assert config["versions"]["gpu"] == torch.cuda.get_device_name(0)
    state = CheckpointManager(out / "seed_4" / "checkpoints").load_latest()
    assert state is not None and state["episode"] == 8
    assert (state["agent"]["scaler"] is not None) == (precision == "fp16")
    assert state["ranks"][0]["torch_cuda_rng"] is not None
    assert all(torch.isfinite(t).all() for t in state["agent"]["policy"].values())
