"""A file replaced whole, never written through a link, and numbered kept copies of what
it replaces. The standard library only.

Every temporary file is made exclusively (O_CREAT|O_EXCL: a link or file planted at its
name is never opened, let alone followed) under a name of its own beside the target, then
renamed over the target: a link at the target is replaced, never written through, so
nothing outside the target's folder is created or changed. A caller that means a link's
file (a dotfiles link) resolves the link first and writes there."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

MAX_COPIES = 1000  # numbered copies of one file


def write_atomic(path: Path, data: bytes | str, *, fsync: bool = True,
                 before: Callable[[Path], None] | None = None) -> None:
    """`data` in place of `path` at once: written to a temp file beside it (with `fsync`
    flushed to disk), `before(temp)` called (a check of the written file, a copy kept),
    then renamed over `path`. A regular file there keeps its permissions. On any failure
    (before's too) the temp file is removed and `path` is as it was."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    while True:  # a new file beside `path`, under a name no one else has
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        with contextlib.suppress(FileExistsError):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            break
    try:
        with os.fdopen(fd, "wb") as fh:
            with contextlib.suppress(FileNotFoundError):
                old = os.lstat(path)
                if stat.S_ISREG(old.st_mode):
                    os.fchmod(fh.fileno(), stat.S_IMODE(old.st_mode))
            fh.write(raw)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if before is not None:
            before(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk or a bad value leaves the old file only
        raise


def keep_copy(path: Path) -> Path:
    """Copy the file at `path` to the first free PATH.N after the highest N in use (an
    earlier copy is never reused nor replaced: created exclusively), with its
    permissions. Returns the copy's path; a copy cut short (a full disk) is removed.
    Raises FileExistsError past MAX_COPIES."""
    data = path.read_bytes()
    prefix = f"{path.name}."
    numbers = [n[len(prefix):] for n in os.listdir(path.parent) if n.startswith(prefix)]
    used = [int(n) for n in numbers if n.isascii() and n.isdigit()]
    for number in range(max(used, default=0) + 1, MAX_COPIES + 1):
        copy = path.with_name(f"{path.name}.{number}")
        try:
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         stat.S_IMODE(path.stat().st_mode))
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except BaseException:
            copy.unlink(missing_ok=True)
            raise
        return copy
    raise FileExistsError(f"{path} has {MAX_COPIES} kept copies ({path.name}.1 to "
                          f".{MAX_COPIES}); move some aside")
