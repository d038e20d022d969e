"""The subprocess boundary (train.common._proc) under a signal that comes while a child is
still starting: the child's whole process group ends with the command, as it does for a
signal that comes while the child runs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from train.common import _proc


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(argv: list[str]) -> None:
    _proc.run(argv, timeout=600)


def _run_bounded(argv: list[str]) -> None:
    _proc.run_bounded(argv, timeout=600)


@pytest.mark.parametrize("runner", [_run, _run_bounded], ids=["run", "run_bounded"])
def test_term_before_popen_returns_still_ends_the_childs_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        runner: Callable[[list[str]], None]) -> None:
    """TERM (turned into KeyboardInterrupt, as `train` does) arrives after the child and
    its own child run but before Popen has returned to the caller: a busy machine's case.
    Nothing of the child's group is left."""
    pids = tmp_path / "pids"
    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        child = real(*args, **kwargs)
        for _ in range(1200):  # until the script and its `sleep` both run
            if pids.exists() and len(pids.read_text().split()) == 2:
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # (its handler runs before this returns)
        return child

    monkeypatch.setattr(subprocess, "Popen", popen)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner(["bash", "-c", f"echo $$ >> {pids}; sleep 3600 & echo $! >> {pids}; wait"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    found = [int(p) for p in pids.read_text().split()]
    try:
        assert len(found) == 2
        for _ in range(1200):  # SIGKILLed on two busy cores: up to a minute to go
            if not any(map(_alive, found)):
                break
            time.sleep(0.05)
        assert not any(map(_alive, found)), found
    finally:
        for pid in found:  # (nothing of a failing run's group outlives the test)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_signal_left_to_its_default_is_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only Python handlers are held: SIGHUP at its default is not replaced while a child
    starts (it would have ended the process, and still does)."""
    seen: list[Any] = []
    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        seen.append(signal.getsignal(signal.SIGHUP))
        seen.append(signal.getsignal(signal.SIGTERM))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    previous = {signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_DFL),
                signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupt)}
    try:
        assert _proc.run(["true"]).returncode == 0
        assert seen[0] is signal.SIG_DFL and seen[1] is not _interrupt
        assert signal.getsignal(signal.SIGTERM) is _interrupt  # put back after the start
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_an_error_said_first_is_kept_before_pages_of_warnings() -> None:
    """Only the end of a command's stderr was kept: an error it printed first, followed by
    pages of warnings, was lost. Its start and end are kept, and what was cut is said."""
    import re
    import sys

    first, noise, last = "error: the first thing said\n", "warning: noise\n" * 20000, "end\n"
    script = f"import sys; sys.stderr.write({first!r} + {noise[:15]!r} * 20000 + {last!r}); " \
        "sys.exit(1)"
    with pytest.raises(_proc.ProcError) as err:
        _proc.run([sys.executable, "-c", script], timeout=120)
    kept = err.value.stderr
    assert kept.startswith(first) and kept.endswith(noise[-100:] + last), kept[:200]
    said = re.search(r"\n\[\.\.\. (\d+) bytes of stderr cut \.\.\.\]\n", kept)
    assert said is not None and int(said.group(1)) == len(first + noise + last) - (
        _proc.STDERR_HEAD + _proc.STDERR_KEPT)
    assert len(kept) == len(first + noise + last) - int(said.group(1)) + len(said.group())
