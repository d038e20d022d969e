"""Build drivers: Apptainer where the binary exists (clusters), else the Docker engine through
its Python SDK with the translated Dockerfile (workstations, CI; train.images.dockerengine).
Both run %test and a short demo in the built image; Docker images export to a docker-archive
that Apptainer turns into a SIF on a cluster.

`--base-sif SIF` (Apptainer) builds a definition on a SIF of this machine instead of the base
its header names: the definition is built as written except its header, which becomes
`Bootstrap: localimage` / `From: SIF` (line numbers kept, so Apptainer's messages point at
the user's lines); Apptainer's own rules then apply to every section (%files copied with
`cp -fLr` onto the SIF's tree, the SIF's labels kept unless the definition sets them)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from train.common import _proc
from train.common.errors import ResourceError, UsageError
from train.common.filehash import file_sha256
from train.images.defs import PLACEHOLDER_RE, DefFile
from train.images.record import (
    DEMO_ARGS,
    BuildLog,
    BuildResult,
    ImageError,
    check_inputs,
    write_record,
)

__all__ = ["SIF_MAGIC", "SMOKE_LABEL", "apptainer_build", "apptainer_content", "apptainer_test",
           "check_base_sif", "engine", "smoke_args"]

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 7200.0
SMOKE_LABEL = "org.train.smoke"  # %labels: the `train` arguments `image test` runs after %test
SIF_MAGIC = b"SIF_MAGIC"  # sylabs/sif: after the 32-byte launch line
_HEADER_BAD = ("#", "{{", "}}", "\\")  # a comment, a placeholder or a continuation there


def engine(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    return "apptainer" if shutil.which("apptainer") else "docker"


def smoke_args(d: DefFile) -> tuple[str, ...]:
    """The short run `image test` does inside the image: the definition's own smoke label
    (sc2: a few episodes on pysc2's mock environment), else the demo."""
    labels = d.sections.get("labels")
    for number, text in labels.body() if labels else []:
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
        argv = ["apptainer", "build", "--force"]
        if fakeroot:
            argv.append("--fakeroot")
        for key, value in passed.items():
            argv += ["--build-arg", f"{key}={value}"]
        argv += [str(sif.resolve()), str(definition)]
        build_log = BuildLog()
        code = _stream(argv, root, build_log.feed, BUILD_TIMEOUT)
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


def _stream(argv: Sequence[str], cwd: Path, feed: Callable[[str], None],
            timeout: float) -> int:
    """Run argv with its output (stdout and stderr together) fed line by line to `feed`;
    the exit status (124 after `timeout` seconds, the process killed)."""
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

    timer = threading.Timer(timeout, kill)
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


def apptainer_test(sif: Path, smoke: Sequence[str] = DEMO_ARGS) -> str:
    _need_apptainer()
    out = _proc.run(["apptainer", "test", str(sif)], timeout=600).stdout
    out += _proc.run(["apptainer", "exec", str(sif), "python", "-m", "train", *smoke],
                     timeout=600).stderr
    return out


def apptainer_content(sif: Path) -> list[str]:
    _need_apptainer()
    out = _proc.run(["apptainer", "exec", "--contain", str(sif), "python", "-m",
                     "train.images.content", "/"], timeout=1800).stdout
    return out.splitlines()


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
    """The definition's text with its header replaced by a localimage on `base`, the same
    number of lines before the first section."""
    first = min(n for s in d.sections.values() for n in (s.headers or [s.line]))
    header = ["Bootstrap: localimage", f"From: {base}"]
    header += [""] * max(0, first - 1 - len(header))
    return "\n".join(header + d.lines[first - 1:]) + "\n"


def used_arguments(text: str, build_args: Mapping[str, str]) -> dict[str, str]:
    """The build arguments the text still uses (Apptainer refuses an unused one)."""
    used = set(PLACEHOLDER_RE.findall(text))
    return {k: v for k, v in build_args.items() if k in used}
