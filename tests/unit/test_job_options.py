"""Job options for any program: env, binds, stop signal, escape hatches, --mem 0, the
defaults file and `train init`, and a CLI that never guesses (no prefix matching)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_cli
from tests.golden.cases import script_step
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import render, step_argv
from train.client.slurm.resolve import resolve
from train.common.errors import ConfigError

REG = Registry(environ={})
LOCAL = dict(cluster="local", cpus_per_task=1, mem="1000M", runtime="none")


def _resolve(**kw: Any) -> Any:
    spec = JobSpec(**{**LOCAL, **kw})
    return resolve(spec, REG.get(spec.cluster or "local"))


def _error(field: str, **kw: Any) -> str:
    with pytest.raises(ConfigError) as err:
        _resolve(**kw)
    assert err.value.field == field, str(err.value)
    return str(err.value)


def _script(**kw: Any) -> str:
    return render(_resolve(**kw))


# -- env -------------------------------------------------------------------------------

@pytest.mark.parametrize("item", ["1ABC", "A B", "A-B", "=x", "", "A.B=1"])
def test_a_bad_env_name_is_refused(item: str) -> None:
    assert "not a variable name" in _error("env", env=(item,), workload=("demo",))


def test_a_passed_through_name_never_has_its_value_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SECRET_TOKEN", "s3cr3t-value")
    text = _script(env=("MY_SECRET_TOKEN", "LR=0.1"), runtime="apptainer", image="/x.sif",
                   entry="command", workload=("python", "fit.py"))
    assert "s3cr3t-value" not in text
    assert "MY_SECRET_TOKEN" in text  # by name, in TRAIN_ENV_NAMES
    # set values reach apptainer by name too: its --env parser splits values on ',' and '='
    assert "--env" not in script_step(text)
    assert "export PYTHONUNBUFFERED=1" in text and " LR=0.1 " in text
    names = shlex.split(text.split("TRAIN_ENV_NAMES=")[1].split("\n")[0])[0].split()
    assert "LR" in names and "PYTORCH_CUDA_ALLOC_CONF" in names


def test_a_pythonpath_value_is_accepted(tmp_path: Path) -> None:
    """Issue 19: --env PYTHONPATH=/scratch/fork was refused, so a fork (the field notes'
    Hydra-MDP) could not be put on the path. It is no secret and no name the job owns."""
    text = _script(env=("PYTHONPATH=/scratch/fork", "HF_HOME=/scratch/hf"),
                   runtime="apptainer", image="/x.sif", entry="command",
                   workload=("python", "fit.py"))
    assert " PYTHONPATH=/scratch/fork " in text
    names = shlex.split(text.split("TRAIN_ENV_NAMES=")[1].split("\n")[0])[0].split()
    assert "PYTHONPATH" in names  # into the container by name
    assert "PYTHONHOME" in _error("env", env=("PYTHONHOME=/x",), workload=("demo",))
    proc = run_cli(["render", "-M", "local", "--runtime", "none", "--env",
                    "PYTHONPATH=/scratch/fork", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 0 and "PYTHONPATH=/scratch/fork" in proc.stdout, proc.stderr


def test_profile_env_names_are_passed_through(tmp_path: Path) -> None:
    profile = tmp_path / "site.yaml"
    profile.write_text("name: site\nextends: local\nenv: [MYLAB_*, SCRATCH]\n")
    reg = Registry([profile], environ={})
    job = resolve(JobSpec(cluster="site", cpus_per_task=1, mem="1000M", runtime="none"),
                  reg.get("site"))
    assert "MYLAB_*" in job.env_names and "SCRATCH" in job.env_names
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nextends: local\nenv: ['A B']\n")
    with pytest.raises(ConfigError):
        Registry([bad], environ={}).get("bad")


# -- binds -----------------------------------------------------------------------------

def test_binds_reach_every_container_runtime(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for runtime, flag in (("apptainer", "--bind"), ("docker", "-v")):
        job = _resolve(runtime=runtime, image="img", bind=(f"{data}:/data:ro", str(data)),
                       workload=("demo",))
        argv = step_argv(job)
        pairs = {argv[i + 1] for i, a in enumerate(argv) if a == flag}
        assert f"{data}:/data:ro" in pairs
        assert (str(data) if runtime == "apptainer" else f"{data}:{data}") in pairs


@pytest.mark.parametrize(("item", "message"), [
    ("/does/not/exist", "does not exist"),
    ("/tmp:data", "must be an absolute path"),
    ("/tmp:/data:rx", "mode must be ro or rw"),
    ("/tmp:/a:ro:x", "is not SRC"),
    ("/tmp,/etc", "cannot be bound"),
])
def test_a_bad_bind_is_refused(item: str, message: str) -> None:
    assert message in _error("bind", runtime="apptainer", image="x.sif", bind=(item,),
                             workload=("demo",))


def test_runtime_none_cannot_move_a_path() -> None:
    assert "runtime none" in _error("bind", bind=("/tmp:/data",), workload=("demo",))


def test_navsim_data_is_bound_where_the_image_expects_it(tmp_path: Path) -> None:
    job = _resolve(entry="navsim", runtime="apptainer", image="n.sif", data=str(tmp_path),
                   workload=())
    assert f"{tmp_path}:/data/navsim" in job.binds
    host = _resolve(entry="navsim", data=str(tmp_path), workload=())
    assert dict(host.env_values)["OPENSCENE_DATA_ROOT"] == f"{tmp_path}/dataset"
    assert "is not a directory" in _error("data", entry="navsim", data=str(tmp_path / "no"),
                                          workload=())
    assert "--entry navsim" in _error("data", data=str(tmp_path), workload=("demo",))


# -- the stop signal and chunks of programs --------------------------------------------

def test_a_command_defaults_to_one_chunk_without_a_stop_signal() -> None:
    job = _resolve(entry="command", workload=("python", "fit.py"))
    assert job.stop == "none" and job.chunks == 1
    text = _script(entry="command", workload=("python", "fit.py"))
    assert "--signal" not in text.split("set -euo")[0]
    assert "stop_signal=none" in text and "max_chunks=1 " in text


def test_chunked_commands_need_a_stop_signal() -> None:
    message = _error("max_chunks", entry="command", max_chunks=3, stop_signal="none",
                     workload=("python", "fit.py"))
    assert "--stop-signal USR1" in message
    job = _resolve(entry="command", max_chunks=3, stop_signal="USR1",
                   workload=("python", "fit.py"))
    assert job.chunks == 3


def test_a_bad_stop_signal_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        JobSpec(stop_signal="KILL")
    assert err.value.field == "stop_signal" and "USR1, TERM, none" in str(err.value)


@pytest.mark.parametrize(("launch", "runtime", "via"), [
    ("tasks", "none", "scancel"), ("tasks", "apptainer", "scancel"),
    ("tasks", "docker", "usr1")])
def test_a_term_stop_signal_takes_the_route_that_keeps_srun_alive(
        launch: str, runtime: str, via: str) -> None:
    text = _script(entry="command", stop_signal="TERM", max_chunks=2, nodes=2, launch=launch,
                   runtime=runtime, image="img" if runtime != "none" else None,
                   workload=("python", "fit.py"))
    assert f"stop_via={via}" in text and "#SBATCH --signal=B:USR1@" in text


def test_term_is_refused_under_torchrun_with_the_reason() -> None:
    message = _error("stop_signal", entry="command", stop_signal="TERM", max_chunks=2,
                     nodes=2, workload=("python", "fit.py"))
    assert "Use USR1" in message and "--launch tasks" in message


def test_torchrun_runs_any_program_verbatim() -> None:
    job = _resolve(entry="command", nodes=2, gpus_per_node=2, cpus_per_task=2,
                   workload=("python", "my train.py", "--lr", "0.1"))
    assert job.launch == "torchrun"
    argv = step_argv(job)
    assert argv[len(argv) - argv[::-1].index("--"):] == ["python", "my train.py", "--lr",
                                                          "0.1"]
    assert "--mode=torchrun" in argv and "--nproc-per-node=2" in argv


def test_torchrun_with_several_tasks_per_node_is_refused() -> None:
    assert "one task per node" in _error("ntasks_per_node", entry="command", launch="torchrun",
                                         nodes=2, ntasks_per_node=2,
                                         workload=("python", "x.py"))


def test_gpu_jobs_train_on_the_gpu_or_stop() -> None:
    job = _resolve(gpus_per_node=1, workload=("demo",))
    argv = step_argv(job)
    assert argv[argv.index("--device") + 1] == "cuda"
    assert "--device" not in step_argv(_resolve(workload=("demo",)))


# -- escape hatches ----------------------------------------------------------------------

def test_extra_options_are_rendered_in_one_place() -> None:
    text = _script(sbatch_extra=("--reservation=ml day", "--exclusive"),
                   srun_extra=("--mpi=none",), workload=("demo",))
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert header[-2:] == ['#SBATCH --reservation="ml day"', "#SBATCH --exclusive"]
    assert "    --mpi=none" in text


@pytest.mark.parametrize(("item", "field", "use"), [
    ("--time=10", "sbatch_extra", "time"), ("--nod=2", "sbatch_extra", "nodes"),
    ("--parti=x", "sbatch_extra", "partition"), ("--depend=afterok:1", "sbatch_extra", "chain"),
    ("--hold", "sbatch_extra", "held"), ("--kill-on=0", "srun_extra", "set by the job"),
    ("--gres=gpu:1", "sbatch_extra", "gpus_per_node"), ("--signal=USR1@60", "sbatch_extra",
                                                          "stop_signal"),
    ("--output=x", "sbatch_extra", "out"), ("--nodes=3", "srun_extra", "nodes"),
    ("--kill-on-bad-exit=0", "srun_extra", "failed rank"),
])
def test_options_the_job_sets_are_refused_naming_the_field(item: str, field: str,
                                                           use: str) -> None:
    with pytest.raises(ConfigError) as err:
        JobSpec(**{field: (item,)})
    assert err.value.field == field and use in str(err.value)


@pytest.mark.parametrize("item", ["reservation=x", "--reservation x", "--a=b\n#SBATCH -x",
                                  "-N2", "-Hpx", "-vN3", "--", "--x"])
def test_malformed_extra_options_are_refused(item: str) -> None:
    with pytest.raises(ConfigError):
        JobSpec(sbatch_extra=(item,))


# -- memory ------------------------------------------------------------------------------

def test_mem_0_is_all_of_the_nodes_memory_as_slurm_reads_it() -> None:
    job = _resolve(mem="0", workload=("demo",))
    assert job.whole_node_mem and job.mem_mb == 8000  # checked as the node's memory
    assert "#SBATCH --mem=0\n" in _script(mem="0", workload=("demo",))
    message = _error("workers", mem="0", workers=3, worker_mem="4G", workload=("demo",))
    assert "8000M" in message


def test_zero_worker_memory_is_refused() -> None:
    _error("worker_mem", workers=1, worker_mem="0", workload=("demo",))


# -- the CLI never guesses ----------------------------------------------------------------

def test_a_flag_prefix_is_not_taken_for_the_flag(tmp_path: Path) -> None:
    proc = run_cli(["render", "--cluster", "local", "--gpus", "4", "--", "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 2
    assert "--gpus" in proc.stderr and "did you mean --gpus-per-node" in proc.stderr
    assert "#SBATCH" not in proc.stdout


def test_a_misspelled_flag_gets_the_nearest_one(tmp_path: Path) -> None:
    proc = run_cli(["submit", "--cluster", "local", "--max-chunk", "3", "--", "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean --max-chunks" in proc.stderr
    proc = run_cli(["run", "--episodez", "3"], cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean --episodes" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_short_flags_make_a_two_node_ddp_job(tmp_path: Path) -> None:
    argv = ["render", "-M", "local", "-N", "2", "-g", "2", "-e", "command", "--", "python",
            "train.py"]
    proc = run_cli(argv, cwd=tmp_path)  # torch's launcher, and no runtime or image
    assert proc.returncode == 2 and "--runtime apptainer --image" in proc.stderr
    proc = run_cli([*argv[:-3], "--runtime", "none", *argv[-3:]], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout and "--mode=torchrun" in proc.stdout


def test_an_empty_program_is_refused(tmp_path: Path) -> None:
    proc = run_cli(["submit", "--cluster", "local", "--entry", "command", "--"],
                   cwd=tmp_path)
    assert proc.returncode == 2 and "workload" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_no_cluster_anywhere_lists_the_profiles(tmp_path: Path) -> None:
    proc = run_cli(["render", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2
    for name in ("gilbreth", "local", "rivanna", "torch", "train init"):
        assert name in proc.stderr


# -- defaults and `train init` --------------------------------------------------------------

def test_defaults_are_used_and_flags_beat_them(tmp_path: Path,
                                               _own_defaults: Path) -> None:
    proc = run_cli(["init", "--cluster", "local", "--runtime", "none", "--env",
                    "WANDB_API_KEY", "--bind", "/tmp"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load(_own_defaults.read_text())
    assert saved == {"cluster": "local", "runtime": "none", "bind": ["/tmp"],
                     "env": ["WANDB_API_KEY"]}
    proc = run_cli(["render", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=debug" in proc.stdout and "WANDB_API_KEY" in proc.stdout
    job = tmp_path / "job.yaml"
    job.write_text("cluster: gilbreth\naccount: lab\npartition: a30\nqos: standby\n"
                   "gpus_per_node: 1\n")
    proc = run_cli(["render", str(job), "--", "demo"], cwd=tmp_path)  # the file beats it
    assert proc.returncode == 0 and "#SBATCH --partition=a30" in proc.stdout, proc.stderr
    job.write_text("name: fromfile\n")
    proc = run_cli(["render", str(job), "--name", "fromflag", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 0 and "#SBATCH --job-name=fromflag" in proc.stdout


def test_init_keeps_what_it_is_not_told_and_refuses_bad_values(
        tmp_path: Path, _own_defaults: Path) -> None:
    assert run_cli(["init", "--cluster", "local"], cwd=tmp_path).returncode == 0
    assert run_cli(["init", "--account", "lab"], cwd=tmp_path).returncode == 0
    assert yaml.safe_load(_own_defaults.read_text()) == {"cluster": "local", "account": "lab"}
    before = _own_defaults.read_text()
    for bad in (["--cluster", "nowhere"], ["--env", "1ABC"], ["--runtime", "podman"]):
        proc = run_cli(["init", *bad], cwd=tmp_path)
        assert proc.returncode == 2, (bad, proc.stderr)
    assert _own_defaults.read_text() == before  # nothing half-written
    proc = run_cli(["init", "--show"], cwd=tmp_path)
    assert str(_own_defaults) in proc.stdout and "account: lab" in proc.stdout


def test_a_bad_defaults_file_is_named(tmp_path: Path, _own_defaults: Path) -> None:
    _own_defaults.write_text("clustr: local\n")
    proc = run_cli(["render", "--cluster", "local", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2 and str(_own_defaults) in proc.stderr
    assert "clustr" in proc.stderr


def test_init_asks_on_a_terminal(tmp_path: Path, _own_defaults: Path) -> None:
    from train.client.defaults import ask, write_defaults

    answers = iter(["local", "", "", "apptainer", "/x.sif", "", "/tmp, /var", "HF_HOME"])
    values = ask(["local"], {"account": "lab"}, read=lambda prompt: next(answers))
    write_defaults(values, ["local"], _own_defaults)
    assert yaml.safe_load(_own_defaults.read_text()) == {
        "account": "lab", "cluster": "local", "runtime": "apptainer", "image": "/x.sif",
        "bind": ["/tmp", "/var"], "env": ["HF_HOME"]}


def test_init_changes_only_its_lines_keeps_a_copy_and_writes_through_a_link(
        tmp_path: Path, _own_defaults: Path) -> None:
    # a dotfiles user: the defaults file is a link into their dotfiles, commented
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    mine = dotfiles / "train-defaults.yaml"
    text = ("# my lab's settings\ncluster: local   # the test cluster\n"
            "#partition: gpu  (for the big runs)\npartition: debug\n\n"
            "env:\n- WANDB_API_KEY  # never in a job file\n# image: /old.sif\n")
    mine.write_text(text)
    _own_defaults.symlink_to(mine)
    proc = run_cli(["init", "--partition", "debug", "--account", "lab"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _own_defaults.is_symlink() and _own_defaults.resolve() == mine
    assert mine.read_text() == text + "account: lab\n"  # only the new line
    assert f"the earlier file is kept as {mine}.1" in proc.stdout, proc.stdout
    assert Path(f"{mine}.1").read_text() == text
    proc = run_cli(["init", "--cluster", "gilbreth", "--partition", "a30", "--account",
                    "lab"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert mine.read_text() == text.replace("cluster: local   # the test cluster",
                                            "cluster: gilbreth").replace(
        "partition: debug", "partition: a30") + "account: lab\n"
    assert Path(f"{mine}.2").read_text() == text + "account: lab\n"
    assert yaml.safe_load(mine.read_text()) == {"cluster": "gilbreth", "partition": "a30",
                                                "env": ["WANDB_API_KEY"], "account": "lab"}


def test_init_through_a_dangling_link_creates_nothing(tmp_path: Path,
                                                      _own_defaults: Path) -> None:
    _own_defaults.symlink_to(tmp_path / "gone" / "defaults.yaml")
    proc = run_cli(["init", "--cluster", "local"], cwd=tmp_path)
    assert proc.returncode == 2 and "is a link to" in proc.stderr, proc.stderr
    assert not (tmp_path / "gone").exists() and _own_defaults.is_symlink()


# -- what a hostile user tried ------------------------------------------------------------

def test_list_flags_repeat_on_the_command_line(tmp_path: Path) -> None:
    proc = run_cli(["render", "-M", "local", "--runtime", "none", "--env", "FOO", "--env",
                    "LR=1", "--bind",
                    "/tmp", "--sbatch-extra=--exclude=n1", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --exclude=n1" in proc.stdout and " LR=1 " in proc.stdout
    assert "FOO" in proc.stdout.split("TRAIN_ENV_NAMES=")[1].split("\n")[0]


def test_a_command_entry_without_a_program_is_refused(tmp_path: Path) -> None:
    for argv in (["-e", "command"], ["-e", "command", "--", ""]):
        proc = run_cli(["render", "-M", "local", *argv], cwd=tmp_path)
        assert proc.returncode == 2 and "workload" in proc.stderr, (argv, proc.stdout)


def test_stop_signal_none_from_a_flag_is_honoured(tmp_path: Path) -> None:
    proc = run_cli(["render", "-M", "local", "--runtime", "none", "--stop-signal", "none",
                    "--", "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 0 and "stop_signal=none" in proc.stdout
    assert "#SBATCH --signal" not in proc.stdout


@pytest.mark.parametrize("item", ["SLURM_JOB_ID=5", "PATH=/x", "TRAIN_RUN_DIR=/x",
                                  "BASH_ENV=/x", "RANK=0", "LD_PRELOAD=/x.so"])
def test_names_the_job_owns_cannot_be_given_values(item: str) -> None:
    assert "cannot be given a value" in _error("env", env=(item,), workload=("demo",))


def test_bind_destinations_are_checked(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    kw = dict(runtime="apptainer", image="x.sif", workload=("demo",))
    assert "two binds" in _error("bind", bind=(f"{a}:/d", f"{b}:/d"), **kw)
    assert "whole file system" in _error("bind", bind=(f"{a}:/",), **kw)
    assert "run directory" in _error("bind", bind=(f"{a}:{tmp_path}/runs:ro",),
                                     out=str(tmp_path / "runs" / "x"), **kw)
    assert "read-only" in _error("bind", bind=(f"{a}:{a}:ro",), workload=("demo",))
    assert "':'" in _error("bind", bind=(f"{a}/with:colon",), **kw)


@pytest.mark.parametrize(("dst", "said"), [
    ("/proc", "mounts its own /proc"), ("/sys/fs/x", "mounts its own /sys"),
    ("/dev", "mounts its own /dev"), ("/dev/shm", "mounts its own /dev"),
    ("//proc", "mounts its own /proc"), ("/usr/", "hides the image's own /usr"),
    ("/.singularity.d", "mounts its own /.singularity.d"),
    ("/usr", "hides the image's own /usr"), ("/etc", "hides the image's own /etc"),
    ("/lib64", "hides the image's own /lib64")])
def test_a_bind_over_what_the_container_runs_on_is_refused(
        tmp_path: Path, dst: str, said: str) -> None:
    """--bind X:/proc was accepted under Apptainer: the container then failed to start
    on the node, after the queue wait, or ran without its devices or its own Python."""
    for runtime in ("apptainer", "docker"):
        err = _error("bind", runtime=runtime, image="x.sif", bind=(f"{tmp_path}:{dst}",),
                     workload=("demo",))
        assert said in err and f"{tmp_path}:/" in err, err
    # a folder of its own under them, and other places, stay allowed
    for ok in ("/usr/local/data", "/etc-data", "/data", "/opt/app", "/devices"):
        _resolve(runtime="apptainer", image="x.sif", bind=(f"{tmp_path}:{ok}",),
                 workload=("demo",))


def test_a_bind_over_the_images_opt_is_refused(tmp_path: Path) -> None:
    """--bind /opt (the host's /opt at /opt) hid the image's /opt/venv, its Python: the
    job died on the node after the queue wait. A folder of its own under /opt stays."""
    for runtime in ("apptainer", "docker"):
        err = _error("bind", runtime=runtime, image="x.sif", bind=(f"{tmp_path}:/opt/",),
                     workload=("demo",))
        assert "hides the image's own /opt" in err, err
    _resolve(runtime="apptainer", image="x.sif", bind=(f"{tmp_path}:/opt/data",),
             workload=("demo",))


def test_lists_add_up_from_defaults_file_and_flags(tmp_path: Path,
                                                   _own_defaults: Path) -> None:
    _own_defaults.write_text("cluster: local\nruntime: none\nenv: [WANDB_API_KEY]\n")
    job = tmp_path / "job.yaml"
    job.write_text("env: [LR=1]\n")
    proc = run_cli(["render", str(job), "--env", "SEED=3", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "WANDB_API_KEY" in proc.stdout and " LR=1 " in proc.stdout
    assert " SEED=3 " in proc.stdout
    assert run_cli(["init", "--env", "HF_TOKEN"], cwd=tmp_path).returncode == 0
    assert yaml.safe_load(_own_defaults.read_text())["env"] == ["WANDB_API_KEY", "HF_TOKEN"]


def test_init_refuses_what_cannot_be_a_default(tmp_path: Path, _own_defaults: Path) -> None:
    proc = run_cli(["init"], cwd=tmp_path)  # no flags, no terminal: nothing to write
    assert proc.returncode == 2 and "nothing to write" in proc.stderr
    assert not _own_defaults.exists()
    proc = run_cli(["init", "--bind", "nope"], cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    (tmp_path / "data").mkdir()
    assert run_cli(["init", "--bind", "data"], cwd=tmp_path).returncode == 0
    assert yaml.safe_load(_own_defaults.read_text())["bind"] == [str(tmp_path / "data")]
    _own_defaults.write_text("cluster: local\nout: /tmp/x\n")
    proc = run_cli(["render", "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2 and "out" in proc.stderr


def test_submit_without_sbatch_writes_nothing(tmp_path: Path) -> None:
    import os
    import sys

    proc = run_cli(["submit", "-M", "local", "--python", sys.executable, "--out",
                    "deep/er/run", "--", "demo"],
                   cwd=tmp_path, env={"PATH": os.path.dirname(os.__file__) + "/../../bin"})
    assert proc.returncode == 3 and "login node" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []
