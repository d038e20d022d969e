"""What the login node can check is checked there, on the REAL SLURM cluster (see
conftest.py): the field conditions of issues 18 and 19, each of which used to show only on
the node after the queue wait, or in chunk 1 alone.

- SBATCH_TIMELIMIT=3 with --time 10 gave chunk 1 a 3:00 limit and chunk 2 10:00 (the
  chain's own sbatch drops SBATCH_*): every chunk now runs with the job spec's options.
- A SIF or script that does not exist, a run folder of the same name trained with other
  settings: refused at submit (exit 2), nothing queued.
- A COMPLETE marker an earlier run left in the folder ended a new command chain after its
  first chunk: it is cleared when the new chain is queued (and put back if it is not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import (
    job_flags,
    logs,
    running_chunk,
    settled,
    slurm,
    status,
    submit,
    wait,
    walltime_signal,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# a program that saves its checkpoint (in the run folder) on the stop signal and exits 0
STOPS_ON_USR1 = ["bash", "-c",
                 'trap "date > \\"\\$TRAIN_RUN_DIR/ckpt\\"; exit 0" USR1; '
                 'touch "$TRAIN_SIGNAL_READY"; while :; do sleep 1; done']
CHAIN = ["--entry", "command", "--stop-signal", "USR1", "--time", "10", "--max-chunks", "2"]


def _job(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """`scontrol show job -o`: its KEY=VALUE fields."""
    text = slurm(["scontrol", "show", "job", "-o", job_id], env)
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


def _queued(name: str, env: dict[str, str]) -> str:
    """The user's jobs named `name` that Slurm knows (queued, running or just ended)."""
    return slurm(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"], env).strip()


def _cancel(cwd: Path, env: dict[str, str], name: str) -> None:
    proc = run_cli(["cancel", name], cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    wait(cwd, env, name, settled)


def test_every_chunk_runs_with_the_specs_options_whatever_sbatch_variables_say(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = {**slurm_env, "SBATCH_TIMELIMIT": "3", "SBATCH_JOB_NAME": "other"}
    proc = run_cli(["submit", "--name", "sbv", *job_flags(*CHAIN), "--", *STOPS_ON_USR1],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    # chunk 1 submits chunk 2 as it starts (from inside the job: SBATCH_* reach it too)
    st = wait(tmp_path, slurm_env, "sbv", lambda s: len(s["chunks"]) == 2)
    try:
        for chunk in st["chunks"]:
            fields = _job(chunk["job_id"], slurm_env)
            assert fields["TimeLimit"] == "00:10:00", (chunk, fields["TimeLimit"])
            assert fields["JobName"] == "sbv", (chunk, fields["JobName"])
    finally:
        _cancel(tmp_path, slurm_env, "sbv")
    assert "SBATCH_TIMELIMIT=3 is not passed to sbatch" in proc.stderr, proc.stderr
    assert "give --time instead" in proc.stderr and "SBATCH_JOB_NAME=other" in proc.stderr


def test_an_image_or_script_that_is_not_there_is_refused_before_anything_is_queued(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    for name, flags, workload, said in (
            ("nosif", ["--runtime", "apptainer", "--image", str(tmp_path / "base.sif")],
             ["demo"], "image: --image"),
            ("noscript", ["--entry", "command"], ["python3", "trian.py"], "workload: ")):
        proc = run_cli(["submit", "--name", name, *job_flags(*flags), "--", *workload],
                       cwd=tmp_path, env=slurm_env)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert f"train: error: {said}" in proc.stderr and "--no-check" in proc.stderr
        assert _queued(name, slurm_env) == "", name
        assert not (tmp_path / "runs" / name).exists()


def test_a_run_of_the_same_name_with_other_settings_is_refused_at_submit(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # the field notes' default name reused: an earlier run trained in runs/same at res 8
    first = run_cli(["run", "demo", "--out", str(tmp_path / "runs" / "same"), "--episodes",
                     "2", *tiny_flags()], cwd=tmp_path, env=slurm_env)
    assert first.returncode == 0, first.stderr
    proc = run_cli(["submit", "--name", "same", *job_flags("--time", "3"), "--", "demo",
                    "--episodes", "4", *tiny_flags(res=12)], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "train: error: name: --name same: " in proc.stderr, proc.stderr
    assert "res: the run has 8, now 12" in proc.stderr
    assert _queued("same", slurm_env) == ""
    assert not (tmp_path / "runs" / "same" / "chain.json").exists()
    # its own settings continue it, through the real job's argv (--time-budget, the CSV)
    run_dir = submit(tmp_path, slurm_env, "same", ["--time", "3"],
                     ["demo", "--episodes", "4", *tiny_flags()])
    st = wait(tmp_path, slurm_env, "same", settled)
    assert st["state"] == "complete", (st, logs(run_dir)[-2000:])


def test_a_complete_marker_left_by_an_earlier_run_does_not_end_a_new_chain(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    run_dir = tmp_path / "runs" / "again"
    run_dir.mkdir(parents=True)
    marker = run_dir / "COMPLETE"
    marker.touch()
    # a submission sbatch refuses leaves the folder as it was, marker included (--no-check:
    # not asked first, which refuses it with exit 2 before anything is written)
    proc = run_cli(["submit", "--name", "again", *job_flags(*CHAIN), "--no-check",
                    "--sbatch-extra=--reservation=nosuch", "--", *STOPS_ON_USR1],
                   cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 1 and "reservation" in proc.stderr.lower(), proc.stderr
    assert marker.exists() and sorted(p.name for p in run_dir.iterdir()) == ["COMPLETE"]
    proc = run_cli(["submit", "--name", "again", *job_flags(*CHAIN), "--", *STOPS_ON_USR1],
                   cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    chunk = running_chunk(tmp_path, slurm_env, "again", 1)
    walltime_signal(chunk["job_id"], slurm_env)
    try:  # chunk 1 stops at the walltime signal; chunk 2 goes on
        st = wait(tmp_path, slurm_env, "again", lambda s: settled(s) or (
            len(s["chunks"]) == 2 and "started" in s["chunks"][1]["events"]))
        assert st["chunks"][0]["events"][-1] == "stopped", st
        assert st["state"] == "running", st
    finally:
        _cancel(tmp_path, slurm_env, "again")
    assert status(tmp_path, slurm_env, "again")["state"] == "cancelled"
    assert f"{marker} was left by an earlier run: cleared" in proc.stderr
    assert not list(run_dir.glob(".COMPLETE*"))


def test_no_check_submits_what_the_login_node_cannot_see(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # the escape hatch: a program the nodes have and this login node has not
    proc = run_cli(["submit", "--name", "hatch", "--no-check",
                    *job_flags("--entry", "command", "--time", "3"), "--",
                    str(tmp_path / "only-on-the-nodes.sh")], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, slurm_env, "hatch", settled)
    assert st["state"] == "failed", st  # (here it is on no node either)
