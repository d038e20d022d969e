"""Real image builds: the base image from base.def through the translator and a real Docker
engine (what CI does), and the Apptainer path where the binary exists (cluster nodes)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.conftest import CI_BUILD_ARGS, CI_IMAGE_TAG

pytestmark = pytest.mark.slow


@pytest.mark.docker
def test_ci_builds_the_base_image_runs_its_test_and_the_demo_and_exports(
        tmp_path: Path, docker_engine: dict[str, str]) -> None:
    import docker

    build = run_cli(["image", "build", "base", "--engine", "docker", "--tag", CI_IMAGE_TAG,
                     *CI_BUILD_ARGS], env=docker_engine, timeout=1200)
    assert build.returncode == 0, build.stderr
    image = docker.from_env().images.get(CI_IMAGE_TAG)
    labels = image.labels
    assert labels["org.train.lock"] == "base-cpu.txt"
    assert labels["org.train.torch"] == "2.13.0"
    env = dict(e.split("=", 1) for e in image.attrs["Config"]["Env"])
    assert env["PYTORCH_CUDA_ALLOC_CONF"].startswith("expandable_segments:True")
    assert env["PYTHONUNBUFFERED"] == "1"

    test = run_cli(["image", "test", "base", "--engine", "docker", "--tag", CI_IMAGE_TAG],
                   env=docker_engine, timeout=600)
    assert test.returncode == 0, test.stderr
    assert "torch 2.13.0+cpu" in test.stdout  # %test ran
    assert "CUDA available False" in test.stdout
    assert "run complete: /tmp/train-demo" in test.stdout  # the demo trained inside

    out = tmp_path / "base.tar"
    export = run_cli(["image", "export", "base", "--engine", "docker", "--tag", CI_IMAGE_TAG,
                      "--out", str(out)], env=docker_engine, timeout=600)
    assert export.returncode == 0, export.stderr
    assert f"apptainer build base.sif docker-archive://{out}" in export.stdout
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest[0]["RepoTags"] == [CI_IMAGE_TAG]


@pytest.mark.docker
def test_bad_build_argument_fails_before_building(docker_engine: dict[str, str]) -> None:
    proc = run_cli(["image", "build", "base", "--engine", "docker", "--build-arg",
                    "CUDA=12"], env=docker_engine)
    assert proc.returncode == 2
    assert "build-arg CUDA: base.def has no such argument" in proc.stderr


@pytest.mark.apptainer
def test_apptainer_builds_tests_and_runs_the_base_image(apptainer_sif: Path) -> None:
    test = run_cli(["image", "test", "base", "--engine", "apptainer", "--out",
                    str(apptainer_sif)],
                   timeout=1200)
    assert test.returncode == 0, test.stderr
    assert "torch 2.13.0" in test.stdout
    assert "run complete" in test.stdout
