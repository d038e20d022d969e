"""A new user's first job at each shipped site, from a fresh home with only `train init`
defaults, checked line by line against what the site requires (../CLUSTERS.md and the
profiles' cited sources): the GPU request and its type, CPUs and memory per GPU, the QOS
and partition limits, the container and its binds. And the first jobs that must be
refused on the login node, each with its fix: a GPU partition without GPUs, a job that
needs torch with neither an image nor a Python, the field notes' host-OOM settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.golden.cases import script_step
from train.client.clusters.profiles import Registry
from train.client.clusters.units import parse_mem, parse_time

REG = Registry(environ={})
SITES = ("gilbreth", "rivanna", "torch")


def _fake_sif(path: Path) -> Path:
    """A file that starts as a SIF image does (its launch line and magic), for checks that
    look at the header; nothing here runs it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0")
    path.write_bytes(head + b"SIF_MAGIC\0" + b"01\0" + b"\0" * 1024)
    return path


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A fresh home: no defaults file, no profiles of the user's own."""
    (tmp_path / "home").mkdir()
    return {"HOME": str(tmp_path / "home"), "TRAIN_DEFAULTS": "", "XDG_CONFIG_HOME": "",
            "TRAIN_CLUSTERS_PATH": ""}


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    proc = run_cli(args, env=env, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def _init(env: dict[str, str], cwd: Path, *args: str) -> None:
    code, out, err = _cli(["init", *args], env, cwd)
    assert code == 0, err
    assert (Path(env["HOME"]) / ".config" / "train" / "defaults.yaml").is_file(), out


def _sbatch(script: str) -> dict[str, str]:
    """The #SBATCH options, by name (flags without a value map to '')."""
    out: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --"):].partition("=")
            out[key] = value.strip('"')
    return out


def _step(script: str) -> list[str]:
    return script_step(script)


def _binds(step: list[str]) -> list[str]:
    return [step[i + 1].split(":")[0] for i, a in enumerate(step) if a == "--bind"]


def _check_cpus_and_memory(opts: dict[str, str], step: list[str], node_cpus: int,
                           node_mem_mb: int, gpus: int, ntasks: int) -> None:
    """At least 4 CPUs for every GPU the node runs (Gilbreth's documented example gives
    4 per GPU; DataLoader workers and the trainer need them), passed to srun too (Slurm
    22.05), and the memory of those CPUs' share of the node, within the node."""
    cpus = int(opts["cpus-per-task"])
    assert int(opts["ntasks-per-node"]) == ntasks
    assert cpus * ntasks >= 4 * gpus, (cpus, ntasks, gpus)
    assert cpus * ntasks <= node_cpus
    assert f"--cpus-per-task={cpus}" in step
    mem = parse_mem(opts["mem"])
    assert mem <= node_mem_mb
    assert mem >= node_mem_mb * cpus * ntasks // node_cpus


def test_gilbreth_first_job_is_the_field_notes_e1_job(tmp_path: Path,
                                                     home: dict[str, str]) -> None:
    """Seed 000: E1 DQN, one A30 GPU, standby QOS, 2 h chunks, account and partition
    always given; the image from `train init`."""
    sif = _fake_sif(tmp_path / "depot" / "train-sc2.sif")
    _init(home, tmp_path, "--cluster", "gilbreth", "--account", "lab", "--image", str(sif))
    code, script, err = _cli(["render", "-p", "a30", "-q", "standby", "-g", "1", "--",
                              "demo", "--res", "32", "--seeds", "4", "--episodes",
                              "10000"], home, tmp_path)
    assert code == 0, err
    node = REG.get("gilbreth").partitions["a30"]
    opts, step = _sbatch(script), _step(script)
    assert opts["account"] == "lab" and opts["partition"] == "a30"
    assert opts["qos"] == "standby"
    assert parse_time(opts["time"]) <= REG.get("gilbreth").qos_limits["standby"]  # 4 h
    assert opts["gres"] == "gpu:1"  # the seeds' form; the partition gives the type
    assert "constraint" not in opts and "gpus" not in opts
    _check_cpus_and_memory(opts, step, node.cpus_per_node, node.mem_mb, gpus=1, ntasks=1)
    # the runtime follows the image in the defaults: apptainer, with the GPU and the
    # site's own binds (Gilbreth binds them into every container), and `module load`
    assert "runtime=apptainer" in script and "module load apptainer" in script
    assert step[step.index("apptainer") + 1] == "exec" and "--nv" in step
    assert str(sif) in step
    for path in ("/home", "/apps", "/scratch", "/depot"):
        assert path in _binds(step)
    assert step[step.index("--out") - 1] == "10000" and "--device" in step
    assert step[step.index("--device") + 1] == "cuda"


def test_rivanna_first_job_is_a_two_node_a100_ddp_script(tmp_path: Path,
                                                         home: dict[str, str]) -> None:
    """Seeds 002/004: a DDP script under torch's launcher on 2 nodes x 8 A100 (UVA RC:
    multi-node jobs take all 8 GPUs of a node), partition gpu with a typed GRES. torchrun
    runs one task per node: that task gets the CPUs and memory of all its GPUs'
    processes."""
    sif = _fake_sif(tmp_path / "scratch" / "base.sif")
    _init(home, tmp_path, "--cluster", "rivanna", "--account", "grp", "--image", str(sif))
    code, script, err = _cli(["render", "-N", "2", "-g", "8", "--gpu-type", "a100", "-e",
                              "command", "--stop-signal", "USR1", "--", "python",
                              "train.py"], home, tmp_path)
    assert code == 0, err
    prof = REG.get("rivanna")
    node = prof.partitions["gpu"]
    opts, step = _sbatch(script), _step(script)
    assert opts["account"] == "grp" and opts["partition"] == "gpu"
    assert opts["gres"] == "gpu:a100:8"  # UVA RC: --gres=gpu:<type>:N, all 8 of a node
    assert opts["nodes"] == "2" and (node.max_nodes or 0) >= 2
    assert (node.max_gpus or 0) >= 2 * 8 and node.multi_node_whole
    assert parse_time(opts["time"]) < (prof.backfill_minutes or 0)  # 2:59:00, backfill
    assert "qos" not in opts
    _check_cpus_and_memory(opts, step, node.cpus_per_node, node.mem_mb, gpus=8, ntasks=1)
    assert opts["cpus-per-task"] == "32" and opts["mem"] == "250G"  # as tasks mode gets
    assert "--mode=torchrun" in step and "--nproc-per-node=8" in step
    assert "runtime=apptainer" in script and "module load apptainer" in script
    for path in ("/home", "/scratch", "/project", "/standard"):
        assert path in _binds(step)


def test_torch_first_job_is_the_field_notes_navsim_job(tmp_path: Path,
                                                      home: dict[str, str]) -> None:
    """Seed 003: NAVSIM, 4 nodes x 4 L40S, one task per GPU under srun, with the fix the
    notes settled on (2 DataLoader workers per GPU); no partition on Torch, GPUs by
    --gres and the type by --constraint."""
    sif = _fake_sif(tmp_path / "scratch" / "navsim.sif")
    _init(home, tmp_path, "--cluster", "torch", "--account", "torch_pr_1_general",
          "--image", str(sif))
    code, script, err = _cli(["render", "-C", "l40s", "-N", "4", "-g", "4", "-e", "navsim",
                              "--workers", "2", "-t", "1-00:00:00"], home, tmp_path)
    assert code == 0, err
    node = REG.get("torch").constraints["l40s"]
    opts, step = _sbatch(script), _step(script)
    assert opts["account"].startswith("torch_pr_")
    assert "partition" not in opts and "gpus" not in opts  # NYU docs: no partitions
    assert opts["gres"] == "gpu:4" and opts["constraint"] == "l40s"
    assert opts["nodes"] == "4" and (node.max_gpus or 0) >= 4 * 4  # 24 GPUs per user
    assert parse_time(opts["time"]) < 48 * 60  # the 24-GPU allowance is for jobs < 48 h
    _check_cpus_and_memory(opts, step, node.cpus_per_node, node.mem_mb, gpus=4, ntasks=4)
    # the workers' memory is in the request: 2 x 4 ranks x the default per worker
    from train.common.hostmem import DEFAULT_WORKER_MEM_MB

    assert parse_mem(opts["mem"]) >= 2 * 4 * DEFAULT_WORKER_MEM_MB
    assert step[0] == "srun" and "--ntasks-per-node=4" in step  # srun: every rank
    assert "trainer.params.num_nodes=4" in step and "+trainer.params.devices=4" in step
    assert "runtime=apptainer" in script and "--nv" in step
    for path in ("/scratch", "/vast"):
        assert path in _binds(step)


@pytest.mark.parametrize("site", SITES)
def test_every_first_job_of_a_site_renders_and_fits(site: str, tmp_path: Path,
                                                    home: dict[str, str]) -> None:
    """One GPU and nothing else on each site: a GPU job (never the CPU), 4 CPUs and their
    memory, the runtime from the defaults' image."""
    sif = _fake_sif(tmp_path / "img.sif")
    where = {"gilbreth": ["-p", "a30"], "rivanna": [], "torch": ["-C", "h200|l40s"]}[site]
    _init(home, tmp_path, "--cluster", site, "--account", "torch_pr_x" if site == "torch"
          else "lab", "--image", str(sif))
    code, script, err = _cli(["render", *where, "-g", "1", "--", "demo"], home, tmp_path)
    assert code == 0, err
    opts, step = _sbatch(script), _step(script)
    assert opts["gres"].endswith("gpu:1") and "--nv" in step
    assert opts["cpus-per-task"] == "4" and "runtime=apptainer" in script


# -- refused on the login node, with the fix --------------------------------------------

def test_a_gpu_partition_without_gpus_is_refused_with_the_fix(tmp_path: Path,
                                                              home: dict[str, str]) -> None:
    """Issue 19: this rendered a CPU job (no --gres, no --nv, device auto)."""
    code, out, err = _cli(["render", "-M", "gilbreth", "-A", "a", "-p", "a30", "-q",
                           "standby", "--runtime", "apptainer", "--image", "X", "--", "sc2",
                           "--episodes", "10000"], home, tmp_path)
    assert code == 2, out
    assert "gpus_per_node" in err and "-g N" in err and "a30" in err and not out
    code, out, err = _cli(["render", "-M", "torch", "-A", "torch_pr_1", "-C", "l40s",
                           "--runtime", "apptainer", "--image", "X", "--", "demo"],
                          home, tmp_path)
    assert code == 2 and "-g N" in err, err


def test_no_image_and_no_runtime_is_refused_for_a_job_that_needs_torch(
        tmp_path: Path, home: dict[str, str]) -> None:
    """Issue 19: the default was runtime none with the nodes' python3 (the client's: no
    torch), found only after the queue wait (exit 3)."""
    _init(home, tmp_path, "--cluster", "gilbreth", "--account", "lab")
    base = ["render", "-p", "a30", "-g", "1"]
    # issue 39: a program of one's own on one GPU died after the queue, "No module named
    # torch" (the nodes' python3 has none, nor CUDA's libraries)
    for job in (["--", "demo"], ["-e", "command", "-g", "3", "--", "python", "t.py"],
                ["-e", "navsim"], ["-e", "command", "--", "python", "train.py"]):
        code, out, err = _cli([*base, *job], home, tmp_path)
        assert code == 2, (job, out)
        assert "runtime" in err and "--runtime apptainer --image" in err, err
        assert "--runtime none --python" in err and not out
    # either way out renders
    env_python = tmp_path / "env" / "bin" / "python"
    for fix in (["--runtime", "apptainer", "--image", str(_fake_sif(tmp_path / "i.sif"))],
                ["--runtime", "none", "--python", str(env_python)]):
        code, out, err = _cli([*base, *fix, "--", "demo"], home, tmp_path)
        assert code == 0, (fix, err)
    # a program of the user's own on CPUs, one process: what it needs is its business
    code, out, err = _cli(["render", "-M", "local", "-e", "command", "--", "./run.sh"], home,
                          tmp_path)
    assert code == 0 and "runtime=none" in out, err


def test_the_field_notes_host_oom_job_is_refused_with_two_workers_as_the_fix(
        tmp_path: Path, home: dict[str, str]) -> None:
    """Seed 003: 8 DataLoader workers per GPU, 4 L40S per 256 GB node: OOM-killed. The
    default memory per worker must refuse it, and the fix must be the notes' own."""
    args = ["render", "-M", "torch", "-A", "torch_pr_1", "-C", "l40s", "-N", "4", "-g", "4",
            "--launch", "tasks", "--workers", "8", "--mem", "250G", "--runtime",
            "apptainer", "--image", str(_fake_sif(tmp_path / "n.sif")), "--", "demo"]
    code, out, err = _cli(args, home, tmp_path)
    assert code == 2, out
    assert "workers" in err and "--workers 2" in err and "--worker-mem" in err, err
    args[args.index("8")] = "2"
    code, out, err = _cli(args, home, tmp_path)
    assert code == 0, err
    # without --mem: the workers' memory goes into the default request, within the node
    code, out, err = _cli([a for a in args if a not in ("--mem", "250G")], home, tmp_path)
    assert code == 0, err
    assert parse_mem(_sbatch(out)["mem"]) <= REG.get("torch").constraints["l40s"].mem_mb



def test_init_writes_a_relative_image_or_python_as_the_path_it_named(
        tmp_path: Path, home: dict[str, str]) -> None:
    """`train init --image base.sif` in the image's folder wrote 'base.sif', which every
    later job read from its own submit folder (a --bind is made absolute already)."""
    _fake_sif(tmp_path / "base.sif")
    _init(home, tmp_path, "--cluster", "local", "--image", "base.sif")
    _init(home, tmp_path, "--python", "env/bin/python")
    (tmp_path / "proj").mkdir()
    code, out, err = _cli(["init", "--show"], home, tmp_path / "proj")
    assert code == 0, err
    assert f"image: {tmp_path / 'base.sif'}" in out and \
        f"python: {tmp_path / 'env' / 'bin' / 'python'}" in out, out
    # a docker tag, and a python found on PATH, stay as written
    _init(home, tmp_path, "--runtime", "docker", "--image", "train-base:cpu", "--python",
          "python3.12")
    code, out, err = _cli(["init", "--show"], home, tmp_path)
    assert code == 0, err
    assert "image: train-base:cpu" in out and "python: python3.12" in out, out


def test_init_on_a_terminal_whose_input_ends_is_a_usage_error() -> None:
    # Ctrl-D at a question of `train init`: exit 2 with words, not an EOFError traceback
    from train.client.defaults import ask
    from train.common.errors import EXIT_USAGE, UsageError

    def ended(prompt: str) -> str:
        raise EOFError

    with pytest.raises(UsageError, match="input ended") as err:
        ask(["local"], {}, read=ended)
    assert err.value.exit_code == EXIT_USAGE
