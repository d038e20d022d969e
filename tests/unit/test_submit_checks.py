"""Issue 19: nothing the login node can check is left for the compute node. `train submit`
refuses (exit 2, the flag named, the fix and --no-check given) a job whose image, program
or Python is not what the nodes need, or whose run folder holds another run; `train
render` says the same as warnings. Issue 18: SBATCH_* variables are not passed to sbatch.

No cluster here: a stand-in `sbatch` first on PATH refuses every job (exit 1), so a
submission that passes every check ends there and nothing can be queued anywhere. Fake
`docker` programs stand in for the engine's answers (error paths only); every Python asked
is a real interpreter."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_flags
from train.client.slurm.checks import files, python, sbatchenv

NO_SBATCH = "#!/bin/sh\necho 'sbatch: error: no cluster in unit tests' >&2\nexit 1\n"
# (a later --python, --runtime in a test wins)
LOCAL = ["--cluster", "local", "--cpus-per-task", "1", "--mem", "1000M", "--python",
         sys.executable]


def _fake_sif(path: Path) -> Path:
    """A file that starts as a SIF does: its launch line, then the magic at byte 32."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0")
    path.write_bytes(head + b"SIF_MAGIC\0" + b"01\0" + b"\0" * 1024)
    return path


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _submit(tmp_path: Path, *args: str, env: dict[str, str] | None = None
            ) -> tuple[int, str]:
    stand_in = _exe(tmp_path / "sbin" / "sbatch", NO_SBATCH).parent
    path = (env or {}).get("PATH", os.environ["PATH"])
    proc = run_cli(["submit", *LOCAL, *args], cwd=tmp_path,
                   env={**(env or {}), "PATH": f"{stand_in}:{path}"})
    return proc.returncode, proc.stderr


def _render(tmp_path: Path, *args: str, env: dict[str, str] | None = None
            ) -> tuple[int, str]:
    proc = run_cli(["render", *LOCAL, *args], cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "#SBATCH" in proc.stdout, proc.stderr
    return proc.returncode, proc.stderr


def _refused(tmp_path: Path, field: str, *args: str, env: dict[str, str] | None = None,
             no_check: bool = True) -> str:
    """Exit 2 at submit naming `field`, nothing written; render warns the same."""
    code, err = _submit(tmp_path, *args, env=env)
    assert code == 2, (args, err)
    assert f"train: error: {field}: " in err, err
    if no_check:
        assert "--no-check" in err, err
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))
    _code, warned = _render(tmp_path, *args, env=env)
    assert f"train submit would refuse this: {field}: " in warned, warned
    return err


def _passes(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """No check refuses: render warns of nothing, submit goes on to sbatch."""
    _code, warned = _render(tmp_path, *args, env=env)
    assert "would refuse" not in warned, warned
    code, err = _submit(tmp_path, *args, env=env)
    assert code == 1 and "no cluster in unit tests" in err, (code, err)


# -- the image --------------------------------------------------------------------------

def test_an_image_that_is_not_there_or_not_a_sif_is_refused_with_the_fix(
        tmp_path: Path) -> None:
    app = ["--runtime", "apptainer", "--python", "python3"]
    err = _refused(tmp_path, "image", *app, "--image", "base.sif", "--", "demo")
    assert "base.sif does not exist" in err and "train image build base" in err
    (tmp_path / "half.sif").write_bytes(b"\0" * 20)  # an incomplete copy
    (tmp_path / "notes.img").write_text("not an image\n")  # not a SIF, whatever its name
    (tmp_path / "folder").mkdir()
    for image, said in (("half.sif", "is not a SIF image"), ("notes.img", "not a SIF image"),
                        ("folder", "is a directory")):
        err = _refused(tmp_path, "image", *app, "--image", image, "--", "demo")
        assert said in err, err
    err = _refused(tmp_path, "image", *app, "--image", "~/base.sif", "--", "demo")
    assert "'~' is not expanded" in err
    _fake_sif(tmp_path / "images" / "base.sif")
    _passes(tmp_path, *app, "--image", "images/base.sif", "--", "demo")
    # the escape hatch: the nodes may see what this login node does not
    code, err = _submit(tmp_path, *app, "--image", "/scratch/x.sif", "--no-check", "--",
                        "demo")
    assert code == 1 and "no cluster in unit tests" in err, err
    code, warned = _render(tmp_path, *app, "--image", "/scratch/x.sif", "--no-check", "--",
                           "demo")
    assert "refuse" not in warned


def test_a_docker_image_is_asked_of_the_engine_and_an_engine_that_does_not_answer_is_said(
        tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    docker = bin_dir / "docker"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    dock = ["--runtime", "docker", "--image", "train/base:ci", "--python", "python3"]
    _exe(docker, '#!/bin/sh\necho "Error response from daemon: No such image: $5" >&2\n'
         "exit 1\n")
    err = _refused(tmp_path, "image", *dock, "--", "demo", env=env)
    assert "has no such image" in err and "train image build base --engine docker" in err
    _exe(docker, '#!/bin/sh\necho "Cannot connect to the Docker daemon at '
         'unix:///var/run/docker.sock. Is the docker daemon running?" >&2\nexit 1\n')
    _code, warned = _render(tmp_path, *dock, "--", "demo", env=env)
    assert "could not be checked" in warned and "Cannot connect" in warned, warned
    _exe(docker, "#!/bin/sh\necho sha256:0123\n")
    _passes(tmp_path, *dock, "--", "demo", env=env)
    _code, warned = _render(tmp_path, *dock, "--", "demo", env={"PATH": str(tmp_path)})
    assert "docker is not on PATH" in warned


# -- the program -------------------------------------------------------------------------

def test_a_command_whose_program_or_script_is_not_there_is_refused(tmp_path: Path) -> None:
    cmd = ["-e", "command"]
    err = _refused(tmp_path, "workload", *cmd, "--", "python3", "fti.py", "--lr", "1")
    assert "fti.py (in " in err and "does not exist" in err
    err = _refused(tmp_path, "workload", *cmd, "--", "./run.sh")
    assert "./run.sh" in err and "does not exist" in err
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    err = _refused(tmp_path, "workload", *cmd, "--", "./run.sh")
    assert "is not executable" in err and "bash ./run.sh" in err
    (tmp_path / "run.sh").chmod(0o755)
    _passes(tmp_path, *cmd, "--", "./run.sh")
    # a typo of the interpreter: the nodes run with this PATH under --runtime none
    err = _refused(tmp_path, "workload", *cmd, "--", "pythn", "fit.py")
    assert "'pythn' is not a program on this PATH" in err
    (tmp_path / "fit.py").write_text("print(1)\n")
    _passes(tmp_path, *cmd, "--", "python3", "-u", "-W", "ignore", "fit.py")
    _passes(tmp_path, *cmd, "--", "python3", "-m", "no_such_module_checked_here")
    _passes(tmp_path, *cmd, "--", "python3", "-c", "print(1)")
    err = _refused(tmp_path, "workload", *cmd, "--", sys.executable, str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in err


def test_in_a_container_only_what_is_bound_from_the_host_is_looked_at(
        tmp_path: Path) -> None:
    sif = str(_fake_sif(tmp_path / "base.sif"))
    app = ["-e", "command", "--runtime", "apptainer", "--image", sif]
    # the image's own programs: only the nodes can look
    _passes(tmp_path, *app, "--", "/opt/conda/bin/python", "/opt/app/fit.py")
    _passes(tmp_path, *app, "--", "pythn", "/opt/app/fit.py")
    # the submit folder (apptainer keeps the working folder)
    err = _refused(tmp_path, "workload", *app, "--", "python", "scripts/fit.py")
    assert "scripts/fit.py" in err
    # a bound folder, under another name inside: looked at on the host
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    err = _refused(tmp_path, "workload", *app, "--bind", f"{code_dir}:/code", "--",
                   "python", "/code/fit.py")
    assert f"it is {code_dir}/fit.py here" in err, err
    (code_dir / "fit.py").write_text("print(1)\n")
    _passes(tmp_path, *app, "--bind", f"{code_dir}:/code", "--", "python", "/code/fit.py")


def test_a_program_after_the_dashes_without_entry_is_checked_as_a_program(
        tmp_path: Path) -> None:
    """Without -e, only a word list (python, a shell, a launcher, .sh) was taken for a
    program: uv, conda, env, julia, pypy3, a typo or a missing path got `train run`'s
    errors ("unrecognized arguments", "did you mean --res?"). Any first word that is no
    workload and no option is a program now, checked as `-e command` checks it."""
    bin_dir = tmp_path / "bin"  # the PATH the nodes get (runtime none): env and python3
    _exe(bin_dir / "env", '#!/bin/sh\nexec /usr/bin/env "$@"\n')
    (bin_dir / "python3").symlink_to(sys.executable)  # (the chain engine's)
    env = {"PATH": str(bin_dir)}
    for typed in (["uv", "run", "train.py"], ["conda", "run", "-n", "env", "python", "x.py"],
                  ["julia", "x.jl"], ["pypy3", "x.py"], ["pyhton", "x.py"]):
        err = _refused(tmp_path, "workload", "--", *typed, env=env)
        assert f"{typed[0]!r} is not a program on this PATH" in err, err
        assert "train run" not in err and "did you mean --" not in err, err
        if typed[0] == "pyhton":
            assert "a typo (did you mean python?)" in err, err
    err = _refused(tmp_path, "workload", "--", "LR=3", "python3", "fit.py", env=env)
    assert "'LR=3' is not a program on this PATH" in err and "--env LR=3" in err, err
    err = _refused(tmp_path, "workload", "--", "./missing", "--lr", "1", env=env)
    assert "./missing (in " in err and "does not exist" in err, err
    _exe(tmp_path / "fit", "#!/bin/sh\n").chmod(0o644)
    err = _refused(tmp_path, "workload", "--", "./fit", env=env)
    assert "./fit (in " in err and "is not executable" in err, err
    _passes(tmp_path, "--", "env", "X=1", sys.executable, "-c", "print(1)", env=env)
    # a name close to a workload's: both ways out
    code, err = _submit(tmp_path, "--", "dmeo", "--episodes", "3")
    assert code == 2 and "did you mean demo?" in err and "-e command -- dmeo" in err, err
    # in a container: looked up in the image, on the node; said, with a slip's likely name
    sif = str(_fake_sif(tmp_path / "base.sif"))
    app = ["--runtime", "apptainer", "--image", sif]
    for program, said in (("julia", "not checked here"),
                          ("pyhton", "not checked here (did you mean python?)")):
        _code, warned = _render(tmp_path, *app, "--", program, "/opt/app/x")
        assert f"starts {program!r}, which is looked up on the PATH inside the image, on " \
               f"the node: {said}" in warned, warned
    _code, warned = _render(tmp_path, *app, "--", "python", "/opt/app/fit.py")
    assert "looked up" not in warned, warned


def test_a_workloads_name_or_a_spaced_name_as_a_commands_program_is_said_so(
        tmp_path: Path) -> None:
    """--entry command from the defaults file with `-- demo`, and a program ' python3',
    were told only 'a typo' (' python3': 'did you mean python3?')."""
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("entry: command\n")
    err = _refused(tmp_path, "workload", "--", "demo", "--episodes", "3",
                   env={"TRAIN_DEFAULTS": str(defaults)})
    assert "demo is a `train run` workload, and this job is --entry command: give " \
        "--entry train" in err, err
    err = _refused(tmp_path, "workload", "-e", "command", "--", " python3", "x.py")
    assert "spaces around the name: 'python3'?" in err and "did you mean" not in err, err


def test_python_script_is_found_behind_the_interpreters_options() -> None:
    script = files.python_script
    assert script(["python", "fit.py", "--lr", "1"]) == "fit.py"
    assert script(["/env/bin/python3.11", "-u", "-X", "dev", "-W", "error", "a.py"]) == "a.py"
    assert script(["python", "-m", "pkg.train"]) is None
    assert script(["python", "-mpkg"]) is None
    assert script(["python3", "-c", "import x"]) is None
    assert script(["python", "-"]) is None
    assert script(["python"]) is None
    assert script(["bash", "run.sh"]) is None
    assert script(["pythonista", "a.py"]) is None


# -- --python under --runtime none -------------------------------------------------------

def _python_without(tmp_path: Path, name: str, keep_torch: bool) -> Path:
    """A real interpreter without its site-packages (so without torch, and without this
    package, which is installed there editable); keep_torch puts the site-packages folder
    back on the path as a plain folder: torch is found, this package's editable hook is
    not."""
    site = sysconfig.get_paths()["purelib"]
    path = f"PYTHONPATH={site} " if keep_torch else ""
    return _exe(tmp_path / "envs" / name, f'#!/bin/sh\n{path}exec {sys.executable} -S "$@"\n')


def test_runtime_none_with_a_python_that_has_no_torch_is_refused_with_both_ways_out(
        tmp_path: Path) -> None:
    bare = str(_python_without(tmp_path, "bare", keep_torch=False))
    none = ["--runtime", "none"]
    for job, needs in ((["--", "demo"], "`train run`"),
                       (["-N", "2", "-e", "command", "--stop-signal", "USR1", "--",
                         "/bin/true"], "torch's launcher"),
                       # issue 39: a program on one GPU without an image
                       (["-g", "1", "-e", "command", "--", "/bin/true"],
                        "a program on GPUs (-g)")):
        err = _refused(tmp_path, "python", *none, "--python", bare, *job)
        assert "cannot import torch" in err and needs in err, err
        assert "--runtime apptainer --image" in err and "--python /path/to/env" in err, err
    # torch is there, this package is not: `python -m train` would fail on the node
    torch_only = str(_python_without(tmp_path, "torch-only", keep_torch=True))
    err = _refused(tmp_path, "python", *none, "--python", torch_only, "--", "demo")
    assert "cannot import this package" in err and "pip install" in err, err
    err = _refused(tmp_path, "python", *none, "--python", "python3.999", "--", "demo")
    assert "python3.999 is not found" in err
    _passes(tmp_path, *none, "--python", sys.executable, "--", "demo")
    # a program of the user's own, one process: what it imports is its business, but
    # `train launch` starts it
    err = _refused(tmp_path, "python", *none, "--python", torch_only, "-e", "command", "--",
                   "/bin/true")
    assert "cannot import this package" in err and "train launch" in err, err
    _passes(tmp_path, *none, "-e", "command", "--", "/bin/true")


def test_a_train_py_in_the_submit_folder_is_not_taken_for_this_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the job's steps leave the working folder out of the path (a train.py there is not
    # the tool): so does the question to --python
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.resolve import resolve
    from train.common.fields import build

    (tmp_path / "train.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.chdir(tmp_path)
    torch_only = _python_without(tmp_path, "torch-only", keep_torch=True)
    spec = build(JobSpec, {"cluster": "local", "runtime": "none", "python": str(torch_only),
                           "workload": ["demo"], "cpus_per_task": 1, "mem": "1000M"}, {})
    job = resolve(spec, Registry(environ={}).get("local"))
    problems, _notes = python.python_problems(job, os.environ)
    assert [p.field for p in problems] == ["python"], problems
    assert "cannot import this package" in problems[0].text


# -- the run folder ----------------------------------------------------------------------

def test_a_run_folder_of_the_same_name_with_other_settings_is_refused_at_submit(
        tmp_path: Path) -> None:
    run = run_cli(["run", "demo", "--out", str(tmp_path / "runs" / "e1"), "--episodes", "2",
                   *tiny_flags()], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    job = ["--name", "e1", "--python", sys.executable, "--", "demo", "--episodes", "50"]
    changed = [*job[:-4], "--", "demo", "--episodes", "50", *tiny_flags(res=12, lr=0.01)]
    code, err = _submit(tmp_path, *changed)
    assert code == 2, err
    assert "train: error: name: --name e1: " in err, err
    assert "res: the run has 8, now 12" in err and "lr: the run has" in err, err
    assert "another --name" in err and "--no-check" not in err
    _code, warned = _render(tmp_path, *changed)
    assert "would refuse this: name:" in warned
    # the same settings continue it (more episodes are not another run)
    _passes(tmp_path, *job[:-4], "--", "demo", "--episodes", "50", *tiny_flags())
    # --out names the folder: the message names --out
    code, err = _submit(tmp_path, "--out", "runs/e1", *changed[2:])
    assert code == 2 and "train: error: out: --out runs/e1: " in err, err


@pytest.mark.parametrize("entry", [["--", "demo"], ["-e", "command", "--", "true"]])
def test_an_out_that_holds_the_users_files_and_no_run_is_refused(
        tmp_path: Path, entry: list[str]) -> None:
    """`--out .` in a project folder (here --out project): its jobs/chain.sbatch was
    replaced and its COMPLETE deleted ("left by an earlier run": it was not). Nothing
    there is touched; a new or empty folder, and a folder of an earlier chain, go on as
    before."""
    mine = tmp_path / "project"  # (the test's cwd holds the sbatch stand-in)
    (mine / "jobs").mkdir(parents=True)
    (mine / "jobs" / "chain.sbatch").write_text("#!/bin/bash\n# my own\n")
    (mine / "COMPLETE").write_text("my marker\n")
    code, err = _submit(tmp_path, "--out", "project", *entry)
    assert code == 2, err
    assert "train: error: out: --out project: " in err and "COMPLETE, jobs" in err, err
    assert "give a new or empty folder (e.g. --out project/" in err, err
    assert "left by" not in err and "--no-check" not in err, err
    _code, warned = _render(tmp_path, "--out", "project", *entry)
    assert "would refuse this: out: --out project" in warned, warned
    assert "left by" not in warned, warned
    assert (mine / "jobs" / "chain.sbatch").read_text() == "#!/bin/bash\n# my own\n"
    assert (mine / "COMPLETE").read_text() == "my marker\n"
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == [
        "COMPLETE", "jobs", "jobs/chain.sbatch"]
    (tmp_path / "empty").mkdir()
    _passes(tmp_path, "--out", "empty", *entry)
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "chain.json").write_text(json.dumps(
        {"name": "x", "entry": "train" if entry[0] == "--" else "command"}))
    (tmp_path / "earlier" / "COMPLETE").touch()
    _passes(tmp_path, "--out", "earlier", *entry)


def test_a_folder_of_another_entry_is_refused_naming_both(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "train"
    run_dir.mkdir(parents=True)
    (run_dir / "chain.json").write_text(json.dumps({"name": "train", "entry": "train"}))
    (tmp_path / "t.py").write_text("print(1)\n")
    code, err = _submit(tmp_path, "-e", "command", "--", "python3", "t.py")
    assert code == 2, err
    assert "--name train: " in err and "--entry train" in err and "--entry command" in err
    assert (run_dir / "chain.json").is_file()


def test_a_complete_marker_left_in_the_folder_is_announced(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "cmd"
    run_dir.mkdir(parents=True)
    (run_dir / "COMPLETE").touch()
    _code, warned = _render(tmp_path, "--name", "cmd", "-e", "command", "--", "/bin/true")
    assert f"{run_dir}/COMPLETE was left by an earlier run: train submit clears it" in warned


# -- SBATCH_* ----------------------------------------------------------------------------

def test_sbatch_variables_are_named_with_the_flag_to_give_and_not_passed_on() -> None:
    env = {"SBATCH_TIMELIMIT": "3", "SBATCH_PARTITION": "gpu", "SBATCH_ACCOUNT": "lab",
           "SBATCH_QOS": "normal", "SBATCH_RESERVATION": "r1", "SBATCH_EXCLUSIVE": "",
           "SBATCH_EXPORT": "NONE", "SLURM_CLUSTERS": "c2", "SBATCH_ARRAY_INX": "1-3", "SALLOC_PARTITION": "x",
           "SLURM_JOB_ID": "77", "SLURM_CONF": "/etc/slurm/slurm.conf", "HOME": "/h"}
    notes = "\n".join(sbatchenv.sbatch_variable_notes(env))
    for name, said in (("SBATCH_TIMELIMIT=3", "give --time instead"),
                       ("SBATCH_PARTITION=gpu", "give --partition instead"),
                       ("SBATCH_ACCOUNT=lab", "give --account instead"),
                       ("SBATCH_QOS=normal", "give --qos instead"),
                       ("SBATCH_RESERVATION=r1", "--sbatch-extra=--reservation=VALUE"),
                       ("SBATCH_EXCLUSIVE=", "--sbatch-extra=--exclusive"),
                       ("SBATCH_EXPORT=NONE", "give --env instead"),
                       ("SBATCH_ARRAY_INX=1-3", "the job sets --array itself"),
                       ("SLURM_CLUSTERS=c2", "the job sets --clusters itself: cluster (")):
        line = next((x for x in notes.splitlines() if x.startswith(name)), "")
        assert said in line and "not passed to sbatch" in line, (name, notes)
    assert "SALLOC_" not in notes and "SLURM_JOB_ID" not in notes
    assert sbatchenv.sbatch_environment(env) == {"SLURM_CONF": "/etc/slurm/slurm.conf",
                                                   "HOME": "/h"}


def test_submit_warns_of_each_sbatch_variable(tmp_path: Path) -> None:
    _code, err = _submit(tmp_path, "--python", sys.executable, "--time", "10", "--", "demo",
                        env={"SBATCH_TIMELIMIT": "3", "SBATCH_QOS": "x"})
    assert "SBATCH_TIMELIMIT=3 is not passed to sbatch" in err and "--time" in err, err
    assert "SBATCH_QOS=x is not passed to sbatch" in err, err


def test_the_escape_hatch_is_in_the_help() -> None:
    for command in ("render", "submit"):
        proc = run_cli([command, "--help"])
        assert "--no-check" in proc.stdout, proc.stdout


# chunk 1's sbatch that fails after the controller took the job (its reply lost: "Socket
# timed out", or sbatch killed at train's timeout): the held job stayed queued, unseen by
# any chain and never released. These stand-ins play the controller: sbatch queues the
# job (a line 'ID COMMAND' in the queue file) and fails; squeue lists the queue; scancel
# records what it cancels.
LOST_REPLY_SBATCH = """#!/bin/sh
case " $* " in *" --test-only "*) echo "sbatch: Job 1 to start at now" >&2; exit 0 ;; esac
while [ "${1#-}" != "$1" ]; do shift; done
echo "4242 $*" >> "$QUEUE"
echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
exit 1
"""
QUEUE_SQUEUE = """#!/bin/sh
echo "4100 /elsewhere/other.sh 1"
cat "$QUEUE" 2>/dev/null
"""
RECORD_SCANCEL = """#!/bin/sh
echo "$*" >> "$CANCELLED"
"""


def _queue_stand_ins(tmp_path: Path, sbatch: str, squeue: str
                     ) -> tuple[dict[str, str], Path, Path]:
    """sbatch, squeue and scancel stand-ins sharing a queue file (QUEUE) and a file of the
    ids cancelled (CANCELLED): the environment to run submit with, and those two files."""
    stand_ins = tmp_path / "sbin"
    _exe(stand_ins / "sbatch", sbatch)
    _exe(stand_ins / "squeue", squeue)
    _exe(stand_ins / "scancel", RECORD_SCANCEL)
    queue, cancelled = tmp_path / "queue", tmp_path / "cancelled"
    return ({"PATH": f"{stand_ins}:{os.environ['PATH']}", "QUEUE": str(queue),
             "CANCELLED": str(cancelled)}, queue, cancelled)


def test_a_lost_sbatch_reply_of_chunk_1_leaves_no_held_job(tmp_path: Path) -> None:
    env, _, cancelled = _queue_stand_ins(tmp_path, LOST_REPLY_SBATCH, QUEUE_SQUEUE)
    proc = run_cli(["submit", *LOCAL, "--name", "lost", "--no-check", "--", "demo"],
                   cwd=tmp_path, env=env)
    assert proc.returncode != 0 and "Socket timed out" in proc.stderr, proc.stderr
    assert cancelled.exists() and cancelled.read_text().split() == ["4242"], proc.stderr
    assert not (tmp_path / "runs" / "lost" / "chain.json").exists()


# chunk 1's sbatch interrupted (TERM, a dropped ssh's HUP, Ctrl-C) while a busy controller
# had queued the job and not yet answered: this sbatch queues the job, then waits on an
# answer that does not come.
SLOW_REPLY_SBATCH = """#!/bin/sh
case " $* " in *" --test-only "*) echo "sbatch: Job 1 to start at now" >&2; exit 0 ;; esac
while [ "${1#-}" != "$1" ]; do shift; done
echo "4242 $*" >> "$QUEUE"
exec sleep 600
"""


@pytest.mark.parametrize(("sig", "squeue"), [
    pytest.param("SIGTERM", QUEUE_SQUEUE, id="term"),
    pytest.param("SIGHUP", QUEUE_SQUEUE, id="hup"),
    pytest.param("SIGINT", "#!/bin/sh\nexit 1\n", id="ctrl-c-and-no-squeue")])
def test_an_interrupted_submit_leaves_no_held_job_or_names_it(
        tmp_path: Path, sig: str, squeue: str) -> None:
    import signal
    import subprocess

    stand_ins, queue, cancelled = _queue_stand_ins(tmp_path, SLOW_REPLY_SBATCH, squeue)
    env = {**os.environ, **stand_ins}
    # Ctrl-C as a terminal gives it: a suite run as a background job of a shell without job
    # control inherits SIGINT ignored, and submit would never see the interrupt
    proc = subprocess.Popen([sys.executable, "-m", "train", "submit", *LOCAL, "--name", "cut",
                             "--no-check", "--", "demo"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for _ in range(1200):  # until the controller holds the job
            if queue.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert queue.exists(), proc.communicate()
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    script = queue.read_text().split()[1]
    if squeue is QUEUE_SQUEUE:  # Slurm answers: the job is found by its script, cancelled
        assert cancelled.read_text().split() == ["4242"], err
        assert "Slurm had queued the job (4242): cancelling it" in err, err
    else:  # Slurm cannot be asked: the user is told exactly what to find and cancel
        assert not cancelled.exists()
        assert f"held in the queue (it never starts) running {script} 1" in err, err
        assert "scancel ID" in err, err
    assert not (tmp_path / "runs" / "cut" / "chain.json").exists()


# a site's sbatch wrapper that ignores --parsable: the job is queued, its answer no id
WORDY_SBATCH = """#!/bin/sh
case " $* " in *" --test-only "*) echo "sbatch: Job 1 to start at now" >&2; exit 0 ;; esac
while [ "${1#-}" != "$1" ]; do shift; done
echo "4242 $*" >> "$QUEUE"
echo "Submitted batch job 4242"
"""


@pytest.mark.parametrize("squeue", [QUEUE_SQUEUE, "#!/bin/sh\nexit 1\n"])
def test_an_sbatch_answer_without_a_job_id_leaves_no_held_job_or_names_it(
        tmp_path: Path, squeue: str) -> None:
    """It was said as 'sbatch was interrupted before it answered' (nothing was)."""
    env, queue, cancelled = _queue_stand_ins(tmp_path, WORDY_SBATCH, squeue)
    proc = run_cli(["submit", *LOCAL, "--name", "wordy", "--no-check", "--", "demo"],
                   cwd=tmp_path, env=env)
    assert proc.returncode != 0 and "cannot read a job id" in proc.stderr, proc.stderr
    assert "interrupted" not in proc.stderr, proc.stderr
    if squeue is QUEUE_SQUEUE:
        assert cancelled.read_text().split() == ["4242"], proc.stderr
    else:
        script = queue.read_text().split()[1]
        assert "sbatch answered without a job id; if Slurm took the job anyway, it is held " \
            f"in the queue (it never starts) running {script} 1" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs" / "wordy" / "chain.json").exists()


def test_a_partitions_gpus_the_image_has_no_code_for_are_refused_at_submit(
        tmp_path: Path) -> None:
    """Issue 20: the CUDA 13 image (its lock's torch carries sm_75 and up) on Gilbreth's
    V100 partition is exit 2 naming the variant, before anything is queued; the cu128
    variant passes this check. The image's labels come from `apptainer inspect` (a stand-in
    here: apptainer cannot be installed on our machines)."""
    sif = _fake_sif(tmp_path / "img" / "base.sif")
    tools = tmp_path / "tools"

    def apptainer(lock: str) -> dict[str, str]:
        labels = {"org.train.image": "base", "org.train.lock": lock}
        inspect = json.dumps({"data": {"attributes": {"labels": labels}}, "type": "container"})
        _exe(tools / "apptainer", f"#!/bin/sh\n[ \"$1\" = inspect ] && cat <<'X'\n{inspect}\nX\n"
             "exit 0\n")
        return {"PATH": f"{tools}:{os.environ['PATH']}"}

    job = ["--cluster", "gilbreth", "-A", "lab", "-q", "standby", "-p", "v100", "-g", "1",
           "--runtime", "apptainer", "--image", str(sif), "--", "demo"]
    env = apptainer("base-cu130.txt")
    proc = run_cli(["submit", *job], cwd=tmp_path,
                   env={**env, "PATH": f"{_exe(tmp_path / 'sbin' / 'sbatch', NO_SBATCH).parent}"
                                       f":{env['PATH']}"})
    assert proc.returncode == 2, proc.stderr
    assert "train: error: image: " in proc.stderr and "v100 (sm_70)" in proc.stderr
    assert "base-cu128.txt" in proc.stderr and "--no-check" in proc.stderr
    assert not (tmp_path / "runs").exists()
    env = apptainer("base-cu128.txt")
    proc = run_cli(["render", *job], cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "sm_70" not in proc.stderr, proc.stderr
