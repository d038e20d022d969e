"""Programs as researchers have them (issue 25), without Slurm: a `train.py` in the folder
the job runs in, a failing worker under torch's launcher, what `train launch` sets for the
program (Lightning's root folder, OpenMP threads, --chdir) and what it leaves behind.
`train launch` runs here as the job step runs it, in a process of its own."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden.cases import script_step
from train.client.programs import imports_lightning, script_of, submit_notes
from train.common.entry import entry_code, module_argv, tool_args

WORKER = Path(__file__).parents[1] / "integration" / "worker_fails.py"
LOUD = 'import sys\nprint("the folder\'s train.py was imported", file=sys.stderr)\nsys.exit(99)\n'


def _loud_folder(path: Path) -> Path:
    """A folder holding a train.py that fails loudly when imported."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.py").write_text(LOUD)
    return path


def test_python_m_train_runs_the_folders_train_py_but_the_jobs_entry_never_does(
        tmp_path: Path) -> None:
    folder = _loud_folder(tmp_path / "work")
    # the trap itself: `python -m` puts the current folder first
    proc = subprocess.run([sys.executable, "-m", "train", "--version"], cwd=folder,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 99 and "train.py was imported" in proc.stderr
    # the job's entry and the console script import this package, from the same folder
    console = Path(sys.executable).with_name("train")
    for argv in (module_argv(sys.executable), [str(console)]):
        proc = subprocess.run([*argv, "--version"], cwd=folder, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0 and proc.stdout.startswith("train "), proc.stderr
    # a train/ package, a PYTHONPATH of ".", and a module of the package (the GPU watch)
    pkg = tmp_path / "pkg"
    (pkg / "train").mkdir(parents=True)
    (pkg / "train" / "__init__.py").write_text(LOUD)
    for cwd, extra in ((pkg, {}), (folder, {"PYTHONPATH": "."})):
        proc = subprocess.run([*module_argv(sys.executable), "--version"], cwd=cwd,
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, **extra})
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([*module_argv(sys.executable, "train.node.gpuwatch"), "--help"],
                          cwd=folder, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and "--parent" in proc.stdout, proc.stderr


def test_the_entry_is_recognised_as_the_tools_command_line() -> None:
    assert tool_args([*module_argv("python3"), "run", "demo"]) == ["run", "demo"]
    assert tool_args(["python3", "-m", "train", "run"]) == ["run"]
    assert tool_args(["python3", "train.py", "run"]) is None
    assert "-m" not in module_argv("python3") and "runpy" in entry_code()


@pytest.mark.parametrize("flags", [
    ["--", "demo"],
    ["--nodes", "2", "--", "demo"],
    ["--gpus-per-node", "1", "--min-free-mb", "100", "--", "demo"],
    ["--entry", "command", "--", "python3", "x.py"],
    ["--entry", "command", "--nodes", "2", "--launch", "tasks", "--", "python3", "x.py"],
])
def test_no_rendered_step_imports_train_from_the_folder(tmp_path: Path,
                                                        flags: list[str]) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["render", "--name", "r", "--cluster", "local", "--runtime", "none",
                    "--python", sys.executable, *flags], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    step = script_step(proc.stdout)
    assert "-m" not in step and "-m train" not in proc.stdout
    assert any("runpy.run_module" in arg for arg in step)


def test_chdir_is_absolute_in_the_step_and_a_missing_folder_is_refused(
        tmp_path: Path) -> None:
    from tests.conftest import run_cli

    (tmp_path / "data").mkdir()
    base = ["render", "--name", "r", "--cluster", "local", "--runtime", "none", "--python",
            sys.executable, "--entry", "command"]
    proc = run_cli([*base, "--chdir", "data", "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"--chdir={tmp_path / 'data'}" in proc.stdout
    proc = run_cli([*base, "--chdir", "nowhere", "--", "python3", "x.py"], cwd=tmp_path)
    assert proc.returncode == 2 and "chdir" in proc.stderr and "not a directory" in proc.stderr
    assert not (tmp_path / "runs").exists()


def _step_env(tmp_path: Path, cpus: str = "3") -> dict[str, str]:
    """One task of a one-node step, as Slurm and the batch shell describe it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TRAIN_", "OMP_", "PL_"))}
    env.update({"SLURM_JOB_ID": str(random.randint(1, 19999)),  # the rendezvous port
                "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
                "SLURM_NTASKS_PER_NODE": "1", "SLURM_CPUS_PER_TASK": cpus,
                "CUDA_VISIBLE_DEVICES": "", "TRAIN_MASTER_ADDR": "127.0.0.1",
                "TRAIN_RUN_DIR": str(run_dir), "TMPDIR": str(private_tmp),
                "TRAIN_STOP_REQUEST": str(run_dir / ".stop-request-1-0")})
    return env


PRINT_ENV = ("import os, shutil; print(os.environ.get('OMP_NUM_THREADS'), "
             "os.environ.get('PL_TRAINER_DEFAULT_ROOT_DIR'), os.getcwd(), "
             "shutil.which('scontrol'))")


def test_tasks_mode_sets_threads_lightning_root_and_folder_and_leaves_nothing_in_tmp(
        tmp_path: Path) -> None:
    env = _step_env(tmp_path)
    folder = _loud_folder(tmp_path / "submit")
    data = tmp_path / "data"
    data.mkdir()
    run_dir = Path(env["TRAIN_RUN_DIR"])
    for _ in range(2):  # the run folder's stand-in is reused, never added to
        proc = subprocess.run([*module_argv(sys.executable), "launch", "--mode", "tasks",
                               f"--chdir={data}", "--", sys.executable, "-c", PRINT_ENV],
                              cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["3", str(run_dir), str(data),
                                       str(run_dir / ".scontrol-shim" / "scontrol")]
        assert os.listdir(env["TMPDIR"]) == []  # no /tmp/.train-shim-XXXX left behind
    assert sorted(os.listdir(run_dir / ".scontrol-shim")) == ["scontrol"]
    # the user's own settings win
    env.update(OMP_NUM_THREADS="1", PL_TRAINER_DEFAULT_ROOT_DIR="/elsewhere")
    proc = subprocess.run([*module_argv(sys.executable), "launch", "--mode", "tasks", "--",
                           sys.executable, "-c", PRINT_ENV], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split()[:3] == ["1", "/elsewhere", str(folder)], proc.stderr
    # a folder that is not there is the program's folder error, exit 2
    proc = subprocess.run([*module_argv(sys.executable), "launch", "--mode", "tasks",
                           "--chdir", str(tmp_path / "nowhere"), "--", "true"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "--chdir" in proc.stderr


def _torchrun(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**_step_env(tmp_path), "WORKER_FAIL": mode}
    return subprocess.run([*module_argv(sys.executable), "launch", "--mode", "torchrun",
                           "--nproc-per-node", "2", "--", sys.executable, str(WORKER)],
                          cwd=_loud_folder(tmp_path / "submit"), env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(("mode", "code"), [("raise", 1), ("exit", 7), ("usr1", 138)])
def test_a_failing_worker_under_torchrun_is_the_programs_failure(
        tmp_path: Path, mode: str, code: int) -> None:
    proc = _torchrun(tmp_path, mode)
    err = proc.stderr
    assert proc.returncode == code, err
    assert "unexpected failure" not in err and "ChildFailedError" not in err, err
    assert "launch.py" not in err and "cli.py" not in err  # no traceback of the tool
    assert "worker rank 1 (local rank 1, pid" in err, err
    assert os.listdir(tmp_path / "tmp") == []  # torchrun mode removes what it made
    if mode == "raise":
        assert err.count("Traceback") == 1 and "RuntimeError: worker boom at rank 1" in err
        assert "exited with code 1" in err
    elif mode == "exit":
        assert "exited with code 7" in err and "worker rank 1 gives up" in err
    else:
        assert "was killed by SIGUSR1 (exit code 138)" in err
        assert "the stop signal USR1 reached a worker that has no handler for it" in err


def test_a_torchrun_step_whose_workers_succeed_exits_0(tmp_path: Path) -> None:
    proc = _torchrun(tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    assert "worker rank 0/2 started" in proc.stdout and "worker rank 1/2 started" in proc.stdout


LIGHTNING = "import os\nimport lightning as L\n"


@pytest.mark.parametrize(("text", "found"), [
    (LIGHTNING, True), ("from pytorch_lightning import Trainer\n", True),
    ("import lightning.pytorch as pl\n", True), ("    from lightning import Trainer\n", True),
    ("# import lightning\nimport torch\n", False), ('"""import lightning"""\n', False),
    ("import lightning_utils\n", False), ("import torch\n", False)])
def test_a_script_that_imports_lightning_is_recognised(tmp_path: Path, text: str,
                                                       found: bool) -> None:
    (tmp_path / "fit.py").write_text(text)
    assert imports_lightning(["python3", "fit.py", "--x"], tmp_path) is found


def test_the_script_of_a_command(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fit.py").write_text(LIGHTNING)
    (tmp_path / "fit.py").write_text(LIGHTNING)
    assert script_of(["python", "-u", "fit.py"], tmp_path) == tmp_path / "fit.py"
    assert script_of(["python", "-m", "pkg.fit"], tmp_path) == tmp_path / "pkg" / "fit.py"
    assert script_of(["python", "missing.py", "fit.py"], tmp_path) is None  # not here
    assert script_of(["./run.sh"], tmp_path) is None
    assert imports_lightning(["python", "-m", "pkg.fit"], tmp_path)


def test_a_lightning_script_gets_one_task_per_gpu_by_default(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    (tmp_path / "fit.py").write_text(LIGHTNING)
    (tmp_path / "ddp.py").write_text("import torch\n")
    base = ["render", "--name", "r", "--cluster", "local", "--runtime", "none", "--python",
            sys.executable, "--entry", "command", "--nodes", "2"]
    for script, mode in (("fit.py", "tasks"), ("ddp.py", "torchrun")):
        proc = run_cli([*base, "--", "python3", script], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert f"--mode={mode}" in proc.stdout, script
    proc = run_cli([*base, "--launch", "torchrun", "--", "python3", "fit.py"], cwd=tmp_path)
    assert proc.returncode == 0 and "--mode=torchrun" in proc.stdout  # as asked


def test_submit_notes_name_another_runs_checkpoints_and_lightning_under_torchrun(
        tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text(LIGHTNING)
    run_dir = str(tmp_path / "runs" / "b")
    assert submit_notes("command", ["python", "fit.py"], "tasks", run_dir, tmp_path) == []
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"x")
    notes = submit_notes("command", ["python", "fit.py"], "torchrun", run_dir, tmp_path)
    assert len(notes) == 2
    assert "hpc_ckpt_1.ckpt" in notes[0] and "PL_TRAINER_DEFAULT_ROOT_DIR" in notes[0]
    assert "--launch tasks" in notes[1]
    assert submit_notes("train", ["demo"], "single", run_dir, tmp_path) == []


def test_a_versioned_python_under_runtime_none_is_warned_it_is_not_the_one_checked(
        tmp_path: Path) -> None:
    """`--runtime none --python P -- python3.12 fit.py`: `python` and `python3` run as P,
    the interpreter submit checked; python3.12 ran from the nodes' PATH unsaid."""
    from tests.conftest import run_cli
    from tests.unit.test_sweep_defects import _slurm

    env = _slurm(tmp_path)
    (tmp_path / "fit.py").write_text("print(1)\n")
    for typed, warned in (("python3.12", True), ("python", False)):
        proc = run_cli(["submit", "--cluster", "local", "--no-check", "--name", typed,
                        "--runtime", "none", "--python", sys.executable, "--", typed,
                        "fit.py"], cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        said = f"the command runs {typed} from the nodes' PATH, not --python {sys.executable}"
        assert (said in proc.stderr) == warned, proc.stderr


def test_accelerates_own_script_name_is_no_slip_of_accelerate() -> None:
    """`accelerate-launch` (accelerate's own script) not found was called 'a typo (did you
    mean accelerate?)'; a real slip still is one."""
    from train.client.programs import program_slip

    assert program_slip("accelerate-launch") == ""
    assert program_slip("acelerate") == " (did you mean accelerate?)"

