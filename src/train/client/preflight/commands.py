"""How preflight runs outside commands: with a timeout (`train.common._proc.run`: a session
of its own, killed whole on a timeout, as a script's `sleep` child would hold its output
open), found on the caller's PATH (`which`, the submit checks' too), their failures turned
into exit codes and short text (`_run`, `_tail`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from train.common import _proc


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
