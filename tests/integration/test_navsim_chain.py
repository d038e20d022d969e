"""NAVSIM chains on the real local SLURM cluster compute the training feature cache once:
a stand-in for NAVSIM's scripts (navsim_standin.py, NAVSIM's overrides and defaults) counts
the scenes whose features it computes across the chunks of a chain. Chunks are ended by the
walltime signal sent when the stand-in says where it is (events.log), never after a time."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.integration.chains import ChainError, logs, settled, submit, wait, walltime_signal
from train.client.slurm.navsimstep import CACHE_DIR
from train.workloads.navsim import marker_paths

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCENES = [f"log-{i % 2}/token-{i}" for i in range(6)]
STANDIN = Path(__file__).with_name("navsim_standin.py")


def _navsim(tmp_path: Path, *hold: str) -> Path:
    """NAVSIM's two scripts (the stand-in) in a folder of their own, with the scenes."""
    folder = tmp_path / "navsim"
    folder.mkdir()
    for name in ("run_training.py", "run_dataset_caching.py"):
        shutil.copy(STANDIN, folder / name)
    (folder / "scenes.txt").write_text("\n".join(SCENES) + "\n")
    for name in hold:
        (folder / name).touch()
    return folder


def _flags(folder: Path) -> list[str]:
    return ["--entry", "navsim", "--runtime", "none", "--navsim-strategy", "none",
            "--navsim-script", str(folder / "run_training.py"), "--time", "10",
            "--max-chunks", "3"]


def _events(folder: Path) -> list[str]:
    path = folder / "events.log"
    return path.read_text().splitlines() if path.exists() else []


def _wait_event(folder: Path, prefix: str, run_dir: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.startswith(prefix) for e in _events(folder)):
        if time.monotonic() > deadline:
            raise ChainError(f"no {prefix!r} in {_events(folder)}\n{logs(run_dir)[-3000:]}")
        time.sleep(0.2)


def _chunk_job(run_dir: Path, chunk: int) -> str:
    for line in (run_dir / "chain.ids").read_text().splitlines():
        number, job = line.split()
        if int(number) == chunk:
            return job
    raise ChainError(f"no chunk {chunk} in {run_dir / 'chain.ids'}")


def test_the_feature_cache_is_computed_once_across_two_chunks(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    folder = _navsim(tmp_path, "hold-train")
    run_dir = submit(tmp_path, slurm_env, "nav", _flags(folder), ["agent=ego_status_mlp_agent"])
    # chunk 1 computes the cache, trains, and is stopped by the walltime signal
    _wait_event(folder, "hold-train", run_dir)
    (folder / "hold-train").unlink()
    walltime_signal(_chunk_job(run_dir, 1), slurm_env)
    st = wait(tmp_path, slurm_env, "nav", settled, timeout=300)
    assert st["state"] == "complete", (st, logs(run_dir)[-3000:])
    assert st["chunks_used"] == 2, st
    events = _events(folder)
    computed = [e.split()[1] for e in events if e.startswith("compute ")]
    assert sorted(computed) == sorted(SCENES), events  # each scene once, over both chunks
    assert [e for e in events if e.startswith("train ")] == ["train 6", "train 6"], events
    cache = run_dir / CACHE_DIR
    assert marker_paths(cache)[0].is_file() and not marker_paths(cache)[1].exists()
    text = logs(run_dir)
    assert text.count("computing the feature cache") == 1, text[-3000:]
    assert "feature cache complete" in text

    # chunk 1 of another chain on the same cache: trains from it, computes nothing
    again = submit(tmp_path, slurm_env, "nav2", _flags(folder),
                   ["agent=ego_status_mlp_agent", f"cache_path={cache}"])
    st = wait(tmp_path, slurm_env, "nav2", settled, timeout=300)
    assert st["state"] == "complete", (st, logs(again)[-3000:])
    events = _events(folder)
    assert len([e for e in events if e.startswith("compute ")]) == len(SCENES), events
    assert events[-1] == "train 6", events
    # ... but not another agent's features: exit 2 on the node, naming cache_path
    other = submit(tmp_path, slurm_env, "nav3", _flags(folder),
                   ["agent=transfuser_agent", f"cache_path={cache}"])
    st = wait(tmp_path, slurm_env, "nav3", settled, timeout=300)
    assert st["state"] == "failed", st
    assert "give another cache_path=" in logs(other), logs(other)[-3000:]
    assert len(_events(folder)) == len(events)


def test_a_cache_cut_by_the_walltime_is_completed_not_trusted(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    folder = _navsim(tmp_path, "hold-cache")
    run_dir = submit(tmp_path, slurm_env, "cut", _flags(folder), ["agent=ego_status_mlp_agent"])
    # chunk 1's caching has written half the scenes and is in the middle of one more
    _wait_event(folder, "hold-cache", run_dir)
    cut = next(e.split()[1] for e in _events(folder) if e.startswith("hold-cache"))
    cache = run_dir / CACHE_DIR
    assert not marker_paths(cache)[0].exists()
    (folder / "hold-cache").unlink()
    walltime_signal(_chunk_job(run_dir, 1), slurm_env)
    st = wait(tmp_path, slurm_env, "cut", settled, timeout=300)
    text = logs(run_dir)
    assert st["state"] == "complete", (st, text[-3000:])
    assert st["chunks_used"] == 2, st
    assert "cut the feature cache" in text and "was cut before it was complete" in text
    events = _events(folder)
    computed = [e.split()[1] for e in events if e.startswith("compute ")]
    assert set(computed) == set(SCENES), events
    assert cut in computed[3:], events  # the cut scene's file was computed again
    # the training read every scene whole (it fails on a cut file) and ran once
    assert [e for e in events if e.startswith("train ")] == ["train 6"], events
    assert marker_paths(cache)[0].is_file()


def test_on_two_nodes_one_task_caches_and_the_other_waits(
        tmp_path: Path, slurm_env: dict[str, str]) -> None:
    folder = _navsim(tmp_path, "wait-peer")  # the cache is computed once the other waits
    run_dir = submit(tmp_path, slurm_env, "two", [*_flags(folder), "--nodes", "2"],
                     ["agent=ego_status_mlp_agent"])
    st = wait(tmp_path, slurm_env, "two", settled, timeout=300)
    text = logs(run_dir)
    assert st["state"] == "complete", (st, text[-3000:])
    events = _events(folder)
    assert sorted(e.split()[1] for e in events if e.startswith("compute ")) == sorted(SCENES)
    assert [e for e in events if e.startswith("train ")] == ["train 6", "train 6"], events
    assert "waiting for the first task to complete the feature cache" in text

