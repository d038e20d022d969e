"""The content of an image, as a list a user can compare across machines and engines.

Run inside the image (`python -m train.images.content /`): one line per file, symlink and
directory, `MODE SHA256 PATH` (symlinks hash their target text, directories hash nothing),
sorted by path. Timestamps, owners and what the runtime mounts or writes at start (/proc,
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

# written or mounted by Docker or Apptainer when a container starts, never by a build
RUNTIME_PATHS = frozenset({"/proc", "/sys", "/dev", "/tmp", "/run", "/var/tmp", "/mnt",  # noqa: S108
                           "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/etc/mtab",
                           "/.dockerenv", "/etc/passwd", "/etc/group", "/etc/localtime",
                           "/.singularity.d", "/.exec", "/.run", "/.shell", "/.test",
                           "/environment", "/singularity"})


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def listing(root: str = "/") -> Iterator[str]:
    """`MODE SHA256 PATH` lines, sorted, for everything under root (one pass, streamed)."""
    root = os.path.abspath(root)

    def rel(path: str) -> str:
        return "/" + os.path.relpath(path, root) if path != root else "/"

    stack = [root]
    while stack:
        top = stack.pop()
        try:
            names = sorted(os.listdir(top), reverse=True)
        except OSError:
            continue
        for name in names:
            path = os.path.join(top, name)
            shown = rel(path)
            if shown in RUNTIME_PATHS:
                continue
            info = os.lstat(path)
            mode = f"{stat.S_IMODE(info.st_mode):04o}"
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(path)
                yield f"l{mode} {hashlib.sha256(target.encode()).hexdigest()} {shown}"
            elif stat.S_ISDIR(info.st_mode):
                if os.path.ismount(path):
                    continue  # a bind mount (home, scratch), not the image's own
                yield f"d{mode} - {shown}/"
                stack.append(path)
            elif stat.S_ISREG(info.st_mode):
                yield f"f{mode} {_sha256(path)} {shown}"


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
