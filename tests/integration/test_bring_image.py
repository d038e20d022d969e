"""Bring your own image (issue 21, item 2) on the REAL 2-node SLURM cluster and a real
Docker engine: an image with Python and torch but no `train` (the CI base image with the
package and python-hostlist uninstalled, and our label cleared) runs a plain DDP script
under --launch torchrun through the walltime stop and a resume. Submit finds the image
has no `train` (its Python asked once), binds the client's launcher read-only, and the
program never sees it."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.chains import TERMINAL, walltime_signal
from tests.integration.chains import logs as _logs
from tests.integration.chains import wait as _wait
from tests.integration.test_programs import _submit

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.slow]

NO_TRAIN_TAG = "train/no-train:ci"
# built from the session's CI image, offline: pip uninstalls, nothing is fetched
DOCKERFILE = """FROM {base}
RUN /opt/venv/bin/pip uninstall -y --disable-pip-version-check train-slurm-apptainer \\
        python-hostlist && ! /opt/venv/bin/python -c "import train"
LABEL org.train.image=""
"""


@pytest.fixture(scope="session")
def no_train_image(ci_image: str, docker_engine: dict[str, str]) -> str:
    import os

    env = {**os.environ, **docker_engine}
    have = subprocess.run(["docker", "image", "inspect", NO_TRAIN_TAG], capture_output=True,
                          env=env, timeout=60, check=False)
    if have.returncode != 0:
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Dockerfile").write_text(DOCKERFILE.format(base=ci_image))
            proc = subprocess.run(["docker", "build", "--network", "none", "-t",
                                   NO_TRAIN_TAG, context], capture_output=True, text=True,
                                  env=env, timeout=600, check=False)
            if proc.returncode != 0:
                pytest.fail(f"building {NO_TRAIN_TAG} failed: {proc.stderr[-3000:]}")
    return NO_TRAIN_TAG


def test_an_image_without_train_keeps_the_walltime_contract_and_resumes(
        tmp_path: Path, slurm_env: dict[str, str], docker_engine: dict[str, str],
        no_train_image: str) -> None:
    env = {**slurm_env, **docker_engine, "USER_HOLD_AT": "7",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    name = "byo-torchrun"
    run_dir = _submit(tmp_path, env, name, ["--runtime", "docker", "--image", no_train_image,
                                            "--launch", "torchrun", "--stop-signal", "USR1",
                                            "--max-chunks", "3", "--env", "USER_HOLD_AT"],
                      "python3")
    script = next((run_dir / "jobs").glob("*.sbatch")).read_text()
    assert "/opt/train-launcher/train:ro" in script  # the client's launcher, bound in
    st = _wait(tmp_path, env, name, lambda s: (run_dir / "user_held").exists(), timeout=300)
    walltime_signal(st["chunks"][0]["job_id"], env)
    st = _wait(tmp_path, env, name, lambda s: s["state"] in TERMINAL, timeout=300)
    out, err = _logs(run_dir, "out"), _logs(run_dir, "err")
    assert st["state"] == "complete", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"], st
    assert "user script stopped by signal at step 7" in out
    assert "rank 0 resumed at step 7" in out and "rank 1 resumed at step 7" in out
    assert out.count("done at step 20") == 2
    assert out.count("can import train: False") == 4 and "can import train: True" not in out
