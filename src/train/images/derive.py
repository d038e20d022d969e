"""`train image new`: a definition that builds on one of our images and adds the user's own
dependencies, with a hash-pinned lock of only what it adds.

The requirements are resolved by pip (`pip install --dry-run --report`) for the images'
CPython 3.12 on manylinux x86_64, wheels only, with every pin of the base image's locks as a
constraint: nothing of the base (torch, CUDA's wheels, NCCL, numpy) can change. What the
resolution picks that the base already pins is dropped; the rest, with the sha256 of the wheel
pip chose, is the lock. Everything is checked before anything is written: a requirement that
conflicts with a base pin, one that cannot be hash-pinned (a URL, a VCS or a local path), one
with no wheel for the image's Python, and a resolution pip refuses are usage errors (exit 2).

Written (default folder `./containers-NAME/`, where %files sources resolve from its parent,
as `containers/` resolves from the clone):
    NAME.def                the definition (`Bootstrap: localimage`, From: {{ BASE_SIF }})
    requirements/NAME.txt   the lock (`train image lint` reads locks from requirements/)
    wheels/README           a folder whose wheels the build installs offline when present
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.common.errors import UsageError
from train.images.defs import DefError, parse

PYTHON_VERSION = "3.12"  # the images' Python (Ubuntu 24.04's)
PLATFORM = "manylinux_2_28_x86_64"
BASES = ("base", "sc2", "navsim")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
PIP_INDEX = "https://pypi.org/simple"
_URL_RE = re.compile(r"^[a-z][a-z0-9+.-]*://|^(git|hg|svn|bzr)\+", re.IGNORECASE)
_NAME_NORM = re.compile(r"[-_.]+")


def canonical(name: str) -> str:
    return _NAME_NORM.sub("-", name).lower()


def _packaging() -> Any:
    """packaging's requirements and versions: the package where installed, else pip's own
    copy (pip is what resolves here, so it is always present)."""
    for module in ("packaging", "pip._vendor.packaging"):
        try:
            return (importlib.import_module(f"{module}.requirements"),
                    importlib.import_module(f"{module}.version"))
        except ImportError:
            continue
    raise UsageError("image new: needs pip (python -m pip) in the Python that runs train")


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    hashes: tuple[str, ...]
    source: str  # the lock file it came from


@dataclass(frozen=True)
class Derived:
    definition: Path
    lock: Path
    added: list[Pin]


def read_lock(path: Path) -> dict[str, Pin]:
    """`name==version` and its `--hash=sha256:` lines of a hash-pinned lock."""
    pins: dict[str, Pin] = {}
    entry: list[str] = []

    def close() -> None:
        if entry:
            name, _, version = entry[0].partition("==")
            key = canonical(name.split("[")[0].strip())
            pins[key] = Pin(key, version.split(";")[0].strip(),
                            tuple(h.removeprefix("--hash=sha256:") for h in entry[1:]),
                            path.name)

    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip().rstrip("\\").strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            entry.append(line)
        elif not line.startswith("-"):
            close()
            entry = [line]
    close()
    return pins


def base_locks(containers: Path, base: str) -> list[Path]:
    """The locks an image of ours installs: base.def's default BASE_LOCK, and for sc2 and
    navsim their own lock on top."""
    if base not in BASES:
        raise UsageError(f"--from: {base!r} is not one of {', '.join(BASES)}")
    try:
        base_lock = parse(containers / "base.def").arguments().get("BASE_LOCK", "")
    except DefError as exc:
        raise UsageError(f"--from: cannot read {containers / 'base.def'}: {exc}") from None
    names = [base_lock] + ([] if base == "base" else [f"{base}.txt"])
    paths = [containers / "requirements" / n for n in names]
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--from {base}: its lock {path} does not exist")
    return paths


@dataclass(frozen=True)
class Request:
    text: str  # the line as written
    where: str  # FILE:LINE
    name: str  # canonical
    req: Any  # packaging's Requirement


def read_requirements(path: Path) -> list[Request]:
    """The requirements file's lines; a URL, VCS or local path (nothing pip can pin by
    hash from an index) and pip options are refused."""
    reqmod, _ = _packaging()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--requirements: cannot read {path}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path.name}:{number}"
        if line.startswith("-"):
            raise UsageError(f"--requirements {where}: {line[:80]!r}: pip options are not "
                             "taken here; list one requirement a line (name and version "
                             "specifier); a local project goes in with --editable DIR")
        if _unpinnable(line):
            raise UsageError(f"--requirements {where}: {line[:80]!r} is a URL, VCS or local "
                             "path: it cannot be hash-pinned from the index. Name a released "
                             "version (name==version), or give a local project with "
                             "--editable DIR")
        try:
            req = reqmod.Requirement(line)
        except reqmod.InvalidRequirement as exc:
            raise UsageError(f"--requirements {where}: {line[:80]!r} is not a requirement: "
                             f"{exc}") from None
        if req.url:
            raise UsageError(f"--requirements {where}: {line[:80]!r} is a direct URL: it "
                             "cannot be hash-pinned from the index")
        out.append(Request(line, where, canonical(req.name), req))
    return out


def _unpinnable(line: str) -> bool:
    """A URL, a VCS reference, a direct reference (`name @ URL`) or a local path."""
    spec = line.split(";", maxsplit=1)[0]
    return bool(_URL_RE.search(spec)) or "@" in spec or "/" in spec or "\\" in spec \
        or spec.startswith((".", "~")) or spec.endswith((".whl", ".tar.gz", ".zip"))


def check_against_base(requests: Sequence[Request], base: dict[str, Pin]) -> None:
    """A requirement on a package the base pins must allow the base's version."""
    _, vermod = _packaging()
    for r in requests:
        pin = base.get(r.name)
        if pin is None:
            continue
        if not r.req.specifier.contains(vermod.Version(pin.version), prereleases=True):
            raise UsageError(f"--requirements {r.where}: {r.text!r} conflicts with the base "
                             f"image's {pin.name}=={pin.version} ({pin.source}); the base's "
                             "packages (torch, CUDA's and NCCL's wheels, numpy...) stay as "
                             "they are: drop the pin or allow that version")


