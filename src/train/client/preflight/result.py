"""A preflight check's outcome (Check), the checks' names, and how they are shown; how the
checks run outside commands (with a timeout, found on the caller's PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from train.common import _proc

# check names, in the order they run
RUNTIME, IMAGE, ACCOUNT, RUNS_ROOT, CUDA = ("container runtime", "image", "account",
                                            "runs root", "CUDA vs driver")
ARCH = "GPU architecture"


@dataclass(frozen=True)
class Check:
    """One check's outcome. ok: True passed, False failed, None skipped (cannot tell, or
    not applicable). `warn` marks a pass that deserves attention; `fix` says what to do."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    warn: bool = False

    @property
    def status(self) -> str:
        if self.ok is None:
            return "skip"
        if not self.ok:
            return "fail"
        return "warn" if self.warn else "pass"


def failed(checks: Sequence[Check]) -> bool:  # the command's exit 1
    return any(c.ok is False for c in checks)


def format_checks(checks: Sequence[Check]) -> list[str]:
    lines = []
    for c in checks:
        line = f"{c.status.upper():<4}  {c.name}: {c.detail}"
        if c.status in ("fail", "warn") and c.fix:
            line += f" Fix: {c.fix}"
        lines.append(line)
    return lines


def checks_json(checks: Sequence[Check]) -> dict[str, Any]:
    return {"ok": not failed(checks),
            "checks": [{"name": c.name, "status": c.status, "ok": c.ok, "detail": c.detail,
                        "fix": c.fix} for c in checks]}


class Runner(Protocol):  # tests pass scripted ones

    def __call__(self, argv: Sequence[str], *, timeout: float = ...,
                 check: bool = ...) -> subprocess.CompletedProcess[str]: ...


def which(name: str, environ: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=environ.get("PATH", os.defpath))


def _run(run: Runner, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); a command that cannot start or times out is 127 / 124
    with the reason as its stderr."""
    try:
        proc = run(argv, timeout=timeout, check=False)
    except _proc.ProcError as exc:
        return exc.returncode, "", exc.stderr
    except OSError as exc:  # e.g. a PATH entry that is not executable
        return 126, "", str(exc)
    return proc.returncode, proc.stdout or "", proc.stderr or ""


def _tail(text: str, lines: int = 3, limit: int = 300) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()][-lines:]
    out = " / ".join(kept)
    return out if len(out) <= limit else out[:limit] + "..."
