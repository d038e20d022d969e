"""When to stop: the time budget and the signals SLURM and users send.

SIGUSR1 (SLURM's walltime signal), SIGTERM and SIGINT ask the trainer to finish the
current episode, checkpoint and exit 0; a second SIGINT stops at once. Signal delivery is
coarse, so the trainer also keeps its own time budget. An episode pending a stop for
STOP_GRACE_SECONDS is cut (Slurm's KillWait, 30 s by default, follows SIGTERM with SIGKILL).

During start-up SIGTERM and SIGINT keep their default action: the process ends at once,
even inside a C++ wait (a rendezvous) where a Python handler would never run; SIGUSR1 is
kept for the trainer, which then stops before its first episode.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType

from train.batch.contract import DEADLINE_VAR, SIGNAL_READY_VAR

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
STOP_GRACE_SECONDS = 15.0

# A walltime signal that arrived before the trainer was ready (SLURM's signal is coarse and
# may come during start-up, when SIGUSR1's default action would kill the process).
_early: dict[str, str | None] = {"reason": None}


def _early_handler(signum: int, frame: FrameType | None) -> None:
    _early["reason"] = f"received {signal.Signals(signum).name}"


def ignore_late_walltime_signal() -> None:
    """Once the work is checkpointed: CPython resets Python handlers to the default action
    while it shuts down (for SIGUSR1: terminate), so a late walltime signal turned a clean
    stop into exit 138. SIG_IGN survives finalization."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def install_early_handlers(mark_ready: bool = True) -> None:
    """SIGUSR1 recorded for the StopController; then tell the batch shell that a walltime
    signal no longer kills this process (SIGNAL_READY_VAR), unless `mark_ready` is false:
    `train launch` cannot say when a program of the user's is ready."""
    signal.signal(signal.SIGUSR1, _early_handler)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    ready = os.environ.get(SIGNAL_READY_VAR) if mark_ready else None
    if ready:
        try:
            Path(ready).touch()
        except OSError as exc:  # the batch shell then waits out its start-up grace
            log.debug("could not mark signal readiness in %s: %s", ready, exc)


def parse_deadline(text: str) -> float | None:
    """TRAIN_DEADLINE as Unix time; None (no deadline) for anything that is not one."""
    try:
        value = float(text.strip())
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def effective_budget(time_budget: float | None, env: Mapping[str, str] | None = None,
                     now: float | None = None) -> float | None:
    """The time budget, cut to the chunk's deadline (time spent before training starts comes
    out of it)."""
    environ = os.environ if env is None else env
    deadline = parse_deadline(environ.get(DEADLINE_VAR, ""))
    if time_budget is None or deadline is None:
        return time_budget
    left = deadline - (time.time() if now is None else now)
    if left < time_budget:
        log.info("time budget %.0f s (the chunk's deadline leaves that of the %g s asked "
                 "for)", max(left, 1.0), time_budget)
        return max(left, 1.0)
    return time_budget


class StopController:
    def __init__(self, time_budget: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.time_budget = time_budget
        self._clock = clock
        self._start = clock()
        self._episode_seconds = 0.0
        self.reason: str | None = None
        self._requested_at: float | None = None
        self._interrupts = 0
        self._previous: dict[int, object] = {}

    # -- signals ----------------------------------------------------------------------
    def __enter__(self) -> StopController:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        if _early["reason"] is not None:
            self.request_stop(_early["reason"])
            _early["reason"] = None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # in a chain's step a late stop signal (a run stops at its deadline as the engine
        # passes it on) must not fail the finished run: TERM's default is exit 143
        step = bool(os.environ.get(SIGNAL_READY_VAR))
        for sig, handler in self._previous.items():
            late = step and sig in (signal.SIGUSR1, signal.SIGTERM)
            signal.signal(sig, signal.SIG_IGN if late else handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            if self._interrupts:  # the second Ctrl-C: at once
                raise KeyboardInterrupt
            self._interrupts += 1
        self.request_stop(f"received {signal.Signals(signum).name}")

    def request_stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self._requested_at = self._clock()
            log.warning("stop requested (%s): finishing the current episode, then "
                        "checkpointing", reason)

    # -- time budget ------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    def episode_finished(self, seconds: float) -> None:
        """Record an episode's duration; the estimate leans on the slowest recent ones."""
        self._episode_seconds = max(seconds, 0.8 * self._episode_seconds + 0.2 * seconds)

    def should_stop(self) -> bool:
        if self.reason is not None:
            return True
        if self.time_budget is None:
            return False
        if self.elapsed + 1.2 * self._episode_seconds >= self.time_budget:
            self.request_stop(f"time budget of {self.time_budget:g} s: "
                              f"{self.elapsed:.1f} s used")
            return True
        return False

    def overdue(self) -> bool:
        """The current episode must be cut (cheap enough to ask at every step)."""
        if self._requested_at is not None:
            return self._clock() - self._requested_at >= STOP_GRACE_SECONDS
        if self.time_budget is not None and self.elapsed >= self.time_budget:
            self.reason = f"time budget of {self.time_budget:g} s used up within an episode"
            self._requested_at = self._clock()
            log.warning("stop: %s; cutting the episode and checkpointing", self.reason)
            return True
        return False