def _toml() -> Any:
    """tomllib (Python >= 3.11), else pip's own copy of tomli."""
    for module in ("tomllib", "pip._vendor.tomli"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    raise UsageError("--editable: reading pyproject.toml needs Python >= 3.11 or pip")


def _editable_requirements(project: Path) -> tuple[list[str], list[str]]:
    """A local project's build requirements and (static) dependencies, from its
    pyproject.toml; setuptools when it has none."""
    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        return ["setuptools>=40.8.0", "wheel"], []
    toml = _toml()
    try:
        data = toml.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, toml.TOMLDecodeError) as exc:
        raise UsageError(f"--editable: cannot read {pyproject}: {exc}") from None
    build = data.get("build-system", {}).get("requires", ["setuptools>=40.8.0", "wheel"])
    project_table = data.get("project", {})
    deps = [] if "dependencies" in project_table.get("dynamic", []) \
        else list(project_table.get("dependencies", []))
    return [str(b) for b in build], [str(d) for d in deps]


def pip_resolve(requirements: Sequence[str], constraints: dict[str, Pin],
                index_args: Sequence[str]) -> list[dict[str, Any]]:
    """pip's dry-run report ("install" items) for the image's Python and platform, wheels
    only, every base pin a constraint. pip's refusal is a usage error quoting pip."""
    with tempfile.TemporaryDirectory(prefix="train-derive-") as tmp:
        req_file = Path(tmp) / "requirements.txt"
        req_file.write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
        con_file = Path(tmp) / "constraints.txt"
        con_file.write_text("".join(f"{p.name}=={p.version}\n" for p in constraints.values()),
                            encoding="utf-8")
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run",
                   "--disable-pip-version-check", "--ignore-installed",
                   "--only-binary=:all:", "--python-version", PYTHON_VERSION,
                   "--implementation", "cp", "--abi", "cp" + PYTHON_VERSION.replace(".", ""),
                   "--platform", PLATFORM, "--report", str(report),
                   # (pip before 24 takes --platform only with --target; nothing is
                   # written there in a dry run)
                   "--target", str(Path(tmp) / "target"),
                   "-c", str(con_file), "-r", str(req_file), *index_args]
        env = {**os.environ, "PIP_REQUIRE_VIRTUALENV": "0", "PIP_CONSTRAINT": "",
               "PIP_NO_INPUT": "1"}
        if "--no-index" in index_args:  # the folder given and nothing else: no pip config
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = os.devnull
        proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            text = re.sub(re.escape(f"-r {req_file}") + r" \(line (\d+)\)",
                          lambda m: repr(requirements[int(m.group(1)) - 1]),
                          proc.stderr + proc.stdout)
            raise UsageError(_pip_refusal(text))
        data = json.loads(report.read_text(encoding="utf-8"))
    return list(data.get("install", []))


