"""Every path a user's image takes, under the real Apptainer 1.4 (ci/sid-apptainer.sh), as an
ordinary user: CI's base converted to a SIF, our definitions built by Apptainer itself on
it, a derived image built and run in a job, submit's label reading and image probe, and
`train doctor --preflight`'s image checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import SiteUser

pytestmark = [pytest.mark.slurm, pytest.mark.apptainer, pytest.mark.slow]


def test_ci_sif_is_the_ci_base_with_its_labels_and_train(site_user: SiteUser,
                                                        ci_sif: Path) -> None:
    """The Docker-built base converted by Apptainer: its labels read by `apptainer inspect`,
    its venv's train and torch run as the user."""
    inspect = site_user.run(["apptainer", "inspect", "--json", "--labels", str(ci_sif)],
                            cwd=ci_sif.parent)
    assert inspect.returncode == 0, inspect.stderr
    labels = json.loads(inspect.stdout)["data"]["attributes"]["labels"]
    assert labels["org.train.image"] == "base"
    assert labels["org.train.lock"] == "base-cpu.txt"
    run = site_user.run(["apptainer", "exec", str(ci_sif), "python", "-c",
                         "import torch, train; print('torch', torch.__version__)"],
                        cwd=ci_sif.parent)
    assert run.returncode == 0, run.stderr
    assert "torch 2.13.0+cpu" in run.stdout
    assert ci_sif.stat().st_uid == site_user.uid
