"""`train image new`: a definition that builds on one of our images and adds the user's own
dependencies, with a hash-pinned lock of only what it adds.

The requirements (derive_reqs) are resolved by pip for the image's Python, every pin of the
base image's locks a constraint: nothing of the base (torch, CUDA's wheels, NCCL, numpy)
can change. What the resolution picks that the base already pins is
dropped; the rest, with the sha256 of the wheel pip chose, is the lock. The markers of
the dependencies' metadata pip evaluates for the Python that runs it, not the image's.
Everything is checked before anything is written (usage errors, exit 2); a file it would
change is kept first as a numbered copy (NAME.def.1, .2, ...).

Written (default folder `./containers-NAME/`, where %files sources resolve from its parent,
as `containers/` resolves from the clone):
    NAME.def                the definition (`Bootstrap: localimage`, From: {{ BASE_SIF }})
    requirements/NAME.txt   the lock (`train image lint` reads locks from requirements/)
    wheels/README           a folder whose wheels the build installs offline when present
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.common.errors import UsageError
from train.common.safewrite import keep_copy, write_atomic
from train.images.defs import DefError, parse
from train.images.derive_reqs import (
    Request,
    Target,
    allows,
    canonical,
    editable_requirements,
    image_target,
    packaging,
    pip_resolve,
    requirement_lines,
    select,
    sha256_of,
)
from train.images.lint import lock_entries

BASES = ("base", "sc2", "navsim")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
PIP_INDEX = "https://pypi.org/simple"


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
    target: Target
    dropped: list[Request] = field(default_factory=list)  # markers false for the image
    duplicates: int = 0  # requirement lines that repeated an earlier one
    kept: list[Path] = field(default_factory=list)  # copies of files it replaced
    unchanged: list[Path] = field(default_factory=list)  # files already as written


def read_lock(path: Path) -> dict[str, Pin]:
    """`name==version` and its `--hash=sha256:` lines of a hash-pinned lock."""
    pins: dict[str, Pin] = {}
    for requirement, hashes in lock_entries(path):
        name, _, version = requirement.partition("==")
        key = canonical(name.split("[")[0].strip())
        pins[key] = Pin(key, version.split(";")[0].strip(),
                        tuple(h.removeprefix("sha256:") for h in hashes), path.name)
    return pins


def base_locks(containers: Path, base: str) -> tuple[list[Path], Target]:
    """The locks an image of ours installs (base.def's default BASE_LOCK, and for sc2 and
    navsim their own lock on top), and the image's Python (from base.def's BASE_IMAGE)."""
    if base not in BASES:
        raise UsageError(f"--from: {base!r} is not one of {', '.join(BASES)}")
    try:
        arguments = parse(containers / "base.def").arguments()
    except DefError as exc:
        raise UsageError(f"--from: cannot read {containers / 'base.def'}: {exc}") from None
    names = [arguments.get("BASE_LOCK", "")] + ([] if base == "base" else [f"{base}.txt"])
    paths = [containers / "requirements" / n for n in names]
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--from {base}: its lock {path} does not exist")
    return paths, image_target(arguments.get("BASE_IMAGE", ""))


def check_against_base(requests: Sequence[Request], base: dict[str, Pin]) -> None:
    """A requirement on a package the base pins must allow the base's version."""
    _, vermod = packaging()
    for r in requests:
        pin = base.get(r.name)
        if pin is not None and not allows(r, pin.version, vermod):
            raise UsageError(f"--requirements {r.where}: {r.text!r} conflicts with the base "
                             f"image's {pin.name}=={pin.version} ({pin.source}); the base's "
                             "packages (torch, CUDA's and NCCL's wheels, numpy...) stay as "
                             "they are: drop the pin or allow that version")


def check_hashes(requests: Sequence[Request], added: Sequence[Pin], target: Target) -> None:
    """The wheel pip chose for a requirement given with --hash must be one of them."""
    chosen = {p.name: p for p in added}
    for r in requests:
        pin = chosen.get(r.name)
        if r.hashes and pin is not None and not set(pin.hashes) & set(r.hashes):
            raise UsageError(f"--requirements {r.where}: pip chose {pin.name}=={pin.version} "
                             f"(sha256 {pin.hashes[0]}), which is none of the "
                             f"{len(r.hashes)} --hash values given for {r.text!r}; "
                             "regenerate the hashes (pip-compile --generate-hashes) for "
                             f"the image ({target.describe()})")


