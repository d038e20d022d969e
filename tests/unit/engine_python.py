"""The Python the engine's tests run the engine's copy with: the oldest this machine has
at or above the engine's minimum (the sites' nodes bring 3.6 and 3.9; pyenv's builds where
present), else python3."""

from __future__ import annotations

import glob
import os
import shutil

from train.batch.engine import MIN_PYTHON


def _oldest() -> str:
    found = []
    for path in glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")):
        parts = path.split("/versions/")[1].split("/")[0].split(".")
        version = tuple(int(p) for p in parts[:2] if p.isdigit())
        if version >= MIN_PYTHON:
            found.append((version, path))
    return min(found)[1] if found else (shutil.which("python3") or "python3")


ENGINE_PYTHON = os.environ.get("TRAIN_TEST_ENGINE_PYTHON") or _oldest()
