"""Seed sweeps: one chain per seed (validated together), and the summary across seeds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.sweep import SweepTask, aggregate, split, write_record
from train.common.errors import ConfigError


def test_a_sweep_is_one_chain_per_seed_under_one_directory(tmp_path: Path) -> None:
    spec = JobSpec(cluster="local", name="e1", out=str(tmp_path / "e1"),
                   sweep_seeds=(4, 6, 8), workload=("demo", "--episodes", "9000"))
    root, specs = split(spec)
    assert root == tmp_path / "e1"
    assert [task.seed for task, _ in specs] == [4, 6, 8]
    assert [task.index for task, _ in specs] == [0, 1, 2]
    _task, six = specs[1]
    assert six.name == "e1-s6" and six.out == str(tmp_path / "e1" / "seed-6")
    assert six.workload == ("demo", "--episodes", "9000", "--seeds", "6")
    assert six.sweep_seeds == ()


@pytest.mark.parametrize(("kw", "message"), [
    (dict(workload=("demo", "--seeds", "4")), "give the seeds once"),
    (dict(entry="navsim", workload=()), "entry train or command"),
])
def test_bad_sweeps_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        split(JobSpec(sweep_seeds=(1, 2), **kw))  # type: ignore[arg-type]
    assert err.value.field == "sweep_seeds" and message in str(err.value)


def test_render_shows_every_seeds_chain_and_refuses_repeats(tmp_path: Path) -> None:
    proc = run_cli(["render", "-M", "local", "--runtime", "none", "--sweep-seeds", "4 6", "--",
                    "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 3  # the array's script and each chain's
    assert "#SBATCH --array=0-1\n" in proc.stdout
    assert " --seeds 4 " in proc.stdout.replace("'", "") and "seed-6" in proc.stdout
    proc = run_cli(["render", "-M", "local", "--runtime", "none", "--sweep-seeds", "4 4", "--",
                    "demo"],
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
    _sweep_on_disk(root, curves, {})
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
    assert proc.returncode == 2 and "chain 1: its dir None is not a task folder" in \
        proc.stderr, proc.stderr


def _sweep_on_disk(root: Path, curves: dict[int, list[float]],
                   evaluations: dict[int, float]) -> None:
    """A sweep's folders as `train submit` and `train run` leave them (no chain record:
    the states come from the run folders)."""
    chains = []
    for seed, rewards in curves.items():
        run_dir = root / f"seed-{seed}"
        (run_dir / f"seed_{seed}").mkdir(parents=True)
        (run_dir / f"seed_{seed}" / "episodes.json").write_text(
            json.dumps({"rewards": rewards}))
        if seed in evaluations:
            (run_dir / "eval").mkdir()
            (run_dir / "eval" / "test_results.json").write_text(json.dumps(
                {str(seed): {"mean_reward": evaluations[seed], "trained_episodes":
                             len(rewards)}}))
            (run_dir / "COMPLETE").touch()
        chains.append(SweepTask(len(chains), str(seed), seed, f"seed-{seed}"))
    write_record(root, root.name, chains)


# `train summary` as the login-node client runs it: neither matplotlib nor numpy installed
_CLIENT = """
import sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("matplotlib", "numpy", "torch"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from train.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_summary_never_writes_through_a_link_at_its_temp_name(tmp_path: Path) -> None:
    """A sweep folder others can write into: a link planted at the name the summary's temp
    file had (.summary.csv.tmp) overwrote the file it named."""
    root = tmp_path / "runs" / "e1"
    _sweep_on_disk(root, {4: [0.0, 1.0], 6: [2.0, 3.0]}, {})
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("theirs\n")
    (root / ".summary.csv.tmp").symlink_to(theirs)
    proc = run_cli(["summary", "e1", "--smooth", "1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert theirs.read_text() == "theirs\n"
    assert (root / "summary.csv").read_text().startswith("episode,mean_reward")


def test_the_summary_runs_on_the_client_without_matplotlib(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "runs" / "e1"
    _sweep_on_disk(root, {4: [0.0, 1.0, 2.0, 3.0], 6: [2.0, 3.0, 4.0, 5.0], 8: [1.0]},
                   {4: 10.0, 6: 14.0})
    proc = subprocess.run([sys.executable, "-c", _CLIENT, "summary", "e1", "--smooth", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "e1: sweep of 3 seed(s)"
    assert lines[1].split() == ["seed", "episodes", "final", "eval", "state"]
    assert lines[2].split() == ["4", "4", "10", "complete"]
    assert lines[3].split() == ["6", "4", "14", "complete"]
    assert lines[4].split() == ["8", "1", "-", "incomplete"]
    # mean and sample standard deviation of 10 and 14: 12 +- 2.828
    assert "final evaluation over 2 of 3 seed(s): 12 +- 2.828 (mean +- std" in lines[5]
    assert "no plot: matplotlib is not installed here" in proc.stderr
    assert "pip install './[run]'" in proc.stderr
    assert (root / "summary.csv").is_file() and not (root / "summary.png").exists()
    rows = list(csv.DictReader((root / "summary.csv").open()))
    # the shortest seed has 1 episode: a window of 1, so the curves are the rewards
    assert float(rows[0]["mean_reward"]) == pytest.approx(1.0)
    assert float(rows[0]["std_reward"]) == pytest.approx((2 / 3) ** 0.5)
    assert proc.stdout.endswith("written: runs/e1/summary.csv\n")


def test_a_short_sweep_plots_no_empty_axes(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "e1"
    _sweep_on_disk(root, {4: [3.0], 6: [5.0]}, {4: 7.0})
    proc = run_cli(["summary", "e1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no plot: the curves have 1 point(s)" in proc.stderr
    assert not (root / "summary.png").exists()
    assert "final evaluation over 1 of 2 seed(s): 7 (one seed, no spread)" in proc.stdout
    # no episode at all: the table still, and no curves
    for seed in (4, 6):
        (root / f"seed-{seed}" / f"seed_{seed}" / "episodes.json").unlink()
    proc = run_cli(["summary", "e1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "has finished an episode yet" in proc.stderr
    assert proc.stdout.splitlines()[2].split() == ["4", "0", "7", "complete"]
