"""Preflight, check 4: the runs root can be created and written, on a file system the
compute nodes share (under the site's scratch where the profile names one)."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from train.client.clusters.schema import Profile
from train.client.preflight.result import RUNS_ROOT, Check
from train.client.preflight.storage import Mount, _storage, _under


def _try_write(directory: Path) -> str | None:
    """None when a file can be created (and is removed) in `directory`, else why not."""
    try:
        fd, name = tempfile.mkstemp(prefix=".train-preflight-", dir=directory)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    try:
        os.unlink(name)
    except OSError as exc:
        return f"a test file could not be removed: {exc.strerror or exc}"
    return None


def _unreachable(path: Path, where: Path, exc: OSError, elsewhere: str) -> Check:
    if exc.errno == errno.ELOOP:
        return Check(RUNS_ROOT, False, f"{path} cannot be reached: a loop of symbolic links "
                     f"(at {where} or above it: {exc.strerror})",
                     f"correct or remove the looping link (ls -l each part of {where}); or "
                     f"choose another directory: {elsewhere}")
    return Check(RUNS_ROOT, False, f"{path} cannot be reached: {exc.strerror or exc}",
                 f"choose another directory: {elsewhere}")


def _check_runs_root(root: Path, profile: Profile, mounts: Sequence[Mount]) -> Check:
    path = Path(os.path.abspath(os.path.expanduser(str(root))))
    scratch = profile.scratch_root
    elsewhere = (f"--runs DIR (and --out) under {scratch}/$USER" if scratch
                 else "--runs DIR (and --out) on a shared file system")
    existing = path
    while True:  # up to the nearest part that exists; no symbolic link may dangle on the way
        try:
            os.stat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            return _unreachable(path, existing, exc, elsewhere)
        if os.path.islink(existing):
            try:
                target = os.readlink(existing)
            except OSError:
                target = "?"
            return Check(RUNS_ROOT, False, f"{path} cannot be created: {existing} is a "
                         f"symbolic link to {target}, which does not exist",
                         f"create the link's target (mkdir -p {target}) or remove the link "
                         f"(rm {existing}); or choose another directory: {elsewhere}")
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != path and not existing.is_dir():
        return Check(RUNS_ROOT, False, f"{path} cannot be created: {existing} is a file",
                     f"choose another directory: {elsewhere}")
    if existing == path and not path.is_dir():
        return Check(RUNS_ROOT, False, f"{path} is a file, not a directory",
                     f"pass a directory: {elsewhere}")
    why = _try_write(existing)
    if why is not None:
        where = path if existing == path else f"{existing} (where {path} would be created)"
        return Check(RUNS_ROOT, False, f"{where} is not writable: {why}",
                     f"chmod u+w {existing}, or choose a directory of yours: {elsewhere}")
    state = "writable" if existing == path else f"does not exist yet; {existing} is writable"
    kind, note = _storage(str(existing), mounts, profile)
    scratch_note = ""
    if scratch and kind != "single_host":
        real = os.path.realpath(existing)
        inside = _under(str(path), scratch) or _under(real, os.path.realpath(scratch))
        scratch_note = (f"; under the site's scratch ({scratch})" if inside else
                        f"; not under the site's scratch ({scratch}): home directories are "
                        "often small")
    detail = f"{path}: {state}; {note}{scratch_note}"
    fix = (f"put runs where every node sees them: {elsewhere} (jobs write checkpoints and "
           "logs there from the compute nodes)")
    if kind in ("volatile", "temp"):
        return Check(RUNS_ROOT, False, detail, fix)
    if kind in ("local", "unknown"):
        return Check(RUNS_ROOT, True, detail, fix, warn=True)
    return Check(RUNS_ROOT, True, detail)