def lock_text(name: str, base: str, locks: Sequence[Path], added: Sequence[Pin],
              target: Target) -> str:
    head = [f"# {name}: what it adds to the {base} image (resolved against "
            f"{', '.join(p.name for p in locks)}; written by `train image new`)",
            f"# {target.describe()}, wheels only"]
    body = [" \\\n    ".join([f"{p.name}=={p.version}", *(f"--hash=sha256:{h}" for h in p.hashes)])
            for p in added]
    return "\n".join(head + body) + "\n"


# the definition `image new` writes; {{{{ NAME }}}} is an Apptainer placeholder
_DEFINITION = """\
Bootstrap: localimage
From: {{{{ BASE_SIF }}}}

%arguments
    BASE_SIF={base}.sif
    PIP_INDEX={index}

%files
{files}
%post
    export SOURCE_DATE_EPOCH=315532800 PYTHONHASHSEED=0
{post}    rm -rf /opt/train/wheels

%environment
{environment}
%runscript
    exec train "$@"

%test
    set -e
    python -c "import torch, train"
{show}
%labels
    org.train.image {name}
    org.train.from {base}
    org.train.lock {name}.txt

%help
    The {base} image plus what requirements/{name}.txt pins (written by `train image new`).
    Requires Apptainer >= 1.2.0. Build from the folder above this one:
      apptainer build --build-arg BASE_SIF={base}.sif {name}.sif {folder}/{name}.def
"""
_LOCK_POST = """\
    # offline from the wheels folder when wheels were put there, else the index
    if ls /opt/train/wheels/*.whl >/dev/null 2>&1; then
        source_args="--no-index --find-links /opt/train/wheels"
    else
        source_args="--index-url {{{{ PIP_INDEX }}}}"
    fi
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check $source_args \\
        --require-hashes --no-deps -r /opt/train/requirements/{name}.txt
"""
_EDITABLE_POST = """\
    # the local project, editable: bind a newer checkout over /opt/src/{name} at run time
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --no-deps \\
        --no-build-isolation -e /opt/src/{name}
"""


def definition_text(name: str, base: str, folder: str, environment: str,
                    lock_nonempty: bool, editable: str | None,
                    top_level: Sequence[str]) -> str:
    files = [f"{folder}/wheels /opt/train/wheels"]
    if lock_nonempty:
        files.insert(0, f"{folder}/requirements/{name}.txt /opt/train/requirements/{name}.txt")
    if editable is not None:
        files.append(f"{editable} /opt/src/{name}")
    post = ((_LOCK_POST if lock_nonempty else "")
            + (_EDITABLE_POST if editable is not None else "")).format(name=name)
    show = " ".join(top_level)
    return _DEFINITION.format(
        base=base, index=PIP_INDEX, name=name, folder=folder, post=post,
        files="".join(f"    {entry}\n" for entry in files),
        environment="".join(f"    {line.strip()}\n" for line in environment.splitlines()
                            if line.strip()),
        show=f"    python -m pip show --disable-pip-version-check {show} >/dev/null\n"
        if show else "")


def _editable_project(editable: Path, folder: Path) -> tuple[str, list[tuple[str, str]]]:
    """A local project for --editable: its path from the folder above `folder` (where
    %files sources resolve), and its build requirements and dependencies as
    (requirement, where) pairs."""
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
    build, deps = editable_requirements(project)
    where = f"{project.name}/pyproject.toml"
    return editable_rel, ([(b, f"{where} [build-system] requires") for b in build]
                          + [(d, f"{where} [project] dependencies") for d in deps])


def _added_pins(resolved: Sequence[dict[str, Any]], pins: dict[str, Pin]) -> list[Pin]:
    """What pip's resolution adds to the base's pins, by name, each with its wheel's sum."""
    added = []
    for item in resolved:
        meta = item.get("metadata", {})
        meta = meta if isinstance(meta, dict) else {}
        key, version = canonical(str(meta.get("name", ""))), str(meta.get("version", ""))
        have = pins.get(key)
        if have is not None:
            if have.version != version:  # the constraints make this pip's bug, not ours
                raise UsageError(f"--requirements: pip chose {key}=={version} over the "
                                 f"base's {have.version}")
            continue
        added.append(Pin(key, version, (sha256_of(item),), ""))
    return sorted(added, key=lambda p: p.name)


