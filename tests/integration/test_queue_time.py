"""Less time in the queue: a chain's chunk starts shorter than --time where the scheduler
has a hole before a maintenance reservation (sbatch --time-min), stops at its stop signal
before it with a save, and the chain goes on after it. Real local Slurm (backfill, as the
sites run it), a MAINT reservation made by the cluster's admin (the tests run as root, the
cluster's SlurmUser), and a program we did not write for the chain: plain_steps.py, which
saves on its stop signal and resumes.

Times here are Slurm's own granularity (whole minutes): the reservation starts 3 minutes
after it is made and lasts 1; the work is counted in steps (the first chunk holds at a step
until its stop signal), never sized from a speed.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.integration.chains import (
    ACTIVE,
    ChainError,
    job_flags,
    logs,
    settled,
    slurm,
    submit,
    wait,
)
from tests.integration.test_benchmarks import NUMBER, short_run
from train.batch.contract import JOB_SCRIPT, JOBS_DIR

pytestmark = pytest.mark.slurm

PLAIN = REPO / "tests" / "integration" / "plain_steps.py"
RESERVATION = "train_maint"


def _delete_reservation(name: str, env: dict[str, str]) -> None:
    """Removed, unless Slurm has already purged it: a reservation that has ended goes on its
    own, a few seconds after its end (the hole test's ends while its chain finishes)."""
    try:
        slurm(["scontrol", "delete", f"ReservationName={name}"], env)
    except ChainError:
        if f"ReservationName={name} " in slurm(["scontrol", "show", "reservation", "-o"], env):
            raise


def _events(run_dir: Path) -> list[list[str]]:
    return [line.split(" ", 4) for line in (run_dir / "chain.events").read_text().splitlines()]


def test_a_chunk_fits_the_hole_before_a_maintenance_and_the_chain_goes_on_after_it(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    made = time.time()
    slurm(["scontrol", "create", "reservation", f"ReservationName={RESERVATION}",
           "StartTime=now+3minutes", "Duration=1", "Nodes=ALL", "Users=root",
           "Flags=MAINT,IGNORE_JOBS"], slurm_env)
    try:
        shutil.copy(PLAIN, tmp_path / "plain_steps.py")
        run_dir = submit(tmp_path, slurm_env, "hole",
                         ["--entry", "command", "--time", "10", "--time-min", "2",
                          "--signal-margin", "30", "--stop-signal", "USR1",
                          "--max-chunks", "2", "--env", "USER_HOLD_AT=5",
                          "--env", "USER_STEPS=10"],
                         [sys.executable, str(tmp_path / "plain_steps.py")])
        st = wait(tmp_path, slurm_env, "hole", settled, timeout=600, poll=2)
    finally:
        _delete_reservation(RESERVATION, slurm_env)
    assert st["state"] == "complete", (st, logs(run_dir)[-3000:])
    events = _events(run_dir)
    by_chunk = {c: [e for e in events if e[1] == c] for c in ("1", "2")}
    first = {e[3]: e for e in by_chunk["1"]}
    # chunk 1 started at once, before the reservation, with the hole's limit, not 10 min
    # (a floor of 2 min: the minute or so left after it is no hole for chunk 2)
    assert int(first["started"][0]) < made + 180, events
    limit, asked = (int(v) for v in first["limit"][4].split())
    assert asked == 600 and 120 <= limit <= 180, events
    assert "stopped" in first and "Slurm started this chunk early" in logs(run_dir)
    # chunk 2 went on from its save after the maintenance, and finished the work
    second = {e[3]: e for e in by_chunk["2"]}
    assert int(second["started"][0]) >= made + 180 + 60 - 5, events
    assert "complete" in second, events
    assert "plain rank 0 resumed at step 5" in logs(run_dir, "out"), logs(run_dir, "out")


def test_the_default_floor_is_off_where_slurm_starts_every_floor_job_short(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """Slurm 22.05 starts a job that has --time-min with that minimum as its limit even on
    idle nodes: there the default floor is off, said at submit; later releases keep it."""
    version = slurm(["sbatch", "--version"], slurm_env).split()[1]
    proc = run_cli(["submit", "--name", "release", *job_flags(
        "--entry", "command", "--time", "8", "--max-chunks", "2", "--stop-signal", "USR1"),
        "--", "true"], cwd=tmp_path, env=slurm_env)
    try:
        assert proc.returncode == 0, proc.stderr
        script = (tmp_path / "runs" / "release" / JOBS_DIR / JOB_SCRIPT).read_text()
        short = tuple(int(n) for n in version.split(".")[:2]) < (23, 0)
        assert ("#SBATCH --time-min=" in script) is not short, (version, script)
        assert (f"Slurm {version} starts a job that has --time-min" in proc.stderr) is short, \
            proc.stderr
    finally:
        run_cli(["cancel", "release"], cwd=tmp_path, env=slurm_env)


def test_the_queue_benchmark_runs_in_its_short_mode(tmp_path: Path,
                                                    slurm_env: dict[str, str]) -> None:
    """benchmarks/bench_queue.py's code whole (the other users' jobs, the maintenance, both
    chains, the figures from the run folders) on a scenario with nothing to wait for: here,
    beside the main run (noxfile.py's SLURM_CHAINS_I), not in test_benchmarks.py's."""
    short_run(tmp_path, "queue", rf"\| ratio \| {NUMBER}x \|(?s:.*)\| fixed chunks \| 1 \| "
              rf"\d+ \|(?s:.*)\| site-b \(n1, n2\) \| 1 min \| {NUMBER} \|", slurm_env)


def test_the_queue_benchmark_removes_its_jobs_and_reservation_when_the_chain_fails(
        slurm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("bench_queue",
                                                  REPO / "benchmarks" / "bench_queue.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_queue", bench)  # (its dataclasses look it up)
    spec.loader.exec_module(bench)
    with pytest.raises(RuntimeError, match="the chain failed"), \
            bench.busy_cluster(bench.FULL, slurm_env, "gone") as busy:
        assert set(busy.jobs) == {"site-a", "site-b"}
        assert "bench_maint_gone" in slurm(["scontrol", "show", "reservation"], slurm_env)
        raise RuntimeError("the chain failed")
    assert "bench_maint_gone" not in slurm(["scontrol", "show", "reservation"], slurm_env)
    deadline = time.monotonic() + 60
    while (left := [s for s in slurm(["squeue", "-h", "-j", ",".join(busy.jobs.values()),
                                      "-o", "%T"], slurm_env).split() if s in ACTIVE]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left


def test_the_reservations_read_whatever_time_format_the_user_set(
        slurm_env: dict[str, str]) -> None:
    """SLURM_TIME_FORMAT (relative, or a strftime format, in a user's shell profile)
    changes how scontrol prints a reservation's times: the client asks in Slurm's standard
    one, so submit, status and the probe still see the maintenance."""
    from train.client.clusters.probe.site import read_site
    from train.client.slurm import queue

    name = "train_maint_fmt"
    slurm(["scontrol", "create", "reservation", f"ReservationName={name}",
           "StartTime=now+2days", "Duration=1", "Nodes=n2", "Users=root",
           "Flags=MAINT,IGNORE_JOBS"], slurm_env)
    try:
        for fmt in ("relative", "%d/%m %H:%M"):
            env = {**slurm_env, "SLURM_TIME_FORMAT": fmt}
            found = [r for r in queue.read(env) or [] if r.name == name]
            assert len(found) == 1 and found[0].maintenance, (fmt, found)
            assert found[0].end - found[0].start == 60
            site = read_site(env)
            assert [r.name for r in site.reservations or []].count(name) == 1, site.unread
    finally:
        _delete_reservation(name, slurm_env)
