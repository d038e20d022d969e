"""`train submit/status/logs/cancel` against a REAL SLURM cluster (see conftest.py): chains
that extend themselves until the work is done, every way a chunk can die, requeue mode,
hostile arguments and bad input. The cluster, like the sites, does not cancel jobs whose
dependency can never be met. Accounting storage is disabled, as on many test set-ups:
status falls back to squeue and the job completion log."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import (
    ENDLESS,
    checkpointed,
    death_kill_step,
    death_node_failure,
    death_requeue,
    death_scancel,
    death_timeout,
    job_flags,
    logs,
    running_chunk,
    settled,
    submit,
    wait,
    walltime_signal,
)
from train.client.slurm import chaincost
from train.workloads.runtime.checkpoint import CheckpointManager

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _doctor(cwd: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    """`train doctor NAME --json` on the real chain: exit 1 (a problem) and its report."""
    proc = run_cli(["doctor", name, "--json"], cwd=cwd, env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def _events(run_dir: Path) -> list[str]:
    return [line.split()[3] for line in (run_dir / "chain.events").read_text().splitlines()]


def test_a_chain_extends_itself_until_the_work_is_done_and_equals_one_run(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # chunks 1 and 2 end at the walltime signal once 25 more episodes are checkpointed;
    # chunk 3 finishes the work. Nothing depends on the machine's speed.
    flags = tiny_flags(checkpoint_every=25)
    run_dir = submit(tmp_path, slurm_env, "chain", ["--time", "10", "--max-chunks", "5"],
                     ["demo", "--episodes", "600", *flags])
    done = 0
    for chunk in (1, 2):
        job = running_chunk(tmp_path, slurm_env, "chain", chunk, min_episode=done + 25)
        walltime_signal(job["job_id"], slurm_env)
        st = wait(tmp_path, slurm_env, "chain",
                  lambda s, c=chunk: any(x["chunk"] == c and "stopped" in x["events"]
                                         for x in s["chunks"]))
        done = checkpointed(run_dir)
        assert st["done"] == done and st["total"] == 600, st
    st = wait(tmp_path, slurm_env, "chain", settled, timeout=400)
    assert st["state"] == "complete", st
    assert st["chunks_used"] == 3 and st["done"] == st["total"] == 600
    assert [c["state"] for c in st["chunks"]] == ["COMPLETED"] * 3 + ["CANCELLED"]
    assert "walltime signal: asking the step to checkpoint" in logs(run_dir)
    assert logs(run_dir).count("resumed at episode") == 2

    straight = tmp_path / "straight"
    proc = run_cli(["run", "demo", "--episodes", "600", "--out", str(straight), *flags],
                   env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    a = json.loads((run_dir / "seed_4" / "episodes.json").read_text())
    b = json.loads((straight / "seed_4" / "episodes.json").read_text())
    assert a["rewards"] == b["rewards"] and len(a["rewards"]) == 600
    ea = json.loads((run_dir / "eval" / "test_results.json").read_text())["4"]
    eb = json.loads((straight / "eval" / "test_results.json").read_text())["4"]
    assert ea["episode_rewards"] == eb["episode_rewards"]
    pa = CheckpointManager(run_dir / "seed_4" / "checkpoints").load_latest()
    pb = CheckpointManager(straight / "seed_4" / "checkpoints").load_latest()
    assert pa is not None and pb is not None
    for key, tensor in pa["agent"]["policy"].items():
        assert torch.equal(tensor, pb["agent"]["policy"][key]), key
    # the CSV row sits beside the run directory, one per finished seed
    rows = (tmp_path / "runs" / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].split(",")[3] == "4"


def test_a_finished_chains_status_shows_each_chunks_wait_and_run_time(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # chunk 1 stops at the walltime signal once 25 episodes are saved; chunk 2 finishes
    from datetime import datetime

    run_dir = submit(tmp_path, slurm_env, "spent", ["--time", "10", "--max-chunks", "3"],
                     ["demo", "--episodes", "100", *tiny_flags(checkpoint_every=25)])
    job = running_chunk(tmp_path, slurm_env, "spent", 1, min_episode=25)
    walltime_signal(job["job_id"], slurm_env)
    st = wait(tmp_path, slurm_env, "spent", settled, timeout=300)
    assert st["state"] == "complete" and st["chunks_used"] == 2, st
    lines = [line.split() for line in (run_dir / "chain.events").read_text().splitlines()]
    times = {(w[2], w[3]): int(w[0]) for w in lines}  # (job, event): its (last) time
    last = {w[2]: int(w[0]) for w in lines if w[3] != "cancelled"}
    one, two = (c["job_id"] for c in st["chunks"][:2])
    submitted = datetime.strptime(json.loads((run_dir / "chain.json").read_text())[
        "submitted"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    ready = max(times[(one, "extended")], last[one])  # chunk 2 could start once 1 ended
    assert [(c["waited_seconds"], c["ran_seconds"]) for c in st["chunks"][:2]] == [
        (times[(one, "started")] - submitted, last[one] - times[(one, "started")]),
        (max(0, times[(two, "started")] - ready), last[two] - times[(two, "started")])]
    limits = {w[2]: int(w[4]) for w in lines if w[3] == "limit"}  # (a chain with a floor)
    assert [(c["limit_seconds"], c["requested_seconds"]) for c in st["chunks"][:2]] == [
        (limits.get(job_id, 600), 600) for job_id in (one, two)]
    assert st["time"]["ran_seconds"] == sum(c["ran_seconds"] for c in st["chunks"][:2]) > 0
    assert (st["time"]["gpus"], st["time"]["gpu_hours"], st["time"]["live"]) == (0, 0.0, False)
    proc = run_cli(["status", "spent", "--chunks"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    rows = [line.strip() for line in proc.stdout.splitlines() if "time: " in line]
    assert rows[0].startswith("time: waited ") and rows[0].endswith("; no GPUs"), rows
    assert [r.split(",")[0] for r in rows[1:3]] == [
        f"time: waited {chaincost.duration(c['waited_seconds'])}" for c in st["chunks"][:2]]
    assert rows[3:] == ["time: it did not run"] * (len(st["chunks"]) - 2)
    assert "written: " in proc.stdout and (run_dir / chaincost.PICTURE).is_file()


def test_the_time_budget_ends_each_chunk_until_the_bound(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # 2-minute chunks with a 60 s margin: the trainer's 60 s budget and the USR1 land
    # together; work that cannot finish runs into --max-chunks 2. Each chunk must add work
    # before its stop, or the chain is stalled (the contract): Slurm sends the walltime
    # signal early (seen: up to 30 s, its time-limit pass; its manual allows 60), so the
    # stop comes 30 s after the start or later, twice what start-up and resume took with a
    # load of 12 on 2 cores (a 1-minute chunk with a 45 s margin left 15 s, or none)
    run_dir = submit(tmp_path, slurm_env, "budget",
                     ["--time", "2", "--signal-margin", "60", "--max-chunks", "2"], ENDLESS)
    st = wait(tmp_path, slurm_env, "budget", settled, timeout=300)
    assert st["state"] == "incomplete", st
    assert "--max-chunks" in st["cause"]
    assert [c["state"] for c in st["chunks"]] == ["COMPLETED", "COMPLETED"]
    assert _events(run_dir).count("stopped") == 1
    assert st["done"] == checkpointed(run_dir) > 0
    assert "resumed at episode" in logs(run_dir)
    proc = run_cli(["status", "budget"], cwd=tmp_path, env=slurm_env)
    assert "budget (local): incomplete" in proc.stdout
    assert "progress: " in proc.stdout and "2 of at most 2 chunk(s) used" in proc.stdout


def test_walltime_timeout_of_a_step_that_ignores_the_signal(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    st = death_timeout(tmp_path, slurm_env, "tmo").status
    assert st["state"] == "failed", st
    assert "reached its walltime" in st["cause"] and "--signal-margin" in st["cause"]
    assert [c["state"] for c in st["chunks"]] == ["TIMEOUT", "CANCELLED"]
    assert "timeout" in st["chunks"][0]["events"]
    first = _doctor(tmp_path, slurm_env, "tmo")["findings"][0]
    assert (first["cause"], first["chunk"]) == ("walltime", 1)
    assert "--signal-margin" in first["fix"]
    # slurmstepd's own banner in the job's error log is the evidence
    assert any("DUE TO TIME LIMIT" in e["text"] for e in first["evidence"]), first


def test_scancel_of_the_running_chunk_checkpoints_and_ends_the_chain(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    st = death_scancel(tmp_path, slurm_env, "scx").status
    run_dir = tmp_path / "runs" / "scx"
    assert st["state"] == "cancelled", st
    assert "cancelled (scancel)" in st["cause"]
    assert [c["state"] for c in st["chunks"]] == ["CANCELLED", "CANCELLED"]
    assert "terminated" in st["chunks"][0]["events"]
    assert "received SIGTERM" in logs(run_dir)  # the trainer checkpointed on the TERM
    # scancel, not `train cancel`: the doctor says so (a site's policy may have done it)
    report = _doctor(tmp_path, slurm_env, "scx")
    assert [f["cause"] for f in report["findings"]] == ["cancelled"], report


def test_a_killed_step_fails_the_chain(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    st = death_kill_step(tmp_path, slurm_env, "kst").status
    assert st["state"] == "failed", st
    assert "exited with code 137" in st["cause"]
    assert [c["state"] for c in st["chunks"]] == ["FAILED", "CANCELLED"]
    first = _doctor(tmp_path, slurm_env, "kst")["findings"][0]
    assert first["cause"] == "sigkill" and "137" in first["detail"], first


def test_a_node_failure_ends_the_chain_with_its_cause(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    st = death_node_failure(tmp_path, slurm_env, "nf").status
    assert st["state"] == "failed", st
    assert "NODE_FAIL" in st["cause"] and "node failure" in st["cause"]
    # nobody was left to cancel the waiting chunk: Slurm removed it (--kill-on-invalid-dep)
    assert [c["state"] for c in st["chunks"]] == ["NODE_FAIL", "CANCELLED"]
    assert st["chunks"][0]["events"] == ["started", "extended"]
    first = _doctor(tmp_path, slurm_env, "nf")["findings"][0]
    exit_code = st["chunks"][0]["exit"]
    assert (first["cause"], first["detail"]) == (
        "node_failure", "Slurm state NODE_FAIL" + (f", exit {exit_code}" if exit_code else ""))


def test_a_requeued_chunk_resumes_and_the_chain_goes_on(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    st = death_requeue(tmp_path, slurm_env, "rqx").status
    run_dir = tmp_path / "runs" / "rqx"
    assert st["state"] == "cancelled", st
    events = _events(run_dir)
    assert events[:3] == ["started", "terminated", "started"], events
    assert "(restart 1)" in logs(run_dir)
    assert len(st["chunks"]) == 1  # requeue mode: one job, run again


def test_requeue_mode_requeues_after_each_checkpointed_stop_up_to_the_bound(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    run_dir = submit(tmp_path, slurm_env, "rq",
                     # (sized as in test_the_time_budget_ends_each_chunk_until_the_bound)
                     ["--requeue", "--time", "2", "--signal-margin", "60", "--max-chunks",
                      "2"], ENDLESS)
    st = wait(tmp_path, slurm_env, "rq", settled, timeout=400)
    assert st["state"] == "incomplete", st
    assert _events(run_dir) == ["started", "requeued", "started", "incomplete"]
    err = logs(run_dir)
    assert "requeueing job" in err and "(restart 1)" in err
    assert "resumed at episode" in err


def test_a_failing_chunk_marks_the_chain_failed_and_leaves_nothing_pending(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # valid at submission, fails on the node: the results CSV cannot be written there
    submit(tmp_path, slurm_env, "fail", ["--time", "2", "--max-chunks", "3"],
           ["demo", "--results-csv", "/proc/nowhere/results.csv", *tiny_flags()])
    st = wait(tmp_path, slurm_env, "fail", settled)
    assert st["state"] == "failed", st
    assert [c["state"] for c in st["chunks"]] == ["FAILED", "CANCELLED"]
    proc = run_cli(["logs", "fail", "--err"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0 and "results_csv: cannot write" in proc.stdout
    assert "training step failed with exit code 2" in proc.stdout
    first = _doctor(tmp_path, slurm_env, "fail")["findings"][0]
    assert first["cause"] == "train_error", first
    assert "results_csv: cannot write" in first["evidence"][0]["text"]
    assert first["evidence"][0]["file"].endswith(".err") and first["evidence"][0]["line"] > 0


def test_finishing_early_cancels_the_waiting_chunk(tmp_path: Path,
                                                   slurm_env: dict[str, str]) -> None:
    run_dir = submit(tmp_path, slurm_env, "early", ["--time", "3", "--max-chunks", "3"],
                     ["demo", "--episodes", "4", *tiny_flags()])
    st = wait(tmp_path, slurm_env, "early", settled)
    assert st["state"] == "complete", st
    assert [c["state"] for c in st["chunks"]] == ["COMPLETED", "CANCELLED"]
    assert (run_dir / "COMPLETE").exists()
    proc = run_cli(["status", "early"], cwd=tmp_path, env=slurm_env)
    assert "early (local): complete" in proc.stdout
    proc = run_cli(["logs", st["chunks"][0]["job_id"]], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0 and "run complete" in proc.stdout + logs(run_dir)


def test_bad_input_submits_nothing_and_keeps_the_earlier_record(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    run_dir = submit(tmp_path, slurm_env, "busy", ["--time", "10", "--max-chunks", "2"],
                     ENDLESS)
    running_chunk(tmp_path, slurm_env, "busy", 1)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name.startswith("chain")}
    cases = [
        (["--name", "busy"], "already has an active chain"),
        (["--name", "other", "--max-chunks", "0"], "max_chunks: must be greater than 0"),
        (["--name", "other", "--max-chunks", "-2"], "max_chunks: must be greater than 0"),
        (["--name", "other", "--runtime", "docker", "--image", "x:1"],
         "results_csv:"),
    ]
    for flags, message in cases:
        workload = ["demo"] if "docker" not in flags else \
            ["demo", "--results-csv", "/var/tmp/elsewhere.csv"]
        proc = run_cli(["submit", *flags, "--cluster", "local", "--python", sys.executable,
                        "--", *workload], cwd=tmp_path, env=slurm_env)
        assert proc.returncode == 2, (flags, proc.stderr)
        assert message in proc.stderr, (flags, proc.stderr)
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name.startswith("chain")}
    assert after == before
    assert not (tmp_path / "runs" / "other").exists()
    proc = run_cli(["cancel", "busy"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, slurm_env, "busy", settled)
    assert st["state"] == "cancelled"


def test_shell_metacharacters_reach_the_trainer_verbatim(tmp_path: Path,
                                                         slurm_env: dict[str, str]) -> None:
    hostile = (f"{tmp_path}/r $(touch {tmp_path}/pwned1); `touch {tmp_path}/pwned2`; "
               f"'q' \"d\" \\ $HOME\nline2.csv")
    run_dir = submit(tmp_path, slurm_env, "meta", ["--time", "3"],
                     ["demo", "--episodes", "2", "--results-csv", hostile, *tiny_flags()])
    st = wait(tmp_path, slurm_env, "meta", settled)
    assert st["state"] == "complete", st
    assert Path(hostile).is_file()
    assert not (tmp_path / "pwned1").exists() and not (tmp_path / "pwned2").exists()
    argv = json.loads((run_dir / "config.json").read_text())["argv"]
    assert argv[argv.index("--results-csv") + 1] == hostile


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_submission_killed_midway_leaves_nothing_queued(
        tmp_path: Path, slurm_env: dict[str, str], sig: signal.Signals) -> None:
    # the release comes late (a slow controller); the user's terminal closes before it
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("scontrol")
    (shim / "scontrol").write_text(f'#!/bin/bash\nsleep 30\nexec {real} "$@"\n')
    (shim / "scontrol").chmod(0o755)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **slurm_env,
           "PATH": f"{shim}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "train", "submit", "--name", "cut",
                             *job_flags("--time", "5"), "--", "demo"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    run_dir = tmp_path / "runs" / "cut"
    for _ in range(600):  # until chunk 1 is submitted, held
        if (run_dir / "chain.ids").exists():
            break
        time.sleep(0.05)
    job_id = (run_dir / "chain.ids").read_text().split()[1]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not (run_dir / "chain.json").exists() and not (run_dir / "chain.ids").exists()
    queue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                           text=True, env=env, check=False).stdout.strip()
    assert queue in ("", "CANCELLED"), queue


def test_a_submission_killed_before_sbatch_answers_leaves_nothing_queued(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # a busy controller: it has queued chunk 1 (held) but its answer has not reached
    # sbatch when the user's terminal closes. The stand-in runs the real sbatch, keeps its
    # answer (the id the test looks for) and then waits, as sbatch does for a late reply.
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("sbatch", path=slurm_env.get("PATH", os.environ["PATH"]))
    assert real is not None
    (shim / "sbatch").write_text(
        f'#!/bin/bash\ncase " $* " in *" --hold "*)\n'
        f'    {real} "$@" > {tmp_path}/reply.tmp && mv {tmp_path}/reply.tmp {tmp_path}/reply\n'
        f'    exec sleep 300 ;;\nesac\nexec {real} "$@"\n')
    (shim / "sbatch").chmod(0o755)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **slurm_env,
           "PATH": f"{shim}:{slurm_env.get('PATH', os.environ['PATH'])}"}
    proc = subprocess.Popen([sys.executable, "-m", "train", "submit", "--name", "slow",
                             *job_flags("--time", "5"), "--", "demo"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    reply = tmp_path / "reply"
    for _ in range(1200):  # until the controller has queued chunk 1, held
        if reply.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert reply.exists(), proc.communicate()
    job_id = reply.read_text().strip().split(";")[0]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"Slurm had queued the job ({job_id}): cancelling it" in err, err
    queue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                           text=True, env=env, check=False).stdout.strip()
    assert queue in ("", "CANCELLED"), queue
    assert not (tmp_path / "runs" / "slow" / "chain.json").exists()
