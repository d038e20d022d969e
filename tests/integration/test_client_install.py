"""The login-node client for real: a fresh venv with the package and its base dependencies
only (no `run` extra), installed offline; the cluster-side commands work in it, the
training runtime is absent and `train run` says how to install it (exit 3)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import REPO
from train.common.errors import EXIT_RESOURCE, RUNTIME_MODULES

pytestmark = pytest.mark.slow

WHEELS_VAR = "TRAIN_TEST_WHEELS"
MAX_VENV_MB = 50


def _env() -> dict[str, str]:
    """No pip configuration (extra indexes, find-links) and nothing of the test venv."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in drop}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(argv: Sequence[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env=_env(), cwd=cwd, check=False)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _disk_usage(root: Path) -> int:
    """Bytes on disk under root, every file counted once (hard links too), as `du -s`."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total + os.lstat(root).st_blocks * 512


def _dependency_wheels() -> Path:
    value = os.environ.get(WHEELS_VAR)
    how = (f"set {WHEELS_VAR} to a directory holding the wheels of the package's base "
           "dependencies (tests may not use the network): `nox -s tests` does it, or by hand "
           "`python -m pip download --only-binary=:all: --no-build-isolation -c "
           "ci/constraints.txt -d DIR .` then "
           f"`{WHEELS_VAR}=DIR python -m pytest {Path(__file__).relative_to(REPO)}`")
    if not value:
        pytest.fail(f"{WHEELS_VAR} is not set: {how}")
    wheels = Path(value)
    if not any(wheels.glob("*.whl")) or not any(
            p.name.lower().startswith("pyyaml-") for p in wheels.glob("*.whl")):
        pytest.fail(f"{WHEELS_VAR}={value} holds no PyYAML wheel: {how}")
    return wheels


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a venv holding the login-node client, installed without the network."""
    deps = _dependency_wheels()
    work = tmp_path_factory.mktemp("client")
    # build from a copy: nothing is written into the working tree
    tree = work / "tree"
    shutil.copytree(REPO / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    # the image definitions and locks ship with the package (pyproject's data-files)
    shutil.copytree(REPO / "containers", tree / "containers",
                    ignore=shutil.ignore_patterns("wheelhouse", "downloads"))
    own = work / "wheel"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
              "--no-index", "-w", str(own), str(tree)], work))
    (wheel,) = own.glob("train_slurm_apptainer-*.whl")  # the distribution's name
    venv = work / "venv"
    _ok(_run([sys.executable, "-m", "venv", str(venv)], work))
    _ok(_run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index",
              "--find-links", str(deps), str(wheel)], work))
    return venv / "bin"


def test_client_venv_is_small_and_has_no_runtime(client: Path, tmp_path: Path) -> None:
    probe = ("import importlib.util, sys; "
             f"found = [m for m in {sorted(RUNTIME_MODULES)!r} if importlib.util.find_spec(m)]; "
             "print(found); sys.exit(1 if found else 0)")
    _ok(_run([str(client / "python"), "-c", probe], tmp_path))
    proc = _run([str(client / "python"), "-c", "import torch"], tmp_path)
    assert proc.returncode != 0
    assert "No module named 'torch'" in proc.stderr
    size = _disk_usage(client.parent)
    print(f"login-node client venv: {size / 1e6:.1f} MB on disk ({client.parent})")
    assert size < MAX_VENV_MB * 1e6, f"the client venv takes {size / 1e6:.1f} MB"


