"""What the doctor's rules find: a line of evidence, a rule's hits in one file, and a
finding (a cause with its evidence and fix)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

_KEEP = 3  # evidence lines kept per rule and file: the first and the last ones


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int  # 1-based; 0 where unknown (in the tail of a log searched in head and tail)
    text: str
    offset: int | None = None  # where the line starts in the file, where line is unknown

    def as_dict(self) -> dict[str, Any]:
        out = {"file": self.file, "line": self.line, "text": self.text}
        return out if self.offset is None else {**out, "offset": self.offset}

    @property
    def where(self) -> str:
        """file:line, or file (byte N) where only the line's offset is known."""
        if self.line:
            return f"{self.file}:{self.line}"
        return self.file if self.offset is None else f"{self.file} (byte {self.offset})"


@dataclass
class Finding:
    cause: str
    title: str  # what happened, in a few words
    fix: str  # what to change: flags and values where they are known
    chunk: int | None = None
    job_id: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "title": self.title, "detail": self.detail,
                "fix": self.fix, "chunk": self.chunk, "job_id": self.job_id,
                "evidence": [e.as_dict() for e in self.evidence]}


@dataclass
class Hits:
    """What one rule found in one file: the first and the last few lines, and a count."""

    count: int = 0
    first: list[Evidence] = field(default_factory=list)
    last: deque[Evidence] = field(default_factory=lambda: deque(maxlen=_KEEP))

    def add(self, ev: Evidence) -> None:
        self.count += 1
        if len(self.first) < _KEEP:
            self.first.append(ev)
        else:
            self.last.append(ev)

    def evidence(self) -> list[Evidence]:
        return [*self.first, *self.last]
