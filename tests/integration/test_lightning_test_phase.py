"""A Lightning program whose stop signal comes during its final test phase, on the REAL
2-node local Slurm cluster (lightning_test_phase.py): the test loop never stops early, so
the step runs on past the stop signal into the walltime; the tool ends it before Slurm's
TIMEOUT and the chain goes on from the intact save before (the overrun bound) instead of
ending "failed". The test phase is held by a file the test controls (counted in batches);
only the walltime itself is waited for.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.chains import TERMINAL, logs, wait, walltime_signal

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROGRAM = Path(__file__).with_name("lightning_test_phase.py")


def test_a_stop_signal_during_the_test_phase_goes_on_from_the_save_before(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    name = "pl-test"
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)
    script = run_dir / "fit_test.py"
    shutil.copy(PROGRAM, script)
    (run_dir / "hold_test").touch()
    proc = run_cli(["submit", "--name", name, "--cluster", "local", "--entry", "command",
                    "--python", sys.executable, "--launch", "tasks", "--stop-signal", "USR1",
                    "--max-chunks", "3", "--nodes", "2", "--cpus-per-task", "2",
                    "--mem", "2000M", "--time", "3", "--", sys.executable, str(script)],
                   cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, slurm_env, name, lambda s: (run_dir / "testing").exists(),
              timeout=300)
    walltime_signal(st["chunks"][0]["job_id"], slurm_env)
    events = run_dir / "chain.events"
    wait(tmp_path, slurm_env, name, lambda s: " overran " in events.read_text(),
         timeout=400)
    (run_dir / "hold_test").unlink()  # the next chunk's test phase runs through
    st = wait(tmp_path, slurm_env, name, lambda s: s["state"] in TERMINAL, timeout=400)
    out, err = logs(run_dir, "out"), logs(run_dir, "err")
    assert st["state"] == "complete", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == ["stopped", "complete"]
    assert st["chunks"][0]["state"] == "COMPLETED"  # ended by the tool, not Slurm's TIMEOUT
    assert "the step ran into the walltime after the stop signal" in err
    assert "the chain goes on from the last save (1 of at most 2 times" in err
    # the next chunk restored the save of the stop (fit done: 2 epochs x 4 steps) and
    # tested every batch (64 samples, 8 a batch, half on each rank)
    assert "hpc_ckpt_1.ckpt" in err.split("chunk 2 of at most")[1], err[-4000:]
    assert out.count("tested 4 batches; global step 8") == 2, out[-3000:]
    assert (run_dir / "checkpoints" / "epoch=1-step=8.ckpt").is_file()
