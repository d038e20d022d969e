"""The one subprocess boundary: argv lists only, never a shell; failures carry stderr.

Each command runs in its own process group (a session of its own; stdin empty: no prompt
waits on the terminal) and is bounded: on its
timeout, or when this process is interrupted while waiting, the whole group is killed (a
program's children too, e.g. what a container runtime's CLI started), not the command
alone."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from train.common.errors import TrainError

log = logging.getLogger(__name__)

TAIL_CHARS = 500  # what of a failed command's stderr its error quotes
_REAP_TIMEOUT = 10.0  # after the group is killed: a process outside it may hold the pipes


class ProcError(TrainError):
    def __init__(self, argv: Sequence[str], returncode: int, stderr: str,
                 timed_out: bool = False) -> None:
        tail = "\n".join(stderr.strip().splitlines()[-10:])
        if len(tail) > TAIL_CHARS:
            tail = "..." + tail[-TAIL_CHARS:]
        super().__init__(f"{shlex.join(argv)} exited with {returncode}: {tail}")
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.timed_out = timed_out


def run(argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 60.0,
        check: bool = True, env: Mapping[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Run argv, capture text output; raise ProcError on a non-zero exit when `check`, and
    on a timeout (its process group killed; `timed_out` set). `env`: the whole environment
    argv gets (default: this process's)."""
    log.debug("running %s", shlex.join(argv))
    try:
        # bytes that are not UTF-8 (a site tool's output, a mangled name) are replaced
        child = subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                 errors="replace", env=None if env is None else dict(env),
                                 start_new_session=True)
    except FileNotFoundError:
        raise ProcError(argv, 127, f"{argv[0]}: command not found") from None
    except OSError as exc:  # E2BIG (an argument list too long), EACCES, ...
        raise ProcError(argv, 126, f"{argv[0]} could not be started: {exc}") from None
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(child)
        raise ProcError(argv, 124, f"timed out after {timeout:g} s", timed_out=True) from None
    except BaseException:  # Ctrl-C, a signal turned into an exception: nothing left behind
        kill_group(child)
        raise
    proc = subprocess.CompletedProcess(list(argv), child.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise ProcError(argv, proc.returncode, proc.stderr)
    return proc


def kill_group(child: subprocess.Popen[str]) -> None:
    """SIGKILL to the child's whole process group, then reap it; pipes that a process
    outside the group still holds are closed rather than waited for."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    try:
        child.communicate(timeout=_REAP_TIMEOUT)
    except subprocess.TimeoutExpired:
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        child.kill()  # (where the group could not be signalled)
        child.wait(timeout=_REAP_TIMEOUT)
