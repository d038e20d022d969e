"""Programs as researchers have them, on the REAL local Slurm cluster (issue 25): a
submit folder holding a `train.py` of its own, a worker under torch's launcher that raises
or dies of the stop signal, and a Lightning script with no default_root_dir chained and
then run again from the same folder as another run.

The client runs as users run it, through the `train` console script: `python -m train`
from a folder with a train.py would import that file (which is the point of the first
test)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_flags
from tests.integration.chains import TERMINAL, assert_complete, walltime_signal
from tests.integration.chains import logs as _logs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HERE = Path(__file__).parent
CONSOLE = Path(sys.executable).with_name("train")
LOUD = ('import sys\nprint("SUBMIT FOLDER train.py IMPORTED", file=sys.stderr)\n'
        'sys.exit(99)\n')


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CONSOLE), *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                          check=False)


def _status(cwd: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    proc = _cli(["status", name, "--json"], cwd, env)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _wait(cwd: Path, env: dict[str, str], name: str, until: Any, timeout: float = 300
          ) -> dict[str, Any]:
    import time

    end = time.monotonic() + timeout
    while True:
        st = _status(cwd, env, name)
        if until(st):
            return st
        assert time.monotonic() < end, st
        time.sleep(1.0)


def _submit(cwd: Path, env: dict[str, str], name: str, *args: str) -> str:
    proc = _cli(["submit", "--name", name, "--cluster", "local", "--runtime", "none",
                 "--python", sys.executable, "--mem", "2000M", "--time", "5", *args], cwd, env)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def _ended(cwd: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    return _wait(cwd, env, name, lambda s: s["state"] in TERMINAL)


def test_a_train_py_in_the_submit_folder_is_never_imported_as_the_tool(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    (tmp_path / "train.py").write_text(LOUD)
    (tmp_path / "hello.py").write_text("print('hello from the program', flush=True)\n")
    jobs = {
        "demo1": ["--cpus-per-task", "1", "--", "demo", "--episodes", "2", *tiny_flags()],
        "demo2": ["--nodes", "2", "--launch", "torchrun", "--cpus-per-task", "2", "--",
                  "demo", "--episodes", "4", *tiny_flags()],
        "cmd": ["--entry", "command", "--cpus-per-task", "1", "--", sys.executable,
                "hello.py"],
        "cmd2": ["--entry", "command", "--nodes", "2", "--launch", "tasks",
                 "--cpus-per-task", "1", "--", sys.executable, "hello.py"],
    }
    # the jobs' own temporary folder (runtime none: the submit environment reaches them)
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    env = {**slurm_env, "TMPDIR": str(job_tmp)}
    for name, args in jobs.items():
        _submit(tmp_path, env, name, *args)
    for name in jobs:
        st = _ended(tmp_path, env, name)
        run_dir = tmp_path / "runs" / name
        err = _logs(run_dir, "err")
        assert "IMPORTED" not in err and "IMPORTED" not in _logs(run_dir, "out"), err[-3000:]
        assert_complete(st, run_dir)
    assert _logs(tmp_path / "runs" / "cmd2", "out").count("hello from the program") == 2
    config = json.loads((tmp_path / "runs" / "demo2" / "config.json").read_text())
    assert config["world_size"] == 2  # torchrun's workers ran the tool's `train run`
    # nothing left behind by the launches: no scontrol stand-in, no torchrun agent folder
    left = [p.name for p in job_tmp.iterdir() if p.name.startswith((".train-", "torchelastic"))]
    assert left == [], left


def test_a_worker_that_raises_under_torchrun_is_the_programs_failure(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(HERE / "worker_fails.py", tmp_path / "worker_fails.py")
    (tmp_path / "train.py").write_text(LOUD)
    env = {**slurm_env, "WORKER_FAIL": "raise"}
    _submit(tmp_path, env, "boom", "--entry", "command", "--launch", "torchrun",
            "--cpus-per-task", "2", "--env", "WORKER_FAIL", "--", sys.executable,
            "worker_fails.py")
    st = _ended(tmp_path, env, "boom")
    run_dir = tmp_path / "runs" / "boom"
    err = _logs(run_dir, "err")
    assert st["state"] == "failed", st
    assert "unexpected failure" not in err and "ChildFailedError" not in err, err[-3000:]
    assert "/train/launch.py" not in err and "/train/cli.py" not in err, err[-3000:]
    assert "RuntimeError: worker boom at rank 0" in err
    assert "worker rank 0 (local rank 0, pid" in err and "exited with code 1" in err
    proc = _cli(["doctor", "boom", "--json"], tmp_path, env)
    first = json.loads(proc.stdout)["findings"][0]
    assert first["cause"] == "python_error", first
    assert first["detail"] == "RuntimeError: worker boom at rank 0", first
    # `train logs` shows stdout, and says where the rest is
    proc = _cli(["logs", "boom"], tmp_path, env)
    assert proc.returncode == 0 and "worker rank 0/1 started" in proc.stdout
    assert "stderr is in" in proc.stderr and ".err" in proc.stderr, proc.stderr


def test_a_worker_without_a_handler_dies_of_the_stop_signal_and_is_told_so(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    run_dir = tmp_path / "runs" / "deaf"
    env = {**slurm_env, "USER_NO_HANDLER": "1", "USER_HOLD_AT": "5"}
    shutil.copy(HERE / "user_ddp.py", tmp_path / "user_ddp.py")
    _submit(tmp_path, env, "deaf", "--entry", "command", "--launch", "torchrun",
            "--nodes", "2", "--cpus-per-task", "2", "--stop-signal", "USR1",
            "--max-chunks", "2", "--env", "USER_NO_HANDLER", "--env", "USER_HOLD_AT", "--",
            sys.executable, "user_ddp.py")
    st = _wait(tmp_path, env, "deaf", lambda s: (run_dir / "user_held").exists())
    walltime_signal(st["chunks"][0]["job_id"], env)
    st = _ended(tmp_path, env, "deaf")
    err = _logs(run_dir, "err")
    assert st["state"] == "failed", (st, err[-3000:])
    assert "unexpected failure" not in err and "ChildFailedError" not in err, err[-3000:]
    assert "was killed by SIGUSR1 (exit code 138)" in err, err[-3000:]
    assert "the program died of the stop signal USR1" in err, err[-3000:]  # the batch shell


def test_a_lightning_script_run_again_from_the_same_folder_starts_from_scratch(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(HERE / "lightning_plain.py", tmp_path / "fit.py")
    env = {**slurm_env, "PL_HOLD_AT": "3"}
    flags = ["--entry", "command", "--nodes", "2", "--cpus-per-task", "2", "--stop-signal",
             "USR1", "--max-chunks", "3", "--env", "PL_HOLD_AT", "--", sys.executable,
             "fit.py"]  # no --launch: a Lightning script gets tasks mode
    first = tmp_path / "runs" / "pl-a"
    _submit(tmp_path, env, "pl-a", *flags)
    assert "--mode=tasks" in next((first / "jobs").glob("*.sbatch")).read_text()
    st = _wait(tmp_path, env, "pl-a", lambda s: (first / "pl_held").exists())
    walltime_signal(st["chunks"][0]["job_id"], env)
    st = _ended(tmp_path, env, "pl-a")
    out = _logs(first, "out")
    assert_complete(st, first)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert (first / "hpc_ckpt_1.ckpt").exists()  # in its run folder, not the submit folder
    assert not list(tmp_path.glob("hpc_ckpt_*.ckpt"))
    assert "plain rank 0 starts at global step 3" in out  # chunk 2 resumed
    assert out.count("global step 12") == 2, out
    # the checkpoint where a run before this change (or a script's default_root_dir=".")
    # left it: the next run from this folder is warned, and does not restore it
    shutil.copy(first / "hpc_ckpt_1.ckpt", tmp_path / "hpc_ckpt_1.ckpt")
    second = tmp_path / "runs" / "pl-b"
    env = dict(slurm_env)  # (no hold)
    warned = _submit(tmp_path, env, "pl-b", "--entry", "command", "--nodes", "2",
                     "--cpus-per-task", "2", "--", sys.executable, "fit.py")
    assert "hpc_ckpt_1.ckpt" in warned and "does not restore them" in warned, warned
    st = _ended(tmp_path, env, "pl-b")
    out, err = _logs(second, "out"), _logs(second, "err")
    assert_complete(st, second)
    assert "Restored all states" not in err, err[-4000:]
    assert out.count("plain rank 0 starts at global step 0") == 1, out
    assert f"root {second};" in out and out.count("global step 12") == 2, out
