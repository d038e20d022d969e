"""Where the answer of an image's probe is kept (train.images.features): per image identity
in ~/.cache/train/image-features.json, the newest CACHE_ENTRIES.

A SIF is known by its real path, size and modification time; a sandbox (a folder) by its
real path, and its answer holds the stamps of the folders its Python imports from and
searches (installing torch into one changes its stamp: the image is asked again). A cache
file that is not a regular file (a FIFO, a link to a device) is never read or written over.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from train.common.jsonio import parse_json_object, write_json_atomic

CACHE_ENTRIES = 64
CACHE_MAX_BYTES = 1 << 20
WATCH_MAX = 200  # paths stamped for a sandbox's answer
_LINK_HOPS = 40
_WARNED: set[str] = set()


def cache_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or
                                                         os.path.expanduser("~"), ".cache")
    return Path(base) / "train" / "image-features.json"


def how_to_clear(path: Path) -> str:
    return f"remove {path} (or its entry for this image) to ask the image again"


def read_entries(path: Path) -> tuple[dict[str, object] | None, str]:
    """(the entries, a warning): {} where there are none yet or not ours (written anew);
    None, with one warning line the first time, where the file cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}, ""
    except OSError as exc:
        data, problem = None, f"cannot be opened ({exc.strerror or exc})"
    else:
        try:
            data, problem = _read_open(fd)
        finally:
            os.close(fd)
    if not problem:
        return data, ""
    key = str(path)
    if key in _WARNED:
        return None, ""
    _WARNED.add(key)
    return None, (f"the image-feature cache {path} {problem}: not used, and images are "
                  f"asked each time; remove it to have a cache again")


def _read_open(fd: int) -> tuple[dict[str, object] | None, str]:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a folder"
                if stat.S_ISDIR(st.st_mode) else "not a file")
        return None, f"is not a regular file ({kind})"
    try:
        with open(fd, "rb", closefd=False) as fh:
            raw = fh.read(CACHE_MAX_BYTES + 1)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if len(raw) > CACHE_MAX_BYTES:
        return None, f"is larger than {CACHE_MAX_BYTES // (1 << 20)} MiB"
    # {}: cut short, or not ours; NaN and Infinity (a hand edit) read as null, so the
    # entries can be written back as strict JSON (write_entries)
    return parse_json_object(raw, parse_constant=lambda _name: None), ""


def write_entries(path: Path, data: Mapping[str, object]) -> None:
    """The newest CACHE_ENTRIES, written whole (a link's target replaced, the link kept)."""
    kept = {key: entry for key, entry in list(data.items())[-CACHE_ENTRIES:]
            if _strict_json(entry)}  # (a hand edit's 1e400: inf, which strict JSON refuses)
    target = Path(os.path.realpath(path))
    with contextlib.suppress(OSError, ValueError):
        write_json_atomic(target, kept, indent=1, sort_keys=False, fsync=False)


def _strict_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


# -- what an image is known by -------------------------------------------------------------
def file_identity(path: str) -> str | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"sandbox:{real}"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def sandbox_stamps(root: str, paths: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(path, stamp) for each path inside the sandbox at `root` (as the image's Python
    sees it): the inode, modification time and size of what is there, or of the nearest
    folder above it that is there (where the path would be created), marked '-'."""
    real = os.path.realpath(root)
    out: dict[str, str] = {}
    for path in paths:
        if len(out) >= WATCH_MAX:
            break
        if path in out or not path.startswith("/"):
            continue
        host, whole = _inside(real, path)
        try:
            st = os.lstat(host)
        except OSError:
            out[path] = "?"
            continue
        out[path] = f"{'' if whole else '-'}{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
    return tuple(out.items())


def _inside(root: str, path: str) -> tuple[str, bool]:
    """`path` of the sandbox as a host path, its links followed inside `root` (an absolute
    link is from the sandbox's root); where a part is missing, the folder above it and
    False."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, name)
        try:
            target = os.readlink(host) if os.path.islink(host) else None
            if target is None and not os.path.lexists(host):
                return os.path.join(root, *done), False
        except OSError:
            return os.path.join(root, *done), False
        if target is None:
            done.append(name)
            continue
        hops += 1
        if hops > _LINK_HOPS:  # a loop
            return os.path.join(root, *done), False
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return os.path.join(root, *done), True