def test_cluster_commands_work_without_the_runtime(client: Path, tmp_path: Path) -> None:
    render = _ok(_run([str(client / "train"), "render", "--cluster", "local", "--runtime",
                       "none", "--", "demo",
                       "--episodes", "10"], tmp_path))
    assert render.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --" in render.stdout
    assert re.search(r"\brun\s+demo\s+--episodes\s+10\b", render.stdout)
    listing = _ok(_run([str(client / "train"), "clusters"], tmp_path)).stdout
    for site in ("gilbreth", "rivanna", "torch", "local"):
        assert site in listing
    _ok(_run([str(client / "train"), "clusters", "show", "gilbreth"], tmp_path))
    _ok(_run([str(client / "train"), "status", "--runs", str(tmp_path / "runs")], tmp_path))
    base_def = REPO / "containers" / "base.def"
    # linting images is a developer's job: it needs the images extra, and says so
    lint = _run([str(client / "train"), "image", "lint", str(base_def)], tmp_path)
    assert lint.returncode == 2 and "pip install './[images]'" in lint.stderr
    assert "'train[" not in lint.stderr  # PyPI's `train` is an unrelated project
    translated = _ok(_run([str(client / "train"), "image", "translate", str(base_def)],
                          tmp_path))
    assert "\nFROM " in translated.stdout
    # outside a clone, images are found by name in the copy installed with the package
    by_name = _ok(_run([str(client / "train"), "image", "translate", "sc2", "--localimage",
                        "base.sif=train/base:ci"], tmp_path))
    assert "# Generated from sc2.def" in by_name.stdout
    installed = client.parent / "share" / "train" / "containers"
    assert sorted(p.name for p in installed.glob("*.def")) == ["base.def", "navsim.def",
                                                               "sc2.def"]
    assert (installed / "requirements" / "sc2.txt").is_file()
    # no definitions where --defs points: exit 2, never "0 definition(s)"
    empty = tmp_path / "empty"
    empty.mkdir()
    none = _run([str(client / "train"), "image", "lint", "--defs", str(empty)], tmp_path)
    assert none.returncode == 2 and f"--defs: {empty} holds no .def files" in none.stderr
    # building needs the %files sources of a clone: exit 2 before any engine is asked
    build = _run([str(client / "train"), "image", "build", "sc2", "--engine", "docker"],
                 tmp_path)
    assert build.returncode == 2, build.stderr
    assert "is not a source tree" in build.stderr and "clone" in build.stderr
    # inside a clone (installed from it with `pip install ./`), its containers/ is found
    # without --defs: the build gets past the source tree to the next check (a value
    # with a control character), before any engine is asked
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "containers", clone / "containers",
                    ignore=shutil.ignore_patterns("wheelhouse", "downloads", "*.sif"))
    shutil.copy2(REPO / "pyproject.toml", clone / "pyproject.toml")
    (clone / "src").mkdir()
    from_clone = _run([str(client / "train"), "image", "build", "sc2", "--engine", "docker",
                       "--build-arg", "SC2_VERSION=a\x01"], clone / "src")
    assert from_clone.returncode == 2, from_clone.stderr
    assert "not a source tree" not in from_clone.stderr, from_clone.stderr
    assert "build-arg SC2_VERSION: the value holds a control" in from_clone.stderr, \
        from_clone.stderr


def test_train_run_names_the_runtime_extra(client: Path, tmp_path: Path) -> None:
    proc = _run([str(client / "train"), "run", "demo", "--out", str(tmp_path / "out")],
                tmp_path)
    assert proc.returncode == EXIT_RESOURCE, proc.stderr
    assert "pip install './[run]'" in proc.stderr and "train-slurm-apptainer" in proc.stderr
    assert "'train[" not in proc.stderr  # PyPI's `train` is an unrelated project
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    launch = _run([str(client / "train"), "launch", "--", "true"], tmp_path)
    assert launch.returncode == EXIT_RESOURCE, launch.stderr
    assert "pip install './[run]'" in launch.stderr


def test_sweep_summary_works_on_the_client(client: Path, tmp_path: Path) -> None:
    """`train summary` on the login node: the table and the CSV, no plot (no matplotlib)."""
    root = tmp_path / "runs" / "sw"
    chains = []
    for seed, rewards, score in ((4, [1.0, 2.0, 3.0], 9.0), (6, [2.0, 4.0, 6.0], 11.0)):
        run_dir = root / f"seed-{seed}"
        (run_dir / f"seed_{seed}").mkdir(parents=True)
        (run_dir / f"seed_{seed}" / "episodes.json").write_text(json.dumps({"rewards": rewards}))
        (run_dir / "eval").mkdir()
        (run_dir / "eval" / "test_results.json").write_text(
            json.dumps({str(seed): {"mean_reward": score}}))
        chains.append({"seed": seed, "run_dir": str(run_dir)})
    (root / "sweep.json").write_text(json.dumps({"name": "sw", "chains": chains}))
    proc = _ok(_run([str(client / "train"), "summary", "sw", "--smooth", "2"], tmp_path))
    assert "final evaluation over 2 of 2 seed(s): 10 +- 1.414 (mean +- std)" in proc.stdout
    assert "no plot: matplotlib is not installed here" in proc.stderr
    assert (root / "summary.csv").is_file() and not (root / "summary.png").exists()
