"""The field notes' own stacks as a user sets them up, on the REAL 2-node SLURM cluster with
the docker runtime: a plain DDP script with one extra dependency from PyPI, in an image
derived from CI's base by `train image new --requirements` + `train image build` (under
torch's launcher and as one rank per task); and a NAVSIM fork (the Hydra-MDP one of the
NYU notes) put on PYTHONPATH with `--bind` + `--env`, beside the user's own allocator
setting (the GRPO/FSDP recipe's `--env PYTORCH_CUDA_ALLOC_CONF=...`).

The extra dependency is a real wheel, tabulate (pure Python, no dependencies), taken from
TRAIN_TEST_STACK_WHEELS: `nox -s tests` downloads it there, so no test reaches the network.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.chains import TERMINAL
from tests.integration.chains import logs as _logs
from tests.integration.chains import wait as _wait

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.slow]

STACK_WHEELS_VAR = "TRAIN_TEST_STACK_WHEELS"
PIN = "tabulate==0.9.0"  # as a user pins it in requirements.txt
STACK_TAG = "train/stack:ci"
SCRIPT = Path(__file__).with_name("user_ddp_extra.py")


def _stack_wheel() -> Path:
    folder = os.environ.get(STACK_WHEELS_VAR)
    wheels = sorted(Path(folder).glob("tabulate-0.9.0-*.whl")) if folder else []
    if not wheels:
        if os.environ.get("CI"):
            pytest.fail(f"{STACK_WHEELS_VAR} holds no tabulate 0.9.0 wheel in CI")
        pytest.skip(f"no tabulate wheel in {STACK_WHEELS_VAR}: run through `nox -s tests`")
    return wheels[0]


def _has_tabulate(image: str) -> bool:
    import docker

    container = docker.from_env().containers.run(
        image, ["-c", "import tabulate"], entrypoint=["python3"], network_mode="none",
        detach=True)
    try:
        return bool(container.wait(timeout=300)["StatusCode"] == 0)
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def stack_image(ci_image: str, docker_engine: dict[str, str],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The user's derived image: requirements.txt -> `train image new` -> `train image
    build` over the session's cached base image, offline. Prints the build's time and the
    size it adds to the base (the closing note's figures; nothing asserts on them)."""
    import docker

    wheel = _stack_wheel()
    assert not _has_tabulate(ci_image), "the base image has tabulate: the test proves nothing"
    project = tmp_path_factory.mktemp("stack")
    (project / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "0"\n',
                                            encoding="utf-8")
    (project / "requirements.txt").write_text(f"{PIN}\n", encoding="utf-8")
    new = run_cli(["image", "new", "stack", "--from", "base", "--requirements",
                   str(project / "requirements.txt"), "--find-links", str(wheel.parent),
                   "--out", str(project / "containers-stack")])
    assert new.returncode == 0, new.stderr
    lock = (project / "containers-stack" / "requirements" / "stack.txt").read_text()
    assert "tabulate==0.9.0" in lock and "--hash=sha256:" in lock
    shutil.copy(wheel, project / "containers-stack" / "wheels")  # the build stays offline
    started = time.monotonic()
    build = run_cli(["image", "build", str(project / "containers-stack" / "stack.def"),
                     "--engine", "docker", "--tag", STACK_TAG, "--localimage",
                     f"base.sif={ci_image}"], env=docker_engine, timeout=900)
    took = time.monotonic() - started
    assert build.returncode == 0, build.stderr[-3000:]
    client = docker.from_env()
    added = client.images.get(STACK_TAG).attrs["Size"] - client.images.get(ci_image).attrs["Size"]
    print(f"\nderived image {STACK_TAG}: built in {took:.1f} s over the cached base, "
          f"adds {added / 1e6:.2f} MB")
    try:
        yield STACK_TAG
    finally:
        client.images.remove(STACK_TAG, force=True)


