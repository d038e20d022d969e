"""Issue 19, re-tried as a new user: mistakes that still reached the compute node (or
were told as another flag's fault) before these checks. Each is refused at submit (exit 2,
the flag named, the fix given, nothing written) and warned of by render:

- the field notes' own launch lines copied after `--`: `torchrun --nproc_per_node=4
  train.py` (the rv tool's examples) inside the job's own torch launcher, `srun python
  train.py` (seed 003's fix) inside the job's srun step;
- a NAVSIM job in a container with no data bound at /data/navsim, or a --data folder
  without NAVSIM's dataset/ and dataset/maps;
- an --sbatch-extra option that Slurm refuses (`sbatch --test-only`), which was said as
  "naming nothing of the job" and then failed at sbatch with exit 1.

No cluster: stand-in `sbatch` programs (the same helpers as test_submit_checks)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import run_cli, tiny_flags
from tests.unit.test_submit_checks import LOCAL, _exe, _fake_sif, _passes, _refused, _submit


def test_a_torch_launcher_of_the_users_own_inside_the_jobs_launcher_is_refused(
        tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text("print(1)\n")
    cmd = ["-e", "command", "-g", "2"]  # two GPUs: the job runs torch's launcher itself
    err = _refused(tmp_path, "workload", *cmd, "--", "torchrun", "--nproc_per_node=2",
                   "--master_port", "29501", "ddp.py", "--lr", "3", no_check=False)
    assert "torch's launcher (torchrun)" in err and "-- python ddp.py --lr 3" in err, err
    assert "2 processes a node" in err and "same GPUs" in err, err
    # a CPU job on two nodes: one process a node, CPUs
    err = _refused(tmp_path, "workload", "-e", "command", "-N", "2", "--launch", "torchrun",
                   "--", "torchrun", "ddp.py", no_check=False)
    assert "1 process a node" in err and "same CPUs" in err, err
    err = _refused(tmp_path, "workload", *cmd, "--", "python", "-m",
                   "torch.distributed.run", "--nproc_per_node", "2", "-m", "pkg.fit",
                   no_check=False)
    assert "python -m torch.distributed.run" in err and "-- python -m pkg.fit" in err, err
    # one tasks a GPU (--launch tasks): each task would start a launcher too
    err = _refused(tmp_path, "workload", *cmd, "--launch", "tasks", "--", "torchrun",
                   "--standalone", "ddp.py", no_check=False)
    assert "one task per GPU" in err and "-- python ddp.py" in err, err
    # what it should be passes; a single process may keep its one-process torchrun
    _passes(tmp_path, *cmd, "--", "python3", "ddp.py", "--lr", "3")


def test_deepspeeds_launcher_inside_the_jobs_launcher_is_refused(tmp_path: Path) -> None:
    """`-- deepspeed fit.py` on 2 GPUs: each of the job's 2 workers would start
    DeepSpeed's launcher, which starts a process per GPU of its own (4 ranks on 2 GPUs),
    as torchrun would; it was let through."""
    (tmp_path / "fit.py").write_text("print(1)\n")
    bin_dir = _exe(tmp_path / "bin" / "deepspeed", "#!/bin/sh\nexit 0\n").parent
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    err = _refused(tmp_path, "workload", "-e", "command", "-g", "2", "--", "deepspeed",
                   "--num_gpus", "2", "fit.py", "--deepspeed", "ds.json", env=env,
                   no_check=False)
    assert "DeepSpeed's launcher (deepspeed)" in err, err
    assert "-- python fit.py --deepspeed ds.json" in err and "2 processes a node" in err


def test_srun_in_the_command_is_refused_with_the_program_to_give(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text("print(1)\n")
    for gpus in ("0", "2"):
        err = _refused(tmp_path, "workload", "-e", "command", "-g", gpus, "--", "srun",
                       "python3", "ddp.py", no_check=False)
        assert "starts with srun" in err and "-- python3 ddp.py" in err, err


def test_a_navsim_job_in_a_container_needs_its_data_bound(tmp_path: Path) -> None:
    sif = str(_fake_sif(tmp_path / "navsim.sif"))
    nav = ["-e", "navsim", "--runtime", "apptainer", "--image", sif]
    err = _refused(tmp_path, "data", *nav)
    assert "/data/navsim" in err and "--data DIR" in err, err
    data = tmp_path / "navsim"
    (data / "exp").mkdir(parents=True)
    err = _refused(tmp_path, "data", *nav, "--data", str(data))
    assert "has no dataset/" in err, err
    (data / "dataset").mkdir()
    err = _refused(tmp_path, "data", *nav, "--data", str(data))
    assert "has no dataset/maps/" in err, err
    (data / "dataset" / "maps").mkdir()
    _passes(tmp_path, *nav, "--data", str(data))
    # bound there by the user's own --bind, or the data roots moved by --env: theirs
    _passes(tmp_path, *nav, "--bind", f"{data}:/data/navsim")
    _passes(tmp_path, *nav, "--bind", str(data), "--env",
            f"OPENSCENE_DATA_ROOT={data}/dataset")


SBATCH_RESERVATION = """#!/bin/sh
# --test-only: refuses a script asking for a reservation, accepts any other
if [ "$1" = --test-only ]; then
    if grep -q -- '--reservation=' "$2"; then
        echo 'sbatch: error: Batch job submission failed: Requested reservation is invalid' >&2
        exit 1
    fi
    echo 'sbatch: Job 7 to start at 2030-01-01T00:00:00 using 1 processors on nodes n1' >&2
    exit 0
