"""Hugging Face's real Trainer on the REAL local Slurm cluster (hf_clm.py: a tiny GPT-2
from its config, a tokenizer trained on the test's text, no hub): the README's recipe
chains it over three chunks, each from the newest checkpoint-N; a seed sweep gives each
task its folder and `train summary` its all_results.json; two ranks on two nodes that
raise are a failure with code 1, never the 143 of the TERM Slurm sends the rest.

The walltime signal is sent by the test (as Slurm's `--signal=B:USR1@N` does) once the
program stands still after a counted number of steps.
"""

from __future__ import annotations

import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.chains import TERMINAL, logs, settled, submit, wait
from tests.integration.test_resume_args import _runs, _stop_when_blocked
from tests.integration.test_resume_newest import _readme_flags, _steps

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROGRAM = Path(__file__).with_name("hf_clm.py")
# the Trainer's own flags every run here gives: CPU, no reporting, a step per log line
TRAINER = ["--use_cpu", "true", "--report_to", "none", "--logging_steps", "1",
           "--per_device_train_batch_size", "4", "--disable_tqdm", "true"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _setup(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    shutil.copy(PROGRAM, tmp_path / "hf_clm.py")
    words = [f"w{i}" for i in range(120)]
    rng = random.Random(0)
    (tmp_path / "corpus.txt").write_text(" ".join(rng.choice(words) for _ in range(1200)))
    return {**env, **OFFLINE}


def test_the_readme_recipe_chains_the_trainer_from_the_newest_checkpoint(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = _setup(tmp_path, slurm_env)
    log_dir = tmp_path / "log"
    flags = _readme_flags()
    assert "--resume_from_checkpoint {newest:out/checkpoint-*}" in flags
    # 14 steps, a save every 4, at most 5 in one process, then the stop signal (the TERM of
    # --stop-mode kill), on which the callback saves: chunk 1 runs 1-5 (saves 4, 5);
    # chunk 2 resumes from checkpoint-5 and runs 6-10 (saves 8, 10); chunk 3 from
    # checkpoint-10 runs 11-14
    run_dir = submit(tmp_path, env, "hf", [*flags, "--max-chunks", "3"],
                     [sys.executable, "hf_clm.py", "--output_dir", "out", "--save_steps", "4",
                      "--max_steps", "14", *TRAINER, "--block_after", "5"])
    _stop_when_blocked(tmp_path, env, "hf", log_dir, 1)
    _stop_when_blocked(tmp_path, env, "hf", log_dir, 2)
    st = wait(tmp_path, env, "hf", lambda s: s["state"] in TERMINAL, timeout=600)
    err = logs(run_dir)
    assert st["state"] == "complete", (st, err[-4000:])
    assert [c["events"][-1] for c in st["chunks"]] == ["stopped", "stopped", "complete"]
    runs = _runs(log_dir)
    assert [r["chunk"] for r in runs] == ["1", "2", "3"]
    assert "--resume_from_checkpoint" not in runs[0]["argv"]
    assert [r["argv"][-2:] for r in runs[1:]] == [
        ["--resume_from_checkpoint", "out/checkpoint-5"],
        ["--resume_from_checkpoint", "out/checkpoint-10"]]
    # the Trainer's own global steps go on where each save left them, up to max_steps
    steps = _steps(log_dir)
    assert [steps[r["pid"]] for r in runs] == [list(range(1, 6)), list(range(6, 11)),
                                               list(range(11, 15))]
    out = logs(run_dir, "out")
    assert out.count("stopped by the signal at step") == 2, out[-3000:]
    assert "finished at step 14" in out
    assert "checkpointed stop (at 5/14); the next chunk goes on from it" in err
    assert "checkpointed stop (at 10/14)" in err
    assert (tmp_path / "out" / "all_results.json").is_file()
    assert st["chunks_used"] == 3


def test_a_seed_sweep_of_the_trainer_gives_each_task_its_folder_and_sums_up_its_results(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = _setup(tmp_path, slurm_env)
    proc = run_cli(["submit", "--name", "seeds", "--cluster", "local", "-e", "command",
                    "--python", sys.executable, "--cpus-per-task", "1", "--mem", "1500M",
                    "--time", "10", "--sweep-seeds", "1 2", "--",
                    sys.executable, "hf_clm.py", "--seed", "{value}",
                    "--output_dir", "{task_dir}/out", "--log_dir", "{task_dir}/log",
                    "--save_steps", "3", "--max_steps", "3", *TRAINER],
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, env, "seeds", lambda s: all(settled(c) for c in s["chains"]),
              timeout=600)
    root = tmp_path / "runs" / "seeds"
    assert st["counts"] == {"complete": 2}, (st, logs(root)[-3000:])
    tasks = sorted(p for p in root.iterdir() if (p / "out").is_dir())
    assert len(tasks) == 2, sorted(p.name for p in root.iterdir())
    for task in tasks:
        assert (task / "out" / "all_results.json").is_file()
        assert (task / "out" / "checkpoint-3" / "trainer_state.json").is_file()
    seeds = [(t / "log" / "runs.log").read_text() for t in tasks]
    assert ['"--seed", "1"' in s for s in seeds] == [True, False]
    assert ['"--seed", "2"' in s for s in seeds] == [False, True]
    out = run_cli(["summary", "seeds"], cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[1].split()
    assert "train_loss" in header and "epoch" in header, out.stdout
    rows = [line.split() for line in lines[2:4]]
    assert [r[0] for r in rows] == ["1", "2"], out.stdout
    assert [r[-1] for r in rows] == ["complete", "complete"], out.stdout
    losses = [float(r[header.index("train_loss")]) for r in rows]
    assert all(0 < loss < 20 for loss in losses) and losses[0] != losses[1], out.stdout


def test_trainer_ranks_raising_on_two_nodes_fail_the_chain_with_code_1(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    env = _setup(tmp_path, slurm_env)
    run_dir = submit(tmp_path, env, "boom", ["--entry", "command", "--nodes", "2",
                                             "--time", "10"],
                     [sys.executable, "hf_clm.py", "--output_dir", "out", "--save_steps",
                      "100", "--max_steps", "10", *TRAINER, "--fail_at_step", "2"])
    st = wait(tmp_path, env, "boom", lambda s: s["state"] in TERMINAL and all(
        c["state"] not in ("PENDING", "RUNNING", "COMPLETING") for c in s["chunks"]),
        timeout=600)
    err = logs(run_dir)
    assert st["state"] == "failed", (st, err[-4000:])
    assert "a bad batch at step 2" in err  # the Trainer ran in DDP and both ranks raised
    assert re.search(r"exited with code 1 on node \S+; see", st["cause"]), st["cause"]
    assert "143" not in st["cause"]
    assert re.search(r"training step failed with exit code 1 on node \S+", err), err[-3000:]
    failed = [line.split() for line in (run_dir / "chain.events").read_text().splitlines()
              if line.split()[3:4] == ["failed"]]
    assert [f[4] for f in failed] == ["1"], failed
