"""What differs between Slurm releases, met on the real cluster (the machine's 22.05, and
24.11 with TRAIN_TEST_SLURM=24.11): each test here holds on both."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from train.client.slurm.queue import ACTIVE_STATES, job_states

pytestmark = [pytest.mark.slurm]


def test_a_job_whose_batch_shell_still_runs_its_term_trap_is_active(
        tmp_path: Path, slurm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # After scancel the batch shell gets TERM and KillWait seconds to clean up (the chain
    # records the chunk's end in that time). Slurm 22.05's squeue --json says COMPLETING;
    # 24.11 says ["CANCELLED", "COMPLETING"]: the job is not over until the trap ends.
    script = tmp_path / "trap.sh"
    script.write_text(f"""#!/bin/bash
trap 'echo $$ > {tmp_path}/in-trap; while [ ! -e {tmp_path}/release ]; do sleep 0.1; done
      exit 0' TERM
touch {tmp_path}/running
while :; do sleep 0.1; done
""")
    env = {**os.environ, **slurm_env}
    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", str(script)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60)
    job = out.stdout.strip().split(";")[0]
    try:
        while not (tmp_path / "running").exists():
            time.sleep(0.1)
        subprocess.run(["scancel", job], env=env, check=True, timeout=60)
        while not (tmp_path / "in-trap").exists():
            time.sleep(0.1)
        state = job_states([job])[job]["state"]
        shell = int((tmp_path / "in-trap").read_text())
        # (conclusive only while the trap still ran: KillWait ends it)
        assert Path(f"/proc/{shell}").exists(), "the trap was killed before the query"
        assert state in ACTIVE_STATES, state
    finally:
        (tmp_path / "release").touch()
