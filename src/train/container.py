"""Argv prefixes for the container runtimes: apptainer, docker, or none (host Python).

The renderer puts this prefix before `python -m train ...` in the job step. Host
PYTHONPATH, CONDA_* and friends never reach the training process inside a container:
apptainer runs with --cleanenv and gets exactly the variables listed here; docker gets
only what is passed with -e.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from train.runtime.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF

# Variables the training process reads; passed by name so their host values carry over.
PASS_THROUGH = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID",
                "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE",
                "SLURM_JOB_NODELIST", "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE",
                "CUDA_VISIBLE_DEVICES", "TRAIN_MASTER_ADDR")


def job_environment(nccl_env: Mapping[str, str]) -> dict[str, str]:
    """Fixed values every training process gets."""
    return {"PYTHONUNBUFFERED": "1", ALLOC_CONF_VAR: TUNED_ALLOC_CONF, **nccl_env}


def runtime_prefix(runtime: str, *, image: str | None, gpus: bool, binds: Sequence[str],
                   run_dir: str, env: Mapping[str, str]) -> list[str]:
    if runtime == "none":
        return []
    if image is None:
        raise ValueError(f"runtime {runtime} needs an image")
    if runtime == "apptainer":
        argv = ["apptainer", "exec"]
        if gpus:
            argv.append("--nv")
        argv.append("--cleanenv")
        for name, value in env.items():
            argv += ["--env", f"{name}={value}"]
        for path in [*binds, run_dir]:
            argv += ["--bind", path]
        return [*argv, image]
    if runtime == "docker":
        argv = ["docker", "run", "--rm", "--network", "host", "--ipc", "host"]
        if gpus:
            argv += ["--gpus", "all"]
        for name, value in env.items():
            argv += ["-e", f"{name}={value}"]
        for name in PASS_THROUGH:
            argv += ["-e", name]
        for path in [*binds, run_dir]:
            argv += ["-v", f"{path}:{path}"]
        # `env` as entrypoint: the command after the image runs as given (the image's
        # runscript would otherwise prepend `python -m train`)
        return [*argv, "-w", run_dir, "--entrypoint", "env", image]
    raise ValueError(f"unknown runtime {runtime!r}")
