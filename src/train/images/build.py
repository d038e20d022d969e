"""Build drivers: Apptainer where the binary exists (clusters), else the Docker engine through
its Python SDK with the translated Dockerfile (workstations, CI; train.images.dockerengine).
Both run %test and a short demo in the built image; Docker images export to a docker-archive
that Apptainer turns into a SIF on a cluster."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from train.common import _proc
from train.common.errors import ResourceError
from train.common.filehash import file_sha256
from train.images.defs import DefFile
from train.images.inputs import check_inputs
from train.images.record import DEMO_ARGS, BuildLog, BuildResult, ImageError, write_record

__all__ = ["SMOKE_LABEL", "apptainer_build", "apptainer_content", "apptainer_test", "engine",
           "smoke_args"]

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 7200.0
SMOKE_LABEL = "org.train.smoke"  # %labels: the `train` arguments `image test` runs after %test


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
    `base_sif`: build on that local SIF instead of the header's base (images.localbase);
    the header's From: arguments then default to its path."""
    import tempfile

    from train.images import localbase

    base = localbase.check_base_sif(base_sif) if base_sif is not None else None
    if base is not None:
        build_args = {**{k: str(base) for k in localbase.header_arguments(d)
                         if k in d.arguments()}, **build_args}
    check_inputs(d, build_args, root)
    _need_apptainer()
    with tempfile.TemporaryDirectory(prefix="train-def-") as tmp:
        definition = d.path.resolve()
        passed = dict(build_args)
        if base is not None:
            text = localbase.on_local_sif(d, base)
            definition = Path(tmp) / d.path.name
            definition.write_text(text, encoding="utf-8")
            passed = localbase.used_arguments(text, build_args)
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
