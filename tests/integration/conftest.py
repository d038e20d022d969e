"""A real SLURM cluster for the `slurm` tier: started once per session by ci/slurm-up.sh
(munged, slurmctld, two slurmd on loopback, fake GPUs), stopped by PID afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (its daemons run as SlurmUser=root)"
    missing = [cmd for cmd in NEEDED if shutil.which(cmd) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: run `bash ci/bootstrap.sh` as root "
                "(apt-get install slurm-wlm munge)")
    return None


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="ts", dir="/tmp"))  # munge socket path < 108
    proc = subprocess.run(["bash", str(REPO / "ci" / "slurm-up.sh"), str(folder)],
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        subprocess.run(["bash", str(REPO / "ci" / "slurm-down.sh"), str(folder)],
                       check=False, timeout=120)
        pytest.fail(f"slurm-up.sh failed: {proc.stderr}")
    try:
        yield {"SLURM_CONF": proc.stdout.strip().splitlines()[-1]}
    finally:
        subprocess.run(["bash", str(REPO / "ci" / "slurm-down.sh"), str(folder)],
                       check=False, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
