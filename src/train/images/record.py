"""What every build shares, whichever engine runs it: the checks it makes on this machine
before any engine starts (exit 2), the reader of its output (downloads reported by %post,
progress lines, the last lines for an error), its result, the build record written beside
the image, and the demo run that tests an image."""

from __future__ import annotations

import collections
import logging
import os
import posixpath
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from train.common.errors import TrainError, UsageError
from train.common.filehash import file_sha256
from train.common.jsonio import write_json_atomic
from train.images.defs import PLACEHOLDER_RE, DefFile
from train.images.dockerfile import check_text, files_source_problem

log = logging.getLogger(__name__)

DEMO_ARGS = ("run", "demo", "--device", "cpu", "--res", "8", "--episode-steps", "16",
             "--batch-size", "8", "--learning-starts", "16", "--replay-size", "200",
             "--episodes", "3", "--eval-episodes", "1", "--out", "/tmp/train-demo")  # noqa: S108 (inside the container)
# what a definition's %post prints for each file it downloads (sc2.def's fetch):
#   train-download: SHA256 NAME URL SUM_ARGUMENT
DOWNLOAD_MARK = "train-download:"
PROGRESS_MARK = "downloading "  # a long download's progress lines, shown as they come
RECORD_SUM = "record-on-first-build"  # a sum argument's value before its first build
# lint rules that stop a build before any engine starts (the others are our images' own
# conventions: a user's definition need not follow them to build)
BUILD_BLOCKING = frozenset({"parse", "size", "section", "header", "placeholder",
                            "files-source", "arguments-empty", "pip-lock"})


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


def _file_url_path(value: str) -> str | None:
    """The path of a file: URL (file:///p, file:/p, any case of the scheme), or None."""
    if value[:5].lower() != "file:":
        return None
    rest = value[5:]
    return "/" + rest.lstrip("/") if rest.startswith("/") else rest


def _check_links(number: int, d: DefFile, source: Path, real_root: Path) -> None:
    """Every symbolic link inside a %files folder must resolve inside the repository (cp -L
    follows them: a link out would copy the build host's files into the image)."""
    for folder, dirs, names in os.walk(source):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                raise UsageError(f"{d.path}:{number}: {path} is a dangling or looping "
                                 "symbolic link") from None
            if not target.is_relative_to(real_root):
                raise UsageError(f"{d.path}:{number}: {path} links outside the repository "
                                 f"({target})")
            if target.is_dir() and (target == Path(folder).resolve()
                                    or target in Path(folder).resolve().parents):
                raise UsageError(f"{d.path}:{number}: {path} is a looping symbolic link "
                                 "(it points at a folder that contains it)")


def _check_unused(d: DefFile, build_args: Mapping[str, str]) -> None:
    """A build argument given that no `{{ NAME }}` outside %arguments uses is refused, as
    `apptainer build` refuses it ("unused build args")."""
    section = d.sections.get("arguments")
    skip = {n for n, _ in section.lines} if section is not None else set()
    used = {name for number, line in enumerate(d.lines, 1) if number not in skip
            for name in PLACEHOLDER_RE.findall(line)}
    unused = [key for key in build_args if key not in used]
    if unused:
        raise UsageError(f"build-arg {unused[0]}: {d.path.name} declares it but uses it "
                         "nowhere ({{ " + unused[0] + " }}), and Apptainer refuses a build "
                         "argument the definition does not use: leave it out")


def check_inputs(d: DefFile, build_args: Mapping[str, str], root: Path) -> list[Path]:
    """Everything a build needs from this machine, checked before any engine starts (exit 2):
    a source tree to build from, build argument values, lint's blocking rules, every %files
    source (and every link inside it) in the repository, and every `file://` build argument
    (an offline stand-in for a download) staged by a %files entry. Returns the sources."""
    if not ((root / "pyproject.toml").is_file() or (root / ".git").exists()):
        raise UsageError(f"image build: {root} is not a source tree (no pyproject.toml or "
                         ".git there): %files sources resolve from the repository root, so "
                         "build from inside a clone (or --defs the containers/ folder of "
                         "one)")
    for key, value in build_args.items():
        check_text(f"build-arg {key}", value)
    from train.images.lint import lint_def

    overridden = [f" {k}=" for k in build_args]
    blocking = [v for v in lint_def(d.path, root=root, reference=False)
                if v.rule in BUILD_BLOCKING
                and not (v.rule == "arguments-empty"
                         and any(o in f" {v.message}" for o in overridden))]
    if blocking:
        raise UsageError("\n".join(str(v) for v in blocking[:10]) + "\nimage build: "
                         f"{d.path.name} breaks the rules above (train image lint)")
    args = d.resolve_arguments(build_args)
    _check_unused(d, build_args)
    staged: list[tuple[str, Path]] = []
    real_root = root.resolve()
    for number, raw_src, raw_dst in d.files():
        src = d.substitute(raw_src, args, number)
        problem = files_source_problem(src)  # the substituted value (lint saw the defaults)
        if problem:
            raise UsageError(f"{d.path}:{number}: %files source {src!r} {problem}")
        source = (root / src).resolve()
        if not source.is_relative_to(real_root) or not source.exists():
            raise UsageError(f"{d.path}:{number}: %files source {src} does not exist under "
                             f"{root}")
        if source.is_dir():
            _check_links(number, d, source, real_root)
        dst = d.substitute(raw_dst, args, number) or "/" + src
        staged.append((posixpath.normpath("/" + dst.lstrip("/")), source))
    for key, value in build_args.items():
        inside = _file_url_path(value)
        if inside is None:
            continue
        clean = posixpath.normpath(inside)
        if ".." in inside.split("/") or not clean.startswith("/"):
            raise UsageError(f"build-arg {key}: {value[:80]} must be an absolute file:// "
                             "path without '..'")
        for dst, source in staged:
            if clean == dst or (source.is_dir() and clean.startswith(dst.rstrip("/") + "/")):
                local = source / clean[len(dst):].lstrip("/") if source.is_dir() else source
                if not local.is_file():
                    raise UsageError(f"build-arg {key}: {value} is missing: put it at "
                                     f"{local} (the %files entry for {dst} copies it in)")
                break
        else:
            raise UsageError(f"build-arg {key}: {value} is not inside any %files "
                             f"destination of {d.path.name}, so the build cannot read it")
    return [source for _, source in staged]
