"""Builds: Apptainer where the binary exists (clusters), else the Docker engine
(workstations, CI; train.images.dockerengine). What both engines share (the checks made
here before any engine starts, exit 2; the reader of a build's output; its result and
record) and the Apptainer driver. Both run %test and a short demo in the built image."""

from __future__ import annotations

import collections
import logging
import os
import posixpath
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from train.common import _proc
from train.common.errors import ResourceError, TrainError, UsageError
from train.common.filehash import file_sha256
from train.common.jsonio import write_json_atomic
from train.images.defs import PLACEHOLDER_RE, DefFile
from train.images.dockerfile import check_text, files_source_problem

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 7200.0
SMOKE_LABEL = "org.train.smoke"  # %labels: the `train` arguments `image test` runs after %test
SIF_MAGIC = b"SIF_MAGIC"  # sylabs/sif: after the 32-byte launch line
_HEADER_BAD = ("#", "{{", "}}", "\\")  # a comment, a placeholder or a continuation there
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
        lines, later = [f"downloaded: {len(self.downloads)} file(s)"], []
        for item in self.downloads:
            if self.args.get(item.argument) == RECORD_SUM:
                state = f"NOT VERIFIED ({item.argument}={RECORD_SUM})"
                later.append(f"next time pass: --build-arg {item.argument}={item.sha256}")
            elif item.argument:
                state = f"verified ({item.argument})"
            else:
                state = "no sum to check"
            lines.append(f"  {item.sha256}  {item.name}  {item.url}  {state}")
        return [*lines, *later, f"image {self.image_digest}; build record: {self.record}"]


def write_record(d: DefFile, root: Path, result: BuildResult, engine_name: str,
                 base: str) -> None:
    """The build record beside the image, written whole or not at all; its locks: the sha256
    of every lock file (requirements *.txt) the definition copies in."""
    locks = {}
    for number, raw_src, _ in d.files():
        source = root / d.substitute(raw_src, result.args, number)
        for path in sorted(source.rglob("*.txt")) if source.is_dir() else [source]:
            if path.suffix == ".txt" and "requirements" in path.parts and path.is_file():
                locks[str(path.relative_to(root))] = file_sha256(path)
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
        "locks": locks,
    }
    write_json_atomic(result.record, record, sort_keys=False, fsync=False)


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
    """Everything a build needs from this machine, checked before any engine starts (exit 2;
    a `file://` build argument is an offline stand-in for a download). Returns the sources."""
    if not ((root / "pyproject.toml").is_file() or (root / ".git").exists()):
        raise UsageError(f"image build: {root} is not a source tree (no pyproject.toml or "
                         ".git there): %files sources resolve from the repository root, so "
                         "build from inside a clone (or --defs the containers/ folder of "
                         "one)")
    for key, value in build_args.items():
        check_text(f"build-arg {key}", value)
    from train.images.lint import lint_def, source_problem

    blocking = [v for v in lint_def(d.path, root=root, reference=False, given=build_args)
                if v.rule in BUILD_BLOCKING]
    if blocking:
        raise UsageError("\n".join(str(v) for v in blocking[:10]) + "\nimage build: "
                         f"{d.path.name} breaks the rules above (train image lint)")
    args = d.resolve_arguments(build_args)
    _check_unused(d, build_args)
    staged: list[tuple[str, Path]] = []
    real_root = root.resolve()
    for number, raw_src, raw_dst in d.files():
        src = d.substitute(raw_src, args, number)
        # the substituted value (lint saw the defaults)
        problem = files_source_problem(src) or source_problem(root, src)
        if problem:
            raise UsageError(f"{d.path}:{number}: %files source {src!r} {problem}")
        source = (root / src).resolve()
        if source.is_dir():
            _check_links(number, d, source, real_root)
        dst = d.substitute(raw_dst, args, number) or "/" + src
        staged.append((posixpath.normpath("/" + dst.lstrip("/")), source))
    for key, value in build_args.items():
        if value[:5].lower() != "file:":  # file:///p, file:/p, any case of the scheme
            continue
        inside = "/" + value[5:].lstrip("/") if value[5:].startswith("/") else value[5:]
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


def smoke_args(d: DefFile) -> tuple[str, ...]:
    """The short run `image test` does inside the image: the definition's own smoke label
    (sc2: a few episodes on pysc2's mock environment), else the demo."""
    for number, text in d.body("labels"):
        key, _, value = text.partition(" ")
        if key == SMOKE_LABEL:
            return tuple(d.substitute(value, d.arguments(), number).split())
    return DEMO_ARGS


