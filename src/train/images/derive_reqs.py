"""`train image new`'s inputs: the requirements file and an --editable project's
pyproject.toml, read, validated and checked before anything is resolved.

A requirements file is read as pip reads one: `\\` continues a line, ` #` starts a comment,
and a requirement's own `--hash=sha256:...` options stay with it (a pip-compile
`--generate-hashes` file): the wheel pip picks for it must be one of them. Environment
markers are evaluated for the image (its CPython on Linux x86_64), not for the Python that
runs train; a requirement whose marker is false there is left out and named. Identical
requirements count once; two pins of one name that exclude each other are refused.
"""

from __future__ import annotations

import importlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.common._proc import printable
from train.common.errors import UsageError
from train.images.derive_pip import Target

MAX_REQUIREMENTS_BYTES = 8 << 20
MAX_PYPROJECT_BYTES = 1 << 20
DEFAULT_BUILD = ["setuptools>=40.8.0", "wheel"]
_URL_RE = re.compile(r"^[a-z][a-z0-9+.-]*://|^(git|hg|svn|bzr)\+", re.IGNORECASE)
_NAME_NORM = re.compile(r"[-_.]+")
_COMMENT_RE = re.compile(r"(^|\s+)#.*$")
_HASH_RE = re.compile(r"--hash[= ]sha256:([0-9a-fA-F]{64})$")


def canonical(name: str) -> str:
    return _NAME_NORM.sub("-", name).lower()


def _first_module(names: Sequence[str], missing: str) -> Any:
    """The first of `names` that imports; none: a usage error saying `missing`."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise UsageError(missing)


def packaging() -> Any:
    """packaging's requirements and versions: the package where installed, else pip's own
    copy (pip is what resolves here, so it is always present)."""
    requirements = _first_module(("packaging.requirements",
                                  "pip._vendor.packaging.requirements"),
                                 "image new: needs pip (python -m pip) in the Python that "
                                 "runs train")
    return requirements, importlib.import_module(f"{requirements.__package__}.version")


@dataclass(frozen=True)
class Request:
    text: str  # the requirement as written (its hash options apart)
    where: str  # FILE:LINE
    name: str  # canonical
    req: Any  # packaging's Requirement
    hashes: tuple[str, ...] = ()  # sha256s the file allows (lower-case hex)

    @property
    def for_pip(self) -> str:
        """The requirement without its marker (evaluated already) or hashes."""
        extras = f"[{','.join(sorted(self.req.extras))}]" if self.req.extras else ""
        return f"{self.req.name}{extras}{self.req.specifier}"

    @property
    def key(self) -> str:
        """What makes two requirements the same: name (canonical), extras, specifier."""
        extras = ",".join(sorted(canonical(e) for e in self.req.extras))
        return f"{self.name}[{extras}]{self.req.specifier}"


@dataclass
class Requests:
    """What a file asks for: kept (deduplicated, markers true for the image), the lines
    left out for the image and how many repeated an earlier one."""

    kept: list[Request] = field(default_factory=list)
    dropped: list[Request] = field(default_factory=list)
    duplicates: int = 0


def read_bounded(path: Path, flag: str, cap: int) -> str:
    """A regular file's text, at most `cap` bytes of UTF-8; anything else is exit 2."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{flag}: {path} is not a regular file")
        if info.st_size > cap:
            raise UsageError(f"{flag}: {path} is {info.st_size} bytes; at most {cap} are read")
        return path.read_bytes()[:cap + 1].decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: cannot read {path}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) as pip joins them: a line ending in `\\` continues on the
    next; comments are cut."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        is_comment = raw.lstrip().startswith("#")
        if raw.endswith("\\") and not is_comment:
            if not pending:
                start = number
            pending.append(raw[:-1])
            continue
        line = _COMMENT_RE.sub("", raw)
        first = start if pending else number
        if pending:
            line = " ".join([*pending, line])
            pending = []
        if line.strip():
            yield first, " ".join(line.split())
    if pending and " ".join(pending).strip():
        yield start, " ".join(" ".join(pending).split())


def _split_hashes(line: str, where: str) -> tuple[str, tuple[str, ...]]:
    """A line's requirement and its --hash options (pip's per-requirement options start at
    the first word that starts with '-')."""
    words = line.split(" ")
    first = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
    spec, options = " ".join(words[:first]), " ".join(words[first:])
    hashes = []
    for option in re.split(r" (?=--)", options) if options else []:
        match = _HASH_RE.match(option)
        if match is None:
            raise UsageError(f"--requirements {where}: {option[:80]!r}: of a requirement's "
                             "options only --hash=sha256:HEX (64 hex digits) is taken here")
        hashes.append(match.group(1).lower())
    return spec, tuple(hashes)


def _unpinnable(spec: str) -> bool:
    """A URL, a VCS reference, a direct reference (`name @ URL`) or a local path."""
    spec = spec.split(";", maxsplit=1)[0]
    return bool(_URL_RE.search(spec)) or "@" in spec or "/" in spec or "\\" in spec \
        or spec.startswith((".", "~")) or spec.endswith((".whl", ".tar.gz", ".zip"))


