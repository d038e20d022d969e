"""The README's Hugging Face Trainer recipe on the REAL local Slurm cluster, with a program
in the Trainer's shape (trainer_like.py: checkpoint-N/trainer_state.json, resumes only with
--resume_from_checkpoint DIR, no signal handler): `{newest:out/checkpoint-*}` names the
newest save at each chunk's start, over three chunks with no wrapper; the same program
without --resume-args starts over in its second chunk, and the chain says so.

The walltime signal is sent by the test (as Slurm's `--signal=B:USR1@N` does) once the
program stands still after a counted number of steps; the tool's own TERM ends it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.integration.chains import logs, submit, wait
from tests.integration.test_resume_args import TERMINAL, _runs, _stop_when_blocked
from tests.unit.test_repo import readme_recipes

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROGRAM = Path(__file__).with_name("trainer_like.py")


def _readme_flags() -> list[str]:
    """The docs' Trainer recipe: its flags between `submit` and `--`, the walltime, the
    chain's bound and the GPUs aside (the test's chunks get 10 minutes, the margin 30 s; the
    test bounds the chain with --max-chunks; the local cluster's GPUs are fake, and a step
    with GPUs stops where CUDA does not work)."""
    argv = next(a for a in readme_recipes() if "run_clm.py" in a)
    flags = argv[1:argv.index("--")]
    for flag in ("-t", "--total-time", "-g"):
        at = flags.index(flag)
        flags = [*flags[:at], *flags[at + 2:]]
    return [*flags, "--time", "10", "--signal-margin", "30"]


def _steps(log_dir: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in (log_dir / "steps.log").read_text().splitlines():
        pid, step = line.split()
        out.setdefault(int(pid), []).append(int(step))
    return out


def test_the_trainer_recipe_resumes_from_the_newest_checkpoint_each_chunk(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(PROGRAM, tmp_path / "trainer_like.py")
    log_dir = tmp_path / "log"
    flags = _readme_flags()
    assert "--resume_from_checkpoint {newest:out/checkpoint-*}" in flags
    # 30 steps, a save every 5, at most 12 in one process: chunk 1 runs 1-12 (saves 5, 10);
    # chunk 2 resumes at 10 and runs 11-22; chunk 3 resumes at 20 and ends at 30
    run_dir = submit(tmp_path, slurm_env, "hf", [*flags, "--max-chunks", "3"],
                     [sys.executable, "trainer_like.py", "--output_dir", "out",
                      "--save_steps", "5", "--max_steps", "30", "--block_after", "12"])
    _stop_when_blocked(tmp_path, slurm_env, "hf", log_dir, 1)
    _stop_when_blocked(tmp_path, slurm_env, "hf", log_dir, 2)
    st = wait(tmp_path, slurm_env, "hf", lambda s: s["state"] in TERMINAL, timeout=300)
    err = logs(run_dir)
    assert st["state"] == "complete", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"]] == ["stopped", "stopped", "complete"]
    runs = _runs(log_dir)
    assert [r["chunk"] for r in runs] == ["1", "2", "3"]
    assert [r["argv"][-2:] for r in runs[1:]] == [
        ["--resume_from_checkpoint", "out/checkpoint-10"],
        ["--resume_from_checkpoint", "out/checkpoint-20"]]
    assert "--resume_from_checkpoint" not in runs[0]["argv"]
    steps = _steps(log_dir)
    assert [steps[r["pid"]] for r in runs] == [list(range(1, 13)), list(range(11, 23)),
                                               list(range(21, 31))]
    # the progress the saves show, chunk by chunk
    assert "checkpointed stop (at 10/30); the next chunk goes on from it" in err
    assert "checkpointed stop (at 20/30)" in err
    assert st["chunks_used"] == 3


def test_a_program_that_ignores_its_saves_is_named_as_making_no_progress(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    shutil.copy(PROGRAM, tmp_path / "trainer_like.py")
    log_dir = tmp_path / "log"
    flags = ["--entry", "command", "--stop-mode", "kill", "--save-path", "out",
             "--time", "10", "--signal-margin", "30", "--max-chunks", "3"]
    run_dir = submit(tmp_path, slurm_env, "again", flags,
                     [sys.executable, "trainer_like.py", "--output_dir", "out",
                      "--save_steps", "5", "--max_steps", "30", "--block_after", "12"])
    _stop_when_blocked(tmp_path, slurm_env, "again", log_dir, 1)
    _stop_when_blocked(tmp_path, slurm_env, "again", log_dir, 2)
    st = wait(tmp_path, slurm_env, "again", lambda s: s["state"] in TERMINAL, timeout=300)
    err = logs(run_dir)
    assert st["state"] == "stalled", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"] if c["events"]] == [
        "stopped", "no_progress"], st
    assert "chunk 2" in st["cause"] and "made no progress" in st["cause"]
    assert "started over from zero" in st["cause"]
    assert "--resume_from_checkpoint {newest:out/checkpoint-*}" in st["cause"]
    assert "made no progress in this chunk" in err
    assert len(_runs(log_dir)) == 2  # no third chunk ran
