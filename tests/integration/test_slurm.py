"""`train submit/status/logs/cancel` against a REAL SLURM cluster (see conftest.py):
chained chunks, walltime signals, failures, early completion, requeue, hostile arguments.
Accounting storage is disabled on this cluster, as on many test set-ups: status falls back
to squeue and the job completion log."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cli, tiny_flags
from train.runtime.checkpoint import CheckpointManager

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TERMINAL = {"complete", "failed", "cancelled", "incomplete", "ended"}


def _job(*flags: str) -> list[str]:
    return ["--cluster", "local", "--python", sys.executable, "--cpus-per-task", "1",
            "--mem", "1000M", *flags]


def _submit(cwd: Path, env: dict[str, str], name: str, flags: list[str],
            workload: list[str]) -> Path:
    proc = run_cli(["submit", "--name", name, *_job(*flags), "--", *workload], cwd=cwd,
                   env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"submitted {name}" in proc.stdout
    return cwd / "runs" / name


def _status(cwd: Path, env: dict[str, str], ref: str) -> dict[str, Any]:
    proc = run_cli(["status", ref, "--json"], cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def _wait(cwd: Path, env: dict[str, str], ref: str, until: Any, timeout: float = 240
          ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = _status(cwd, env, ref)
        if until(st):
            return st
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text(errors="replace")[-3000:]
                             for p in sorted((cwd / "runs" / st["name"] / "logs").glob("*")))
            pytest.fail(f"timed out waiting on {ref}: {json.dumps(st, indent=1)}\n{logs}")
        time.sleep(1.0)


def _logs(run_dir: Path, suffix: str) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted((run_dir / "logs").glob(f"*.{suffix}")))


def test_three_chunks_complete_and_equal_one_uninterrupted_run(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # size the work to about 1.3 chunk budgets at this machine's measured speed, so the
    # walltime must end at least one chunk and three chunks always suffice (a coarse,
    # early signal can shorten one chunk to almost nothing)
    # (reference and calibration run as the jobs do: same CLI, same thread settings, as
    # float reductions differ with the thread count)
    calibration = ["run", "demo", "--out", str(tmp_path / "calibration"),
                   *tiny_flags(checkpoint_every=25, log_every=1000)]
    assert run_cli([*calibration, "--episodes", "10"]).returncode == 0
    proc = run_cli([*calibration, "--episodes", "60"])
    rate = float(re.findall(r"episode 60/60 \(([\d.]+) ep/s\)", proc.stderr)[-1])
    budget = 60 - 45
    episodes = max(40, int(1.3 * budget * rate))
    flags = tiny_flags(checkpoint_every=25)
    run_dir = _submit(tmp_path, slurm_env, "chain",
                      ["--chunks", "3", "--time", "1", "--signal-margin", "45"],
                      ["demo", "--episodes", str(episodes), *flags])
    st = _wait(tmp_path, slurm_env, "chain", lambda s: s["state"] in TERMINAL, timeout=400)
    assert st["state"] == "complete", st
    ran = [c for c in st["chunks"] if "started" in c["events"]]
    assert len(ran) >= 2, st  # the walltime ended a chunk and the next resumed
    assert "resumed at episode" in _logs(run_dir, "err")
    assert all(c["state"] not in ("PENDING", "RUNNING") for c in st["chunks"])

    straight = tmp_path / "straight"
    proc = run_cli(["run", "demo", "--episodes", str(episodes), "--out", str(straight),
                    *flags], env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    a = json.loads((run_dir / "seed_4" / "episodes.json").read_text())
    b = json.loads((straight / "seed_4" / "episodes.json").read_text())
    assert a["rewards"] == b["rewards"] and len(a["rewards"]) == episodes
    ea = json.loads((run_dir / "eval" / "test_results.json").read_text())["4"]
    eb = json.loads((straight / "eval" / "test_results.json").read_text())["4"]
    assert ea["episode_rewards"] == eb["episode_rewards"]
    pa = CheckpointManager(run_dir / "seed_4" / "checkpoints").load_latest()
    pb = CheckpointManager(straight / "seed_4" / "checkpoints").load_latest()
    assert pa is not None and pb is not None
    for key, tensor in pa["agent"]["policy"].items():
        assert torch.equal(tensor, pb["agent"]["policy"][key]), key


def test_walltime_signal_checkpoints_and_the_next_chunk_resumes(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    run_dir = _submit(tmp_path, slurm_env, "sig",
                      ["--chunks", "2", "--time", "1", "--signal-margin", "40",
                       "--no-time-budget"],
                      ["demo", "--episodes", "1000000", *tiny_flags(checkpoint_every=50)])
    st = _wait(tmp_path, slurm_env, "sig",
               lambda s: "resumed at episode" in _logs(run_dir, "err"), timeout=240)
    err = _logs(run_dir, "err")
    assert "received SIGUSR1" in err
    assert "walltime signal: asking the training step to checkpoint" in err
    first = st["chunks"][0]
    assert "stopped" in first["events"], st
    assert "--time-budget" not in (run_dir / "jobs" / "sig-c1of2.sbatch").read_text()
    # cancel the whole chain by any of its job ids
    proc = run_cli(["cancel", st["chunks"][1]["job_id"]], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, slurm_env, "sig",
               lambda s: all(c["state"] not in ("PENDING", "RUNNING", "COMPLETING")
                             for c in s["chunks"]))
    assert st["state"] == "cancelled"


def test_failing_chunk_marks_the_chain_failed_and_leaves_nothing_pending(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # valid at submission, fails on the node: the results CSV cannot be written there
    _submit(tmp_path, slurm_env, "fail", ["--chunks", "3", "--time", "2"],
            ["demo", "--results-csv", "/proc/nowhere/results.csv", *tiny_flags()])
    st = _wait(tmp_path, slurm_env, "fail",
               lambda s: s["state"] == "failed" and all(
                   c["state"] not in ("PENDING", "RUNNING", "COMPLETING")
                   for c in s["chunks"]))
    assert st["chunks"][0]["state"] == "FAILED"
    assert {c["state"] for c in st["chunks"][1:]} == {"CANCELLED"}
    proc = run_cli(["logs", "fail", "--err"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0 and "results_csv: cannot write" in proc.stdout
    assert "training step failed with exit code 2" in proc.stdout


def test_finishing_early_cancels_the_waiting_chunks(tmp_path: Path,
                                                    slurm_env: dict[str, str]) -> None:
    run_dir = _submit(tmp_path, slurm_env, "early", ["--chunks", "3", "--time", "3"],
                      ["demo", "--episodes", "4", *tiny_flags()])
    st = _wait(tmp_path, slurm_env, "early",
               lambda s: s["state"] == "complete" and all(
                   c["state"] not in ("PENDING", "RUNNING", "COMPLETING")
                   for c in s["chunks"]))
    assert st["chunks"][0]["state"] == "COMPLETED"
    assert [c["state"] for c in st["chunks"][1:]] == ["CANCELLED", "CANCELLED"]
    assert (run_dir / "COMPLETE").exists()
    proc = run_cli(["status", "early"], cwd=tmp_path, env=slurm_env)
    assert "early (local): complete" in proc.stdout
    proc = run_cli(["logs", st["chunks"][0]["job_id"]], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0


def test_requeue_mode_resumes_after_a_requeue(tmp_path: Path,
                                              slurm_env: dict[str, str]) -> None:
    run_dir = _submit(tmp_path, slurm_env, "rq",
                      ["--requeue", "--time", "1", "--signal-margin", "40",
                       "--no-time-budget"],
                      ["demo", "--episodes", "1000000", *tiny_flags(checkpoint_every=50)])
    _wait(tmp_path, slurm_env, "rq",
          lambda s: "resumed at episode" in _logs(run_dir, "err"), timeout=300)
    err = _logs(run_dir, "err")
    assert "requeueing job" in err and "(restart 1)" in err
    events = (run_dir / "chain.events").read_text()
    assert " requeued" in events
    proc = run_cli(["cancel", "rq"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr


def test_shell_metacharacters_reach_the_trainer_verbatim(tmp_path: Path,
                                                         slurm_env: dict[str, str]) -> None:
    hostile = (f"{tmp_path}/r $(touch {tmp_path}/pwned1); `touch {tmp_path}/pwned2`; "
               f"'q' \"d\" \\ $HOME\nline2.csv")
    run_dir = _submit(tmp_path, slurm_env, "meta", ["--time", "3"],
                      ["demo", "--episodes", "2", "--results-csv", hostile, *tiny_flags()])
    st = _wait(tmp_path, slurm_env, "meta", lambda s: s["state"] in TERMINAL)
    assert st["state"] == "complete", st
    assert Path(hostile).is_file()
    assert not (tmp_path / "pwned1").exists() and not (tmp_path / "pwned2").exists()
    argv = json.loads((run_dir / "config.json").read_text())["argv"]
    assert argv[argv.index("--results-csv") + 1] == hostile
