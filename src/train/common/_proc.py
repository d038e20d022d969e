"""The one subprocess boundary: argv lists only, never a shell; failures carry stderr.

Each command runs in its own process group (a session of its own; stdin empty: no prompt
waits on the terminal) and is bounded: on its timeout, or when this process is interrupted
while waiting, the whole group is killed (a program's children too, e.g. what a container
runtime's CLI started), not the command alone."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from train.common.errors import TrainError

log = logging.getLogger(__name__)

TAIL_CHARS = 500  # what of a failed command's stderr its error quotes
_REAP_TIMEOUT = 10.0  # after the group is killed (one it may not signal: a setuid program)


class ProcError(TrainError):
    def __init__(self, argv: Sequence[str], returncode: int, stderr: str,
                 timed_out: bool = False) -> None:
        tail = "\n".join(printable(stderr[-STDERR_KEPT:]).strip().splitlines()[-10:])
        if len(tail) > TAIL_CHARS:
            tail = "..." + tail[-TAIL_CHARS:]
        super().__init__(f"{shlex.join(argv)} exited with {returncode}: {tail}")
        self.returncode = returncode
        self.stderr = stderr
        self.timed_out = timed_out


# programs that did not answer within their bound in this process: a caller passing
# `skip_hung` does not wait on one of them again (a hung Docker engine asked three times
# by one submit held it three bounds long)
_HUNG: set[str] = set()


def run(argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 60.0,
        check: bool = True, env: Mapping[str, str] | None = None, skip_hung: bool = False
        ) -> subprocess.CompletedProcess[str]:
    """run_bounded, raising ProcError on a non-zero exit when `check`. `skip_hung`: where
    argv's program timed out earlier in this process, the same ProcError at once instead
    of another wait."""
    if skip_hung and argv and argv[0] in _HUNG:
        raise ProcError(argv, 124, f"not asked again: {argv[0]} did not answer earlier in "
                        "this command", timed_out=True)
    try:
        proc = run_bounded(argv, timeout=timeout, env=env, cwd=cwd)
    except ProcError as exc:
        if exc.timed_out:
            _HUNG.add(argv[0])
        raise
    if check and proc.returncode != 0:
        raise ProcError(argv, proc.returncode, proc.stderr)
    return proc


_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _popen(argv: Sequence[str], env: Mapping[str, str] | None, cwd: Path | None
           ) -> tuple[subprocess.Popen[bytes], list[int]]:
    """argv started in a session of its own, stdin empty, its output piped, with SIGINT,
    SIGTERM and SIGHUP held while it starts; and the signals that came meanwhile (for
    `_deliver` once the child is in hand): raised before Popen returned, one would unwind
    without the child, whose group would run on (seen: TERM to `train render` while a hung
    engine started). Only Python handlers are held, and only in the main thread."""
    held: list[int] = []
    previous = {}
    for sig in _HELD if threading.current_thread() is threading.main_thread() else ():
        handler = signal.getsignal(sig)
        if callable(handler):
            previous[sig] = signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        try:
            child = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True,
                                     env=None if env is None else dict(env), cwd=cwd)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    except BaseException as exc:
        _deliver(held)  # (an interrupt while it failed to start: the interrupt wins)
        if isinstance(exc, FileNotFoundError):
            raise ProcError(argv, 127, f"{argv[0]}: command not found") from None
        if isinstance(exc, OSError):  # E2BIG (an argument list too long), EACCES, ...
            raise ProcError(argv, 126, f"{argv[0]} could not be started: {exc}") from None
        raise
    return child, held


def _deliver(held: list[int]) -> None:
    for sig in dict.fromkeys(held):
        signal.raise_signal(sig)


# terminal escape sequences (CSI `ESC [ ... final`, OSC `ESC ] ... BEL|ESC \`, two-byte ESC
# X) and the other control characters (C0 but line break and tab, DEL, C1, bidi controls)
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?"
                      r"|\x9b[0-?]*[ -/]*[@-~]?|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
                      r"|[\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
TAIL = 300  # characters of a command's stderr a message quotes
STDERR_HEAD = 4 << 10  # bytes of a command's stderr kept from its start (an error said first)
STDERR_KEPT = 16 << 10  # and from its end
MAX_OUTPUT = 64 << 20  # bytes of a command's stdout read before it is stopped


def printable(text: str) -> str:
    """`text` without terminal escape sequences or other control characters (line breaks
    and tabs stay)."""
    return _ESCAPES.sub("", text)


def tail(text: str, limit: int = TAIL) -> str:
    """The end of a command's output on one line: printable, whitespace runs as one space,
    at most `limit` characters ('...' before a cut)."""
    line = " ".join(printable(text[-8 * limit:]).split())
    return line if len(line) <= limit else "..." + line[-limit:]


def run_bounded(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                slow: tuple[float, Callable[[], None]] | None = None, cwd: Path | None = None
                ) -> subprocess.CompletedProcess[str]:
    """Run argv (in `cwd`; `env`: its whole environment, default this process's) for at
    most `timeout` seconds; its group is killed then (ProcError, `timed_out` set), or when
    argv ends leaving children behind. Keeps the first MAX_OUTPUT bytes of stdout (more:
    stopped, 125) and the first STDERR_HEAD and last STDERR_KEPT bytes of stderr; bytes
    that are not UTF-8 (a site tool's output, a mangled name) are replaced. `slow`:
    (seconds, call) calls `call()` once if argv runs that long. A non-zero exit is
    returned, not raised."""
    log.debug("running %s (at most %g s)", shlex.join(argv), timeout)
    proc, held = _popen(argv, env, cwd=cwd)
    try:
        _deliver(held)
        out, err, failed = _collect(proc, timeout, slow)
    finally:
        _end_group(proc)
    if failed is not None:
        raise ProcError(argv, failed[0], failed[1], timed_out=failed[0] == 124)
    return subprocess.CompletedProcess(list(argv), proc.returncode,
                                       out.decode("utf-8", errors="replace"),
                                       err.decode("utf-8", errors="replace"))


def _collect(proc: subprocess.Popen[bytes], timeout: float,
             slow: tuple[float, Callable[[], None]] | None
             ) -> tuple[bytes, bytes, tuple[int, str] | None]:
    """(stdout, stderr's start and end, (code, why) where argv was stopped): read both
    pipes to their end and wait for argv's exit (not reaping it), within the deadline."""
    start = time.monotonic()
    deadline = start + timeout
    out, err = bytearray(), bytearray()
    cut = 0  # bytes of stderr left out between its start and its end
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None  # both are pipes
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map() or not _exited(proc):
            now = time.monotonic()
            if slow is not None and now >= start + slow[0]:
                slow[1]()
                slow = None
            if now >= deadline:
                why = f"timed out after {timeout:g} s; it and its children were killed"
                return bytes(out), bytes(err), (124, why)
            wait = deadline - now if slow is None else min(deadline, start + slow[0]) - now
            if not sel.get_map():  # both pipes closed, argv not yet gone: look again soon
                time.sleep(min(wait, 0.01))
                continue
            for key, _ in sel.select(wait):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    out += chunk
                    if len(out) > MAX_OUTPUT:
                        return bytes(out), bytes(err), (125, f"printed more than {MAX_OUTPUT} "
                                                        "bytes; stopped")
                else:
                    err += chunk
                    over = len(err) - STDERR_HEAD - STDERR_KEPT
                    if over > 0:
                        del err[STDERR_HEAD:STDERR_HEAD + over]
                        cut += over
    said = f"\n[... {cut} bytes of stderr cut ...]\n".encode() if cut else b""
    return bytes(out), bytes(err[:STDERR_HEAD]) + said + bytes(err[STDERR_HEAD:]), None


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether argv has ended, without reaping it (its pid, the group's id, stays taken
    until `_end_group` has killed the group)."""
    if not hasattr(os, "waitid"):  # not Linux: reaped here, the group is killed anyway
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_REAP_TIMEOUT)
