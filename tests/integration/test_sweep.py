"""A seed sweep on the REAL local SLURM cluster: one chain per seed, running side by side,
`train status` for the sweep, and the summary across seeds."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_flags
from tests.integration.chains import wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sweep(cwd: Path, env: dict[str, str]) -> dict[str, object]:
    proc = run_cli(["status", "sw", "--json"], cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


def test_a_seed_sweep_runs_its_chains_side_by_side_and_summarises_them(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    proc = run_cli(["submit", "--name", "sw", "--cluster", "local", "--python",
                    sys.executable, "--cpus-per-task", "1", "--mem", "1000M", "--time", "10",
                    "--sweep-seeds", "4 6", "--", "demo", "--episodes", "120",
                    *tiny_flags()], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("submitted sw seed") == 2
    # both seeds' first chunks run at the same time (polled, not timed)
    both = wait(tmp_path, slurm_env, "sw", lambda s: all(
        c["chunks"] and c["chunks"][0]["state"] == "RUNNING" for c in s["chains"])
        or s["state"] == "complete", timeout=240, poll=0.2)
    assert both["state"] != "complete", "the seeds ran one after the other"
    st = wait(tmp_path, slurm_env, "sw", lambda s: s["state"] in ("complete", "failed"),
              timeout=400)
    assert st["state"] == "complete", st
    assert st["done"] == st["total"] == 240 and st["counts"] == {"complete": 2}
    text = run_cli(["status", "sw"], cwd=tmp_path, env=slurm_env).stdout
    assert "sweep of 2 seeds, complete" in text and "sw-s6" in text
    rows = (tmp_path / "runs" / "sw" / "results.csv").read_text().splitlines()
    assert len(rows) == 3  # header + one row per seed, in the sweep's shared CSV
    proc = run_cli(["summary", "sw"], cwd=tmp_path, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    # the table: each seed's chain state as Slurm reports it, and the final evaluations
    table = proc.stdout.splitlines()
    assert [line.split()[::3] for line in table[2:4]] == [["4", "complete"],
                                                          ["6", "complete"]]
    assert "final evaluation over 2 of 2 seed(s): " in table[4] and "+-" in table[4]
    summary = list(csv.DictReader((tmp_path / "runs" / "sw" / "summary.csv").open()))
    assert summary and {r["seeds"] for r in summary} == {"2"}
    assert (tmp_path / "runs" / "sw" / "summary.png").exists()