def parse_line(line: str, where: str) -> Request:
    reqmod, _ = packaging()
    if line.startswith("-"):
        raise UsageError(f"--requirements {where}: {line[:80]!r}: pip options are not "
                         "taken here; list one requirement a line (name and version "
                         "specifier, --hash=sha256:... allowed); a local project goes in "
                         "with --editable DIR")
    spec, hashes = _split_hashes(line, where)
    if _unpinnable(spec):
        raise UsageError(f"--requirements {where}: {spec[:80]!r} is a URL, VCS or local "
                         "path: it cannot be hash-pinned from the index. Name a released "
                         "version (name==version), or give a local project with "
                         "--editable DIR")
    try:
        req = reqmod.Requirement(spec)
    except reqmod.InvalidRequirement as exc:
        raise UsageError(f"--requirements {where}: {spec[:80]!r} is not a requirement: "
                         f"{printable(str(exc))[:200]}") from None  # it quotes the line
    if req.url:
        raise UsageError(f"--requirements {where}: {spec[:80]!r} is a direct URL: it "
                         "cannot be hash-pinned from the index")
    return Request(spec, where, canonical(req.name), req, hashes)


def select(lines: Sequence[tuple[str, str]], target: Target) -> Requests:
    """(line, FILE:LINE) pairs as requests for the image: markers evaluated for it,
    duplicates merged (their hashes joined), conflicting pins refused."""
    out = Requests()
    seen: dict[str, int] = {}
    environment = target.marker_environment()
    for line, where in lines:
        request = parse_line(line, where)
        if request.req.marker is not None and not _holds(request, environment):
            out.dropped.append(request)
            continue
        index = seen.get(request.key)
        if index is None:
            seen[request.key] = len(out.kept)
            out.kept.append(request)
            continue
        out.duplicates += 1
        first = out.kept[index]  # either's hashes allowed; none on one: any wheel
        joined = first.hashes + tuple(h for h in request.hashes if h not in first.hashes) \
            if first.hashes and request.hashes else ()
        out.kept[index] = Request(first.text, first.where, first.name, first.req, joined)
    check_pins(out.kept)
    return out


def _holds(request: Request, environment: dict[str, str]) -> bool:
    try:
        return bool(request.req.marker.evaluate(environment))
    except ValueError as exc:  # packaging's UndefinedComparison, InvalidVersion, ...
        raise UsageError(f"--requirements {request.where}: {request.text[:80]!r}: its marker "
                         f"cannot be evaluated: {str(exc)[:200]}") from None


def _exact(request: Request) -> str | None:
    specs = list(request.req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return str(specs[0].version)
    return None


def check_pins(requests: Sequence[Request]) -> None:
    """Two requirements of one name where one pins a version the other excludes."""
    _, vermod = packaging()
    by_name: dict[str, list[Request]] = {}
    for r in requests:
        by_name.setdefault(r.name, []).append(r)
    for group in (g for g in by_name.values() if len(g) > 1):
        for pinned in group:
            version = _exact(pinned)
            if version is None:
                continue
            for other in group:
                if other is not pinned and not allows(other, version, vermod):
                    raise UsageError(f"--requirements: {pinned.where} {pinned.text!r} and "
                                     f"{other.where} {other.text!r} conflict (no version of "
                                     f"{pinned.name} meets both); keep one")


def allows(request: Request, version: str, vermod: Any) -> bool:
    try:
        return bool(request.req.specifier.contains(vermod.Version(version), prereleases=True))
    except vermod.InvalidVersion:
        return _exact(request) == version


def requirement_lines(path: Path) -> list[tuple[str, str]]:
    """The requirements file's logical lines, each with its FILE:LINE."""
    text = read_bounded(path, "--requirements", MAX_REQUIREMENTS_BYTES)
    return [(line, f"{path.name}:{n}") for n, line in logical_lines(text)]


def _strings(value: object, pyproject: Path, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"--editable: {pyproject}: {key} must be a list of strings "
                         f"(PEP 621/518), not {type(value).__name__} {str(value)[:60]!r}")
    return list(value)


def _table(value: object, pyproject: Path, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"--editable: {pyproject}: {key} must be a table, not "
                         f"{type(value).__name__} {str(value)[:60]!r}")
    return value


def editable_requirements(project: Path) -> tuple[list[str], list[str]]:
    """A local project's build requirements and (static) dependencies, from its
    pyproject.toml, each key checked for its type; setuptools when it has none."""
    pyproject = project / "pyproject.toml"
    if not pyproject.exists():
        return list(DEFAULT_BUILD), []
    toml = _first_module(("tomllib", "pip._vendor.tomli"),  # tomllib: Python >= 3.11
                         "--editable: reading pyproject.toml needs Python >= 3.11 or pip")
    text = read_bounded(pyproject, "--editable", MAX_PYPROJECT_BYTES)
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise UsageError(f"--editable: {pyproject} is not TOML: {str(exc)[:200]}") from None
    system = _table(data.get("build-system", {}), pyproject, "[build-system]")
    build = _strings(system.get("requires", DEFAULT_BUILD), pyproject,
                     "[build-system] requires")
    table = _table(data.get("project", {}), pyproject, "[project]")
    dynamic = _strings(table.get("dynamic", []), pyproject, "[project] dynamic")
    deps = _strings(table.get("dependencies", []), pyproject, "[project] dependencies")
    optional = _table(table.get("optional-dependencies", {}), pyproject,
                      "[project] optional-dependencies")
    for extra, listed in optional.items():
        _strings(listed, pyproject, f"[project.optional-dependencies] {extra}")
    return build, [] if "dependencies" in dynamic else deps
