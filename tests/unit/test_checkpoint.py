from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from train.errors import CheckpointError
from train.runtime.checkpoint import (
    FORMAT,
    CheckpointManager,
    checksum_path,
    episode_of,
    load,
    save_atomic,
    snapshot,
)


def _state(i: int) -> dict[str, object]:
    return {"episode": i, "weights": torch.full((256, 256), float(i)),
            "replay": np.full((64, 3, 16, 16), i % 250, dtype=np.uint8), "nested": [{"a": i}]}


def test_save_atomic_roundtrip_and_no_temp_left(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-00000001.pt"
    save_atomic({"format": FORMAT, "x": torch.arange(3)}, path)
    assert torch.equal(load(path)["x"], torch.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".sha256"]


def test_snapshot_is_a_deep_copy() -> None:
    t = torch.zeros(3)
    a = np.zeros(3)
    snap = snapshot({"t": t, "list": [a], "tuple": (1, t)})
    t += 1
    a += 1
    assert snap["t"].sum() == 0 and snap["list"][0].sum() == 0 and snap["tuple"][1].sum() == 0


@pytest.mark.parametrize("background", [True, False])
def test_keeps_last_two_and_loads_newest(tmp_path: Path, background: bool) -> None:
    mgr = CheckpointManager(tmp_path, background=background)
    mgr.prepare()
    for i in range(1, 6):
        mgr.save(_state(i), i)
    mgr.wait()
    assert [episode_of(p) for p in mgr.complete()] == [4, 5]
    latest = mgr.load_latest()
    assert latest is not None and latest["episode"] == 5
    assert latest["format"] == FORMAT


def test_state_mutated_after_save_does_not_leak(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.prepare()
    state = _state(1)
    mgr.save(state, 1)
    state["weights"].add_(100)  # type: ignore[union-attr]
    mgr.wait()
    loaded = mgr.load_latest()
    assert loaded is not None and float(loaded["weights"][0, 0]) == 1.0


def test_damaged_newest_falls_back_to_previous(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, background=False)
    mgr.prepare()
    mgr.save(_state(1), 1)
    mgr.save(_state(2), 2)
    (tmp_path / "ckpt-00000002.pt").write_bytes(b"garbage")
    latest = mgr.load_latest()
    assert latest is not None and latest["episode"] == 1
    (tmp_path / "ckpt-00000001.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        mgr.load_latest()


def test_stale_temp_files_removed_and_ignored(tmp_path: Path) -> None:
    (tmp_path / ".ckpt-00000009.pt.tmp-1-2").write_bytes(b"partial")
    mgr = CheckpointManager(tmp_path)
    assert mgr.complete() == []
    mgr.prepare()
    assert list(tmp_path.iterdir()) == []
    assert mgr.load_latest() is None


def test_background_write_failure_is_raised(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "missing")  # directory never prepared
    mgr.save(_state(1), 1)
    with pytest.raises(CheckpointError, match="writing a checkpoint"):
        mgr.wait()


def _writer_loop(directory: str, ready: object) -> None:
    """Child process: write checkpoints back to back, as the trainer does, until killed."""
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    mgr = CheckpointManager(Path(directory))
    mgr.prepare()
    state = {"weights": torch.randn(512, 512),
             "replay": np.random.randint(0, 255, size=(2000, 6, 16, 16), dtype=np.uint8)}
    ready.set()  # type: ignore[attr-defined]
    episode = 0
    while True:
        episode += 1
        state["episode"] = episode
        state["weights"][0, 0] = episode
        mgr.save(state, episode)


@pytest.mark.slow
def test_sigkill_during_writes_never_leaves_an_unloadable_newest(tmp_path: Path) -> None:
    rng = random.Random(1234)
    ctx = multiprocessing.get_context("fork")
    trials = 24
    for trial in range(trials):
        directory = tmp_path / f"t{trial}"
        ready = ctx.Event()
        proc = ctx.Process(target=_writer_loop, args=(str(directory), ready))
        proc.start()
        assert ready.wait(timeout=60)
        time.sleep(rng.uniform(0.02, 0.5))
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
        assert proc.exitcode == -signal.SIGKILL
        mgr = CheckpointManager(directory)
        complete = mgr.complete()
        if not complete:
            continue  # killed before the first rename: nothing claims to be complete
        newest = load(complete[-1])  # the newest itself must load, no fallback
        assert newest["episode"] == episode_of(complete[-1])
        assert float(newest["weights"][0, 0]) == newest["episode"]
        assert len(complete) <= 3  # pruning runs right after each rename
    # at least most trials were killed mid-stream with checkpoints on disk
    assert sum(1 for d in tmp_path.iterdir() if CheckpointManager(d).complete()) >= trials // 2


def test_state_round_trips_exactly_through_safe_loading(tmp_path: Path) -> None:
    """NumPy arrays, NumPy's and Python's RNG states and big integers survive the encoding
    that lets torch.load(weights_only=True) read them."""
    rng = np.random.default_rng([4, 0])
    rng.random(5)
    state = {"format": FORMAT, "replay": np.arange(12, dtype=np.float32).reshape(3, 4),
             "rng": rng.bit_generator.state, "numpy_rng": np.random.get_state(),
             "python_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
             "scalar": np.float64(0.5), "empty": np.zeros((0, 3), dtype=np.uint8)}
    path = tmp_path / "ckpt-00000001.pt"
    save_atomic(state, path)
    loaded = load(path)
    assert np.array_equal(loaded["replay"], state["replay"])
    assert loaded["replay"].dtype == np.float32 and loaded["empty"].shape == (0, 3)
    restored = np.random.default_rng()
    restored.bit_generator.state = loaded["rng"]
    assert restored.random() == rng.random()
    np.random.set_state(loaded["numpy_rng"])
    random.setstate(loaded["python_rng"])
    assert torch.equal(loaded["torch_rng"], state["torch_rng"]) and loaded["scalar"] == 0.5


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_a_crafted_checkpoint_runs_no_code_and_the_older_one_is_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = CheckpointManager(tmp_path, background=False)
    manager.prepare()
    manager.save(_state(1), 1)
    evil = tmp_path / "ckpt-00000002.pt"
    torch.save({"format": FORMAT, "x": _Payload()}, evil)
    import hashlib
    checksum_path(evil).write_text(hashlib.sha256(evil.read_bytes()).hexdigest() + "\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        loaded = manager.load_latest()
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "PWNED").exists()
    assert loaded is not None and loaded["episode"] == 1
    assert "ckpt-00000002.pt cannot be loaded safely" in caplog.text


@pytest.mark.parametrize("damage", ["flip", "no-checksum"])
def test_a_damaged_checkpoint_falls_back_to_the_older_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    manager = CheckpointManager(tmp_path, background=False)
    manager.prepare()
    manager.save(_state(1), 1)
    manager.save(_state(2), 2)
    newest = tmp_path / "ckpt-00000002.pt"
    if damage == "flip":  # one byte inside a tensor's data: torch would load it silently
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0x01
        newest.write_bytes(bytes(data))
    else:
        checksum_path(newest).unlink()
    loaded = manager.load_latest()
    assert loaded is not None and loaded["episode"] == 1
    assert "ckpt-00000002.pt" in caplog.text and "trying an older one" in caplog.text


def test_a_folder_named_like_a_checkpoint_is_exit_2_at_start_not_a_failed_save(
        tmp_path: Path) -> None:
    from train.errors import UsageError

    (tmp_path / "ckpt-00000003.pt").mkdir()
    mgr = CheckpointManager(tmp_path, background=False)
    assert mgr.complete() == []  # never a candidate to load
    with pytest.raises(UsageError, match=r"out: .*ckpt-00000003.pt is not a regular file"):
        mgr.prepare()
    (tmp_path / "ckpt-00000003.pt").rmdir()
    (tmp_path / "ckpt-00000003.pt").symlink_to(tmp_path / "elsewhere")
    assert mgr.complete() == []
    with pytest.raises(UsageError, match="not a regular file"):
        mgr.prepare()


def test_a_damaged_checkpoint_is_set_aside_and_holds_no_keep_place(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, background=False)
    mgr.prepare()
    mgr.save(_state(1), 1)
    mgr.save(_state(2), 2)
    junk = tmp_path / "ckpt-99999999.pt"  # the newest by name, forever
    junk.write_bytes(b"junk")
    latest = mgr.load_latest(set_aside=True)
    assert latest is not None and latest["episode"] == 2
    assert not junk.exists() and (tmp_path / "damaged-ckpt-99999999.pt").read_bytes() == b"junk"
    mgr.save(_state(3), 3)
    mgr.save(_state(4), 4)
    # the two newest good ones are kept; the junk no longer takes one of the two places
    assert [episode_of(p) for p in mgr.complete()] == [3, 4]


def test_a_checkpoint_with_a_valid_checksum_but_foreign_content_falls_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from train.workloads.dqn.trainer import check_state

    mgr = CheckpointManager(tmp_path, background=False)
    good = {"seed": 1, "episode": 1, "step": 8, "world_size": 1, "identity": {},
            "agent": {}, "history": {"rewards": [0.0], "losses": [float("nan")]},
            "ranks": [{"replay": {}, "env": {}, "rng": {}, "numpy_rng": (), "python_rng": (),
                       "torch_cpu_rng": torch.zeros(3, dtype=torch.uint8)}]}
    mgr.save(good, 1)
    check_state(mgr.load_latest() or {})  # what the trainer writes passes
    # written through save_atomic, so the checksum is right; only the content is wrong
    foreign = [{**good, "episode": "two"}, {**good, "ranks": []}, {**good, "history": []},
               {k: v for k, v in good.items() if k != "agent"},
               {**good, "ranks": [{"replay": {}}]}]
    for i, bad in enumerate(foreign, start=2):
        mgr.save(bad, i)
        caplog.clear()
        latest = mgr.load_latest(check_state)
        assert latest is not None and latest["episode"] == 1, bad
        assert f"ckpt-{i:08d}.pt is unreadable" in caplog.text
        (tmp_path / f"ckpt-{i:08d}.pt").unlink()


def test_an_array_that_does_not_decode_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-00000001.pt"
    save_atomic({"format": FORMAT, "a": {"__ndarray__": torch.zeros(3, dtype=torch.uint8),
                                         "dtype": "<f8", "shape": [7]}}, path)
    with pytest.raises(CheckpointError, match="does not decode"):
        load(path)


def test_a_second_set_aside_keeps_the_first_and_a_missing_checksum_is_named(
        tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, background=False)
    mgr.prepare()
    mgr.save(_state(1), 1)
    for text in (b"junk one", b"junk two"):
        (tmp_path / "ckpt-00000002.pt").write_bytes(text)
        latest = mgr.load_latest(set_aside=True)
        assert latest is not None and latest["episode"] == 1
    assert (tmp_path / "damaged-ckpt-00000002.pt").read_bytes() == b"junk one"
    assert (tmp_path / "damaged2-ckpt-00000002.pt").read_bytes() == b"junk two"
    checksum_path(tmp_path / "ckpt-00000001.pt").unlink()
    with pytest.raises(CheckpointError, match="has no checksum"):
        load(tmp_path / "ckpt-00000001.pt")
