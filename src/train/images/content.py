"""The content of an image, as a list a user can compare across machines and engines.

Run inside the image (`python -m train.images.content /`): one line per entry,
`KINDMODE SHA256 PATH` (symlinks hash their target text, folders and special files hash
nothing, files the user cannot read say so; names are escaped to one line), sorted.
Timestamps, owners and what the runtime mounts or writes at start (/proc,
/sys, /dev, /tmp, /run, bind mounts, /etc/hosts and the like) are not part of it. The
digest is the sha256 of the listing: two builds with the same digest hold the same files.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from train.common.filehash import file_sha256

# written or mounted by Docker or Apptainer when a container starts, never by a build
RUNTIME_PATHS = frozenset({"/proc", "/sys", "/dev", "/tmp", "/run", "/var/tmp", "/mnt",  # noqa: S108
                           "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/etc/mtab",
                           "/.dockerenv", "/etc/passwd", "/etc/group", "/etc/localtime",
                           "/.singularity.d", "/.exec", "/.run", "/.shell", "/.test",
                           "/environment", "/singularity"})


def _name(path: str) -> str:
    """The path with every byte outside printable ASCII (and the backslash) escaped as \\xNN,
    so a name holding a newline or invalid UTF-8 stays one unambiguous line."""
    raw = os.fsencode(path)
    return "".join(chr(b) if 32 < b < 127 and b != 0x5C else f"\\x{b:02x}" for b in raw)


_KINDS = ((stat.S_ISFIFO, "p"), (stat.S_ISSOCK, "s"), (stat.S_ISCHR, "c"),
          (stat.S_ISBLK, "b"))


def listing(root: str = "/") -> Iterator[str]:
    """The listing's lines, unsorted (one pass, streamed): KIND f, d, l or p/s/c/b."""
    root = os.path.abspath(root)

    def rel(path: str) -> str:
        return "/" + os.path.relpath(path, root) if path != root else "/"

    stack = [root]
    while stack:
        top = stack.pop()
        try:
            names = sorted(os.listdir(top), reverse=True)
        except OSError:
            yield f"d---- unreadable {_name(rel(top))}/"
            continue
        for name in names:
            path = os.path.join(top, name)
            shown = rel(path)
            if shown in RUNTIME_PATHS:
                continue
            try:
                info = os.lstat(path)
            except OSError:
                continue  # gone while listing
            mode = f"{stat.S_IMODE(info.st_mode):04o}"
            if stat.S_ISLNK(info.st_mode):
                target = os.fsencode(os.readlink(path))
                yield f"l{mode} {hashlib.sha256(target).hexdigest()} {_name(shown)}"
            elif stat.S_ISDIR(info.st_mode):
                if os.path.ismount(path):
                    continue  # a bind mount (home, scratch), not the image's own
                yield f"d{mode} - {_name(shown)}/"
                stack.append(path)
            elif stat.S_ISREG(info.st_mode):
                try:
                    sha = file_sha256(path)
                except OSError:  # root-only files, as seen by the user the listing runs as
                    sha = "unreadable"
                yield f"f{mode} {sha} {_name(shown)}"
            else:
                kind = next((k for test, k in _KINDS if test(info.st_mode)), "?")
                yield f"{kind}{mode} - {_name(shown)}"


def digest(lines: list[str]) -> str:
    return "sha256:" + hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def main(argv: list[str]) -> int:
    root = argv[0] if argv else "/"
    if not Path(root).is_dir():
        print(f"{root} is not a directory", file=sys.stderr)
        return 2
    for line in sorted(listing(root)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
