"""A chain with a floor (--time-min): the engine reads the time limit Slurm started the
chunk with, tells the program the deadline it sets, and counts the chain's bound in time
(stub Slurm commands, as in test_chain_engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_chain_engine import _calls, _env, _events, _ids, _kinds, _run, _start
from train.batch import contract
from train.batch.saves import parse_limit, time_used


@pytest.mark.parametrize(("text", "seconds"), [
    ("30:00\n", 1800), ("2:00:00", 7200), ("1-00:00:00", 86400), ("1-02:03:04", 93784),
    ("45", 2700), ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("", None),
    ("0:00", None), ("1:2:3:4", None), ("-5", None)])
def test_squeue_time_limits_read_as_seconds(text: str, seconds: int | None) -> None:
    assert parse_limit(text) == seconds


def test_the_time_used_counts_each_chunks_last_limit_and_the_whole_walltime_without_one(
        ) -> None:
    events = ("1 3 500 started 0 0 0\n1 3 500 limit 1800 3600\n"
              "2 3 500 limit 1200 3600\n"  # (a restart of chunk 3: its last counts)
              "3 5 600 limit junk 3600\n9 2 400 limit 60 3600\n")
    # chunks 3, 4 (none: 3600) and 5 (junk: 3600); chunk 2 is an earlier chain's
    assert time_used(events, 3, 6, 3600) == 1200 + 3600 + 3600


def _limit(tmp_path: Path, text: str) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    (stubs / "squeue.limit").write_text(text)


def test_a_chunk_started_short_is_told_its_real_deadline_and_records_its_limit(
        tmp_path: Path) -> None:
    _env(tmp_path)
    _limit(tmp_path, "30:00\n")
    proc = _start(tmp_path, COMPLETE_ON_SUCCESS="1", WALLTIME_SECONDS="3600",
                  STOP_MARGIN="300", TIME_MIN_SECONDS="900", MAX_CHUNKS="1")
    env = dict(line.split("=", 1) for line in
               (tmp_path / "run" / "step.env").read_text().splitlines())
    (tmp_path / "run" / "step.quit").touch()
    _, err = proc.communicate(timeout=30)
    started = int((tmp_path / "run" / contract.CHAIN_EVENTS).read_text().split()[0])
    # the deadline from the limit Slurm set (1800 s), not the 3600 asked for
    assert 0 <= started + 1800 - 300 - int(env["TRAIN_DEADLINE"]) <= 1, err
    assert "--noheader --jobs=500 --format=%l" in _calls(tmp_path, "squeue")
    assert [e[2:] for e in _events(tmp_path)][:2] == [["started", "0 0 0"],
                                                     ["limit", "1800 3600"]]
    assert "Slurm started this chunk early, in a hole of 1800s of the 3600s" in err
    # a bound of one chunk of 3600 s, half used: one more chunk (no extra chunk charged)
    assert env["TRAIN_MAX_CHUNKS"] == "2"
    assert _ids(tmp_path).endswith("2 901\n"), err


def test_the_bound_counts_time_so_short_chunks_cost_no_extra_chunk(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # chunks 1 and 2 ran 1800 s each of the 3600 asked; chunk 3 gets the whole 3600: with
    # max_chunks 3 the chain has 3600 s left after it, one more chunk
    (run / contract.CHAIN_IDS).write_text("1 300\n2 400\n3 500\n")
    (run / contract.CHAIN_EVENTS).write_text("1 1 300 limit 1800 3600\n"
                                             "2 2 400 limit 1800 3600\n")
    _env(tmp_path)
    _limit(tmp_path, "1:00:00\n")
    proc = _run(tmp_path, "progress", chunk="3", TIME_MIN_SECONDS="900")
    assert proc.returncode == 0, proc.stderr
    assert _kinds(tmp_path)[2:] == ["started", "limit", "extended", "stopped"]
    assert _ids(tmp_path).endswith("4 901\n")
    # the same chain of whole chunks: chunk 3 is its last
    other = tmp_path / "whole"
    (other / "run").mkdir(parents=True)
    (other / "run" / contract.CHAIN_IDS).write_text("1 300\n2 400\n3 500\n")
    _env(other)
    _limit(other, "1:00:00\n")
    proc = _run(other, "progress", chunk="3", TIME_MIN_SECONDS="900")
    assert _kinds(other) == ["started", "limit", "incomplete"], proc.stderr
    assert "counted in time" in proc.stderr


def test_a_limit_squeue_cannot_give_is_the_walltime_asked_for(tmp_path: Path) -> None:
    _env(tmp_path)
    _limit(tmp_path, "UNLIMITED\n")
    proc = _run(tmp_path, "progress", TIME_MIN_SECONDS="900")
    assert proc.returncode == 0, proc.stderr
    assert "could not read this chunk's time limit (squeue: UNLIMITED): taking the 3600s " \
           "asked for" in proc.stderr
    assert [e[2:] for e in _events(tmp_path)][1] == ["limit", "3600 3600"]
    # asked again before it gives up (a busy controller's one timeout is no answer)
    assert _calls(tmp_path, "squeue").count("--noheader --jobs=500 --format=%l") == 3


def test_a_chain_without_a_floor_asks_squeue_nothing_and_writes_no_limit(
        tmp_path: Path) -> None:
    proc = _run(tmp_path, "progress")
    assert proc.returncode == 0, proc.stderr
    assert "limit" not in _kinds(tmp_path)
    assert not any("%l" in call for call in _calls(tmp_path, "squeue"))


@pytest.mark.parametrize(("said", "short"), [
    ("slurm 22.05.8\n", "22.05.8"), ("slurm 21.08.5\n", "21.08.5"),
    ("slurm 23.02.7\n", None), ("slurm 24.11.5\n", None), ("slurm 26.05.5\n", None),
    ("junk\n", None), ("", None)])
def test_the_release_where_a_default_floor_would_start_every_chunk_short(
        said: str, short: str | None, tmp_path: Path) -> None:
    import os
    import shlex

    from train.client.slurm.testonly import floor_starts_short

    stub = tmp_path / "sbatch"
    stub.write_text(f"#!/bin/bash\necho {shlex.quote(said.strip())}\n")
    stub.chmod(0o755)
    assert floor_starts_short({**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}) == short
    stub.write_text("#!/bin/bash\nexit 1\n")  # no answer: the floor stays
    assert floor_starts_short({**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}) is None


def test_the_last_task_of_a_sweeps_array_reads_its_own_time_limit(tmp_path: Path) -> None:
    """The last task of an array has the array's own job id (700): squeue --jobs=700 lists
    every task still in the queue, one limit a line, which reads as none. The task asks
    for its own (700_3)."""
    _env(tmp_path)
    _limit(tmp_path, "30:00\n")
    proc = _run(tmp_path, "progress", TIME_MIN_SECONDS="900",
                extra_env={"SLURM_JOB_ID": "700", "SLURM_ARRAY_JOB_ID": "700",
                           "SLURM_ARRAY_TASK_ID": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "--noheader --jobs=700_3 --format=%l" in _calls(tmp_path, "squeue")
    assert [e[2:] for e in _events(tmp_path)][1] == ["limit", "1800 3600"]


def test_the_bound_reads_the_events_end_where_the_file_is_long(tmp_path: Path) -> None:
    """The engine reads at most 4 MiB of chain.events: its end, where this chain's limit
    events are (status reads the end too), not what came first (earlier chains' events,
    or junk a program wrote there)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / contract.CHAIN_IDS).write_text("1 300\n2 400\n3 500\n")
    (run / contract.CHAIN_EVENTS).write_text(
        "1 9 100 junk from an earlier run\n" * (5 * 2 ** 20 // 30)
        + "1 1 300 limit 1800 3600\n2 2 400 limit 1800 3600\n")
    _env(tmp_path)
    _limit(tmp_path, "1:00:00\n")
    proc = _run(tmp_path, "progress", chunk="3", TIME_MIN_SECONDS="900")
    assert proc.returncode == 0, proc.stderr
    # chunks 1 and 2 used 1800 s each: one chunk of the bound left after chunk 3
    assert _ids(tmp_path).endswith("4 901\n"), proc.stderr
