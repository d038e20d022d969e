"""Build drivers: Apptainer where the binary exists (clusters), else the Docker engine through
its Python SDK with the translated Dockerfile (workstations, CI). Both run %test and a short
demo in the built image; Docker images export to a docker-archive that Apptainer turns into
a SIF on a cluster."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train import _proc
from train.errors import ResourceError, TrainError, UsageError, install_hint
from train.images.defs import DefFile
from train.images.dockerfile import (
    BUILD_DIR,
    SCRIPT_DIR,
    Translation,
    check_text,
    context_path,
    files_source_problem,
    quote_env,
    translate,
)

log = logging.getLogger(__name__)

DEMO_ARGS = ("run", "demo", "--device", "cpu", "--res", "8", "--episode-steps", "16",
             "--batch-size", "8", "--learning-starts", "16", "--replay-size", "200",
             "--episodes", "3", "--eval-episodes", "1", "--out", "/tmp/train-demo")  # noqa: S108 (inside the container)
# lint rules that stop a build before any engine starts (the others are our images' own
# conventions: a user's definition need not follow them to build)
BUILD_BLOCKING = frozenset({"parse", "size", "section", "header", "placeholder",
                            "files-source", "arguments-empty", "pip-lock"})
SMOKE_LABEL = "org.train.smoke"  # %labels: the `train` arguments `image test` runs after %test
# what a definition's %post prints for each file it downloads (sc2.def's fetch):
#   train-download: SHA256 NAME URL SUM_ARGUMENT
DOWNLOAD_MARK = "train-download:"
PROGRESS_MARK = "downloading "  # a long download's progress lines, shown as they come
RECORD_SUM = "record-on-first-build"  # a sum argument's value before its first build
NETWORKS = ("none", "default", "host")


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
    """Reads a build's output line by line: keeps the downloads its %post reported and the
    last lines (for an error), and passes progress lines on to `show` as they come."""

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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lock_digests(d: DefFile, args: Mapping[str, str], root: Path) -> dict[str, str]:
    """sha256 of every lock file (requirements *.txt) the definition copies in."""
    out = {}
    for number, raw_src, _ in d.files():
        source = root / d.substitute(raw_src, args, number)
        files = sorted(source.rglob("*.txt")) if source.is_dir() else [source]
        for path in files:
            if path.suffix == ".txt" and "requirements" in path.parts and path.is_file():
                out[str(path.relative_to(root))] = sha256_file(path)
    return out


def write_record(d: DefFile, root: Path, result: BuildResult, engine_name: str,
                 base: str) -> None:
    """The build record beside the image: what was downloaded and its sum, the lock files'
    sums, the base it was built from, and the image's own digest. Written whole or not at
    all (a temporary file renamed into place)."""
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
    result.record.parent.mkdir(parents=True, exist_ok=True)
    tmp = result.record.with_name(result.record.name + ".part")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(result.record)


def default_record(tag: str) -> Path:
    """Where a docker build's record goes when --out names none (the image itself lives in
    the engine): the user's cache folder, named after the tag."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "train" / "images" / (tag.replace("/", "_").replace(":", "_")
                                         + ".build.json")


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


def write_context(d: DefFile, dest: Path, build_args: Mapping[str, str],
                  localimages: Mapping[str, str], root: Path) -> Path:
    """The Docker build context: Dockerfile, generated scripts, and the %files sources
    under files/ (see dockerfile.context_path). Written to a fresh folder beside `dest`,
    then renamed into place: an error leaves nothing behind; `dest` must not exist yet or
    be an empty folder, and must not lie inside a %files source."""
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
            if source.is_dir():  # every link inside was checked by check_inputs
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        if dest.exists():
            dest.rmdir()
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return dest


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


def check_inputs(d: DefFile, build_args: Mapping[str, str], root: Path) -> list[Path]:
    """Everything a build needs from this machine, checked before any engine starts (exit 2):
    a source tree to build from, build argument values, lint's blocking rules, every %files
    source (and every link inside it) in the repository, and every `file://` build argument
    (an offline stand-in for a download) staged by a %files entry. Returns the sources."""
    if not ((root / "pyproject.toml").is_file() or (root / ".git").exists()):
        raise UsageError(f"image build: {root} is not a source tree (no pyproject.toml or "
                         ".git there): %files sources resolve from the repository root, so "
                         "build from a clone (or --defs the containers/ folder of one)")
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
                 nocache: bool = False, record: Path | None = None,
                 show: Callable[[str], None] | None = None) -> BuildResult:
    """Build with the Docker engine as Apptainer builds: one container from the base image
    gets the %files sources and the generated scripts (staged under /.train), runs the
    %files copies and %post in one go, removes what was staged, and is committed as the
    image's one new layer with %environment, %labels and the runscript as its config. So
    nothing staged or downloaded and then removed stays in any layer (Docker's builder
    would keep each COPY as a layer of its own). `network`: what %post reaches ("none", the
    default and CI's: offline inputs only; "default" or "host": the downloads a real build
    makes, as Apptainer's build makes them). Every build starts from the base image (the
    engine's cache is not used, so `nocache` changes nothing)."""
    del nocache
    if network not in NETWORKS:
        raise UsageError(f"network: {network!r} is not one of {', '.join(NETWORKS)}")
    build_log = BuildLog() if show is None else BuildLog(show=show)
    args = d.resolve_arguments(build_args)
    with tempfile.TemporaryDirectory(prefix="train-image-") as tmp:
        # every input checked and translated before the engine is asked
        ctx = write_context(d, Path(tmp) / "context", build_args, localimages, root)
        translation = translate(d, build_args, localimages)
        base = translation.dockerfile.split("\nFROM ", 1)[1].split("\n", 1)[0]
        archive = Path(tmp) / "staged.tar"
        _stage(ctx, translation.scripts, archive)
        client = _client()
        import docker

        try:
            base_id = _base_image(client, base)
            container = client.containers.create(
                base, entrypoint=["/bin/sh", "-e", f"{SCRIPT_DIR}/build/all"], command=[],
                network_mode=network, detach=True)
        except docker.errors.DockerException as exc:
            raise ImageError(f"docker build of {d.name}: {exc}") from None
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
                raise ImageError(f"docker build of {d.name} failed: %files/%post exited with "
                                 f"{code}\n" + "\n".join(build_log.tail)
                                 + _network_hint(network))
            image = container.commit(*_split_tag(tag),
                                     changes=_config(translation, client, base))
        except docker.errors.DockerException as exc:
            raise ImageError(f"docker build of {d.name} failed: {exc}\n"
                             + "\n".join(build_log.tail)) from None
        finally:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
    result = BuildResult(str(image.id), str(image.id), build_log.downloads, args,
                         record or default_record(tag))
    write_record(d, root, result, "docker", f"{base} ({base_id})")
    return result