def _pip_refusal(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    missing = [m.group(1) for ln in lines
               if (m := re.search(r"No matching distribution found for (\S+)", ln))]
    if missing:
        return (f"--requirements: {', '.join(missing)}: no wheel for the image's Python "
                f"(CPython {PYTHON_VERSION}, {PLATFORM}) that fits the base's pins; pick a "
                "version that publishes one (pip: "
                + "; ".join(ln for ln in lines if ln.startswith("ERROR"))[:500] + ")")
    conflict = [ln for ln in lines if ln.startswith(("The user requested", "ERROR"))
                or " depends on " in ln]
    if conflict:
        return ("--requirements: pip cannot resolve them against the base image's pins "
                "(the base's versions are constraints): " + "; ".join(conflict)[:600])
    return "--requirements: pip refused them: " + "; ".join(lines[-5:])[:600]


def _sha256_of(item: dict[str, Any]) -> str:
    info = item.get("download_info", {})
    archive = info.get("archive_info", {})
    found = archive.get("hashes", {}).get("sha256")
    if not found and str(archive.get("hash", "")).startswith("sha256="):
        found = archive["hash"].split("=", 1)[1]
    if found:
        return str(found)
    url = str(info.get("url", ""))
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        from train.images.build import sha256_file

        return sha256_file(Path(urllib.request.url2pathname(parsed.path)))
    raise UsageError(f"--requirements: the index gave no sha256 for {url[:120]}: it cannot "
                     "be hash-pinned")


def lock_text(name: str, base: str, locks: Sequence[Path], added: Sequence[Pin]) -> str:
    head = [f"# {name}: what it adds to the {base} image (resolved against "
            f"{', '.join(p.name for p in locks)}; written by `train image new`)",
            f"# CPython {PYTHON_VERSION}, {PLATFORM}, wheels only"]
    body = []
    for pin in added:
        body.append(f"{pin.name}=={pin.version} \\")
        body += [f"    --hash=sha256:{h}" + (" \\" if i < len(pin.hashes) - 1 else "")
                 for i, h in enumerate(pin.hashes)]
    return "\n".join(head + body) + "\n"


def _files_lines(name: str, folder: str, lock_nonempty: bool,
                 editable: str | None) -> list[str]:
    files = [f"    {folder}/wheels /opt/train/wheels"]
    if lock_nonempty:
        files.insert(0, f"    {folder}/requirements/{name}.txt "
                        f"/opt/train/requirements/{name}.txt")
    if editable is not None:
        files.append(f"    {editable} /opt/src/{name}")
    return files


def _post_lines(name: str, lock_nonempty: bool, editable: str | None) -> list[str]:
    post = ["    export SOURCE_DATE_EPOCH=315532800 PYTHONHASHSEED=0"]
    if lock_nonempty:
        post += [
            "    # offline from the wheels folder when wheels were put there, else the index",
            "    if ls /opt/train/wheels/*.whl >/dev/null 2>&1; then",
            '        source_args="--no-index --find-links /opt/train/wheels"',
            "    else",
            '        source_args="--index-url {{ PIP_INDEX }}"',
            "    fi",
            "    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check "
            "$source_args \\",
            f"        --require-hashes --no-deps -r /opt/train/requirements/{name}.txt"]
    if editable is not None:
        post += [
            "    # the local project, editable: bind a newer checkout over /opt/src/"
            f"{name} at run time",
            "    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check "
            "--no-index --no-deps \\",
            f"        --no-build-isolation -e /opt/src/{name}"]
    post.append("    rm -rf /opt/train/wheels")
    return post


def _test_lines(top_level: Sequence[str]) -> list[str]:
    show = " ".join(top_level)
    test = ["    set -e", '    python -c "import torch, train"']
    if show:
        test.append(f"    python -m pip show --disable-pip-version-check {show} >/dev/null")
    return test


def definition_text(name: str, base: str, folder: str, environment: str,
                    lock_nonempty: bool, editable: str | None,
                    top_level: Sequence[str]) -> str:
    return "\n".join([
        "Bootstrap: localimage",
        "From: {{ BASE_SIF }}",
        "",
        "%arguments",
        f"    BASE_SIF={base}.sif",
        f"    PIP_INDEX={PIP_INDEX}",
        "",
        "%files",
        *_files_lines(name, folder, lock_nonempty, editable),
        "",
        "%post",
        *_post_lines(name, lock_nonempty, editable),
        "",
        "%environment",
        *[f"    {line.strip()}" for line in environment.splitlines() if line.strip()],
        "",
        "%runscript",
        '    exec train "$@"',
        "",
        "%test",
        *_test_lines(top_level),
        "",
        "%labels",
        f"    org.train.image {name}",
        f"    org.train.from {base}",
        f"    org.train.lock {name}.txt",
        "",
        "%help",
        f"    The {base} image plus what requirements/{name}.txt pins (written by `train "
        "image new`).",
        "    Requires Apptainer >= 1.2.0. Build from the folder above this one:",
        f"      apptainer build --build-arg BASE_SIF={base}.sif {name}.sif "
        f"{folder}/{name}.def",
        "",
    ])


def _check_name(name: str, containers: Path) -> None:
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"image new: NAME {name[:80]!r} must be lower-case letters, digits, "
                         "'-' or '_' (a docker tag and a file name)")
    if name in BASES or (containers / "requirements" / f"{name}.txt").exists():
        raise UsageError(f"image new: NAME {name!r} is one of our images or locks; pick "
                         "another")


