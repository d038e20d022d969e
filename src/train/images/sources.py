"""Where the image definitions and their locks come from.

In order: `--defs DIR` (or TRAIN_DEFS), the `containers/` folder of a source tree this
package runs from (an editable install), that of the clone the working directory is in
(`pip install ./` runs the package from site-packages, and `train image build` needs the
clone's %files sources), and the copy installed with the package
(`<prefix>/share/train/containers`, from pyproject.toml's data-files). Finding none is a
usage error (exit 2), never "0 definitions".
"""

from __future__ import annotations

import os
import re
import site
import sys
from pathlib import Path

from train.common.errors import DISTRIBUTION, UsageError

DEFS_VAR = "TRAIN_DEFS"


def _working_clone() -> list[Path]:
    """containers/ of the clone of this project that holds the working directory, if any."""
    try:
        here = Path.cwd()
        for folder in (here, *here.parents):
            project = folder / "pyproject.toml"
            if (folder / "containers").is_dir() and project.is_file() \
                    and project.stat().st_size < 1 << 20 \
                    and re.search(rf'(?m)^name\s*=\s*"{DISTRIBUTION}"',
                                  project.read_text(encoding="utf-8", errors="replace")):
                return [folder / "containers"]
    except OSError:  # a working directory removed or unreadable: no clone there
        pass
    return []


def containers_dir(defs: str | Path | None = None) -> Path:
    """The folder holding the .def files (and requirements/ with the locks)."""
    chosen = defs or os.environ.get(DEFS_VAR)
    if chosen:
        source = "--defs" if defs else DEFS_VAR
        try:
            path = Path(chosen).expanduser().resolve()
            found = any(p.is_file() for p in path.glob("*.def"))
        except (OSError, RuntimeError) as exc:
            raise UsageError(f"{source}: {str(chosen)[:80]!r} cannot be used: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        if not found:
            raise UsageError(f"{source}: {path} holds no .def files")
        return path
    tree = Path(__file__).resolve().parents[3] / "containers"
    installed = [p / "share" / "train" / "containers"
                 for p in (Path(sys.prefix), Path(site.getuserbase()))]
    candidates = [tree, *_working_clone(), *installed]
    for candidate in candidates:
        if any(candidate.glob("*.def")):
            return candidate
    raise UsageError("image: no image definitions found (looked in "
                     f"{', '.join(str(p) for p in candidates)}); "
                     "name a folder of .def files with --defs DIR")


def find_def(image: str, defs: str | Path | None = None) -> Path:
    path = Path(image)
    if path.suffix == ".def":
        if path.is_file():
            return path.resolve()
        raise UsageError(f"image: {image} does not exist")
    candidate = containers_dir(defs) / f"{image}.def"
    if candidate.is_file():
        return candidate
    known = sorted(p.stem for p in containers_dir(defs).glob("*.def") if p.is_file())
    raise UsageError(f"image: unknown image {image!r}; known: {', '.join(known)}")