def _stage(ctx: Path, scripts: Mapping[str, str], archive: Path) -> None:
    """The tar put into the build container: the %files sources under /.train/files, the
    build scripts under /.train/build (`all` runs them and removes what was staged), the
    runscript, test and help under /.train, as the translated Dockerfile places them."""
    import io
    import tarfile

    steps = [f"/bin/sh -e {SCRIPT_DIR}/build/{name}" for name in ("files", "post")
             if name in scripts]
    run_all = ("set -e\n" + "\n".join(steps)
               + f"\nrm -rf {SCRIPT_DIR}/build {SCRIPT_DIR}/files\n")

    def add_text(tar: tarfile.TarFile, name: str, text: str, mode: int) -> None:
        data = text.encode("utf-8")
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))

    inside = SCRIPT_DIR.lstrip("/")
    with tarfile.open(archive, "w") as tar:
        files = ctx / "files"
        if files.is_dir():
            tar.add(files, arcname=f"{inside}/files")
        add_text(tar, f"{inside}/build/all", run_all, 0o644)
        for name, text in scripts.items():
            if name in ("files", "post"):
                add_text(tar, f"{inside}/build/{name}", text, 0o644)
            else:  # runscript, test, help: kept in the image
                add_text(tar, f"{inside}/{name}", text, 0o644)


def _base_image(client: Any, base: str) -> str:
    """The base image's id, pulled first when the engine does not hold it."""
    import docker

    try:
        return str(client.images.get(base).id)
    except docker.errors.ImageNotFound:
        return str(client.images.pull(base).id)


def _split_tag(tag: str) -> tuple[str, str]:
    name, sep, version = tag.rpartition(":")
    if sep and "/" not in version:
        return name, version
    return tag, "latest"


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _config(translation: Translation, client: Any, base: str) -> list[str]:
    """The commit's config: %environment (each `$VAR` filled in from the base image's
    environment and the lines before, as Docker's ENV does: a commit would keep `$PATH`
    as text), the translation's LABEL and ENTRYPOINT; without a runscript, the base
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
    if not any(line.startswith("ENTRYPOINT ") for line in changes):
        changes.append(f"ENTRYPOINT {json.dumps(config.get('Entrypoint') or [])}")
        changes.append(f"CMD {json.dumps(config.get('Cmd') or [])}")
    else:
        changes.append("CMD []")
    return changes


def _network_hint(network: str) -> str:
    if network != "none":
        return ""
    return ("\n(the build had no network: --network none. A build that downloads the real "
            "base, game or packages needs --network default)")


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


def docker_test(tag: str, smoke: Sequence[str] = DEMO_ARGS) -> str:
    """%test (as Apptainer runs it: a plain /bin/sh script), then a short run inside."""
    report = docker_run(tag, [f"{SCRIPT_DIR}/test"], entrypoint=["/bin/sh"])
    report += docker_run(tag, smoke)
    return report


def docker_content(tag: str) -> list[str]:
    """The listing as an unprivileged user sees it, as under `apptainer exec` on a cluster
    (files only root may read are listed as unreadable in both)."""
    out = docker_run(tag, ["-m", "train.images.content", "/"], entrypoint=["python"],
                     user="65534:65534")
    return out.splitlines()


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


def apptainer_build(d: DefFile, root: Path, sif: Path, build_args: Mapping[str, str],
                    fakeroot: bool, show: Callable[[str], None] | None = None,
                    timeout: float = 7200) -> BuildResult:
    """`apptainer build` run from the repository root, where %files sources resolve; its
    output is read as it comes (progress lines shown, downloads kept for the record)."""
    check_inputs(d, build_args, root)
    _need_apptainer()
    argv = ["apptainer", "build", "--force"]
    if fakeroot:
        argv.append("--fakeroot")
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    argv += [str(sif.resolve()), str(d.path.resolve())]
    build_log = BuildLog() if show is None else BuildLog(show=show)
    code = _stream(argv, root, build_log.feed, timeout)
    if code != 0:
        raise ImageError(f"apptainer build of {d.name} exited with {code}:\n"
                         + "\n".join(build_log.tail))
    args = d.resolve_arguments(build_args)
    digest = "sha256:" + sha256_file(sif)
    result = BuildResult(str(sif), digest, build_log.downloads, args,
                         sif.with_suffix(".build.json"))
    header = d.header["from"]
    write_record(d, root, result, "apptainer", d.substitute(header[1], args, header[0]))
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
