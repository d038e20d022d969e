"""A user's `--env` beats what the job sets by default, in the rendered script of every
runtime: PYTORCH_CUDA_ALLOC_CONF (the GRPO/FSDP recipe: a library with its own memory pool
refuses our expandable_segments default) and PYTHONPATH (a fork bound into the container).
The batch shell's export line and what each task hands the container are run here in bash
(the docker task's `-e` options; apptainer's APPTAINERENV_ copies), as the job runs them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from train.batch.engine import install
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import render, step_argv
from train.client.slurm.resolve import resolve
from train.common.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF

USER_ALLOC = "backend:cudaMallocAsync"
USER_ENV = (f"{ALLOC_CONF_VAR}={USER_ALLOC}", "PYTHONPATH=/opt/fork")
IMAGES = {"docker": "train/mine:1", "apptainer": "/scratch/me/mine.sif", "none": None}


def _job(runtime: str) -> JobSpec:
    return JobSpec(cluster="local", name="grpo", out="/scratch/me/runs/grpo", nodes=2,
                   gpus_per_node=2, cpus_per_task=2, mem="2000M", entry="command",
                   launch="torchrun", runtime=runtime, image=IMAGES[runtime],
                   env=USER_ENV,
                   bind=("/usr/share:/opt/fork:ro",) if IMAGES[runtime] else (),
                   workload=("python", "train_grpo.py"))


def _exported(runtime: str) -> dict[str, str]:
    """What the batch shell exports: its export line, run by bash."""
    job = resolve(_job(runtime), Registry(environ={}).get("local"))
    (line,) = [ln for ln in render(job).splitlines()
               if ln.startswith("export ")]
    out = subprocess.run(["bash", "-c", f"{line}; env -0"], capture_output=True,
                         check=True, env={}).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if item)


@pytest.mark.parametrize("runtime", ["docker", "apptainer", "none"])
def test_the_batch_shell_exports_the_users_values_over_the_defaults(runtime: str) -> None:
    env = _exported(runtime)
    assert env[ALLOC_CONF_VAR] == USER_ALLOC
    assert env["PYTHONPATH"] == "/opt/fork"


def test_the_docker_task_passes_the_users_values_once() -> None:
    job = resolve(_job("docker"), Registry(environ={}).get("local"))
    argv = step_argv(job)
    given = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-e"]
    assert [g for g in given if g.startswith(ALLOC_CONF_VAR)] == \
        [f"{ALLOC_CONF_VAR}={USER_ALLOC}"]
    assert f"{ALLOC_CONF_VAR}={TUNED_ALLOC_CONF}" not in argv
    assert [g for g in given if g.startswith("PYTHONPATH")] == ["PYTHONPATH=/opt/fork"]
    assert "/usr/share:/opt/fork:ro" in argv  # docker -v, as given


def _apptainer_env(tmp_path: Path, env: dict[str, str]) -> str:
    """What an apptainer command gets from its task's wrapper (train.batch.task): a stand-in
    `apptainer` on PATH that prints its environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apptainer").write_text("#!/bin/sh\nexec env\n")
    (bin_dir / "apptainer").chmod(0o755)
    env = {**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    wrapper = [sys.executable, "-E", "-s", install(str(tmp_path)), "task", "--"]
    return subprocess.run([*wrapper, "apptainer", "exec", "/x.sif", "true"],
                          capture_output=True, text=True, check=True, env=env,
                          timeout=60).stdout


def test_the_apptainer_task_hands_the_users_values_to_the_container(tmp_path: Path) -> None:
    # apptainer --cleanenv lets only APPTAINERENV_ copies in; they override the image's
    # %environment (where base.def exports the tuned default)
    out = _apptainer_env(tmp_path, _exported("apptainer"))
    assert f"APPTAINERENV_{ALLOC_CONF_VAR}={USER_ALLOC}\n" in out
    assert "APPTAINERENV_PYTHONPATH=/opt/fork\n" in out


def test_without_the_users_value_the_tuned_default_is_exported() -> None:
    job = resolve(dataclasses.replace(_job("docker"), env=()),
                  Registry(environ={}).get("local"))
    assert f"-e {ALLOC_CONF_VAR}={TUNED_ALLOC_CONF}" in " ".join(step_argv(job))


def test_each_apptainer_task_hands_its_own_ready_file_to_the_container(
        tmp_path: Path) -> None:
    # every rank says for itself that its handler is set (the engine waits for all)
    out = _apptainer_env(tmp_path, {"SLURM_PROCID": "1",
                                    "TRAIN_SIGNAL_READY": "/runs/a/.signal-ready-7-0"})
    assert "APPTAINERENV_TRAIN_SIGNAL_READY=/runs/a/.signal-ready-7-0.rank-1\n" in out
