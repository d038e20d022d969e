"""A program as most research code is (issue 25, item 3), on the REAL local Slurm cluster:
nanogpt_like.py saves every few iterations to its own folder, resumes only when told
(`--init_from=resume`, which fails with no checkpoint yet), and has no signal handler.
With `--resume-args --init_from=resume --stop-mode kill --save-path out` it chains with no
wrapper; a chunk stopped before its first save ends the chain "stopped before any save",
and a resubmitted chain of the run goes on counting chunks.

The chunks run with a 10-minute walltime; the walltime signal is sent by the test (as
Slurm's `--signal=B:USR1@N` sends it: to the batch shell) once the program stands still
after a counted number of iterations, so the tool's own TERM (and KILL) end it for real.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.chains import logs, status, submit, wait, walltime_signal

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROGRAM = Path(__file__).with_name("nanogpt_like.py")
TERMINAL = {"complete", "failed", "cancelled", "incomplete", "stalled", "ended"}


def _runs(log_dir: Path) -> list[dict[str, Any]]:
    """What each process of the program was started with, in order."""
    path = log_dir / "runs.log"
    return [json.loads(line) for line in path.read_text().splitlines()] \
        if path.exists() else []


def _iters(log_dir: Path) -> dict[int, list[int]]:
    """The iterations each process ran, by pid."""
    out: dict[int, list[int]] = {}
    for line in (log_dir / "iters.log").read_text().splitlines():
        pid, it = line.split()
        out.setdefault(int(pid), []).append(int(it))
    return out


def _stop_when_blocked(cwd: Path, env: dict[str, str], name: str, log_dir: Path,
                       nth: int) -> None:
    """Wait until the nth process of the program stands still, then send its chunk the
    walltime signal."""
    def blocked(st: dict[str, Any]) -> bool:
        runs = _runs(log_dir)
        return len(runs) >= nth and (log_dir / f"blocked.{runs[nth - 1]['pid']}").exists()

    st = wait(cwd, env, name, blocked, timeout=300)
    running = [c for c in st["chunks"] if c["state"] == "RUNNING"]
    assert len(running) == 1, st
    walltime_signal(running[0]["job_id"], env)


def _flags(*extra: str) -> list[str]:
    return ["--entry", "command", "--time", "10", "--signal-margin", "30",
            "--stop-mode", "kill", "--resume-args", "--init_from=resume",
            "--save-path", "out", *extra]


def test_a_nanogpt_shaped_program_chains_over_three_chunks_with_no_wrapper(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(PROGRAM, tmp_path / "nanogpt_like.py")
    log_dir = tmp_path / "log"
    # 30 iterations, a save every 5, at most 12 in one process: chunk 1 runs 1-12 and
    # saves at 10; chunk 2 resumes at 10 and runs 11-22; chunk 3 resumes at 20, ends at 30
    run_dir = submit(tmp_path, slurm_env, "nano", _flags("--max-chunks", "3"),
                     [sys.executable, "nanogpt_like.py", "--max_iters=30",
                      "--eval_interval=5", "--block_after=12"])
    _stop_when_blocked(tmp_path, slurm_env, "nano", log_dir, 1)
    _stop_when_blocked(tmp_path, slurm_env, "nano", log_dir, 2)
    st = wait(tmp_path, slurm_env, "nano", lambda s: s["state"] in TERMINAL, timeout=300)
    err = logs(run_dir)
    assert st["state"] == "complete", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"]] == ["stopped", "stopped", "complete"]
    runs = _runs(log_dir)
    assert [r["chunk"] for r in runs] == ["1", "2", "3"]
    base = ["--max_iters=30", "--eval_interval=5", "--block_after=12"]
    assert [r["argv"] for r in runs] == [base, [*base, "--init_from=resume"],
                                         [*base, "--init_from=resume"]]
    iters = _iters(log_dir)
    assert [iters[r["pid"]] for r in runs] == [list(range(1, 13)), list(range(11, 23)),
                                               list(range(21, 31))]
    assert json.loads((tmp_path / "out" / "ckpt.json").read_text()) == {"iter_num": 30}
    out = logs(run_dir, "out")
    assert "resuming from iteration 10" in out and "resuming from iteration 20" in out
    assert "finished at iteration 30" in out
    assert err.count("ending the program (stop mode kill)") == 2
    assert err.count("the work since the program's last save is redone") == 2
    assert err.count("the program's arguments end with --init_from=resume") == 2
    assert "failed" not in (run_dir / "chain.events").read_text()


def test_a_chunk_stopped_before_any_save_ends_the_chain_and_a_resubmit_counts_on(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(PROGRAM, tmp_path / "nanogpt_like.py")
    log_dir = tmp_path / "log"
    argv = [sys.executable, "nanogpt_like.py", "--max_iters=10", "--eval_interval=5"]
    # stands still after 3 iterations, before its first save at 5
    run_dir = submit(tmp_path, slurm_env, "early", _flags("--max-chunks", "3"),
                     [*argv, "--block_after=3"])
    _stop_when_blocked(tmp_path, slurm_env, "early", log_dir, 1)
    st = wait(tmp_path, slurm_env, "early", lambda s: s["state"] in TERMINAL, timeout=300)
    err = logs(run_dir)
    assert st["state"] == "stalled", (st, err[-4000:])
    assert "stopped before any save" in st["cause"], st
    assert "goes on at chunk 2" in st["cause"], st
    assert "stopped before any save" in err
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["unsaved"], st
    assert len(_runs(log_dir)) == 1  # no second chunk ran
    assert not (tmp_path / "out" / "ckpt.json").exists()

    # the same run again: chunk 2, TRAIN_CHUNK=2, and no resume flag (nothing was saved)
    submit(tmp_path, slurm_env, "early", _flags("--max-chunks", "3"), argv)
    st = wait(tmp_path, slurm_env, "early", lambda s: s["state"] in TERMINAL, timeout=300)
    assert st["state"] == "complete", (st, logs(run_dir)[-4000:])
    assert st["chunks"][0]["chunk"] == 2, st
    assert [c["chunk"] for c in st["chunks"] if c["events"]] == [2], st
    runs = _runs(log_dir)
    assert [r["chunk"] for r in runs] == ["1", "2"]
    assert "--init_from=resume" not in runs[1]["argv"]
    assert json.loads((tmp_path / "out" / "ckpt.json").read_text()) == {"iter_num": 10}
    assert status(tmp_path, slurm_env, "early")["chunks_used"] == 1


def test_a_program_that_carries_on_through_the_term_is_killed_after_the_grace(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(PROGRAM, tmp_path / "nanogpt_like.py")
    log_dir = tmp_path / "log"
    # chunk 1 runs 1-7 (a save at 5) and ignores the TERM; chunk 2 resumes at 5, ends at 10
    run_dir = submit(tmp_path, slurm_env, "deaf", _flags("--max-chunks", "2"),
                     [sys.executable, "nanogpt_like.py", "--max_iters=10",
                      "--eval_interval=5", "--block_after=7", "--ignore_term=1"])
    _stop_when_blocked(tmp_path, slurm_env, "deaf", log_dir, 1)
    st = wait(tmp_path, slurm_env, "deaf", lambda s: s["state"] in TERMINAL, timeout=300)
    err = logs(run_dir)
    assert st["state"] == "complete", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"]] == ["stopped", "complete"]
    assert "still running 10s after the TERM: KILL" in err
    assert "exit code 137" in err  # the program died of the KILL
    runs = _runs(log_dir)
    iters = _iters(log_dir)
    assert [iters[r["pid"]] for r in runs] == [list(range(1, 8)), list(range(6, 11))]
