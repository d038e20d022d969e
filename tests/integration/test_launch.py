"""`train launch` on a REAL 2-node SLURM cluster: torchrun mode (one task per node) and
tasks mode (one task per rank), the DQN trainer under DDP over gloo across the nodes."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import (
    TERMINAL,
    assert_complete,
    checkpointed,
    kill_wait,
    walltime_signal,
)
from tests.integration.chains import logs as _logs
from tests.integration.chains import status as _status
from tests.integration.chains import wait as _wait
from train.batch.contract import DOCKER_JOB_LABEL

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PLAIN = Path(__file__).parent / "plain_steps.py"


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
    assert_complete(st, run_dir)
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


def test_a_torchrun_worker_exiting_after_its_save_gets_the_stop_once(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Slurm signals every process of the step, torch's workers too, and `train launch`
    passed the stop on again: a worker whose handler was gone by then (a one-shot handler
    here; on a busy node, a Python exiting after its save) died of that second USR1 (exit
    138) and the chain failed (found in CI's apptainer tier, where the agent's copy came
    late)."""
    shutil.copy(PLAIN, tmp_path / "plain_steps.py")
    proc = run_cli(["submit", "--name", "slow-exit", "--cluster", "local", "--python",
                    sys.executable, "--entry", "command", "--nodes", "2", "--launch",
                    "torchrun", "--cpus-per-task", "1", "--mem", "2000M", "--time", "5",
                    "--stop-signal", "USR1", "--max-chunks", "3", "--env", "USER_HOLD_AT",
                    "--env", "USER_SLOW_EXIT", "--", "python3",
                    str(tmp_path / "plain_steps.py")], cwd=tmp_path,
                   env={**slurm_env, "USER_HOLD_AT": "7", "USER_SLOW_EXIT": "3"})
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / "slow-exit"
    held = [run_dir / "user_held-0", run_dir / "user_held-1"]
    st = _wait(tmp_path, slurm_env, "slow-exit", lambda s: all(p.exists() for p in held)
               or s["state"] in TERMINAL)
    walltime_signal(st["chunks"][0]["job_id"], slurm_env)
    st = _wait(tmp_path, slurm_env, "slow-exit", lambda s: s["state"] in TERMINAL)
    assert_complete(st, run_dir)
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert _logs(run_dir, "out").count("done at step 20") == 2


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
    assert_complete(st, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["process_env"]["PYTHONPATH"] is None
    assert config["process_env"]["CONDA_PREFIX"] is None
    assert config["versions"]["python"].startswith("3.11")  # the image's Python
    assert config["world_size"] == int(nodes)
    assert json.loads((run_dir / "seed_4" / "summary.json").read_text())["complete"]


DOCKER_USER = "train-docker-ci"


@pytest.fixture
def docker_user(docker_engine: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """A non-root user allowed to use the test engine the way sites allow docker users:
    membership of the group that owns dockerd's socket. Yields the user and a directory
    it owns to submit from. The user is kept (created once per machine)."""
    socket = Path(docker_engine["DOCKER_HOST"].removeprefix("unix://"))
    group = grp.getgrgid(socket.stat().st_gid).gr_name
    if group == "root":
        pytest.skip("dockerd's socket belongs to root: no docker group to admit a user")
    try:
        pwd.getpwnam(DOCKER_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell",
                        "/bin/bash", DOCKER_USER], check=True, capture_output=True)
    subprocess.run(["usermod", "--append", "--groups", group, DOCKER_USER], check=True,
                   capture_output=True)
    socket.parent.chmod(0o711)  # the engine's private folder: let members reach the socket
    base = Path(tempfile.mkdtemp(prefix="dku", dir="/tmp"))
    base.chmod(0o755)
    shutil.chown(base, DOCKER_USER, DOCKER_USER)
    try:
        yield DOCKER_USER, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60,
                          check=True).stdout


