"""Races between a chunk's end and what asks it to stop, on the REAL SLURM cluster (see
conftest.py): a program that asks to be requeued and exits at once, a late walltime signal
while the batch shell submits the successor again, and an sbatch whose reply is lost after
the controller accepted the job. Each program is a small bash script that behaves as a
real training script does; the Slurm commands it meets are the real ones, except where a
test puts a stand-in for `sbatch` first on PATH (it runs the real sbatch)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.integration.chains import (
    ENDLESS,
    logs,
    running_chunk,
    settled,
    slurm,
    status,
    submit,
    wait,
    walltime_signal,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _events(run_dir: Path) -> list[tuple[str, str]]:
    """(chunk, event) for each line of the chain's record."""
    return [(line.split()[1], line.split()[3])
            for line in (run_dir / "chain.events").read_text().splitlines()]


def _sbatch_first(tmp_path: Path, env: dict[str, str], body: str) -> dict[str, str]:
    """env with an `sbatch` stand-in first on PATH: `body` runs for the successor submissions
    (those with --dependency) before the real sbatch ($REAL) does; train submit's own
    sbatch of chunk 1 goes straight through. The job inherits PATH (sbatch --export=ALL)."""
    path = env.get("PATH", os.environ["PATH"])  # (the cluster's client commands first)
    shim = tmp_path / "shim"
    shim.mkdir()
    real = shutil.which("sbatch", path=path)
    assert real is not None
    (shim / "sbatch").write_text(
        f"#!/bin/bash\nREAL={real}\nSTATE={tmp_path}\n"
        'case " $* " in *" --dependency="*)\n' + body + "\n;; esac\n"
        'exec "$REAL" "$@"\n')
    (shim / "sbatch").chmod(0o755)
    return {**env, "PATH": f"{shim}:{path}"}


# -- 1: a program that asks to end its chunk is never taken as complete --------------

# Chunk 1 records 5 of 100 units and asks to be requeued (`scontrol requeue`, which train
# launch's stand-in turns into "end this chunk"); chunk 2 finishes the work and exits 0.
ASKS = """#!/bin/bash
if [ "$TRAIN_CHUNK" -ge 2 ]; then echo "100 100" > "$TRAIN_PROGRESS_FILE"; exit 0; fi
ask() {
    echo "5 100" > "$TRAIN_PROGRESS_FILE"
    scontrol requeue "$SLURM_JOB_ID"
}
case "$1" in
    at-once) ask; exit 0 ;;
    lingers) ask; sleep 1; exit 0 ;;  # closes its files, say; no TERM handler
    usr1)  # the everyday idiom, on the walltime signal
        trap 'ask; exit 0' USR1
        touch "$TRAIN_SIGNAL_READY" "$TRAIN_RUN_DIR/held"
        while :; do sleep 0.1; done ;;
esac
exit 9
"""


@pytest.mark.parametrize("way", ["at-once", "lingers", "usr1", "usr1-to-the-step"])
def test_a_program_that_asks_to_be_requeued_is_continued_not_complete(
        tmp_path: Path, slurm_env: dict[str, str], way: str) -> None:
    program = tmp_path / "asks.sh"
    program.write_text(ASKS)
    program.chmod(0o755)
    name = f"asks-{way}"
    run_dir = submit(tmp_path, slurm_env, name,
                     ["--entry", "command", "--launch", "tasks", "--stop-signal", "USR1",
                      "--time", "5", "--max-chunks", "3"],
                     [str(program), way.removesuffix("-to-the-step")])
    if way.startswith("usr1"):
        st = wait(tmp_path, slurm_env, name, lambda s: (run_dir / "held").exists())
        job = st["chunks"][0]["job_id"]
        if way == "usr1":
            walltime_signal(job, slurm_env)  # through the batch shell, as at the margin
        else:  # straight to the step's tasks, as `scancel -s USR1 JOB` does
            slurm(["scancel", "--signal=USR1", job], slurm_env)
    st = wait(tmp_path, slurm_env, name, settled)
    assert st["state"] == "complete", (st, logs(run_dir)[-3000:])
    assert (st["done"], st["total"]) == (100, 100), st
    assert _events(run_dir) == [("1", "started"), ("1", "extended"), ("1", "stopped"),
                                ("2", "started"), ("2", "extended"), ("2", "complete")]
    assert [c["state"] for c in st["chunks"]] == ["COMPLETED", "COMPLETED", "CANCELLED"]
    assert "asked to end this chunk" in logs(run_dir)


