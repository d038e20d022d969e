"""Argv prefixes for the container runtimes (apptainer, docker, or none: host Python), put
before `python -m train ...` in the job step. Host PYTHONPATH, CONDA_* and friends never
reach a container's process: apptainer runs with --cleanenv (the submitting shell's
APPTAINER_* and SINGULARITY_* settings are dropped by the batch script), docker gets only
what is passed with -e. Under Docker, the engine's task wrapper (train.batch.task) ties the
container's life to the Slurm task's and runs it as the task's user.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from train.batch.contract import PASS_THROUGH
from train.common.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF

# Apptainer binds the user's home: a `pip install --user` there (UVA's how-to advises it
# inside a container) would shadow the image's packages. Off unless the job sets the
# variable itself (`--env PYTHONNOUSERSITE=`: empty turns the user site back on).
APPTAINER_ENV = {"PYTHONNOUSERSITE": "1"}

def job_environment(nccl_env: Mapping[str, str], runtime: str = "none") -> dict[str, str]:
    """Fixed values every training process gets (and apptainer's own: APPTAINER_ENV)."""
    extra = APPTAINER_ENV if runtime == "apptainer" else {}
    return {"PYTHONUNBUFFERED": "1", ALLOC_CONF_VAR: TUNED_ALLOC_CONF, **nccl_env, **extra}


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
        # `env` reaches the container by name (the task wrapper exports APPTAINERENV_ copies
        # of the batch shell's values): apptainer's own --env parser splits a value on ','
        # and '=' (PYTORCH_CUDA_ALLOC_CONF has commas), and quotes break it
        for spec in dict.fromkeys([*binds, run_dir]):
            argv += ["--bind", spec]
        return [*argv, image]
    if runtime == "docker":
        # --init: the command is not PID 1, which ignores a signal it has no handler for
        # (TERM would not stop programs we did not write). Signals come from DOCKER_TASK,
        # by name, not from the CLI's proxy: Slurm signals the CLI too, which would make
        # two of each. The image has no passwd entry for the task's user (DOCKER_TASK
        # sets it): HOME must be somewhere that user can write.
        argv = ["--rm", "--init", "--sig-proxy=false", "--stop-signal", "TERM",
                "--network", "host", "--ipc", "host", "-e", "HOME=/tmp"]
        if gpus:
            argv += ["--gpus", "all"]
        for name, value in env.items():
            argv += ["-e", f"{name}={value}"]
        for name in PASS_THROUGH:
            argv += ["-e", name]
        for spec in dict.fromkeys([*binds, run_dir]):
            argv += ["-v", spec if ":" in spec else f"{spec}:{spec}"]
        # `env` as entrypoint: the command after the image runs as given (the image's
        # runscript would otherwise prepend `python -m train`); the engine's task wrapper
        # names and labels the container and hands it Slurm's signals (train.batch.task)
        return ["docker", "run", *argv, "-w", run_dir, "--entrypoint", "env", image]
    raise ValueError(f"unknown runtime {runtime!r}")