def _editable_project(editable: Path, folder: Path, pins: dict[str, Pin]
                      ) -> tuple[str, list[Request]]:
    """A local project for --editable: its path from the folder above `folder` (where
    %files sources resolve), and its build requirements and dependencies, checked."""
    root = folder.parent
    project = editable.resolve()
    if not project.is_dir():
        raise UsageError(f"--editable: {editable} is not a folder")
    try:
        editable_rel = project.relative_to(root).as_posix()
    except ValueError:
        raise UsageError(f"--editable: {project} must be inside {root} (the folder "
                         f"above {folder.name}/, where %files sources resolve); "
                         "or choose --out inside the project's parent") from None
    build, deps = _editable_requirements(project)
    extra = read_requirements_lines(build + deps, f"{project.name}/pyproject.toml")
    check_against_base(extra, pins)
    return editable_rel, extra


def _added_pins(resolved: Sequence[dict[str, Any]], pins: dict[str, Pin]) -> list[Pin]:
    """What pip's resolution adds to the base's pins, by name, each with its wheel's sum."""
    added = []
    for item in resolved:
        meta = item.get("metadata", {})
        key, version = canonical(str(meta.get("name", ""))), str(meta.get("version", ""))
        have = pins.get(key)
        if have is not None:
            if have.version != version:  # the constraints make this pip's bug, not ours
                raise UsageError(f"--requirements: pip chose {key}=={version} over the "
                                 f"base's {have.version}")
            continue
        added.append(Pin(key, version, (_sha256_of(item),), ""))
    added.sort(key=lambda p: p.name)
    return added


def _write_folder(folder: Path, name: str, lock: str, definition: str) -> tuple[Path, Path]:
    """The derived folder, each file whole (temp file, then rename): the definition's path
    and the lock's."""
    (folder / "requirements").mkdir(parents=True, exist_ok=True)
    (folder / "wheels").mkdir(exist_ok=True)
    readme = folder / "wheels" / "README"
    if not readme.exists():
        readme.write_text("Wheels put here (e.g. `pip download --no-deps -r "
                          f"../requirements/{name}.txt -d .`) are installed offline by the "
                          "build.\n", encoding="utf-8")
    lock_path = folder / "requirements" / f"{name}.txt"
    def_path = folder / f"{name}.def"
    _write(lock_path, lock)
    _write(def_path, definition)
    return def_path, lock_path


def derive(name: str, base: str, requirements: Path, containers: Path,
           out: Path | None = None, editable: Path | None = None,
           index_args: Sequence[str] = ("--index-url", PIP_INDEX)) -> Derived:
    """Resolve, check and write NAME.def and requirements/NAME.txt (nothing is written when
    any check fails)."""
    _check_name(name, containers)
    locks = base_locks(containers, base)
    pins: dict[str, Pin] = {}
    for lock in locks:
        pins.update(read_lock(lock))
    requests = read_requirements(requirements)
    check_against_base(requests, pins)
    folder = (out or Path.cwd() / f"containers-{name}").resolve()
    wanted = [r.text for r in requests]
    editable_rel = None
    if editable is not None:
        editable_rel, extra = _editable_project(editable, folder, pins)
        wanted += [r.text for r in extra]
    if not wanted:
        raise UsageError(f"--requirements: {requirements} lists nothing to add")
    added = _added_pins(pip_resolve(wanted, pins, index_args), pins)
    if not added and editable is None:
        raise UsageError(f"--requirements: everything {requirements.name} lists is in the "
                         f"{base} image already; nothing to derive")
    environment = parse(containers / f"{base}.def").sections["environment"].text
    definition = definition_text(name, base, folder.name, environment, bool(added),
                                 editable_rel, [r.req.name for r in requests])
    # write only now, every check passed
    def_path, lock_path = _write_folder(folder, name, lock_text(name, base, locks, added),
                                        definition)
    return Derived(def_path, lock_path, added)


def read_requirements_lines(lines: Sequence[str], where: str) -> list[Request]:
    with tempfile.TemporaryDirectory(prefix="train-derive-") as tmp:
        path = Path(tmp) / where.replace("/", "_")
        path.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")
        return read_requirements(path)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