@pytest.mark.parametrize("launch", ["torchrun", "tasks"])
def test_a_ddp_script_imports_the_derived_images_package_on_two_nodes(
        tmp_path: Path, slurm_env: dict[str, str], docker_engine: dict[str, str],
        stack_image: str, launch: str) -> None:
    env = {**slurm_env, **docker_engine}
    name = f"stack-{launch}"
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)  # the script lives where the container sees it
    script = run_dir / SCRIPT.name
    shutil.copy(SCRIPT, script)
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--runtime", "docker",
                    "--image", stack_image, "--entry", "command", "--launch", launch,
                    "--nodes", "2", "--cpus-per-task", "2", "--mem", "2000M", "--time", "5",
                    "--", "python3", str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    assert st["state"] == "complete", (st, _logs(run_dir, "err")[-4000:])
    for rank in (0, 1):
        version, module, total = (run_dir / f"rank-{rank}.txt").read_text().split()
        assert version == "0.9.0"
        assert "-packages/tabulate/" in module, module  # installed in the image, not a copy
        assert total == "3"  # 1 + 2: the allreduce ran over both nodes
    out = _logs(run_dir, "out")
    assert "allreduce" in out and "0.9.0" in out  # tabulate's table, printed by each rank


FORK_AGENT = '''"""The fork's own agent: not in the released navsim."""
AGENT = "hydra_mdp_v8192_w_ep"
'''
FORK_TRAINING = '''"""The fork's run_training.py: it imports navsim from wherever Python finds it (a
script's own folder is sys.path[0], not the fork's root: only PYTHONPATH brings it)."""
import os
import sys
from pathlib import Path

import navsim
from navsim.agents import hydra_mdp

args = dict(a.split("=", 1) for a in sys.argv[1:])
line = " ".join([navsim.__file__, hydra_mdp.__file__, args["agent"],
                 os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "-")])
print("fork:", line, flush=True)
Path(os.environ["TRAIN_RUN_DIR"], "fork.txt").write_text(line + "\\n")
'''
USER_ALLOC = "backend:cudaMallocAsync"  # a setting without expandable_segments


def _fork(root: Path) -> Path:
    """A stand-in for the Hydra-MDP fork of NAVSIM: the navsim package, extended."""
    package = root / "navsim"
    (package / "agents").mkdir(parents=True)
    (package / "planning" / "script").mkdir(parents=True)
    (package / "__init__.py").write_text('FORK = "hydra-mdp"\n')
    (package / "agents" / "__init__.py").write_text("")
    (package / "agents" / "hydra_mdp.py").write_text(FORK_AGENT)
    (package / "planning" / "script" / "run_training.py").write_text(FORK_TRAINING)
    return root


def test_a_navsim_fork_on_pythonpath_and_the_users_allocator_setting_reach_the_program(
        tmp_path: Path, slurm_env: dict[str, str], docker_engine: dict[str, str],
        ci_image: str) -> None:
    env = {**slurm_env, **docker_engine}
    fork = _fork(tmp_path / "navsim-fork")
    name = "fork"
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--runtime", "docker",
                    "--image", ci_image, "--entry", "command", "--launch", "torchrun",
                    "--bind", f"{fork}:/opt/fork:ro", "--env", "PYTHONPATH=/opt/fork",
                    "--env", f"PYTORCH_CUDA_ALLOC_CONF={USER_ALLOC}",
                    "--cpus-per-task", "1", "--mem", "1000M", "--time", "5", "--",
                    "python3", "/opt/fork/navsim/planning/script/run_training.py",
                    "agent=hydra_mdp_v8192_w_ep"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / name
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    assert st["state"] == "complete", (st, _logs(run_dir, "err")[-4000:])
    navsim, agent, which, alloc = (run_dir / "fork.txt").read_text().split()
    assert navsim == "/opt/fork/navsim/__init__.py"  # the fork's, through the bind
    assert agent == "/opt/fork/navsim/agents/hydra_mdp.py" and which == "hydra_mdp_v8192_w_ep"
    assert alloc == USER_ALLOC  # the user's, not the image's tuned default
