"""Time and cost in `train status`: each chunk's wait in the queue and time run, from
hand-made run folders whose events have known times (the engine's `limit` event, or none
in an older folder), GPU-hours from chain.json's resources, the totals of a chain and of
a sweep, and the picture. Slurm's states are injected, and the clock is set."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from train.batch import contract
from train.cli import main
from train.client.slurm import chaincost, chainstatus, queue, sweeparray
from train.client.slurm.chain import load_chain

T0 = 1767225600  # 2026-01-01T00:00:00+0000: chain.json's submit time
GPUS = {"nodes": 2, "gpus_per_node": 4}
# chunk 1 waits 60 s and runs 45 min of its hour; chunk 2 (submitted by chunk 1's
# `extended`) waits 140 s after chunk 1's end and runs 22.5 min of the 30 min Slurm gave it
FINISHED = [(60, 1, "10", "started 0 0 100"), (60, 1, "10", "limit 3600 3600"),
            (70, 1, "10", "extended 11"), (2760, 1, "10", "stopped 50 100"),
            (2900, 2, "11", "started 0 50 100"), (2900, 2, "11", "limit 1800 3600"),
            (4250, 2, "11", "complete 100 100")]


def _run(root: Path, events: list[tuple[int, int, str, str]], ids: str = "1 10\n2 11\n",
         **record: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / contract.CHAIN_RECORD).write_text(json.dumps({
        "name": root.name, "cluster": "local", "max_chunks": 5,
        "submitted": "2026-01-01T00:00:00+0000", "job": {"walltime_seconds": 3600},
        "resources": GPUS, **record}))
    (root / contract.CHAIN_IDS).write_text(ids)
    (root / contract.CHAIN_EVENTS).write_text(
        "".join(f"{T0 + at} {chunk} {job} {what}\n" for at, chunk, job, what in events))
    return root


def _slurm(monkeypatch: pytest.MonkeyPatch, states: dict[str, str], now: int) -> None:
    monkeypatch.setattr(queue, "job_states", lambda ids: {
        i: {"state": states.get(i, "UNKNOWN")} for i in ids})
    monkeypatch.setattr(chaincost, "_clock", lambda: T0 + now)


def _status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            events: list[tuple[int, int, str, str]], states: dict[str, str],
            now: int = 10 ** 6, **record: Any) -> dict[str, Any]:
    _slurm(monkeypatch, states, now)
    return chainstatus.chain_status(load_chain(_run(tmp_path / "e1", events, **record)))


def _figures(st: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(c["waited_seconds"], c["ran_seconds"], c["limit_seconds"],
             c["requested_seconds"], c["gpu_hours"]) for c in st["chunks"]]


def test_a_finished_gpu_chain_shows_each_chunks_wait_run_and_gpu_hours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _status(tmp_path, monkeypatch, FINISHED, {"10": "COMPLETED", "11": "COMPLETED"})
    assert _figures(st) == [(60, 2700, 3600, 3600, 6.0), (140, 1350, 1800, 3600, 3.0)]
    assert st["chunks"][1]["runs"] == [{"queued": T0 + 2760, "started": T0 + 2900,
                                        "ended": T0 + 4250}]
    t = st["time"]
    assert (t["waited_seconds"], t["ran_seconds"], t["gpus"], t["gpu_hours"], t["live"]) \
        == (200, 4050, 8, 9.0, False)
    assert t["progress"] == [[T0 + 60, 0, 100], [T0 + 2760, 50, 100], [T0 + 2900, 50, 100],
                             [T0 + 4250, 100, 100]]
    lines = chainstatus.format_status(st, times=True)
    assert "  time: waited 3m20s in the queue, ran 1h07m; 9.00 GPU-h (8 GPUs)" in lines
    assert lines[lines.index("  chunk 1: job 10 COMPLETED: stopped after a save (at "
                             "50/100); chunk 2 goes on from it") + 1] == \
        "    time: waited 1m00s, ran 45m00s of a 1h00m limit, 6.00 GPU-h"
    assert lines[-1] == ("    time: waited 2m20s, ran 22m30s of a 30m00s limit (started "
                         "short of -t 1h00m), 3.00 GPU-h")
    plain = chainstatus.format_status(st)  # without --chunks: the totals only
    assert plain == [line for line in lines if not line.startswith("    time:")]


def test_a_cpu_job_says_it_used_no_gpus(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    st = _status(tmp_path, monkeypatch, FINISHED, {"10": "COMPLETED", "11": "COMPLETED"},
                 resources={"nodes": 1, "gpus_per_node": 0})
    assert _figures(st) == [(60, 2700, 3600, 3600, 0.0), (140, 1350, 1800, 3600, 0.0)]
    assert (st["time"]["gpus"], st["time"]["gpu_hours"]) == (0, 0.0)
    lines = chainstatus.format_status(st, times=True)
    assert "  time: waited 3m20s in the queue, ran 1h07m; no GPUs" in lines
    assert "    time: waited 1m00s, ran 45m00s of a 1h00m limit" in lines


def test_a_pending_chunk_waits_from_its_predecessors_end_until_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _status(tmp_path, monkeypatch, FINISHED[:4], {"10": "COMPLETED", "11": "PENDING"},
                 now=3400)
    assert _figures(st) == [(60, 2700, 3600, 3600, 6.0), (640, 0, 3600, 3600, 0.0)]
    assert st["chunks"][1]["runs"] == [{"queued": T0 + 2760, "started": None,
                                        "ended": None}]
    assert (st["time"]["waited_seconds"], st["time"]["ran_seconds"], st["time"]["live"]) \
        == (700, 2700, True)
    lines = chainstatus.format_status(st, times=True)
    assert "  time: waited 11m40s in the queue, ran 45m00s so far; 6.00 GPU-h (8 GPUs)" \
        in lines
    assert lines[-1] == "    time: waited 10m40s so far"
    # while chunk 1 runs, chunk 2 waits on it (its dependency), not in the queue
    st = _status(tmp_path, monkeypatch, FINISHED[:3], {"10": "RUNNING", "11": "PENDING"},
                 now=1860)
    assert _figures(st) == [(60, 1800, 3600, 3600, 4.0), (0, 0, 3600, 3600, 0.0)]
    assert st["time"]["gpu_hours"] == 4.0


def test_an_old_run_folder_without_limit_events_takes_the_job_records_walltime(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = [e for e in FINISHED if not e[3].startswith("limit")]
    st = _status(tmp_path, monkeypatch, old, {"10": "COMPLETED", "11": "COMPLETED"},
                 job={"walltime_seconds": 5400})
    assert _figures(st) == [(60, 2700, 5400, 5400, 6.0), (140, 1350, 5400, 5400, 3.0)]
    assert "started short" not in "\n".join(chainstatus.format_status(st, times=True))


def test_a_requeued_job_waits_again_from_its_runs_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [(60, 1, "10", "started 0 0 100"), (600, 1, "10", "terminated 540"),
              (900, 1, "10", "started 1 20 100"), (1500, 1, "10", "complete 100 100")]
    st = _status(tmp_path, monkeypatch, events, {"10": "COMPLETED"}, ids="1 10\n")
    assert _figures(st) == [(60 + 300, 540 + 600, 3600, 3600, 8 * 1140 / 3600)]
    assert [r["queued"] - T0 for r in st["chunks"][0]["runs"]] == [0, 600]


def test_an_event_time_out_of_reach_counts_no_more_than_the_time_there_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A junk time (a damaged line, a node's clock years off) is no run of years: a run
    lies between when its chunk was queued and now."""
    events = [(-10 ** 8, 1, "10", "started 0 0 100"), *FINISHED[1:-1],
              (10 ** 12, 2, "11", "complete 100 100")]
    st = _status(tmp_path, monkeypatch, events, {"10": "COMPLETED", "11": "COMPLETED"},
                 now=5000)
    assert _figures(st) == [(0, 2760, 3600, 3600, 8 * 2760 / 3600),
                            (140, 2100, 1800, 3600, 8 * 2100 / 3600)]


