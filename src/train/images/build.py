"""Build drivers: Apptainer where the binary exists (clusters), else the Docker engine through
its Python SDK with the translated Dockerfile (workstations, CI). Both run %test and a short
demo in the built image; Docker images export to a docker-archive that Apptainer turns into
a SIF on a cluster."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from train import _proc
from train.errors import ResourceError, TrainError, UsageError
from train.images.defs import DefFile, parse
from train.images.dockerfile import BUILD_DIR, SCRIPT_DIR, translate
from train.images.sources import containers_dir, find_def

log = logging.getLogger(__name__)

DEMO_ARGS = ("run", "demo", "--device", "cpu", "--res", "8", "--episode-steps", "16",
             "--batch-size", "8", "--learning-starts", "16", "--replay-size", "200",
             "--episodes", "3", "--eval-episodes", "1", "--out", "/tmp/train-demo")  # noqa: S108 (inside the container)
_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc", ".keep")


class ImageError(TrainError):
    """A build, test or export failed."""


def repo_root() -> Path:
    return containers_dir().parent


def engine(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    return "apptainer" if shutil.which("apptainer") else "docker"


def write_context(d: DefFile, dest: Path, build_args: Mapping[str, str],
                  localimages: Mapping[str, str], root: Path | None = None) -> Path:
    """The Docker build context: Dockerfile, generated scripts, the %files sources."""
    root = root or repo_root()
    translation = translate(d, build_args, localimages)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Dockerfile").write_text(translation.dockerfile, encoding="utf-8")
    (dest / BUILD_DIR).mkdir(exist_ok=True)
    for name, text in translation.scripts.items():
        (dest / BUILD_DIR / name).write_text(text, encoding="utf-8")
    for src, _ in translation.copies:
        source, target = root / src, dest / src
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=_IGNORE, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy2(source, target)
        else:
            raise ImageError(f"%files source {src} does not exist under {root}")
    return dest


def _client() -> Any:
    try:
        import docker
    except ImportError:
        raise UsageError("docker builds need the docker SDK: pip install "
                         "'train[images]'") from None

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        raise ResourceError(f"no Docker engine reachable (DOCKER_HOST="
                            f"{os.environ.get('DOCKER_HOST')}): {exc}. Start "
                            "one (ci/docker-up.sh) or build with apptainer") from None
    return client


def docker_build(image: str, tag: str, build_args: Mapping[str, str],
                 localimages: Mapping[str, str], network: str = "none") -> str:
    import docker

    d = parse(find_def(image))
    client = _client()
    with tempfile.TemporaryDirectory(prefix="train-image-") as tmp:
        ctx = write_context(d, Path(tmp), build_args, localimages)
        try:
            built, logs = client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True,
                                              network_mode=network, pull=False)
        except docker.errors.BuildError as exc:
            tail = "".join(str(chunk.get("stream", chunk.get("error", "")))
                           for chunk in exc.build_log)[-3000:]
            raise ImageError(f"docker build of {image} failed: {exc.msg}\n{tail}") from None
        for chunk in logs:
            if "stream" in chunk and chunk["stream"].strip():
                log.debug("%s", chunk["stream"].rstrip())
    return str(built.id)


def docker_run(tag: str, args: Sequence[str], entrypoint: Sequence[str] | None = None) -> str:
    import docker

    client = _client()
    try:
        out = client.containers.run(tag, list(args), entrypoint=list(entrypoint)
                                    if entrypoint else None, remove=True,
                                    network_mode="none", stdout=True, stderr=True)
    except docker.errors.ContainerError as exc:
        stderr = exc.stderr.decode(errors="replace") if exc.stderr else ""
        raise ImageError(f"{tag} {' '.join(args)} exited with {exc.exit_status}:\n"
                         f"{stderr[-3000:]}") from None
    return bytes(out).decode(errors="replace")


def docker_test(tag: str) -> str:
    """%test, then a short demo run, inside the image."""
    report = docker_run(tag, [f"{SCRIPT_DIR}/test"], entrypoint=["/bin/sh"])
    report += docker_run(tag, DEMO_ARGS)
    return report


def docker_export(tag: str, out: Path) -> str:
    client = _client()
    image = client.images.get(tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as fh:
        for chunk in image.save(named=True):
            fh.write(chunk)
    tmp.replace(out)
    return f"apptainer build {out.stem}.sif docker-archive://{out}"


def apptainer_build(image: str, sif: Path, build_args: Mapping[str, str],
                    fakeroot: bool) -> None:
    argv = ["apptainer", "build", "--force"]
    if fakeroot:
        argv.append("--fakeroot")
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    _proc.run([*argv, str(sif), str(find_def(image))], cwd=repo_root(), timeout=7200)


def apptainer_test(sif: Path) -> str:
    out = _proc.run(["apptainer", "test", str(sif)], timeout=600).stdout
    out += _proc.run(["apptainer", "exec", str(sif), "python", "-m", "train",
                      *DEMO_ARGS], timeout=600).stderr
    return out