# -- 2: a late walltime signal never kills the batch shell after the step ended ------

def test_a_walltime_signal_during_the_end_time_retry_does_not_fail_the_chunk(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # the successor is refused at the chunk's start; at its end the batch shell submits
    # it again, and the walltime USR1 reaches the batch shell just then
    env = _sbatch_first(tmp_path, slurm_env, """
    if mkdir "$STATE/refused" 2>/dev/null; then
        echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy" >&2
        exit 1
    fi
    if mkdir "$STATE/signalled" 2>/dev/null; then
        pid=$$  # up to the batch shell: the child of slurmstepd
        while parent=$(awk '{print $4}' "/proc/$pid/stat") && \\
                [ "$(cat "/proc/$parent/comm")" != slurmstepd ]; do
            pid=$parent
        done
        kill -USR1 "$pid"
    fi""")
    run_dir = submit(tmp_path, env, "late", ["--time", "10", "--max-chunks", "3"], ENDLESS)
    job = running_chunk(tmp_path, env, "late", 1, min_episode=25)
    walltime_signal(job["job_id"], env)
    st = wait(tmp_path, env, "late", lambda s: any(
        c["chunk"] == 2 and c["state"] == "RUNNING" for c in s["chunks"])
        or settled(s))
    assert (tmp_path / "signalled").exists()
    assert [c["state"] for c in st["chunks"]][:2] == ["COMPLETED", "RUNNING"], (
        st, logs(run_dir)[-3000:])
    assert _events(run_dir)[:4] == [("1", "started"), ("1", "extend_failed"),
                                    ("1", "extended"), ("1", "stopped")]
    proc = run_cli(["cancel", "late"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, env, "late", settled)
    assert st["state"] == "cancelled", st


# -- 4: a lost sbatch reply never makes a second successor ---------------------------

def _queued(env: dict[str, str], name: str) -> list[str]:
    """This user's jobs of that name that Slurm still holds (pending or running)."""
    return slurm(["squeue", "-h", "-u", str(os.getuid()), "-n", name, "-o", "%i",
                  "-t", "PENDING,CONFIGURING,RUNNING,SUSPENDED"], env).split()


def test_a_lost_sbatch_reply_leaves_one_successor_which_train_cancel_ends(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    # the controller accepts chunk 2, but its reply never reaches the batch shell
    env = _sbatch_first(tmp_path, slurm_env, """
    if mkdir "$STATE/lost" 2>/dev/null; then
        "$REAL" "$@" > "$STATE/lost/reply" 2>&1
        echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
        exit 1
    fi""")
    # (chunk 2 is the last: it submits no successor of its own while the test counts)
    run_dir = submit(tmp_path, env, "lost", ["--time", "10", "--max-chunks", "2"], ENDLESS)
    first = running_chunk(tmp_path, env, "lost", 1, min_episode=25)["job_id"]
    wait(tmp_path, env, "lost", lambda s: ("1", "extend_failed") in _events(run_dir))
    accepted = (tmp_path / "lost" / "reply").read_text().strip()
    assert accepted.isdigit(), accepted  # the controller did take it
    walltime_signal(first, env)
    wait(tmp_path, env, "lost", lambda s: ("1", "stopped") in _events(run_dir) or settled(s))
    st = status(tmp_path, env, "lost")  # (what the record says now)
    successors = [j for j in _queued(env, "lost") if j != first]
    assert successors == [accepted], (successors, st, logs(run_dir)[-3000:])
    chunks: list[dict[str, Any]] = st["chunks"]
    assert [c["job_id"] for c in chunks] == [first, accepted], st
    proc = run_cli(["cancel", "lost"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    st = wait(tmp_path, env, "lost", settled)
    assert st["state"] == "cancelled", st
    assert _queued(env, "lost") == []
