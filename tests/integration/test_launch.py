"""`train launch` on a REAL 2-node SLURM cluster: torchrun mode (one task per node) and
tasks mode (one task per rank), the DQN trainer under DDP over gloo across the nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import TERMINAL
from tests.integration.chains import logs as _logs
from tests.integration.chains import wait as _wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _two_node(tmp_path: Path, env: dict[str, str], name: str, launch: str) -> Path:
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--python",
                    sys.executable, "--nodes", "2", "--launch", launch, "--cpus-per-task",
                    "2", "--mem", "2000M", "--time", "5", "--", "demo", "--episodes", "4",
                    *tiny_flags()], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / name
    script = next((run_dir / "jobs").glob("*.sbatch")).read_text()
    assert f"--mode={launch}" in script
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    assert st["state"] == "complete", (st, _logs(run_dir, "err")[-4000:])
    return run_dir


@pytest.mark.parametrize("launch", ["torchrun", "tasks"])
def test_two_node_ddp_ranks_end_with_identical_parameters(
        tmp_path: Path, slurm_env: dict[str, str], launch: str) -> None:
    run_dir = _two_node(tmp_path, slurm_env, f"ddp-{launch}", launch)
    summary = json.loads((run_dir / "seed_4" / "summary.json").read_text())
    assert summary["ranks_checked"] == 2 and summary["complete"] is True
    config = json.loads((run_dir / "config.json").read_text())
    assert config["world_size"] == 2
    err = _logs(run_dir, "err")
    assert "backend gloo" in err
    assert "NCCL settings" in err and "InfiniBand not visible" in err
    # both nodes took part: one rank per node
    assert "rank 0/2" in err and "rank 1/2" in err
    if launch == "tasks":
        assert "(node 1, local 0)" in err
    else:
        assert "node 1/2: torchrun" in err


HOST_LEAKS = {"PYTHONPATH": "/nonexistent", "CONDA_PREFIX": "/opt/conda/envs/gpu"}


@pytest.mark.docker
@pytest.mark.parametrize("nodes", ["1", "2"])
def test_docker_runtime_jobs_keep_the_host_environment_out(
        tmp_path: Path, slurm_env: dict[str, str], docker_engine: dict[str, str],
        ci_image: str, nodes: str) -> None:
    env = {**slurm_env, **docker_engine, **HOST_LEAKS}
    name = f"docker{nodes}"
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--runtime", "docker",
                    "--image", ci_image, "--nodes", nodes, "--cpus-per-task", "2", "--mem",
                    "2000M", "--time", "5", "--", "demo", "--episodes", "3", *tiny_flags()],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / name
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    assert st["state"] == "complete", (st, _logs(run_dir, "err")[-4000:])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["process_env"]["PYTHONPATH"] is None
    assert config["process_env"]["CONDA_PREFIX"] is None
    assert config["versions"]["python"].startswith("3.11")  # the image's Python
    assert config["world_size"] == int(nodes)
    assert json.loads((run_dir / "seed_4" / "summary.json").read_text())["complete"]


def test_runtime_none_uses_the_host_python_as_it_is(tmp_path: Path,
                                                   slurm_env: dict[str, str]) -> None:
    env = {**slurm_env, **HOST_LEAKS}
    proc = run_cli(["submit", "--name", "host", "--cluster", "local", "--python",
                    sys.executable, "--cpus-per-task", "1", "--mem", "1000M", "--time", "5",
                    "--", "demo", "--episodes", "2", *tiny_flags()], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, "host", lambda s: s["state"] in TERMINAL, timeout=300)
    assert st["state"] == "complete"
    config = json.loads((tmp_path / "runs" / "host" / "config.json").read_text())
    assert config["process_env"]["PYTHONPATH"] == "/nonexistent"  # no container: as given


@pytest.mark.apptainer
def test_apptainer_runtime_job_keeps_the_host_environment_out(
        apptainer_sif: Path, tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = {**slurm_env, **HOST_LEAKS}
    proc = run_cli(["submit", "--name", "app", "--cluster", "local", "--runtime",
                    "apptainer", "--image", str(apptainer_sif), "--nodes", "2",
                    "--cpus-per-task", "2",
                    "--mem", "2000M", "--time", "10", "--", "demo", "--episodes", "3",
                    *tiny_flags()], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, "app", lambda s: s["state"] in TERMINAL, timeout=600)
    assert st["state"] == "complete"
    config = json.loads((tmp_path / "runs" / "app" / "config.json").read_text())
    assert config["process_env"]["PYTHONPATH"] is None
    assert config["world_size"] == 2


@pytest.mark.parametrize("runtime", ["none", pytest.param("docker", marks=pytest.mark.docker)])
def test_two_node_tasks_mode_lightning_ranks_join(tmp_path: Path, slurm_env: dict[str, str],
                                                 runtime: str,
                                                 request: pytest.FixtureRequest) -> None:
    import shutil

    name = f"pl-{runtime}"
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)  # the run directory is what the container sees
    script = run_dir / "lightning_tiny.py"
    shutil.copy(Path(__file__).with_name("lightning_tiny.py"), script)
    env = dict(slurm_env)
    flags = ["--python", sys.executable]
    python = sys.executable
    if runtime == "docker":
        env.update(request.getfixturevalue("docker_engine"))
        flags = ["--runtime", "docker", "--image", request.getfixturevalue("ci_image")]
        python = "python3"
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--entry", "command",
                    *flags, "--nodes", "2", "--cpus-per-task", "2", "--mem", "2000M",
                    "--time", "5", "--", python, str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    out = _logs(run_dir, "out")
    assert st["state"] == "complete", (st, _logs(run_dir, "err")[-4000:])
    assert "lightning rank 0/2 joined" in out and "lightning rank 1/2 joined" in out
    sums = {line.rsplit(" ", 1)[-1] for line in out.splitlines() if "weight sum" in line}
    assert len(sums) == 1  # DDP kept both ranks' weights identical