fi
echo 'sbatch: error: no cluster in unit tests' >&2
exit 1
"""


def test_slurms_refusal_of_an_sbatch_extra_option_names_it(tmp_path: Path) -> None:
    """Slurm's words named nothing of the job: submit went on, and sbatch failed with
    exit 1 after the note."""
    stand_in = _exe(tmp_path / "fake" / "sbatch", SBATCH_RESERVATION).parent
    env = {"PATH": f"{stand_in}:{os.environ['PATH']}"}

    def submit(*args: str) -> tuple[int, str]:
        proc = run_cli(["submit", *LOCAL, *args], cwd=tmp_path, env=env)
        return proc.returncode, proc.stderr

    code, err = submit("--sbatch-extra=--reservation=nosuch", "--", "demo")
    assert code == 2, err
    assert "train: error: sbatch_extra: " in err, err
    assert "--sbatch-extra=--reservation=nosuch" in err and "Requested reservation" in err
    assert not (tmp_path / "runs").exists()
    # without the option Slurm accepts it: submit goes on to sbatch (the stand-in's end)
    code, err = submit("--", "demo")
    assert code == 1 and "no cluster in unit tests" in err, err


def test_a_python_that_is_there_but_cannot_run_is_said_as_such(tmp_path: Path) -> None:
    """--python ./env-python (a text file, or the environment's folder) was said to be
    'not found here', which sends the user looking for a typo."""
    (tmp_path / "notes").write_text("not a python\n")
    err = _refused(tmp_path, "python", "--python", "./notes", "--", "demo")
    assert "is there but not executable" in err and "not found" not in err, err
    (tmp_path / "env").mkdir()
    err = _refused(tmp_path, "python", "--python", "./env", "--", "demo")
    assert "is a folder" in err and "bin/python" in err, err
    err = _refused(tmp_path, "python", "--python", "./nope/bin/python", "--", "demo")
    assert "is not found here" in err, err


def test_a_sweep_resubmitted_with_other_settings_names_its_name_and_seeds_once(
        tmp_path: Path) -> None:
    """The refusal named --out runs/sw/seed-1 (a flag the user never gave) and said it
    once per seed."""
    for seed in (1, 2, 3):
        run = run_cli(["run", "demo", "--out", str(tmp_path / "runs" / "sw" / f"seed-{seed}"),
                       "--episodes", "2", "--seeds", str(seed), *tiny_flags()], cwd=tmp_path)
        assert run.returncode == 0, run.stderr
    sweep = ["--name", "sw", "--sweep-seeds", "1 2 3", "--", "demo", "--episodes", "4"]
    code, err = _submit(tmp_path, *sweep, *tiny_flags(res=12))
    assert code == 2, err
    assert "train: error: name: --name sw: the folders of seeds 1, 2 and 3 (" in err, err
    assert "res: the run has 8, now 12" in err and "another --name for a new sweep" in err
    assert "--out" not in err and "also," not in err, err
    # one seed of them: said in the singular
    code, err = _submit(tmp_path, "--name", "sw", "--sweep-seeds", "2", "--", "demo",
                        "--episodes", "4", *tiny_flags(res=12))
    assert code == 2 and "--name sw: the folder of seed 2 (" in err and " holds " in err, err
    # a sweep given --out is told by its --out
    code, err = _submit(tmp_path, "--out", "runs/sw", "--sweep-seeds", "1 2", "--", "demo",
                        "--episodes", "4", *tiny_flags(res=12))
    assert code == 2 and "train: error: out: --out " in err and "seeds 1 and 2" in err, err
    # its own settings continue it
    code, err = _submit(tmp_path, *sweep, *tiny_flags())
    assert code == 1 and "no cluster in unit tests" in err, err


SBATCH_NO_NODE = """#!/bin/sh
# --test-only: no node fits, as Slurm says it for CPUs, memory or GPUs alike
echo 'sbatch: error: Batch job submission failed: Requested node configuration is not available' >&2
exit 1
"""
# sinfo -h -N -o '%R|%N|%c|%m|%G|%f|%l|%s|%P': two 2-CPU, 4000 MB nodes with 2 GPUs each
SINFO_SMALL = """#!/bin/sh
printf 'debug|n1|2|4000|gpu:2|(null)|1:00:00|1-infinite|debug*\\n'
printf 'debug|n2|2|4000|gpu:2|(null)|1:00:00|1-infinite|debug*\\n'
printf 'other|n9|64|512000|(null)|(null)|1:00:00|1-infinite|other\\n'
"""


def test_a_node_configuration_slurm_refuses_names_the_cpus_or_memory_it_lacks(
        tmp_path: Path) -> None:
    """`-c 4` on 2-CPU nodes was blamed on the GPUs ('--gpus-per-node 0'): where Slurm
    says no node fits, sinfo tells what the partition's nodes have."""
    fake = tmp_path / "fake"
    _exe(fake / "sbatch", SBATCH_NO_NODE)
    _exe(fake / "sinfo", SINFO_SMALL)
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}

    def refused(*args: str) -> str:
        proc = run_cli(["submit", *LOCAL, *args, "--", "demo"], cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stderr
        assert not (tmp_path / "runs").exists()
        return proc.stderr

    err = refused("--cpus-per-task", "4")
    assert err.startswith("train: error: cpus_per_task: Slurm refuses this job "
                          "(`sbatch --test-only`: "), err
    assert "--cpus-per-task 4, and the partition debug's nodes have at most 2 CPUs each " \
           "(sinfo; the profile says 4)" in err and "--gpus-per-node" not in err, err
    err = refused("--cpus-per-task", "1", "--mem", "6000M")
    assert err.startswith("train: error: mem: Slurm refuses this job"), err
    assert "--mem 6000M a node, and the partition debug's nodes have at most 4000M" in err
    # CPUs and memory fit: the GPUs, as before
    err = refused("--cpus-per-task", "1", "--gpus-per-node", "2")
    assert err.startswith("train: error: gpus: Slurm refuses this job"), err
    assert "--gpus-per-node 2" in err, err


def test_a_node_configuration_slurm_refuses_for_a_job_of_no_gpus_never_names_the_gpus(
        tmp_path: Path) -> None:
    """Where sinfo cannot be asked (it fails, or is not on PATH), `-c 4` of a job of no
    GPUs was still blamed on 'gpus' and '--gpus-per-node 0': its CPUs and memory are."""
    fake = tmp_path / "fake"
    _exe(fake / "sbatch", SBATCH_NO_NODE)
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    for sinfo in ("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\n"
                  "exit 1\n", None):
        if sinfo is not None:
            _exe(fake / "sinfo", sinfo)
        else:
            (fake / "sinfo").unlink()
        proc = run_cli(["submit", *LOCAL, "--cpus-per-task", "4", "--", "demo"], cwd=tmp_path,
                       env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("train: error: cpus_per_task: Slurm refuses this job"), \
            proc.stderr
        assert "--cpus-per-task 4 x 1 task(s) a node and --mem " in proc.stderr, proc.stderr
        assert "--gpus-per-node" not in proc.stderr, proc.stderr
        assert not (tmp_path / "runs").exists()


def test_accelerate_launch_runs_once_per_node_with_the_jobs_shape_or_is_refused(
        tmp_path: Path) -> None:
    """Issue 39: `-- accelerate launch` under one task per GPU would start N processes in
    each of N tasks; its own --num_processes would fight the job's; the stop signal kills
    it. What runs: one accelerate launch per node (--launch torchrun, the default)."""
    import sys

    (tmp_path / "fit.py").write_text("print(1)\n")
    acc = ["-e", "command", "-N", "2", "-g", "2"]
    accelerate = str(Path(sys.executable).with_name("accelerate"))  # the dev extra's
    err = _refused(tmp_path, "launch", *acc, "--launch", "tasks", "--", accelerate,
                   "launch", "fit.py", no_check=False)
    assert "once per node" in err and "--launch torchrun" in err, err
    err = _refused(tmp_path, "workload", *acc, "--", accelerate, "launch",
                   "--num_processes", "4", "--machine-rank=0", "fit.py", "--num_processes",
                   "9", no_check=False)
    assert "--num_processes, --machine-rank belong to the job" in err, err
    assert "2 node(s) x 2 process(es)" in err, err
    err = _refused(tmp_path, "stop_signal", *acc, "--stop-signal", "USR1", "--max-chunks",
                   "2", "--", accelerate, "launch", "fit.py", no_check=False)
    assert "--stop-mode kill" in err, err
    _passes(tmp_path, *acc, "--", accelerate, "launch", "--mixed_precision", "bf16",
            "fit.py")
    _passes(tmp_path, "-e", "command", "--", accelerate, "launch", "fit.py")
