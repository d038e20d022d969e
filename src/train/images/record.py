"""What every build shares, whichever engine runs it: the reader of its output (downloads
reported by %post, progress lines, the last lines for an error), its result, the build
record written beside the image, and the demo run that tests an image."""

from __future__ import annotations

import collections
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from train.common.errors import TrainError
from train.common.filehash import file_sha256
from train.common.jsonio import write_json_atomic
from train.images.defs import DefFile

log = logging.getLogger(__name__)

DEMO_ARGS = ("run", "demo", "--device", "cpu", "--res", "8", "--episode-steps", "16",
             "--batch-size", "8", "--learning-starts", "16", "--replay-size", "200",
             "--episodes", "3", "--eval-episodes", "1", "--out", "/tmp/train-demo")  # noqa: S108 (inside the container)
# what a definition's %post prints for each file it downloads (sc2.def's fetch):
#   train-download: SHA256 NAME URL SUM_ARGUMENT
DOWNLOAD_MARK = "train-download:"
PROGRESS_MARK = "downloading "  # a long download's progress lines, shown as they come
RECORD_SUM = "record-on-first-build"  # a sum argument's value before its first build


class ImageError(TrainError):
    """A build, test or export failed."""


@dataclass(frozen=True)
class Download:
    sha256: str
    name: str
    url: str
    argument: str  # the build argument that holds its expected sum ("" when none)


@dataclass
class BuildLog:
    """A build's output, line by line: the downloads its %post reported, the last lines
    (for an error); progress lines go on to `show`."""

    show: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    downloads: list[Download] = field(default_factory=list)
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=60))

    def feed(self, text: str) -> None:
        for raw in text.splitlines():
            line = raw.rstrip()
            if not line:
                continue
            self.tail.append(line)
            log.debug("%s", line)
            words = line.split()
            if line.startswith(DOWNLOAD_MARK) and len(words) >= 4:
                self.downloads.append(Download(words[1], words[2], words[3],
                                               words[4] if len(words) > 4 else ""))
                self.show(line)
            elif line.startswith(PROGRESS_MARK):
                self.show(line)


@dataclass
class BuildResult:
    image: str  # the docker image id (sha256 of its config) or the SIF path
    image_digest: str  # sha256:... of the image's content (docker: its id; SIF: the file)
    downloads: list[Download]
    args: dict[str, str]  # every build argument's value, defaults included
    record: Path

    def summary(self) -> list[str]:
        """The lines printed at the end of a build: each download's sha256, and the exact
        --build-arg to pass next time for a sum that was not yet recorded."""
        lines = [f"downloaded: {len(self.downloads)} file(s)"]
        for item in self.downloads:
            expected = self.args.get(item.argument, "")
            if expected == RECORD_SUM:
                state = f"NOT VERIFIED ({item.argument}={RECORD_SUM})"
            elif item.argument:
                state = f"verified ({item.argument})"
            else:
                state = "no sum to check"
            lines.append(f"  {item.sha256}  {item.name}  {item.url}  {state}")
        for item in self.downloads:
            if self.args.get(item.argument) == RECORD_SUM:
                lines.append(f"next time pass: --build-arg {item.argument}={item.sha256}")
        lines.append(f"image {self.image_digest}; build record: {self.record}")
        return lines


def lock_digests(d: DefFile, args: Mapping[str, str], root: Path) -> dict[str, str]:
    """sha256 of every lock file (requirements *.txt) the definition copies in."""
    out = {}
    for number, raw_src, _ in d.files():
        source = root / d.substitute(raw_src, args, number)
        files = sorted(source.rglob("*.txt")) if source.is_dir() else [source]
        for path in files:
            if path.suffix == ".txt" and "requirements" in path.parts and path.is_file():
                out[str(path.relative_to(root))] = file_sha256(path)
    return out


def write_record(d: DefFile, root: Path, result: BuildResult, engine_name: str,
                 base: str) -> None:
    """The build record beside the image, written whole or not at all."""
    record = {
        "definition": d.path.name,
        "engine": engine_name,
        "image": result.image,
        "image_digest": result.image_digest,
        "from": base,
        "build_args": result.args,
        "downloads": [{"name": i.name, "url": i.url, "sha256": i.sha256,
                       "sum_argument": i.argument,
                       "verified": bool(i.argument)
                       and result.args.get(i.argument) != RECORD_SUM}
                      for i in result.downloads],
        "locks": lock_digests(d, result.args, root),
    }
    write_json_atomic(result.record, record, sort_keys=False, fsync=False)


def default_record(tag: str) -> Path:
    """Where a docker build's record goes when --out names none (the image is the
    engine's)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "train" / "images" / (tag.replace("/", "_").replace(":", "_")
                                         + ".build.json")
