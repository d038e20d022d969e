from __future__ import annotations

import csv
import errno
import fcntl
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from train.common.jsonio import to_builtin, write_json_atomic
from train.common.secrets.environment import recorded_environment
from train.common.secrets.names import REDACTED
from train.workloads.runtime.results import (
    append_csv_row,
    moving_average,
    outcome_lines,
    plot_learning_curves,
    run_metadata,
)


def test_environment_snapshot_filters_and_redacts() -> None:
    env = {
        "SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO",
        "PYTORCH_CUDA_ALLOC_CONF": "x", "HOME": "/root", "SLURM_API_TOKEN": "abc",
        "NCCL_SECRET_KEY": "k", "CUDA_PASSWORD_HINT": "p", "PYTORCH_CREDENTIALS": "c",
        "WANDB_API_KEY": "w",
    }
    snap = recorded_environment(env)
    assert snap["SLURM_JOB_ID"] == "42" and snap["NCCL_DEBUG"] == "INFO"
    assert "HOME" not in snap and "WANDB_API_KEY" not in snap
    for name in ("SLURM_API_TOKEN", "NCCL_SECRET_KEY", "CUDA_PASSWORD_HINT",
                 "PYTORCH_CREDENTIALS"):
        assert snap[name] == REDACTED


def test_run_metadata_has_versions_and_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    meta = run_metadata({"a": 1}, torch.device("cpu"), {"extra": True})
    assert meta["versions"]["torch"] == torch.__version__
    assert {"python", "cuda", "cudnn", "gpu"} <= set(meta["versions"])
    assert meta["environment"]["SLURM_JOB_ID"] == "7"
    assert meta["host"] and meta["extra"] is True
    json.dumps(to_builtin(meta), allow_nan=False)


def test_to_builtin_converts_numpy_and_torch(tmp_path: Path) -> None:
    data = {"a": np.float32(1.5), "b": np.arange(3), "c": torch.tensor([1, 2]), "d": (1, 2),
            "e": np.bool_(True), "f": Path("/x")}
    out = to_builtin(data)
    assert out == {"a": 1.5, "b": [0, 1, 2], "c": [1, 2], "d": [1, 2], "e": True, "f": "/x"}
    assert type(out["a"]) is float and type(out["e"]) is bool
    write_json_atomic(tmp_path / "x.json", data)
    assert json.loads((tmp_path / "x.json").read_text())["b"] == [0, 1, 2]


def _append_rows(args: tuple[str, int]) -> None:
    path, worker = args
    for i in range(50):
        append_csv_row(Path(path), {"worker": worker, "row": i, "text": "a,b \"q\""})


def test_sixteen_processes_appending_lose_no_row(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    # forkserver, not fork: forking the test process, which may hold other tests'
    # threads, can copy a lock held at that instant into a worker, which then never
    # starts (seen in a full-suite run); the server is a fresh process forked from
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    with ctx.Pool(16) as pool:
        pool.map(_append_rows, [(str(path), w) for w in range(16)])
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 16 * 50
    assert {(r["worker"], r["row"]) for r in rows} == {(str(w), str(i)) for w in range(16)
                                                       for i in range(50)}
    assert all(r["text"] == 'a,b "q"' for r in rows)
    assert path.read_text().count("worker,row,text") == 1


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK])
def test_no_flock_appends_each_row_in_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               code: int) -> None:
    def no_flock(fd: int, op: int) -> None:
        raise OSError(code, "flock refused")

    writes: list[bytes] = []
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            writes.append(bytes(data))
        return real_write(fd, data)

    path = tmp_path / "results.csv"
    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(os, "write", counting_write)
    assert append_csv_row(path, {"seed": 4, "text": "a,b"}) is False
    assert append_csv_row(path, {"seed": 6, "text": "c"}) is False
    # one write() per row, the header riding with the first
    assert writes == [b'seed,text\n4,"a,b"\n', b"6,c\n"]
    with open(path, newline="") as fh:
        assert list(csv.DictReader(fh)) == [{"seed": "4", "text": "a,b"},
                                            {"seed": "6", "text": "c"}]


def test_locked_append_reports_the_lock_and_other_errors_raise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert append_csv_row(tmp_path / "ok.csv", {"a": 1}) is True
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(OSError):  # the CSV's directory is a file
        append_csv_row(blocker / "results.csv", {"a": 1})

    def broken_flock(fd: int, op: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fcntl, "flock", broken_flock)
    with pytest.raises(OSError, match="I/O error"):
        append_csv_row(tmp_path / "eio.csv", {"a": 1})
    assert (tmp_path / "eio.csv").read_text() == ""


def test_moving_average() -> None:
    assert moving_average([1, 2, 3, 4], 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([], 3).size == 0


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "curve.png"
    plot_learning_curves(path, {"seed 1": [0, 1, 2, 5, 8], "seed 2": [1, 1]}, "t",
                         {"scripted": 9.0})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000


def test_keyed_rows_are_appended_once(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    row = {"run": "/r", "seed": 4, "episodes": 10, "reward": 1.5}
    assert append_csv_row(path, row, key=("run", "seed", "episodes")) is True
    append_csv_row(path, {**row, "reward": 2.0}, key=("run", "seed", "episodes"))
    append_csv_row(path, {**row, "episodes": 20}, key=("run", "seed", "episodes"))
    append_csv_row(path, {**row, "seed": 6}, key=("run", "seed", "episodes"))
    lines = path.read_text().splitlines()
    assert lines[0] == "run,seed,episodes,reward"
    assert lines[1:] == ["/r,4,10,1.5", "/r,4,20,1.5", "/r,6,10,1.5"]


def test_a_failed_json_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # refused mid-write, as a full disk is
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
    assert path.read_text().strip() == '{\n  "a": 1\n}'


def test_the_outcome_says_the_score_against_the_scripted_policy_and_where_files_are(
        tmp_path: Path) -> None:
    out = tmp_path / "runs" / "demo"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "test_results.json").write_text(json.dumps({
        "4": {"mean_reward": 18.5, "std_reward": 1.25, "episode_rewards": [17.25, 19.75],
              "trained_episodes": 200, "scripted_mean_reward": 23.0},
        "6": {"mean_reward": 2.0, "std_reward": 0.0, "episode_rewards": [2.0],
              "trained_episodes": 200, "scripted_mean_reward": 0.0}}))
    for seed in (4, 6):
        (out / f"seed_{seed}" / "checkpoints").mkdir(parents=True)
    (out / "learning_curve.png").write_bytes(b"\x89PNG")
    csv_path = tmp_path / "runs" / "results.csv"
    csv_path.write_text("seed\n4\n")
    lines = outcome_lines(out, [4, 6, 8], csv_path)
    assert lines == [
        f"run complete: {out}",
        "seed 4: evaluation reward 18.5 +- 1.2 over 2 episodes after 200 trained; the "
        "scripted policy scores 23 (80% of it)",
        # a scripted score of 0 gives no share
        "seed 6: evaluation reward 2 +- 0 over 1 episodes after 200 trained; the scripted "
        "policy scores 0",
        "seed 8: not evaluated (--eval-episodes 0, or done earlier)",
        f"learning curve: {out / 'learning_curve.png'}",
        f"results CSV: {csv_path}",
        f"checkpoints: {out / 'seed_4' / 'checkpoints'}, {out / 'seed_6' / 'checkpoints'}",
    ]
