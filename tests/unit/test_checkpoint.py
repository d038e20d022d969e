from __future__ import annotations

import builtins
import contextlib
import itertools
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from train.common import filehash
from train.common.errors import CheckpointError
from train.workloads.runtime.checkpoint import (
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
    from train.common.errors import UsageError

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


# --- a crash at every step of a save ---------------------------------------------------------
# Every call a save makes to the file system (open, write-out, fsync, rename, unlink) is a
# point where a process can die. The injector counts those calls and stops the process just
# before or just after the k-th one: by an exception (the writer's own clean-up runs) or by
# os._exit in a forked child (nothing runs, as under SIGKILL or a node failure). After each,
# a fresh manager resumes as the trainer does (prepare, load_latest with set_aside) and must
# load the newest intact checkpoint, setting nothing intact aside.
_CRASHED = 17


class _Crash(BaseException):
    """A death at a chosen point (BaseException: no `except Exception` stops it)."""


class _Injector:
    """Counts the file-system calls made inside `directory` and dies at call `target`
    (`when`: "before" or "after" it); target None only records the trace."""

    def __init__(self, directory: Path, target: int | None = None, when: str = "before",
                 die: Callable[[], None] | None = None) -> None:
        self.directory = str(directory)
        self.target, self.when = target, when
        self.die = die or self._raise
        self.trace: list[tuple[str, str]] = []
        self.fds: dict[int, str] = {}

    @staticmethod
    def _raise() -> None:
        raise _Crash

    def _mine(self, path: object) -> bool:
        return str(path).startswith(self.directory)

    def _step(self, what: str, name: str, call: Callable[[], Any]) -> Any:
        index = len(self.trace)
        self.trace.append((what, name))
        if index == self.target and self.when == "before":
            self.die()
        result = call()
        if index == self.target and self.when == "after":
            self.die()
        return result

    def install(self, patch: Callable[[object, str, object], None]) -> None:
        real = {name: getattr(os, name) for name in ("replace", "rename", "unlink", "fsync",
                                                     "open")}
        real_open = builtins.open

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            if not self._mine(dst):
                return real["replace"](src, dst, **kw)  # type: ignore[no-any-return]
            self._step("replace", f"{Path(src).name} -> {Path(dst).name}",
                       lambda: real["replace"](src, dst, **kw))

        def rename(src: Any, dst: Any, **kw: Any) -> None:
            if not self._mine(dst):
                return real["rename"](src, dst, **kw)  # type: ignore[no-any-return]
            self._step("rename", f"{Path(src).name} -> {Path(dst).name}",
                       lambda: real["rename"](src, dst, **kw))

        def unlink(path: Any, **kw: Any) -> None:
            if not self._mine(path):
                return real["unlink"](path, **kw)  # type: ignore[no-any-return]
            self._step("unlink", Path(path).name, lambda: real["unlink"](path, **kw))

        def fsync(fd: int) -> None:
            if fd not in self.fds:
                return real["fsync"](fd)  # type: ignore[no-any-return]
            self._step("fsync", self.fds[fd], lambda: real["fsync"](fd))

        def os_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
            fd: int = real["open"](path, flags, *args, **kw)
            if self._mine(path):
                self.fds[fd] = "<dir>" if os.path.isdir(path) else Path(path).name
            return fd

        def py_open(path: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
            if not isinstance(path, (str, Path)) or not self._mine(path) or "r" in mode:
                return real_open(path, mode, *args, **kw)
            fh = self._step("open", Path(path).name,
                            lambda: real_open(path, mode, *args, **kw))
            self.fds[fh.fileno()] = Path(path).name
            return fh

        for name, fake in (("replace", replace), ("rename", rename), ("unlink", unlink),
                           ("fsync", fsync), ("open", os_open)):
            patch(os, name, fake)
        patch(builtins, "open", py_open)


def _small(marker: str, episode: int) -> dict[str, object]:
    return {"marker": marker, "episode": episode, "w": torch.full((64,), float(episode))}


# (episodes saved before, the save that is cut short): a new name, which also prunes the
# oldest, and the re-save of the newest under its own name (an episode cut by a stop)
_SCENARIOS = {"new name": ([1, 2], ("3", 3)), "same name again": ([1, 2], ("2-cut", 2))}


def _prepared(directory: Path, scenario: str) -> tuple[str, str, int]:
    """`directory` with the scenario's earlier checkpoints: (old newest, new, episode)."""
    before, (marker, episode) = _SCENARIOS[scenario]
    mgr = CheckpointManager(directory, background=False)
    mgr.prepare()
    for i in before:
        mgr.save(_small(str(i), i), i)
    return str(before[-1]), marker, episode


def _resumed(directory: Path) -> str:
    """What a restarted run loads, checking that nothing intact was set aside and that
    every file under a checkpoint's name is intact; then that the run can save again."""
    mgr = CheckpointManager(directory, background=False)
    mgr.prepare()
    state = mgr.load_latest(set_aside=True)
    assert sorted(p.name for p in directory.iterdir() if "damaged" in p.name) == []
    assert all(load(p) is not None for p in mgr.complete())
    assert state is not None
    mgr.save(_small("after", 9), 9)
    again = CheckpointManager(directory).load_latest()
    assert again is not None and again["marker"] == "after"
    return str(state["marker"])


def _save_trace(tmp_path: Path, scenario: str) -> list[tuple[str, str]]:
    directory = tmp_path / "trace"
    _, marker, episode = _prepared(directory, scenario)
    injector = _Injector(directory)
    with pytest.MonkeyPatch.context() as mp:
        injector.install(mp.setattr)
        CheckpointManager(directory, background=False).save(_small(marker, episode), episode)
    return injector.trace


def _check_sequence(seen: list[str], old: str, new: str) -> None:
    """The run resumes from the old checkpoint up to one point of the save and from the new
    one after it, never from anything else."""
    assert set(seen) <= {old, new}, seen
    assert seen[0] == old and seen[-1] == new, seen
    switch = seen.index(new)
    assert seen[switch:] == [new] * (len(seen) - switch), seen


@pytest.mark.parametrize("scenario", _SCENARIOS)
def test_an_exception_at_any_step_of_a_save_resumes_from_the_newest_intact(
        tmp_path: Path, scenario: str) -> None:
    trace = _save_trace(tmp_path, scenario)
    assert len(trace) >= 6, trace  # opens, fsyncs and renames were all seen
    seen = []
    for k in range(len(trace)):
        for when in ("before", "after"):
            directory = tmp_path / f"{k}-{when}"
            old, new, episode = _prepared(directory, scenario)
            injector = _Injector(directory, k, when)
            with pytest.MonkeyPatch.context() as mp:
                injector.install(mp.setattr)
                try:
                    CheckpointManager(directory, background=False).save(
                        _small(new, episode), episode)
                except CheckpointError as exc:
                    assert isinstance(exc.__cause__, _Crash)
            assert injector.trace[k] == trace[k]  # the same save, cut where intended
            seen.append(_resumed(directory))
    _check_sequence(seen, old, new)


def _crash_in_child(directory: Path, scenario: str, k: int, when: str) -> int:
    """Fork; the child saves and dies by os._exit at step k; the child's exit code."""
    marker, episode = _SCENARIOS[scenario][1]
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            torch.set_num_threads(1)
            injector = _Injector(directory, k, when, die=lambda: os._exit(_CRASHED))
            mp = pytest.MonkeyPatch()
            injector.install(mp.setattr)
            mgr = CheckpointManager(directory)  # the background writer thread, as trained
            mgr.save(_small(marker, episode), episode)
            mgr.wait()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", _SCENARIOS)
def test_a_process_killed_at_any_step_of_a_save_resumes_from_the_newest_intact(
        tmp_path: Path, scenario: str) -> None:
    trace = _save_trace(tmp_path, scenario)
    seen = []
    for k in range(len(trace)):
        for when in ("before", "after"):
            directory = tmp_path / f"{k}-{when}"
            old, new, _ = _prepared(directory, scenario)
            assert _crash_in_child(directory, scenario, k, when) == _CRASHED, (k, when)
            seen.append(_resumed(directory))
    _check_sequence(seen, old, new)
    # and a save that is not cut short completes in the child
    directory = tmp_path / "whole"
    _prepared(directory, scenario)
    assert _crash_in_child(directory, scenario, len(trace), "before") == 0


@pytest.mark.parametrize("scenario", _SCENARIOS)
def test_each_rename_of_a_save_is_on_disk_before_the_next(tmp_path: Path,
                                                          scenario: str) -> None:
    """A power cut keeps renames and removals only up to the last directory fsync: each
    rename or removal of a save is on disk before the next one (a directory fsync between),
    the last rename before the save ends, and the file renamed was fsynced first, so no
    order of lost steps pairs a checkpoint with a wrong checksum or leaves one without."""
    trace = _save_trace(tmp_path, scenario)
    steps = [i for i, (what, _) in enumerate(trace) if what in ("replace", "rename", "unlink")]
    renames = [i for i in steps if trace[i][0] != "unlink"]
    assert renames, trace
    for i, j in itertools.pairwise(steps):
        assert ("fsync", "<dir>") in trace[i + 1:j], (trace[i], trace)
    assert ("fsync", "<dir>") in trace[renames[-1] + 1:], trace
    for i in renames:
        source = trace[i][1].split(" -> ")[0]
        assert ("fsync", source) in trace[:i], (trace[i], trace)


def test_a_checkpoint_that_cannot_be_read_now_is_skipped_but_not_set_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error (a file server's hiccup) says nothing of the file: the older one is
    used and the newer stays in the rotation for the next start."""
    import errno

    from train.workloads.runtime import checkpoint

    mgr = CheckpointManager(tmp_path, background=False)
    mgr.prepare()
    mgr.save(_state(1), 1)
    mgr.save(_state(2), 2)
    real = filehash.file_sha256

    def flaky(path: Path) -> str:
        if path.name == "ckpt-00000002.pt":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path)

    monkeypatch.setattr(checkpoint, "file_sha256", flaky)
    latest = mgr.load_latest(set_aside=True)
    assert latest is not None and latest["episode"] == 1
    assert not any("damaged" in p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(checkpoint, "file_sha256", real)
    latest = mgr.load_latest(set_aside=True)
    assert latest is not None and latest["episode"] == 2


@pytest.mark.parametrize("failure", [
    MemoryError(),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough "
                 "memory: you tried to allocate 4294967296 bytes."),
    RuntimeError("[enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't "
                 "allocate memory: you tried to allocate 4294967296 bytes. Error code 12 "
                 "(Cannot allocate memory)"),
])
def test_an_intact_checkpoint_that_memory_cannot_hold_now_is_not_set_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException) -> None:
    """The host short of memory while loading (a crowded node, a smaller --mem) says
    nothing of the file, whose checksum matched: it stays in the rotation for the next
    start. A hostile trial found it renamed damaged-ckpt-N.pt and the run resumed from the
    older one."""
    from train.workloads.runtime import checkpoint

    mgr = CheckpointManager(tmp_path, background=False)
    mgr.prepare()
    mgr.save(_state(1), 1)
    mgr.save(_state(2), 2)
    real = torch.load

    def short(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == "ckpt-00000002.pt":
            raise failure
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "load", short)
    with contextlib.suppress(MemoryError, CheckpointError):
        mgr.load_latest(set_aside=True)
    assert not any("damaged" in p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(checkpoint.torch, "load", real)
    latest = mgr.load_latest(set_aside=True)
    assert latest is not None and latest["episode"] == 2
