"""Docker builds, for workstations and CI: the build context, one build container from the
base image committed as the image's one new layer, and the runs that test, list and
export the image (a docker-archive that Apptainer turns into a SIF on a cluster)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from train.common.errors import ResourceError, UsageError, install_hint
from train.images.build import BuildLog, BuildResult, ImageError, check_inputs, write_record
from train.images.defs import DefFile
from train.images.dockerfile import (
    BUILD_DIR,
    SCRIPT_DIR,
    Translation,
    context_path,
    quote_env,
    translate,
)
from train.images.features import cache_path


def write_context(d: DefFile, dest: Path, build_args: Mapping[str, str],
                  localimages: Mapping[str, str], root: Path) -> Path:
    """The Docker build context (Dockerfile, scripts, %files sources under files/), written
    beside `dest` and renamed into place: an error leaves nothing behind."""
    sources = check_inputs(d, build_args, root)
    translation = translate(d, build_args, localimages)
    dest = dest.absolute()
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise UsageError(f"out: {dest} already exists; name a new or empty folder")
    for source in sources:
        if dest.resolve() == source or source in dest.resolve().parents:
            raise UsageError(f"out: {dest} is inside the %files source {source}: the "
                             "context would copy itself")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        (work / "Dockerfile").write_text(translation.dockerfile, encoding="utf-8")
        (work / BUILD_DIR).mkdir()
        for name, text in translation.scripts.items():
            (work / BUILD_DIR / name).write_text(text, encoding="utf-8")
        for index, (src, _) in enumerate(translation.copies):
            source, target = root / src, work / context_path(index, src)
            target.parent.mkdir(parents=True)
            # (every link inside a folder was checked by check_inputs)
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
        if dest.exists():
            dest.rmdir()
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return dest


def _client() -> Any:
    try:
        import docker
    except ImportError:
        raise UsageError(f"docker builds need the docker SDK: {install_hint('images')}"
                         ) from None

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        raise ResourceError(f"no Docker engine reachable (DOCKER_HOST="
                            f"{os.environ.get('DOCKER_HOST')}): {exc}. Start "
                            "one (ci/docker-up.sh) or build with apptainer") from None
    return client


def docker_build(d: DefFile, root: Path, tag: str, build_args: Mapping[str, str],
                 localimages: Mapping[str, str], network: str = "none",
                 record: Path | None = None) -> BuildResult:
    """Build with the Docker engine as Apptainer builds: one container from the base image
    runs the staged %files copies and %post, removes what was staged, and is committed as
    the image's one new layer (Docker's builder would keep each COPY as a layer, and what
    was staged with it); then a failing %test fails the build. `network`: what %post
    reaches ("none": offline inputs only). The engine's cache is never used."""
    build_log = BuildLog()
    args = d.resolve_arguments(build_args)
    with tempfile.TemporaryDirectory(prefix="train-image-") as tmp:
        # every input checked and translated before the engine is asked
        ctx = write_context(d, Path(tmp) / "context", build_args, localimages, root)
        translation = translate(d, build_args, localimages)
        base = translation.dockerfile.split("\nFROM ", 1)[1].split("\n", 1)[0]
        archive = Path(tmp) / "staged.tar"
        _stage(ctx, translation.scripts, archive)
        client = _client()
        base_id, image = _run_and_commit(client, archive, build_log, d.name, network, tag,
                                         translation, base)
    if "test" in translation.scripts:
        _build_test(client, tag, d.name)
    if record is None:  # no --out: the record goes to the cache (the image is the engine's)
        record = cache_path(os.environ, f"images/{tag.replace('/', '_').replace(':', '_')}"
                                        ".build.json")
    result = BuildResult(str(image.id), str(image.id), build_log.downloads, args, record)
    write_record(d, root, result, "docker", f"{base} ({base_id})")
    return result


def _build_test(client: Any, tag: str, what: str) -> None:
    """%test, last, as `apptainer build` runs it: on a failure the tag is not kept."""
    import docker

    try:
        docker_run(tag, [f"{SCRIPT_DIR}/test"], entrypoint=["/bin/sh"])
    except ImageError as exc:
        with contextlib.suppress(docker.errors.DockerException):
            client.images.remove(tag, force=True)
        raise ImageError(f"docker build of {what} failed: its %test failed (apptainer build "
                         f"runs %test last, and so does this build): {exc}") from None


