"""The apptainer tier: a real Apptainer 1.4 and Slurm 26.05 (Debian sid, ci/sid-apptainer.sh),
everything run as an ordinary user, as on the sites. Jobs run `apptainer exec` on both
nodes of the local cluster; the images are real SIFs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.chains import TERMINAL, assert_complete, slurm, walltime_signal
from tests.integration.chains import logs as _logs
from tests.integration.conftest import SiteUser
from train.client.slurm.queue import parse_sacct, parse_squeue_json

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.slow]

PLAIN = REPO / "tests" / "integration" / "plain_steps.py"


def test_a_two_node_chain_in_a_plain_python_image_stops_and_resumes(
        site_user: SiteUser, plain_sif: Path) -> None:
    """An ordinary user's 2-node chain in an image with neither torch nor train: the
    walltime signal reaches the program inside the container, the chain resumes to
    completion, and the log says which Python and site-packages ran."""
    work = site_user.folder("plainchain")
    shutil.copy(PLAIN, work / "plain_steps.py")
    name = "plain"
    proc = site_user.cli(
        ["submit", "--name", name, "--cluster", "local", "--entry", "command",
         "--nodes", "2", "--cpus-per-task", "1", "--mem", "1000M", "--time", "5",
         "--runtime", "apptainer", "--image", str(plain_sif), "--launch", "tasks",
         "--stop-signal", "USR1", "--max-chunks", "3", "--env", "USER_HOLD_AT",
         "--", "python3", str(work / "plain_steps.py")],
        cwd=work, env={"USER_HOLD_AT": "7"})
    assert proc.returncode == 0, proc.stderr
    run_dir = work / "runs" / name
    # both ranks hold at step 7 with their handlers set (one rank's readiness is not the
    # other's: a signal passed on while a node still unpacks the SIF meets Apptainer's
    # starter, not the program)
    held = [run_dir / "user_held-0", run_dir / "user_held-1"]
    st = site_user.wait(work, name, lambda s: all(p.exists() for p in held)
               or s["state"] in TERMINAL)
    assert all(p.exists() for p in held), (st, _logs(run_dir, "err")[-4000:])
    walltime_signal(st["chunks"][0]["job_id"], site_user.env)
    st = site_user.wait(work, name, lambda s: s["state"] in TERMINAL)
    out = _logs(run_dir, "out")
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert "plain rank 0 stopped by signal at step 7" in out, out
    assert "plain rank 1 resumed at step 7" in out and out.count("done at step 20") == 2
    # the image's own Python and nothing of the login node's
    assert out.count("python /usr/bin/python3 3.11") == 4, out
    assert out.count("can import train: False torch: False") == 4, out


def test_the_walltime_signal_waits_for_a_rank_that_starts_late(
        site_user: SiteUser, plain_sif: Path) -> None:
    """Rank 0 is ready and holds; rank 1 has not set its handler yet (as when its node is
    still unpacking the SIF): the signal is held for rank 1's own readiness, never passed
    on on rank 0's alone, and then stops both ranks."""
    work = site_user.folder("latechain")
    shutil.copy(PLAIN, work / "plain_steps.py")
    name = "late"
    proc = site_user.cli(
        ["submit", "--name", name, "--cluster", "local", "--entry", "command",
         "--nodes", "2", "--cpus-per-task", "1", "--mem", "1000M", "--time", "5",
         "--runtime", "apptainer", "--image", str(plain_sif), "--launch", "tasks",
         "--stop-signal", "USR1", "--max-chunks", "3", "--env", "USER_HOLD_AT",
         "--env", "USER_LATE_RANK", "--", "python3", str(work / "plain_steps.py")],
        cwd=work, env={"USER_HOLD_AT": "7", "USER_LATE_RANK": "1"})
    assert proc.returncode == 0, proc.stderr
    run_dir = work / "runs" / name
    st = site_user.wait(work, name, lambda s: ((run_dir / "user_held-0").exists()
               and (run_dir / "user_late-1").exists()) or s["state"] in TERMINAL)
    assert (run_dir / "user_late-1").exists(), (st, _logs(run_dir, "err")[-4000:])
    walltime_signal(st["chunks"][0]["job_id"], site_user.env)
    site_user.wait(work, name, lambda s: "when the program is ready" in
          _logs(run_dir, "err") or s["state"] in TERMINAL)
    assert "1 of 2 rank(s) ready now" in _logs(run_dir, "err")
    (run_dir / "user_go").write_text("go")  # rank 1 starts: its handler, its readiness
    st = site_user.wait(work, name, lambda s: s["state"] in TERMINAL)
    out = _logs(run_dir, "out")
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert "plain rank 0 stopped by signal at step 7" in out, out
    assert "plain rank 1 stopped by signal" in out, out
    assert out.count("done at step 20") == 2, out


def test_a_gpu_chain_submitted_from_inside_a_gpu_job_chains_on_slurm_26_05(
        site_user: SiteUser, plain_sif: Path) -> None:
    """Slurm 26.05 refuses --gres=gpu beside --gpus-per-node, also when one comes from the
    environment: a chunk submitted from a shell inside a GPU allocation (its SLURM_GPUS_*
    variables), and every successor submitted from inside its GPU chunk, asks for the
    job's own GRES alone and runs."""
    work = site_user.folder("gpuchain")
    shutil.copy(PLAIN, work / "plain_steps.py")
    name = "gpu"
    inside = {"SLURM_GPUS_PER_NODE": "2", "SLURM_GPUS": "2", "SLURM_GPUS_PER_TASK": "1",
              "SLURM_JOB_ID": "99999"}
    proc = site_user.cli(
        ["submit", "--name", name, "--cluster", "local", "--entry", "command",
         "--nodes", "1", "--gpus-per-node", "1", "--cpus-per-task", "1", "--mem", "1000M",
         "--time", "5", "--runtime", "apptainer", "--image", str(plain_sif),
         "--launch", "tasks", "--stop-signal", "USR1", "--max-chunks", "3",
         "--env", "USER_HOLD_AT", "--", "python3", str(work / "plain_steps.py")],
        cwd=work, env={"USER_HOLD_AT": "7", **inside})
    assert proc.returncode == 0, proc.stderr
    run_dir = work / "runs" / name
    assert "--gres=gpu:1" in (run_dir / "jobs" / "chain.sbatch").read_text()
    st = site_user.wait(work, name, lambda s: (run_dir / "user_held-0").exists()
               or s["state"] in TERMINAL)
    assert (run_dir / "user_held-0").exists(), (st, _logs(run_dir, "err")[-4000:])
    first = st["chunks"][0]["job_id"]
    # our parsers on what 26.05 really prints (squeue --json's data format v0.0.45)
    running = parse_squeue_json(slurm(["squeue", "--json", "--jobs", first],
                                      site_user.env))
    assert running[first]["state"] == "RUNNING", running
    walltime_signal(first, site_user.env)
    st = site_user.wait(work, name, lambda s: s["state"] in TERMINAL)
    out = _logs(run_dir, "out")
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert out.count("plain rank 0 gpus 1") == 2, out  # each chunk had its GPU
    ids = [c["job_id"] for c in st["chunks"] if c["events"]]
    # (the local cluster keeps no accounting: its job completion log, as job_states asks)
    done = parse_sacct(slurm(["sacct", "-c", "-P", "-n", "-o", "JobIDRaw,State,ExitCode", "-j",
                              ",".join(ids)], site_user.env))
    assert {i: done[i] for i in ids} == {i: {"state": "COMPLETED", "exit": "0:0"}
                                         for i in ids}, done
    assert "extend_failed" not in json.dumps(st)