def test_a_sweep_adds_up_its_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sw"
    _run(root / "seed-4", FINISHED)
    _run(root / "seed-6", [(300, 1, "20", "started 0 0 100"),
                           (1200, 1, "20", "complete 100 100")], ids="1 20\n",
         resources={"nodes": 1, "gpus_per_node": 2})
    (root / contract.SWEEP_RECORD).write_text(json.dumps({
        "name": "sw", "flag": "seeds", "array_job": "7", "chains": [
            {"index": i, "value": str(s), "seed": s, "dir": f"seed-{s}"}
            for i, s in enumerate((4, 6))]}))
    _slurm(monkeypatch, {}, 10 ** 6)
    monkeypatch.setattr(sweeparray, "ref_states", lambda ids: {
        i: {"state": "COMPLETED"} for i in ids})
    st = sweeparray.sweep_status(root)
    t = st["time"]
    assert (t["waited_seconds"], t["ran_seconds"], t["gpu_hours"], t["gpus"]) == \
        (200 + 300, 4050 + 900, 9.0 + 0.5, None)
    lines = sweeparray.format_sweep_status(st)
    assert lines[1] == ("  time: waited 8m20s in the queue, ran 1h22m (all tasks together); "
                        "9.50 GPU-h")
    tasks = sweeparray.format_sweep_status(st, tasks=True)
    assert "complete, chunk 1 job 20 COMPLETED; done 100/100; time: waited 5m00s in the " \
           "queue, ran 15m00s; 0.50 GPU-h (2 GPUs)" in tasks[-1]


def test_status_chunks_draws_the_chain_and_says_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "runs" / "e1", FINISHED)
    _slurm(monkeypatch, {"10": "COMPLETED", "11": "COMPLETED"}, 10 ** 6)
    assert main(["status", "e1", "--chunks", "--runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "    time: waited 1m00s, ran 45m00s of a 1h00m limit, 6.00 GPU-h" in out
    assert f"written: {run / chaincost.PICTURE}" in out
    assert (run / chaincost.PICTURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_picture_is_said_not_drawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "runs" / "e1", FINISHED)
    _slurm(monkeypatch, {"10": "COMPLETED", "11": "COMPLETED"}, 10 ** 6)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import raises ImportError)
    assert main(["status", "e1", "--chunks", "--json", "--runs", str(tmp_path / "runs")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["time"]["gpu_hours"] == 9.0
    assert "train: no picture: matplotlib is not installed here" in captured.err
    assert "pip install './[run]'" in captured.err
    assert not (run / chaincost.PICTURE).exists()


def test_chunks_of_a_sweep_is_refused_naming_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs" / "sw"
    root.mkdir(parents=True)
    (root / contract.SWEEP_RECORD).write_text('{"name": "sw", "chains": []}')
    assert main(["status", "sw", "--chunks", "--runs", str(tmp_path / "runs")]) == 2
    assert "status: --chunks shows one chain's chunks, and sw is a sweep: --tasks" in \
        capsys.readouterr().err
