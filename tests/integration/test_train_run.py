"""`train run` for real: CPU training, resume, signals, bad input, DDP under torchrun."""

from __future__ import annotations

import csv
import errno
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TINY, run_cli, tiny_flags, train_cmd
from train.batch import contract
from train.batch.saves import file_progress as read_progress
from train.common.errors import ConfigError, UsageError
from train.workloads import runner
from train.workloads.config import RunConfig
from train.workloads.dqn import trainer
from train.workloads.runtime import results
from train.workloads.runtime.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow


def _cfg(out: Path, episodes: int, **kw: Any) -> RunConfig:
    return RunConfig(**{**TINY, "out": str(out), "episodes": episodes, "log_every": 60.0,
                        **kw})


def _final(out: Path, seed: int = 4) -> tuple[list[float], list[Any], list[float], dict[str, Any]]:
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
    record = (tmp_path / "r" / "config.json").read_bytes()
    with pytest.raises(UsageError, match="lr: differs"):
        runner.run(_cfg(tmp_path / "r", 4, lr=0.1))
    # the finished run too (same episodes: nothing left to train), naming every field, and
    # the refused settings are never written down
    with pytest.raises(UsageError, match=r"gamma: differs .*gamma: the run has 0\.9, now "
                       r"0\.5; lr: the run has 0\.0005, now 0\.1"):
        runner.run(_cfg(tmp_path / "r", 2, lr=0.1, gamma=0.5))
    assert (tmp_path / "r" / "config.json").read_bytes() == record
    (tmp_path / "r" / "config.json").write_text("{broken")
    with pytest.raises(UsageError, match=r"out: .*config\.json is not a readable run record"):
        runner.run(_cfg(tmp_path / "r", 4))
    (tmp_path / "r" / "config.json").write_bytes(record)
    with pytest.raises(UsageError, match="resume"):
        runner.run(_cfg(tmp_path / "r", 4, resume="never"))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_cli_demo_writes_every_result(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "demo"
    # the device as the demo has it (auto), every progress line shown
    proc = run_cli(["run", "demo", "--out", str(out), "--seeds", "4 6", "--episodes", "3",
                    *tiny_flags(device="auto", log_every=1e-6)],
                   env={"SLURM_JOB_ID": "77", "SLURM_FAKE_TOKEN": "s3cret"})
    assert proc.returncode == 0, proc.stderr
    # no CUDA warning where there is no GPU to use (nor anything else to warn about)
    assert "WARNING" not in proc.stderr and "CUDA is unusable" not in proc.stderr, proc.stderr
    # the progress lines have an ETA once two episodes are timed
    assert re.search(r"seed 4 episode 2/3 \([0-9.]+ ep/s, ETA \d+s\)", proc.stderr), \
        proc.stderr
    # it ends saying what it did and where everything is
    assert f"INFO train.workloads.runner: run complete: {out}\n" in proc.stderr
    for seed in (4, 6):
        assert re.search(rf"INFO train.workloads.runner: seed {seed}: evaluation reward -?[0-9.]+ \+- "
                         r"[0-9.e+-]+ over 2 episodes after 3 trained; the scripted policy "
                         r"scores [0-9.]+ \(\d+% of it\)\n", proc.stderr), proc.stderr
    assert f"learning curve: {out / 'learning_curve.png'}\n" in proc.stderr
    assert f"results CSV: {tmp_path / 'runs' / 'results.csv'}\n" in proc.stderr
    assert (f"checkpoints: {out / 'seed_4' / 'checkpoints'}, "
            f"{out / 'seed_6' / 'checkpoints'}\n") in proc.stderr
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
    # A budget used up by a slow start (a busy machine) is a clean stop with no episode:
    # the contract holds either way, and each run resumes the last; a larger budget is
    # tried until one episode fits (at most 6 runs, 4 s to 128 s)
    done = 0
    for budget in (4, 8, 16, 32, 64, 128):
        proc = run_cli([*args, "--episodes", "100000", "--time-budget", str(budget)])
        assert proc.returncode == 0, proc.stderr
        status = json.loads((out / "status.json").read_text())
        assert status["complete"] is False
        assert "time budget" in status["stop_reason"]
        assert not (out / contract.COMPLETE_MARKER).exists()
        done = status["seeds"]["4"]["episodes"]
        if done > 0:
            break
    assert done > 0
    ckpts = CheckpointManager(out / "seed_4" / "checkpoints").complete()
    assert ckpts and ckpts[-1].name == f"ckpt-{done:08d}.pt"
    assert not csv_path.exists()  # the seed is not finished: no result row yet
    assert read_progress(out) == (done, 100000)
    assert not (out / contract.COMPLETE_MARKER).exists()
    proc = run_cli([*args, "--episodes", str(done + 3)])
    assert proc.returncode == 0, proc.stderr
    assert f"resumed at episode {done}" in proc.stderr
    status = json.loads((out / "status.json").read_text())
    assert status["complete"] is True and status["seeds"]["4"]["episodes"] == done + 3
    assert status["warnings"] == []
    assert len(_rows(csv_path)) == 1
    assert read_progress(out) == (done + 3, done + 3)
    assert (out / contract.COMPLETE_MARKER).exists()


def test_progress_counts_every_seed_up_to_the_target(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.run(_cfg(out, 3, seeds=(4, 6)))
    assert result.complete and (out / contract.COMPLETE_MARKER).exists()
    assert (out / contract.PROGRESS_FILE).read_text() == "6 6\n"
    # a larger target, stopped by the time budget in seed 4: seed 6 keeps its 3 episodes (on a
    # busy machine start-up may spend the whole budget: seed 4 then trains no episode more)
    result = runner.run(_cfg(out, 100000, seeds=(4, 6), time_budget=2.0))
    assert not result.complete and "time budget" in str(result.stop_reason)
    assert not (out / contract.COMPLETE_MARKER).exists()
    trained = result.status["seeds"]["4"]["episodes"]
    assert 3 <= trained < 100000 and "6" not in result.status["seeds"]
    assert read_progress(out) == (trained + 3, 200000)
    # a smaller target than a seed has trained counts that seed as the target
    result = runner.run(_cfg(out, 2, seeds=(4, 6)))
    assert result.complete
    assert read_progress(out) == (4, 4)


def _status(out: Path) -> dict[str, Any]:
    status: dict[str, Any] = json.loads((out / "status.json").read_text())
    return status


def test_completion_record_is_written_before_the_csv_row_and_the_plot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    seen: list[str] = []
    append, plot = results.append_csv_row, results.plot_learning_curves

    def record_exists(what: str) -> None:
        assert _status(out)["complete"] is True, what
        assert (out / contract.COMPLETE_MARKER).exists(), what
        assert read_progress(out) == (6, 6), what
        seen.append(what)

    def checked_append(path: Path, row: Any, **kwargs: Any) -> bool:
        record_exists(f"row {row['seed']}")
        assert not (out / "learning_curve.png").exists()
        return append(path, row, **kwargs)

    def checked_plot(*args: Any, **kwargs: Any) -> None:
        record_exists("plot")
        plot(*args, **kwargs)

    monkeypatch.setattr(results, "append_csv_row", checked_append)
    monkeypatch.setattr(results, "plot_learning_curves", checked_plot)
    assert runner.run(_cfg(out, 3, seeds=(4, 6))).complete
    assert seen == ["row 4", "row 6", "plot"]
    assert [r["seed"] for r in _rows(tmp_path / "results.csv")] == ["4", "6"]


def test_csv_without_flock_falls_back_to_one_append_and_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    out = tmp_path / "run"
    result = runner.run(_cfg(out, 3))
    assert result.complete and (out / contract.COMPLETE_MARKER).exists()
    rows = _rows(tmp_path / "results.csv")
    assert [(r["seed"], r["episodes"]) for r in rows] == [("4", "3")]
    warnings = _status(out)["warnings"]
    assert len(warnings) == 1 and "flock" in warnings[0] and "O_APPEND" in warnings[0]
    assert json.loads((out / "seed_4" / "summary.json").read_text())["csv_episodes"] == 3


def test_failing_csv_is_a_warning_and_the_rerun_appends_the_row_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    csv_dir = tmp_path / "shared"
    csv_path = csv_dir / "results.csv"
    real_train = trainer.train

    def train_then_break_the_csv_dir(*args: Any) -> results.RunSummary:
        summary = real_train(*args)
        csv_dir.rmdir()  # after validation: the directory is replaced by a file
        csv_dir.write_text("")
        return summary

    csv_dir.mkdir()
    cfg = _cfg(out, 3, seeds=(4, 6), results_csv=str(csv_path))
    with monkeypatch.context() as m:
        m.setattr(trainer, "train", train_then_break_the_csv_dir)
        result = runner.run(cfg)
    assert result.complete and (out / contract.COMPLETE_MARKER).exists()
    status = _status(out)
    assert status["complete"] is True and result.status == status
    assert len(status["warnings"]) == 2
    assert all(w.startswith("results_csv: could not append the row for seed")
               and str(csv_path) in w for w in status["warnings"])
    assert read_progress(out) == (6, 6)
    assert (out / "learning_curve.png").exists()
    # the path fixed, the same command appends each missing row once, and only once
    csv_dir.unlink()
    csv_dir.mkdir()
    for _ in range(2):
        result = runner.run(cfg)
        assert result.complete and _status(out)["warnings"] == []
        assert [r["seed"] for r in _rows(csv_path)] == ["4", "6"]
    summary = json.loads((out / "seed_6" / "summary.json").read_text())
    assert summary["csv_rows"] == 1 and summary["csv_episodes"] == 3


def test_failing_plot_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_plot(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no usable backend")

    monkeypatch.setattr(results, "plot_learning_curves", broken_plot)
    out = tmp_path / "run"
    result = runner.run(_cfg(out, 3))
    assert result.complete and (out / contract.COMPLETE_MARKER).exists()
    assert _status(out)["warnings"] == [
        f"plot: could not write {out / 'learning_curve.png'}: RuntimeError: no usable backend"]
    assert len(_rows(tmp_path / "results.csv")) == 1


def test_results_csv_naming_a_directory_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    proc = run_cli(["run", "--out", str(tmp_path / "run"), "--results-csv", str(taken),
                    *tiny_flags()])
    assert proc.returncode == 2, proc.stderr
    assert "error: results_csv:" in proc.stderr and "is a directory" in proc.stderr
    assert list(tmp_path.iterdir()) == [taken] and list(taken.iterdir()) == []
    # the default, results.csv beside the run directory, is checked the same way
    (tmp_path / "results.csv").mkdir()
    with pytest.raises(ConfigError, match=r"results_csv: .*is a directory"):
        runner.validate(_cfg(tmp_path / "run2", 3))


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


def test_a_kill_between_the_csv_row_and_its_record_never_doubles_the_row(
        tmp_path: Path) -> None:
    """Killed after appending the seeds' rows but before summary.json recorded them: the
    rerun finds the rows (keyed by run, seed and total) and appends none again."""
    out = tmp_path / "k"
    runner.run(_cfg(out, 2, seeds=(4, 6)))
    for seed in (4, 6):  # as if the kill came before the record
        path = out / f"seed_{seed}" / "summary.json"
        summary = json.loads(path.read_text())
        summary.pop("csv_episodes")
        path.write_text(json.dumps(summary))
    runner.run(_cfg(out, 2, seeds=(4, 6)))
    rows = _rows(tmp_path / "results.csv")  # beside the run directory
    assert sorted((r["seed"], r["episodes"]) for r in rows) == [("4", "2"), ("6", "2")]