def apptainer_build(d: DefFile, root: Path, sif: Path, build_args: Mapping[str, str],
                    fakeroot: bool, base_sif: Path | None = None) -> BuildResult:
    """`apptainer build` run from the repository root, where %files sources resolve; its
    output is read as it comes (progress lines shown, downloads kept for the record).
    `base_sif`: build on that local SIF instead of the header's base; the header's From:
    arguments then default to its path."""
    import tempfile

    base = check_base_sif(base_sif) if base_sif is not None else None
    if base is not None:
        build_args = {**{k: str(base) for k in header_arguments(d)
                         if k in d.arguments()}, **build_args}
    check_inputs(d, build_args, root)
    _need_apptainer()
    with tempfile.TemporaryDirectory(prefix="train-def-") as tmp:
        definition = d.path.resolve()
        passed = dict(build_args)
        if base is not None:
            text = on_local_sif(d, base)
            definition = Path(tmp) / d.path.name
            definition.write_text(text, encoding="utf-8")
            passed = used_arguments(text, build_args)
        argv = ["apptainer", "build", "--force", *(["--fakeroot"] if fakeroot else []),
                *(a for k, v in passed.items() for a in ("--build-arg", f"{k}={v}")),
                str(sif.resolve()), str(definition)]
        build_log = BuildLog()
        code = _stream(argv, root, build_log.feed)
    if code != 0:
        raise ImageError(f"apptainer build of {d.name} exited with {code}:\n"
                         + "\n".join(build_log.tail))
    args = d.resolve_arguments(build_args)
    digest = "sha256:" + file_sha256(sif)
    result = BuildResult(str(sif), digest, build_log.downloads, args,
                         sif.with_suffix(".build.json"))
    header = d.header["from"]
    write_record(d, root, result, "apptainer", str(base) if base is not None
                 else d.substitute(header[1], args, header[0]))
    return result


def _stream(argv: Sequence[str], cwd: Path, feed: Callable[[str], None]) -> int:
    """Run argv with its output (stdout and stderr together) fed line by line to `feed`;
    the exit status (124 after BUILD_TIMEOUT seconds, the process killed)."""
    import threading

    log.debug("running %s", " ".join(argv))
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, encoding="utf-8",
                                errors="replace")
    except OSError as exc:
        raise ImageError(f"{argv[0]} could not be started: {exc}") from None
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(BUILD_TIMEOUT, kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            feed(line)
        code = proc.wait()
    finally:
        timer.cancel()
    return 124 if killed.is_set() else code


def _need_apptainer() -> None:
    if shutil.which("apptainer") is None:
        raise ResourceError("apptainer is not installed here (on a cluster: module load "
                            "apptainer); or build with --engine docker")


def apptainer_test(sif: Path, smoke: Sequence[str]) -> str:
    """%test, then a short run inside (as docker_test)."""
    _need_apptainer()
    return (_proc.run(["apptainer", "test", str(sif)], timeout=600).stdout
            + _proc.run(["apptainer", "exec", str(sif), "python", "-m", "train", *smoke],
                        timeout=600).stderr)


def apptainer_content(sif: Path) -> list[str]:
    _need_apptainer()
    return _proc.run(["apptainer", "exec", "--contain", str(sif), "python", "-m",
                      "train.images.content", "/"], timeout=1800).stdout.splitlines()


def check_base_sif(value: Path) -> Path:
    """The --base-sif path, absolute, once checked (exit 2 otherwise)."""
    text = str(value)
    if not text or any(c in text for c in "\n\r\0") or any(b in text for b in _HEADER_BAD) \
            or text != text.strip():
        raise UsageError(f"--base-sif: {text[:80]!r} cannot be named in a definition's "
                         "header (no '#', '{{', '}}', '\\', control characters or edge "
                         "spaces): rename or link it")
    path = Path(os.path.abspath(value))
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        raise UsageError(f"--base-sif: {path} {what}: give a SIF file (e.g. one built by "
                         "`train image build base` or `apptainer build`)")
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise UsageError(f"--base-sif: {path} cannot be read: {exc.strerror or exc}") from None
    if head[32:41] != SIF_MAGIC:
        raise UsageError(f"--base-sif: {path} is not a SIF image (no SIF header: an "
                         "incomplete copy, or another file)")
    return path


def header_arguments(d: DefFile) -> set[str]:
    """The build arguments the header's From: names (replaced by --base-sif)."""
    return set(PLACEHOLDER_RE.findall(d.header["from"][1]))  # (parse requires From:)


def on_local_sif(d: DefFile, base: Path) -> str:
    """The definition's text (--base-sif) with its header replaced by `Bootstrap: localimage`
    / `From: base` and as many lines before the first section (Apptainer's messages point
    at the user's lines); Apptainer's own rules then apply to every section (%files copied
    with `cp -fLr` onto the SIF's tree, its labels kept unless the definition sets them)."""
    first = min(n for s in d.sections.values() for n in (s.headers or [s.line]))
    header = ["Bootstrap: localimage", f"From: {base}"]
    header += [""] * max(0, first - 1 - len(header))
    return "\n".join(header + d.lines[first - 1:]) + "\n"


def used_arguments(text: str, build_args: Mapping[str, str]) -> dict[str, str]:
    """The build arguments the text still uses (Apptainer refuses an unused one)."""
    used = set(PLACEHOLDER_RE.findall(text))
    return {k: v for k, v in build_args.items() if k in used}
