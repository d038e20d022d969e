"""`train image new` output builds: a derived definition on CI's base image, through the
translator and the real Docker engine, offline (the lock's wheel in containers-NAME/wheels),
and its %test sees the added package while the base's torch is untouched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.unit.test_image_derive import make_wheel

pytestmark = [pytest.mark.slow, pytest.mark.docker]
TAG = "train/derived:ci"


def test_a_derived_image_builds_on_the_base_and_holds_the_added_package(
        ci_image: str, docker_engine: dict[str, str], tmp_path: Path) -> None:
    import docker

    # a user's project folder (`train image build` builds from a source tree: a folder
    # with pyproject.toml or .git, where %files sources resolve)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"\nversion = "0"\n',
                                             encoding="utf-8")
    wheels = tmp_path / "index"
    wheels.mkdir()
    wheel = make_wheel(wheels, "derived-extra", "0.1")
    (tmp_path / "requirements.txt").write_text("derived-extra==0.1\n", encoding="utf-8")
    new = run_cli(["image", "new", "derived", "--requirements",
                   str(tmp_path / "requirements.txt"), "--find-links", str(wheels),
                   "--out", str(tmp_path / "containers-derived")])
    assert new.returncode == 0, new.stderr
    definition = tmp_path / "containers-derived" / "derived.def"
    shutil.copy(wheel, tmp_path / "containers-derived" / "wheels")  # an offline build
    build = run_cli(["image", "build", str(definition), "--engine", "docker", "--tag", TAG,
                     "--localimage", f"base.sif={ci_image}"], env=docker_engine,
                    timeout=900)
    try:
        assert build.returncode == 0, build.stderr
        container = docker.from_env().containers.run(
            TAG, ["-c", "set -e; sh /.train/test; python -c 'import derived_extra, torch; "
                  "print(derived_extra.VERSION, torch.__version__)'"],
            entrypoint=["/bin/sh"], network_mode="none", detach=True)
        try:
            code = container.wait(timeout=600)["StatusCode"]
            out = container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
        assert code == 0, out
        assert "0.1 2.13.0+cpu" in out
    finally:
        if build.returncode == 0:
            docker.from_env().images.remove(TAG, force=True)
