"""A seed sweep on the REAL local SLURM cluster as one job array: a throttle of 2 runs
at most two chunks at a time, over every chunk of every task (a throttled sweep's tasks
requeue themselves, so each chunk is the array's), one task killed with scancel ends
alone, `train status` shows one line for the sweep, and the summary gives the mean and
spread across seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import (
    ENDLESS,
    checkpointed,
    conf_dir,
    fail_node,
    logs,
    node_of,
    restart_node,
    settled,
    slurm,
    status,
    wait,
)
from train.client.slurm.chain import parse_events

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SEEDS = (4, 6, 8, 10)


def _first_chunk(task: dict[str, Any]) -> dict[str, Any] | None:
    chunk = task["chunks"][0] if task["chunks"] else None
    if chunk and chunk["state"] == "RUNNING" and "started" in chunk["events"]:
        return dict(chunk)
    return None


def _walltime_signal(ref: str, env: dict[str, str]) -> None:
    """USR1 to an array task's batch shell (chains.walltime_signal). Slurm 22.05's scancel
    retries while an array task is "in transitional state", and fails when the task has
    meanwhile ended: of this very signal (its checkpointed stop), which its log shows."""
    proc = subprocess.run(["scancel", "-v", "--batch", "--signal=USR1", ref],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 or "already completing or completed" in proc.stderr, \
        proc.stderr


def _runs(run_dir: Path) -> list[tuple[int, int]]:
    """When each run of each chunk of the task started and ended, as its own batch shell
    recorded it (a chunk's job or a requeued array task's every run)."""
    events = parse_events((run_dir / "chain.events").read_text())
    runs, start = [], None
    for e in events:
        if e["event"] == "started":
            start = e["time"]
        elif start is not None and e["event"] not in ("extended", "extend_failed"):
            runs.append((start, e["time"]))
            start = None
    assert start is None, events  # every run recorded its end
    return runs


def _most_at_once(spans: list[tuple[int, int]]) -> int:
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


def test_a_throttled_sweep_runs_at_most_its_throttle_of_chunks_at_once(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Every task runs two chunks, each ended by Slurm's own walltime signal (sized as
    test_slurm's requeue-mode test): no signal from outside, and the bound on chunks, not
    the work, ends each task."""
    proc = run_cli(["submit", "--name", "sw", "--cluster", "local", "--python",
                    sys.executable, "--cpus-per-task", "1", "--mem", "1000M", "--time", "2",
                    "--signal-margin", "60", "--max-chunks", "2", "--sweep-seeds",
                    " ".join(map(str, SEEDS)), "--sweep-throttle", "2", "--", *ENDLESS],
                   cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    assert "--array=0-3%2" in proc.stdout
    root = tmp_path / "runs" / "sw"
    array_id = json.loads((root / "sweep.json").read_text())["array_job"]
    st = wait(tmp_path, slurm_env, "sw", lambda s: all(settled(c) for c in s["chains"]),
              timeout=900)
    # the throttle bounds every chunk of every task: never more than 2 ran at once
    spans = [run for s in SEEDS for run in _runs(root / f"seed-{s}")]
    assert len(spans) == 8 and _most_at_once(spans) == 2, spans
    assert st["counts"] == {"incomplete": 4}, st
    for seed, task in zip(SEEDS, st["chains"], strict=True):
        run_dir = root / f"seed-{seed}"
        events = [e["event"] for e in parse_events((run_dir / "chain.events").read_text())]
        assert events == ["started", "requeued", "started", "incomplete"], events
        # every chunk ran as the task itself, requeued: one job id, its own, throughout
        (job,) = [c["job_id"] for c in task["chunks"]]
        assert "_" not in job and (run_dir / "chain.ids").read_text() == f"1 {job}\n"
        assert task["chunks_used"] == 2 and "resumed at episode" in logs(run_dir)
    text = run_cli(["status", "sw"], cwd=tmp_path, env=slurm_env).stdout.splitlines()
    assert text[0].startswith("sweep sw: 4 tasks  incomplete 4  (array job "
                              f"{array_id}, at most 2 at once; 8 chunks run"), text


def test_a_seed_sweep_is_one_array_whose_tasks_chain_on_their_own(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    proc = run_cli(["submit", "--name", "sw", "--cluster", "local", "--python",
                    sys.executable, "--cpus-per-task", "1", "--mem", "1000M", "--time", "10",
                    "--max-chunks", "3", "--sweep-seeds", " ".join(map(str, SEEDS)),
                    "--", "demo", "--episodes", "120",
                    *tiny_flags()], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("submitted sweep sw: job array ")
    assert "--array=0-3;" in proc.stdout and "chaining on its own" in proc.stdout
    root = tmp_path / "runs" / "sw"
    array_id = json.loads((root / "sweep.json").read_text())["array_job"]
    # Tasks 0-2 are stopped at the walltime signal once they have checkpointed (their
    # successors finish the work); task 3 is killed with scancel. Counted, never timed.
    acted: dict[int, str] = {}

    def act(st: dict[str, Any]) -> bool:
        for i, task in enumerate(st["chains"]):
            chunk = _first_chunk(task)
            if i in acted or chunk is None or checkpointed(root / f"seed-{SEEDS[i]}",
                                                           SEEDS[i]) < 2:
                continue
            acted[i] = chunk["job_id"]
            ref = f"{array_id}_{i}"  # (Slurm 22.05's scancel refuses the task's own id)
            if i == 3:
                slurm(["scancel", ref], slurm_env)
            else:
                _walltime_signal(ref, slurm_env)
        return len(acted) == len(SEEDS)

    wait(tmp_path, slurm_env, "sw", act, timeout=900, poll=0.3)
    st = wait(tmp_path, slurm_env, "sw", lambda s: all(
        c["state"] in ("complete", "cancelled", "failed", "ended", "stalled")
        for c in s["chains"]), timeout=900)
    states = [c["state"] for c in st["chains"]]
    assert states == ["complete", "complete", "complete", "cancelled"], st
    assert st["counts"] == {"complete": 3, "cancelled": 1}
    for task in st["chains"][:3]:  # each extended itself by its own single jobs
        assert task["chunks_used"] >= 2 and task["done"] == task["total"] == 120, task
        assert "_" not in task["chunks"][1]["job_id"]
    assert st["chains"][3]["chunks_used"] == 1
    assert all(c["state"] == "CANCELLED" for c in st["chains"][3]["chunks"])
    # chunk 1 ran as the array's tasks: its own job id, recorded when it started
    assert all(c["chunks"][0]["job_id"] == acted[i] for i, c in enumerate(st["chains"]))
    text = run_cli(["status", "sw"], cwd=tmp_path, env=slurm_env).stdout.splitlines()
    assert text[0].startswith("sweep sw: 4 tasks  complete 3, cancelled 1  (array job "
                              f"{array_id}; "), text
    assert sum(1 for line in text if line.startswith("sweep ")) == 1
    text = run_cli(["status", "sw", "--tasks"], cwd=tmp_path, env=slurm_env).stdout
    assert text.count("\n  task ") == 4 and "task 3 (seed 10): cancelled" in text
    proc = run_cli(["summary", "sw"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.splitlines()
    assert [line.split()[::3] for line in table[2:6]] == [
        ["4", "complete"], ["6", "complete"], ["8", "complete"], ["10", "cancelled"]]
    assert "final evaluation over 3 of 4 seed(s): " in table[6] and "+-" in table[6]
    assert (root / "summary.csv").exists()


def test_train_cancel_ends_every_task_running_or_waiting_for_the_throttle(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    proc = run_cli(["submit", "--name", "sc", "--cluster", "local", "--python",
                    sys.executable, "--cpus-per-task", "1", "--mem", "1000M", "--time", "10",
                    "--max-chunks", "3", "--sweep", "lr=1e-3,5e-4,2e-4",
                    "--sweep-throttle", "1", "--", "demo", "--episodes", "100000",
                    *tiny_flags()], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    assert "requeued after each checkpointed stop" in proc.stdout
    # task 0 runs (requeue mode: no successor); tasks 1 and 2 wait for the throttle
    wait(tmp_path, slurm_env, "sc", lambda s: _first_chunk(s["chains"][0]) is not None)
    proc = run_cli(["cancel", "sc"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, slurm_env, "sc", lambda s: all(
        c["state"] == "cancelled" and all(x["state"] not in ("PENDING", "RUNNING")
                                          for x in c["chunks"]) for c in s["chains"]))
    assert [len(c["chunks"]) for c in st["chains"]] == [1, 1, 1]
    # nothing of the sweep stays queued: a cancelled task still ending its step (squeue's
    # CG, on a busy machine for a while) is let go; one pending or running again is not
    for _ in range(300):
        queued = slurm(["squeue", "-h", "--array", "-o", "%i %j %T"], slurm_env)
        if " sc " not in queued:
            break
        assert all(line.split()[-1] == "COMPLETING" for line in queued.splitlines()
                   if " sc " in line), queued
        time.sleep(1)
    assert " sc " not in queued, queued


def _sweep(cwd: Path, env: dict[str, str], name: str, *flags: str) -> tuple[Path, str]:
    """Two seeds of endless work, each task on a node of its own (its memory takes most
    of one): the sweep's root and its array job id."""
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--python",
                    sys.executable, "--cpus-per-task", "1", "--mem", "5000M", "--time", "10",
                    "--max-chunks", "3", "--sweep-seeds", "4 6", *flags, "--", *ENDLESS],
                   cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    root = cwd / "runs" / name
    return root, str(json.loads((root / "sweep.json").read_text())["array_job"])


def _both_checkpointed(root: Path) -> Callable[[dict[str, Any]], bool]:
    return lambda st: all(_first_chunk(c) for c in st["chains"]) and all(
        checkpointed(root / f"seed-{s}", s) >= 2 for s in (4, 6))


def test_a_requeued_task_resumes_and_the_other_runs_on(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    root, array_id = _sweep(tmp_path, slurm_env, "rq", "--requeue")
    st = wait(tmp_path, slurm_env, "rq", _both_checkpointed(root), timeout=300, poll=0.3)
    other = st["chains"][1]["chunks"][0]["job_id"]
    slurm(["scontrol", "requeue", f"{array_id}_0"], slurm_env)
    wait(tmp_path, slurm_env, "rq", lambda s: "resumed at episode" in logs(root / "seed-4"),
         timeout=300, poll=0.3)
    st = status(tmp_path, slurm_env, "rq")
    assert [c["state"] for c in st["chains"]] == ["running", "running"], st
    assert "resumed at episode" not in logs(root / "seed-6")  # the other task ran on
    assert st["chains"][1]["chunks"][0] == {**st["chains"][1]["chunks"][0],
                                            "job_id": other, "state": "RUNNING"}
    # scancel of one requeue-mode task ends that task alone
    slurm(["scancel", f"{array_id}_0"], slurm_env)
    st = wait(tmp_path, slurm_env, "rq", lambda s: settled(s["chains"][0]))
    assert st["chains"][0]["state"] == "cancelled", st["chains"][0]
    assert [c["state"] for c in st["chains"][0]["chunks"]] == ["CANCELLED"]
    assert st["chains"][1]["state"] == "running" and [
        (c["job_id"], c["state"]) for c in st["chains"][1]["chunks"]] == [(other, "RUNNING")]
    assert run_cli(["cancel", "rq"], cwd=tmp_path, env=slurm_env).returncode == 0
    st = wait(tmp_path, slurm_env, "rq", lambda s: all(settled(c) for c in s["chains"]))
    assert st["counts"] == {"cancelled": 2}
    assert slurm(["squeue", "-h", "--array", "-o", "%i %j"], slurm_env).strip() == ""


def test_a_node_failure_ends_its_task_alone(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    root, _array_id = _sweep(tmp_path, slurm_env, "nf")
    st = wait(tmp_path, slurm_env, "nf", _both_checkpointed(root), timeout=300, poll=0.3)
    job = st["chains"][0]["chunks"][0]["job_id"]
    node = node_of(job, slurm_env)
    assert node != node_of(st["chains"][1]["chunks"][0]["job_id"], slurm_env)
    fail_node(conf_dir(slurm_env), node, job)
    try:
        st = wait(tmp_path, slurm_env, "nf", lambda s: settled(s["chains"][0]), timeout=180)
    finally:
        restart_node(conf_dir(slurm_env), node, slurm_env)
    assert st["chains"][0]["state"] == "failed" and "NODE_FAIL" in st["chains"][0]["cause"]
    assert st["chains"][1]["state"] == "running", st["chains"][1]
    assert run_cli(["cancel", "nf"], cwd=tmp_path, env=slurm_env).returncode == 0


def test_a_commands_sweep_tells_each_task_its_value(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    program = 'echo "$TRAIN_SWEEP_INDEX $TRAIN_SWEEP_VALUE" > "$TRAIN_RUN_DIR/value"'
    proc = run_cli(["submit", "--name", "cmd", "--cluster", "local", "-e", "command",
                    "--python", sys.executable, "--cpus-per-task", "1", "--mem", "500M", "--time",
                    "5", "--max-chunks", "1", "--sweep", "alpha=0.1,0.3", "--",
                    "bash", "-c", program], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, slurm_env, "cmd", lambda s: all(settled(c) for c in s["chains"]))
    assert st["counts"] == {"complete": 2}, st
    root = tmp_path / "runs" / "cmd"
    assert [(root / f"task-{i}" / "value").read_text() for i in (0, 1)] == [
        "0 0.1\n", "1 0.3\n"]
    text = run_cli(["status", "cmd", "--tasks"], cwd=tmp_path, env=slurm_env).stdout
    assert "task 1 (alpha=0.3): complete" in text, text