def _run_and_commit(client: Any, archive: Path, build_log: BuildLog, what: str,
                    network: str, tag: str, translation: Translation, base: str
                    ) -> tuple[str, Any]:
    """The build container from `base` (its id returned), run and committed as `tag`."""
    import docker

    try:
        try:
            base_id = str(client.images.get(base).id)
        except docker.errors.ImageNotFound:
            base_id = str(client.images.pull(base).id)
        container = client.containers.create(
            base, entrypoint=["/bin/sh", "-e", f"{SCRIPT_DIR}/build/all"], command=[],
            network_mode=network, detach=True)
    except docker.errors.DockerException as exc:
        raise ImageError(f"docker build of {what}: {exc}") from None
    try:
        with open(archive, "rb") as fh:
            container.put_archive("/", fh)
        container.start()
        pending = ""
        for chunk in container.logs(stream=True, follow=True):
            pending += bytes(chunk).decode(errors="replace")
            done, _, pending = pending.rpartition("\n")
            build_log.feed(done)
        build_log.feed(pending)
        code = int(container.wait()["StatusCode"])
        if code != 0:
            raise ImageError(f"docker build of {what} failed: %files/%post exited with "
                             f"{code}\n" + "\n".join(build_log.tail)
                             + ("\n(the build had no network: --network none. A build that "
                                "downloads the real base, game or packages needs --network "
                                "default)" if network == "none" else ""))
        name, sep, version = tag.rpartition(":")  # a registry's port is no version
        repository, version = (name, version) if sep and "/" not in version else (tag, "latest")
        return base_id, container.commit(repository, version,
                                         changes=_config(translation, client, base))
    except docker.errors.DockerException as exc:
        raise ImageError(f"docker build of {what} failed: {exc}\n"
                         + "\n".join(build_log.tail)) from None
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)


def _stage(ctx: Path, scripts: Mapping[str, str], archive: Path) -> None:
    """The tar put into the build container, as the translated Dockerfile places it
    (build/all runs the build scripts and removes what was staged)."""
    import io
    import tarfile

    steps = [f"/bin/sh -e {SCRIPT_DIR}/build/{name}" for name in ("files", "post")
             if name in scripts]
    run_all = ("set -e\n" + "\n".join(steps)
               + f"\nrm -rf {SCRIPT_DIR}/build {SCRIPT_DIR}/files\n")

    def add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
        data = text.encode("utf-8")
        info = tarfile.TarInfo(f"{SCRIPT_DIR.lstrip('/')}/{name}")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(archive, "w") as tar:
        if (ctx / "files").is_dir():
            tar.add(ctx / "files", arcname=f"{SCRIPT_DIR.lstrip('/')}/files")
        add_text(tar, "build/all", run_all)
        for name, text in scripts.items():  # runscript, test, help: kept in the image
            add_text(tar, f"build/{name}" if name in ("files", "post") else name, text)


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _config(translation: Translation, client: Any, base: str) -> list[str]:
    """The commit's config: %environment with each `$VAR` filled in as Docker's ENV does (a
    commit would keep `$PATH` as text), LABEL and ENTRYPOINT; without a runscript the base
    image's own entrypoint and command (the build container's are the build script)."""
    config = client.images.get(base).attrs.get("Config") or {}
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    env.setdefault("PATH", DEFAULT_PATH)  # Docker's FROM gives an image without one this
    changes = []
    for name, value in translation.env:
        env[name] = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
        changes.append(f"ENV {name}={quote_env(env[name])}")
    changes += [line for line in translation.dockerfile.splitlines()
                if line.startswith(("LABEL ", "ENTRYPOINT "))]
    if "runscript" in translation.scripts:  # (its ENTRYPOINT is among the lines above)
        return [*changes, "CMD []"]
    return [*changes, f"ENTRYPOINT {json.dumps(config.get('Entrypoint') or [])}",
            f"CMD {json.dumps(config.get('Cmd') or [])}"]


def docker_run(tag: str, args: Sequence[str], entrypoint: Sequence[str] | None = None,
               user: str | None = None) -> str:
    import docker

    client = _client()
    try:
        out = client.containers.run(tag, list(args), entrypoint=list(entrypoint)
                                    if entrypoint else None, remove=True, user=user,
                                    network_mode="none", stdout=True, stderr=True)
    except docker.errors.ContainerError as exc:
        stderr = exc.stderr.decode(errors="replace") if exc.stderr else ""
        raise ImageError(f"{tag} {' '.join(args)} exited with {exc.exit_status}:\n"
                         f"{stderr[-3000:]}") from None
    return bytes(out).decode(errors="replace")


def docker_test(tag: str, smoke: Sequence[str]) -> str:
    """%test (as Apptainer runs it: a plain /bin/sh script), then a short run inside."""
    return (docker_run(tag, [f"{SCRIPT_DIR}/test"], entrypoint=["/bin/sh"])
            + docker_run(tag, smoke))


def docker_content(tag: str) -> list[str]:
    """The listing as an unprivileged user sees it, as under `apptainer exec`."""
    return docker_run(tag, ["-m", "train.images.content", "/"], entrypoint=["python"],
                      user="65534:65534").splitlines()


def docker_export(tag: str, out: Path) -> str:
    client = _client()
    image = client.images.get(tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as fh:
        fh.writelines(image.save(named=True))
    tmp.replace(out)
    return f"apptainer build {out.stem}.sif docker-archive://{out}"
