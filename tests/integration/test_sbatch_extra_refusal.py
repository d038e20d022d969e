"""Slurm's refusal of an --sbatch-extra option, on the REAL local cluster (conftest.py):
`sbatch --test-only` refused the job, but its words named nothing of the job (an unknown
reservation: submit went on and sbatch failed with exit 1) or named the wrong flag (an
--exclude that leaves too few nodes read as the GPU request, 'gpus'). The job is asked
again without its extra options: Slurm accepts it, so the refusal is theirs (exit 2,
sbatch_extra, nothing queued or written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import job_flags, slurm

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize(("extra", "words"), [
    ("--reservation=nosuch", "reservation"),
    ("--exclude=n1", "node configuration"),
])
def test_an_sbatch_extra_option_slurm_refuses_is_named(
        tmp_path: Path, slurm_env: dict[str, str], extra: str, words: str) -> None:
    proc = run_cli(["submit", "--name", "extra", *job_flags("--nodes", "2", "--time", "3"),
                    f"--sbatch-extra={extra}", "--", "demo", "--episodes", "2",
                    *tiny_flags()], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "train: error: sbatch_extra: " in proc.stderr, proc.stderr
    assert f"--sbatch-extra={extra}" in proc.stderr and words in proc.stderr.lower()
    assert not (tmp_path / "runs").exists()
    assert slurm(["squeue", "-h", "-n", "extra", "-o", "%i"], slurm_env).strip() == ""
