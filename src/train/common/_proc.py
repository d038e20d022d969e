"""The one subprocess boundary: argv lists only, never a shell; failures carry stderr."""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from train.common.errors import TrainError

log = logging.getLogger(__name__)


class ProcError(TrainError):
    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        tail = "\n".join(stderr.strip().splitlines()[-10:])
        super().__init__(f"{shlex.join(argv)} exited with {returncode}: {tail}")
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


def run(argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 60.0,
        check: bool = True, env: Mapping[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output; raise ProcError on a non-zero exit when `check`.
    `env`: the whole environment argv gets (default: this process's)."""
    log.debug("running %s", shlex.join(argv))
    try:
        # bytes that are not UTF-8 (a site tool's output, a mangled name) are replaced
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True,
                              encoding="utf-8", errors="replace", timeout=timeout,
                              check=False, env=None if env is None else dict(env))
    except FileNotFoundError:
        raise ProcError(argv, 127, f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise ProcError(argv, 124, f"timed out after {timeout:g} s") from None
    except OSError as exc:  # E2BIG (an argument list too long), EACCES, ...
        raise ProcError(argv, 126, f"{argv[0]} could not be started: {exc}") from None
    if check and proc.returncode != 0:
        raise ProcError(argv, proc.returncode, proc.stderr)
    return proc