def check_out(folder: Path, name: str) -> None:
    """`--out` (or the default folder) must be, or be creatable as, a folder whose
    requirements/, wheels/ and NAME.def are of the right kinds: checked before resolving."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "is" if existing == folder else f"is inside {existing}, which is"
        raise UsageError(f"--out: {folder} {what} a file, not a folder; name a folder "
                         f"(it is made when missing; default ./containers-{name}/)")
    for sub, kind in (("requirements", "folder"), ("wheels", "folder"),
                      (f"{name}.def", "file"), (f"requirements/{name}.txt", "file")):
        path = folder / sub
        # a FIFO or device would hang the read of what is there; a dangling link at a
        # folder's name stops its mkdir (one at a file's name is replaced)
        there = path.exists() if kind == "file" else os.path.lexists(path)
        if there and not (path.is_file() if kind == "file" else path.is_dir()):
            raise UsageError(f"--out: {path} is in the way: a {kind} of that name is "
                             "written there")


def _write_folder(folder: Path, name: str, lock: str, definition: str
                  ) -> tuple[list[Path], list[Path]]:
    """The derived folder (lock first, then the definition): the copies kept of files it
    replaced, and the files that were as written already."""
    try:
        (folder / "requirements").mkdir(parents=True, exist_ok=True)
        (folder / "wheels").mkdir(exist_ok=True)
        readme = folder / "wheels" / "README"
        # made only where nothing is at its name: "x" (O_EXCL) never follows a link, even
        # a dangling one, which would create its target elsewhere
        with contextlib.suppress(FileExistsError), open(readme, "x", encoding="utf-8") as fh:
            fh.write("Wheels put here (e.g. `pip download --no-deps -r "
                     f"../requirements/{name}.txt -d .`) are installed offline by the "
                     "build.\n")
        kept, unchanged = [], []
        for path, text in ((folder / "requirements" / f"{name}.txt", lock),
                           (folder / f"{name}.def", definition)):
            data = text.encode("utf-8")
            if path.exists():  # kept as PATH.N first, unless it holds this text already
                if path.read_bytes() == data:
                    unchanged.append(path)
                    continue
                kept.append(keep_copy(path))
            write_atomic(path, data)
    except OSError as exc:
        raise UsageError(f"--out: cannot write {exc.filename or folder}: "
                         f"{exc.strerror or exc}") from None
    return kept, unchanged


def derive(name: str, base: str, requirements: Path, containers: Path,
           out: Path | None = None, editable: Path | None = None,
           index_args: Sequence[str] = ("--index-url", PIP_INDEX)) -> Derived:
    """Resolve, check and write NAME.def and requirements/NAME.txt (module docstring)."""
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"image new: NAME {name[:80]!r} must be lower-case letters, digits, "
                         "'-' or '_' (a docker tag and a file name)")
    if name in BASES or (containers / "requirements" / f"{name}.txt").exists():
        raise UsageError(f"image new: NAME {name!r} is one of our images or locks; pick "
                         "another")
    locks, target = base_locks(containers, base)
    pins = {name: pin for lock in locks for name, pin in read_lock(lock).items()}
    lines = requirement_lines(requirements)
    asked = select(lines, target)  # the file's own: what %test shows
    folder = (out or Path.cwd() / f"containers-{name}").resolve()
    check_out(folder, name)
    editable_rel = None
    if editable is not None:
        editable_rel, extra = _editable_project(editable, folder)
        lines = lines + extra
    wanted = select(lines, target) if editable is not None else asked
    check_against_base(wanted.kept, pins)
    if not wanted.kept:
        left_out = "; ".join(f"{r.where} {r.text!r}" for r in wanted.dropped)[:400]
        raise UsageError(f"--requirements: {requirements} lists nothing to add"
                         + (f" for the image ({target.describe()}; left out by their "
                            f"markers: {left_out})" if left_out else ""))
    resolved = pip_resolve([r.for_pip for r in wanted.kept],
                           [f"{p.name}=={p.version}" for p in pins.values()],
                           target, index_args)
    added = _added_pins(resolved, pins)
    check_hashes(wanted.kept, added, target)
    if not added and editable is None:
        raise UsageError(f"--requirements: everything {requirements.name} lists is in the "
                         f"{base} image already; nothing to derive")
    environment = parse(containers / f"{base}.def").sections["environment"].text
    definition = definition_text(name, base, folder.name, environment, bool(added),
                                 editable_rel, [r.req.name for r in asked.kept])
    # write only now, every check passed
    kept, unchanged = _write_folder(folder, name, lock_text(name, base, locks, added, target),
                                    definition)
    return Derived(folder / f"{name}.def", folder / "requirements" / f"{name}.txt", added,
                   target, wanted.dropped, wanted.duplicates, kept, unchanged)
