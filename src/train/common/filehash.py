"""A file's sha256, read in blocks: the one digest of a file's bytes every side takes
(image locks and builds, the image content listing, checkpoints). The standard library
only."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the file's bytes; OSError where it cannot be read."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
