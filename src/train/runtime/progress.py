"""Progress output: a live bar on a terminal, plain periodic lines in batch logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, initial: int, label: str, interval: float,
                 stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.count = initial
        self.label = label
        self.interval = interval
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = enabled and self.stream.isatty()
        self._start = time.monotonic()
        self._start_count = initial
        self._last = float("-inf")  # the first update always shows

    def update(self, count: int, **metrics: float) -> None:
        self.count = count
        if not self.enabled:
            return
        now = time.monotonic()
        final = count >= self.total
        if not final and now - self._last < (0.2 if self.live else self.interval):
            return
        self._last = now
        rate = (count - self._start_count) / max(now - self._start, 1e-9)
        stats = " ".join(f"{k}={v:.3g}" for k, v in metrics.items())
        if self.live:
            width = 24
            filled = int(width * count / max(self.total, 1))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {count}/{self.total} "
                              f"{rate:.2f} ep/s {stats}\033[K")
            if final:
                self.stream.write("\n")
        else:
            stamp = time.strftime("%H:%M:%S")
            self.stream.write(f"{stamp} {self.label} episode {count}/{self.total} "
                              f"({rate:.2f} ep/s) {stats}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.live and self.count < self.total:
            self.stream.write("\n")
            self.stream.flush()
