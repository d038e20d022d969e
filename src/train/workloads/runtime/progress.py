"""Progress output: a live bar on a terminal, plain periodic lines in batch logs, each with
the episode rate and the time left (ETA) at that rate."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

# The rate (and so the ETA) is measured over the last this many episodes: the first
# episodes of a run, before the replay holds enough to learn from, are many times faster
# than the rest, and an average since the start would promise too little time.
RATE_WINDOW = 20
# No ETA from fewer episodes than this (the first one alone says nothing of the rest).
ETA_MIN_EPISODES = 2


def format_duration(seconds: float) -> str:
    """45s, 2m05s, 1h02m: short enough for a progress line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, total: int, initial: int, label: str, interval: float,
                 stream: TextIO | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.count = initial
        self.label = label
        self.interval = interval
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and self.stream.isatty()
        self._clock = clock
        self._recent: deque[tuple[float, int]] = deque([(clock(), initial)],
                                                       maxlen=RATE_WINDOW + 1)
        self._last = float("-inf")  # the first update always shows

    def update(self, count: int, **metrics: float) -> None:
        self.count = count
        if not self.enabled:
            return
        now = self._clock()
        self._recent.append((now, count))
        final = count >= self.total
        if not final and now - self._last < (0.2 if self.live else self.interval):
            return
        self._last = now
        # episodes per second over the last RATE_WINDOW episodes, and the time left at it
        (t0, c0), (t1, c1) = self._recent[0], self._recent[-1]
        rate = (c1 - c0) / max(t1 - t0, 1e-9) if c1 > c0 else 0.0
        timing = f"{rate:.2f} ep/s" + (
            f", ETA {format_duration(max(0, self.total - count) / rate)}"
            if rate and c1 - c0 >= ETA_MIN_EPISODES and not final else "")
        stats = " ".join(f"{k}={v:.3g}" for k, v in metrics.items())
        if self.live:
            width = 24
            filled = int(width * count / max(self.total, 1))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {count}/{self.total} "
                              f"{timing} {stats}\033[K")
            if final:
                self.stream.write("\n")
        else:
            stamp = time.strftime("%H:%M:%S")
            self.stream.write(f"{stamp} {self.label} episode {count}/{self.total} "
                              f"({timing}) {stats}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.live and self.count < self.total:
            self.stream.write("\n")
            self.stream.flush()
