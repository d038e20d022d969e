"""Programs that are not ours on the REAL 2-node SLURM cluster: a plain DDP script (no
`train` import) under torch's launcher and as one rank per task, on the host and inside
the CI image, and the walltime contract (stop signal, checkpoint, the next chunk resumes,
the chain completes)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.chains import TERMINAL, assert_complete, walltime_signal
from tests.integration.chains import logs as _logs
from tests.integration.chains import wait as _wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("user_ddp.py")


def _submit(tmp_path: Path, env: dict[str, str], name: str, flags: list[str],
            python: str = sys.executable) -> Path:
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)  # the script lives where every runtime sees it
    script = run_dir / "user_ddp.py"
    shutil.copy(SCRIPT, script)
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--entry", "command",
                    "--nodes", "2", "--cpus-per-task", "2", "--mem", "2000M", "--time", "5",
                    *flags, "--", python, str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    return run_dir


def _python(request: pytest.FixtureRequest, runtime: str, env: dict[str, str]
            ) -> tuple[list[str], str]:
    if runtime == "docker":
        env.update(request.getfixturevalue("docker_engine"))
        return ["--runtime", "docker", "--image", request.getfixturevalue("ci_image")], \
            "python3"
    return ["--python", sys.executable], sys.executable


@pytest.mark.parametrize("runtime", ["none", pytest.param("docker", marks=pytest.mark.docker)])
@pytest.mark.parametrize("launch", ["torchrun", "tasks"])
def test_a_plain_ddp_script_trains_on_two_nodes(
        tmp_path: Path, slurm_env: dict[str, str], request: pytest.FixtureRequest,
        launch: str, runtime: str) -> None:
    env = dict(slurm_env)
    flags, python = _python(request, runtime, env)
    name = f"user-{launch}-{runtime}"
    run_dir = _submit(tmp_path, env, name, [*flags, "--launch", launch], python)
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    out = _logs(run_dir, "out")
    assert_complete(st, run_dir)
    assert "user script rank 0/2" in out and "user script rank 1/2" in out
    weights = {line.rsplit(" ", 1)[-1] for line in out.splitlines() if "weight sum" in line}
    assert len(weights) == 1, out  # DDP kept both ranks identical
    assert out.count("done at step 20") == 2


def test_a_torchrun_only_script_runs_as_the_one_process_of_a_job(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # (issue 39: one process ran with no RANK, LOCAL_RANK, ...: KeyError: 'LOCAL_RANK')
    run_dir = _submit(tmp_path, slurm_env, "one", ["--nodes", "1", "--python",
                                                   sys.executable])
    st = _wait(tmp_path, slurm_env, "one", lambda s: s["state"] in TERMINAL, timeout=300)
    out = _logs(run_dir, "out")
    assert_complete(st, run_dir)
    assert "user script rank 0/1 local 0 master 127.0.0.1:" in out, out
    assert out.count("done at step 20") == 1


def test_under_runtime_none_the_commands_python_is_the_python_checked(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # (issue 39: the first `python` on the nodes' PATH ran, a Python without torch, while
    # submit had checked that --python imports it)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named "
                                 "'torch'\" >&2\nexit 1\n")
    (bare / "python").chmod(0o755)
    env = {**slurm_env, "PATH": f"{bare}:{os.environ['PATH']}"}
    run_dir = tmp_path / "runs" / "py"
    run_dir.mkdir(parents=True)
    shutil.copy(SCRIPT, run_dir / "user_ddp.py")
    proc = run_cli(["submit", "--name", "py", "--cluster", "local", "--cpus-per-task", "1",
                    "--mem", "1000M", "--time", "5", "--runtime", "none", "--python",
                    sys.executable, "--", "python", str(run_dir / "user_ddp.py")],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, "py", lambda s: s["state"] in TERMINAL, timeout=300)
    assert_complete(st, run_dir)
    assert "done at step 20" in _logs(run_dir, "out")
    assert f"runs as --python {sys.executable}" in proc.stderr, proc.stderr


def test_accelerate_launch_runs_once_per_node_given_the_jobs_shape(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # (issue 39: accelerate launch ran under torch's launcher, told nothing of the job:
    # "`--num_processes` was set to a value of `0`"; on N GPUs a node, N x N ranks)
    accelerate = str(Path(sys.executable).with_name("accelerate"))  # the dev extra's
    script = tmp_path / "accelerate_fit.py"
    shutil.copy(Path(__file__).with_name("accelerate_fit.py"), script)
    for name, nodes in (("acc2", "2"), ("acc1", "1")):
        proc = run_cli(["submit", "--name", name, "--cluster", "local", "--nodes", nodes,
                        "--cpus-per-task", "1", "--mem", "1500M", "--time", "5",
                        "--python", sys.executable, "--", accelerate, "launch", "--cpu",
                        str(script)], cwd=tmp_path, env=slurm_env)
        assert proc.returncode == 0, proc.stderr
    for name, world in (("acc2", 2), ("acc1", 1)):
        run_dir = tmp_path / "runs" / name
        st = _wait(tmp_path, slurm_env, name, lambda s: s["state"] in TERMINAL, timeout=300)
        out, err = _logs(run_dir, "out"), _logs(run_dir, "err")
        assert_complete(st, run_dir)
        for rank in range(world):  # (a group of one too, as under torchrun)
            assert f"accelerate process {rank} of {world} (MULTI_CPU): gathered " \
                f"{list(range(world))}" in out, out
        assert f"--num_processes={world} --num_machines={world}" in err, err
        assert "`--num_processes` was set" not in err and "`--num_machines` was set" \
            not in err, err


def test_with_no_stop_signal_a_program_without_a_handler_is_never_signalled(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = {**slurm_env, "USER_NO_HANDLER": "1", "USER_HOLD_AT": "5"}
    run_dir = _submit(tmp_path, env, "nohandler", ["--launch", "tasks", "--python",
                                                   sys.executable])
    script = next((run_dir / "jobs").glob("*.sbatch")).read_text()
    assert "--signal" not in script.split("set -euo")[0]  # Slurm sends nothing early
    st = _wait(tmp_path, env, "nohandler",
               lambda s: (run_dir / "user_held").exists(), timeout=300)
    walltime_signal(st["chunks"][0]["job_id"], env)  # as if: it must not reach the step
    _wait(tmp_path, env, "nohandler", lambda s: "not passed on" in _logs(run_dir), 120)
    (run_dir / "user_release").touch()
    st = _wait(tmp_path, env, "nohandler", lambda s: s["state"] in TERMINAL, timeout=300)
    assert_complete(st, run_dir)  # exit 0, never asked
    assert "stopped by signal" not in _logs(run_dir, "out")
    assert _logs(run_dir, "out").count("done at step 20") == 2

@pytest.mark.parametrize(("launch", "stop"), [("torchrun", "USR1"), ("tasks", "TERM")])
def test_a_script_that_checkpoints_on_its_stop_signal_resumes_in_the_next_chunk(
        tmp_path: Path, slurm_env: dict[str, str], launch: str, stop: str) -> None:
    env = {**slurm_env, "USER_HOLD_AT": "7"}
    name = f"resume-{launch}-{stop}"
    run_dir = _submit(tmp_path, env, name, ["--launch", launch, "--stop-signal", stop,
                                            "--max-chunks", "3", "--python", sys.executable])
    st = _wait(tmp_path, env, name, lambda s: (run_dir / "user_held").exists(), timeout=300)
    walltime_signal(st["chunks"][0]["job_id"], env)
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    out, err = _logs(run_dir, "out"), _logs(run_dir, "err")
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"], st
    assert "user script stopped by signal at step 7" in out
    assert "rank 0 resumed at step 7" in out and "rank 1 resumed at step 7" in out
    assert out.count("done at step 20") == 2
    assert f"checkpoint and stop ({stop})" in err


@pytest.mark.parametrize("runtime", ["none", pytest.param("docker", marks=pytest.mark.docker)])
def test_lightning_checkpoints_on_the_walltime_signal_and_the_next_chunk_resumes(
        tmp_path: Path, slurm_env: dict[str, str], request: pytest.FixtureRequest,
        runtime: str) -> None:
    # Lightning's own SLURM support on USR1: it saves hpc_ckpt_1.ckpt and runs `scontrol
    # requeue`, which train launch's stand-in turns into "end this chunk" (never a real
    # requeue: the real scontrol is on PATH with runtime none); the next chunk's Lightning
    # finds the checkpoint in its default_root_dir (TRAIN_RUN_DIR) and resumes
    env = {**slurm_env, "PL_HOLD_AT": "3", "PL_EPOCHS": "3"}
    flags, python = _python(request, runtime, env)
    name = f"pl-resume-{runtime}"
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)
    script = run_dir / "lightning_tiny.py"
    shutil.copy(Path(__file__).with_name("lightning_tiny.py"), script)
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--entry", "command",
                    "--launch", "tasks", "--stop-signal", "USR1", "--max-chunks", "3",
                    "--env", "PL_HOLD_AT", "--env", "PL_EPOCHS", *flags, "--nodes", "2",
                    "--cpus-per-task", "2", "--mem", "2000M", "--time", "5", "--", python,
                    str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, name, lambda s: (run_dir / "pl_held").exists(), timeout=300)
    walltime_signal(st["chunks"][0]["job_id"], env)
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    out, err = _logs(run_dir, "out"), _logs(run_dir, "err")
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert st["chunks"][0]["state"] == "COMPLETED"  # ended by us, not requeued by Slurm
    assert "requeued" not in (run_dir / "chain.events").read_text()
    assert "asked to requeue job" in err and "asked to end this chunk" in err
    assert (run_dir / "hpc_ckpt_1.ckpt").exists()
    assert "hpc_ckpt_1.ckpt" in err.split("chunk 2 of at most")[1]  # restored from it
    assert out.count("global step 12") == 2, out  # 3 epochs x 4 steps, on both ranks