@pytest.mark.docker
def test_scancel_of_a_docker_job_leaves_no_container_and_files_are_the_users(
        slurm_env: dict[str, str], docker_engine: dict[str, str], ci_image: str,
        docker_user: tuple[str, Path]) -> None:
    user, base = docker_user
    entry = pwd.getpwnam(user)
    # The job must run as someone other than root, or root-owned files would pass. Root's
    # Python cannot be handed to the user (/root is private), so the job is submitted the
    # way Slurm lets root submit for a user: `sbatch --uid --gid`, through an sbatch
    # first on PATH (the CLI's own calls). The run directory is given to the user before
    # the held job is released. The container's uid then comes only from the task's `id`.
    real_sbatch = shutil.which("sbatch")
    assert real_sbatch
    (base / "bin").mkdir()
    shim = base / "bin" / "sbatch"
    shim.write_text(
        "#!/bin/sh\n"
        'if [ "$(id -u)" = 0 ]; then\n'
        f"    chown -R {user}:{user} {shlex.quote(str(base / 'runs'))}\n"
        f"    exec {shlex.quote(real_sbatch)} --uid={user} --gid={user} \"$@\"\n"
        "fi\n"
        f'exec {shlex.quote(real_sbatch)} "$@"\n')
    shim.chmod(0o755)
    env = {**slurm_env, **docker_engine, "HOME": str(base),
           "PATH": f"{base / 'bin'}:{os.environ['PATH']}"}
    name = "dkill"
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--runtime", "docker",
                    "--image", ci_image, "--cpus-per-task", "1", "--mem", "1000M", "--time",
                    "5", "--max-chunks", "1", "--", "demo", "--episodes", "1000000",
                    *tiny_flags()], cwd=base, env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = base / "runs" / name
    job_id = (run_dir / "chain.ids").read_text().split()[1]
    label = f"label={DOCKER_JOB_LABEL}={job_id}"
    deadline = time.monotonic() + 240
    while not (_docker("ps", "-q", "--filter", label)
               and checkpointed(run_dir) > 0):
        st = _status(base, env, name)
        assert st["state"] not in TERMINAL, (st, _logs(run_dir, "err")[-4000:])
        assert time.monotonic() < deadline, "the job's container never ran"
        time.sleep(0.5)
    (container_id,) = _docker("ps", "-q", "--filter", label).split()
    assert _docker("inspect", "--format", "{{.Config.User}}", container_id).strip() == \
        f"{entry.pw_uid}:{entry.pw_gid}"
    subprocess.run(["scancel", job_id], env={**os.environ, **slurm_env}, check=True,
                   timeout=60)
    # gone (neither running nor left stopped) by Slurm's KILL, give or take the engine
    bound = time.monotonic() + kill_wait(slurm_env) + 10
    while _docker("ps", "-aq", "--filter", label):
        assert time.monotonic() < bound, _docker("ps", "-a", "--filter", label)
        time.sleep(0.2)
    _wait(base, env, name, lambda s: s["state"] in TERMINAL, timeout=120)
    # Everything in the run directory is the user's, apart from the CLI's (root's) own
    # records and its copy of the chain engine; what the container wrote (config,
    # checkpoints) included.
    cli_files = {"chain.json", "chain.ids"}
    owners = {p.relative_to(run_dir).as_posix(): p.stat().st_uid
              for p in run_dir.rglob("*") if p.name not in cli_files
              and ".train" not in p.relative_to(run_dir).parts}
    assert owners["config.json"] == entry.pw_uid != 0
    assert any(k.startswith("seed_4/checkpoints/") for k in owners), sorted(owners)
    assert set(owners.values()) == {entry.pw_uid}, owners


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
                    "--launch", "tasks", *flags, "--nodes", "2", "--cpus-per-task", "2", "--mem", "2000M",
                    "--time", "5", "--", python, str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    out = _logs(run_dir, "out")
    assert_complete(st, run_dir)
    assert "lightning rank 0/2 joined" in out and "lightning rank 1/2 joined" in out
    sums = {line.split("weight sum ")[1].split(";")[0] for line in out.splitlines()
            if "weight sum" in line}
    assert len(sums) == 1  # DDP kept both ranks' weights identical
