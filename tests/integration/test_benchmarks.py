"""Every benchmark of benchmarks/ in its short mode (benchmarks/_results.py): its code runs
whole on a few rounds of its smallest case and writes its section of figures to a file of
the test's own; RESULTS.md is never touched and no figure is judged (a short run measures
nothing). A benchmark whose jobs the client has come to refuse, or whose imports moved,
fails here, not on the day someone next runs `nox -s bench`. Those that need the local
Slurm or a Docker engine run in their tier, on its cluster or engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

BENCH = REPO / "benchmarks"
NUMBER = r"\d+(?:\.\d+)?"


def short_run(tmp_path: Path, name: str, figure: str,
              env: dict[str, str] | None = None) -> None:
    """Runs benchmarks/bench_NAME.py in the short mode; its section of the results file
    must hold `figure` (a regular expression: where a figure stands, a number)."""
    results = tmp_path / "RESULTS.md"
    before = (BENCH / "RESULTS.md").read_bytes()
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"bench_{name}.py")], cwd=tmp_path,
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, **(env or {}), "TRAIN_BENCH_SHORT": "1",
             "TRAIN_BENCH_RESULTS": str(results), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"bench_{name}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert (BENCH / "RESULTS.md").read_bytes() == before
    found = re.search(rf"<!-- bench:{name} -->\n(.*?)<!-- /bench:{name} -->",
                      results.read_text(), re.S)
    assert found, results.read_text()
    assert re.search(figure, found.group(1)), found.group(1)


@pytest.mark.parametrize(("name", "figure"), [
    pytest.param("flags", rf"MIG smoke test on Rivanna, 10 minutes \| 4: (?s:.*)warm "
                 rf"{NUMBER} ms", id="flags"),
    pytest.param("update", rf"\| 16 \| 32 \| {NUMBER} \| {NUMBER} \| {NUMBER} \|",
                 id="update"),
    pytest.param("checkpoint", rf"\| 16 \| 500 \| {NUMBER} \| {NUMBER} \|", id="checkpoint"),
    pytest.param("learning", rf"\| 16 \| {NUMBER} \| {NUMBER} \| {NUMBER} \(2 episodes",
                 id="learning"),
    pytest.param("doctor", rf"`train status --all`, 10 runs \| {NUMBER} s", id="doctor"),
])
def test_a_benchmark_on_this_machine_runs_in_its_short_mode(
        tmp_path: Path, name: str, figure: str) -> None:
    short_run(tmp_path, name, figure)
    if name == "learning":
        assert (tmp_path / "learning_curve.png").stat().st_size > 0


@pytest.mark.slurm
@pytest.mark.parametrize(("name", "figure"), [
    pytest.param("submit", rf"\| train submit \| {NUMBER} \|", id="submit"),
    pytest.param("launch", rf"\| tasks \| {NUMBER} \| {NUMBER} \| {NUMBER} \|", id="launch"),
    pytest.param("chain", rf"\| scancel \| `scancel JOB` \| cancelled \| {NUMBER} \|",
                 id="chain"),
])
def test_a_benchmark_on_the_local_slurm_runs_in_its_short_mode(
        tmp_path: Path, slurm_env: dict[str, str], name: str, figure: str) -> None:
    short_run(tmp_path, name, figure, slurm_env)


@pytest.mark.docker
def test_the_image_benchmark_runs_in_its_short_mode_on_the_tiers_images(
        tmp_path: Path, ci_image: str, sc2_image: str,
        docker_engine: dict[str, str]) -> None:
    short_run(tmp_path, "image",
              rf"not built in the short mode(?s:.*)\| mock / demo \| {NUMBER}x \|",
              {**docker_engine, "TRAIN_BENCH_BASE_TAG": ci_image,
               "TRAIN_BENCH_SC2_TAG": sc2_image})


@pytest.mark.gpu
def test_the_gpu_benchmark_runs_in_its_short_mode(tmp_path: Path) -> None:
    short_run(tmp_path, "gpu", rf"\| 32 \| 32 \| bf16 \| {NUMBER} \|")
