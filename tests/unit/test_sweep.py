"""Seed sweeps: one chain per seed (validated together), and the summary across seeds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from train.errors import ConfigError
from train.slurm.job import JobSpec
from train.slurm.sweep import aggregate, split, write_record


def test_a_sweep_is_one_chain_per_seed_under_one_directory(tmp_path: Path) -> None:
    spec = JobSpec(cluster="local", name="e1", out=str(tmp_path / "e1"),
                   sweep_seeds=(4, 6, 8), workload=("demo", "--episodes", "9000"))
    root, specs = split(spec)
    assert root == tmp_path / "e1"
    assert [seed for seed, _ in specs] == [4, 6, 8]
    _seed, six = specs[1]
    assert six.name == "e1-s6" and six.out == str(tmp_path / "e1" / "seed-6")
    assert six.workload == ("demo", "--episodes", "9000", "--seeds", "6")
    assert six.sweep_seeds == ()


@pytest.mark.parametrize(("kw", "message"), [
    (dict(workload=("demo", "--seeds", "4")), "give the seeds once"),
    (dict(entry="command", workload=("python", "x.py")), "`train run` workloads"),
])
def test_bad_sweeps_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        split(JobSpec(sweep_seeds=(1, 2), **kw))  # type: ignore[arg-type]
    assert err.value.field == "sweep_seeds" and message in str(err.value)


def test_render_shows_every_seeds_chain_and_refuses_repeats(tmp_path: Path) -> None:
    proc = run_cli(["render", "-M", "local", "--sweep-seeds", "4 6", "--", "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 2
    assert "--seeds\n    4" in proc.stdout.replace("'", "") and "seed-6" in proc.stdout
    proc = run_cli(["render", "-M", "local", "--sweep-seeds", "4 4", "--", "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 2 and "sweep_seeds" in proc.stderr


def test_the_sweeps_state_is_its_worst_chains() -> None:
    chains = [{"state": "complete", "done": 10, "total": 10},
              {"state": "running", "done": 4, "total": 10}]
    st = aggregate("e1", Path("/r/e1"), chains)
    assert st["state"] == "running" and st["done"] == 14 and st["total"] == 20
    st = aggregate("e1", Path("/r/e1"), [*chains, {"state": "failed"}])
    assert st["state"] == "failed" and st["counts"]["failed"] == 1


def test_the_summary_has_the_mean_and_spread_across_seeds(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "e1"
    curves = {4: [0.0, 1.0, 2.0, 3.0, 4.0], 6: [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}
    chains = []
    for seed, rewards in curves.items():
        run_dir = root / f"seed-{seed}"
        (run_dir / f"seed_{seed}").mkdir(parents=True)
        (run_dir / f"seed_{seed}" / "episodes.json").write_text(
            json.dumps({"rewards": rewards}))
        chains.append({"seed": seed, "run_dir": str(run_dir)})
    write_record(root, "e1", chains)
    proc = run_cli(["summary", "e1", "--smooth", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((root / "summary.csv").open()))
    # moving averages over 2 episodes, per episode over the seeds that reached it
    assert [int(r["episode"]) for r in rows] == [2, 3, 4, 5, 6]
    assert float(rows[0]["mean_reward"]) == pytest.approx((0.5 + 2.5) / 2)
    assert float(rows[0]["std_reward"]) == pytest.approx(1.0)
    assert [r["seeds"] for r in rows] == ["2", "2", "2", "2", "1"]
    assert float(rows[-1]["mean_reward"]) == pytest.approx(6.5)
    assert (root / "summary.png").stat().st_size > 0
    proc = run_cli(["summary", "nope"], cwd=tmp_path)
    assert proc.returncode == 2
    # a seed whose record is broken is left out by name; bad windows are refused
    (root / "seed-6" / "seed_6" / "episodes.json").write_text('{"rewards": ["a", null]}')
    proc = run_cli(["summary", "e1"], cwd=tmp_path)
    assert proc.returncode == 0 and "seed 6 left out" in proc.stderr, proc.stderr
    assert run_cli(["summary", "e1", "--smooth", "0"], cwd=tmp_path).returncode == 2
    (root / "sweep.json").write_text('{"chains": [{"run_dir": "x"}]}')
    proc = run_cli(["summary", "e1"], cwd=tmp_path)
    assert proc.returncode == 2 and "no integer seed" in proc.stderr
