"""`train image new`'s inputs and their resolution: the requirements file and an --editable
project's pyproject.toml, read, validated and checked before anything is resolved; the
image's Python, and pip's dry run for it.

A requirements file is read as pip reads one: `\\` continues a line, ` #` starts a comment,
and a requirement's own `--hash=sha256:...` options stay with it (a pip-compile
`--generate-hashes` file): the wheel pip picks for it must be one of them. Environment
markers are evaluated for the image (its CPython on Linux x86_64), not for the Python that
runs train; a requirement whose marker is false there is left out and named. Identical
requirements count once; two pins of one name that exclude each other are refused.

pip runs as `python -m pip` of the Python that runs train. `--python-version`, `--platform`,
`--abi` and `--implementation` are taken by `pip install` only with `--target` before pip
23.3 ("Can not use any platform or abi specific options unless installing via '--target'"):
the dry run names a target folder it never writes, so the pip a fresh venv brings on Python
3.10-3.12 (23.0.1, 23.2.1) resolves as a newer one does. `--dry-run --report` with report
format 1 needs pip >= 23.0: an older pip is refused first, naming the upgrade.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import stat
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.common import _proc
from train.common.errors import UsageError
from train.common.filehash import file_sha256

MAX_REQUIREMENTS_BYTES = 8 << 20
MAX_PYPROJECT_BYTES = 1 << 20
DEFAULT_BUILD = ["setuptools>=40.8.0", "wheel"]
_URL_RE = re.compile(r"^[a-z][a-z0-9+.-]*://|^(git|hg|svn|bzr)\+", re.IGNORECASE)
_NAME_NORM = re.compile(r"[-_.]+")
_COMMENT_RE = re.compile(r"(^|\s+)#.*$")
_HASH_RE = re.compile(r"--hash[= ]sha256:([0-9a-fA-F]{64})$")
# the oldest manylinux pip installs (manylinux1's glibc 2.5), and the legacy names pip
# gives after the glibc they stand for (packaging.tags' order)
OLDEST_GLIBC_MINOR = 5
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
MIN_PIP = (23, 0)
PIP_TIMEOUT_S = 900.0  # a resolution against the index of many requirements
MAX_REPORT_BYTES = 64 << 20
# the Ubuntu release of base.def's BASE_IMAGE -> its python3 (major.minor, full) and
# glibc's minor version (2.X)
UBUNTU_PYTHON = {"22.04": ("3.10", "3.10.12", 35), "24.04": ("3.12", "3.12.3", 39)}


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
        start = start if pending else number
        if raw.endswith("\\") and not raw.lstrip().startswith("#"):
            pending.append(raw[:-1])
            continue
        words = " ".join([*pending, _COMMENT_RE.sub("", raw)]).split()
        pending = []
        if words:
            yield start, " ".join(words)
    if " ".join(pending).strip():
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
                         f"{_proc.printable(str(exc))[:200]}") from None  # it quotes the line
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


def _typed(value: object, kind: type, pyproject: Path, key: str) -> Any:
    """`value` where it is a `kind` (a list: of strings), else exit 2 naming `key`."""
    if not isinstance(value, kind) or (isinstance(value, list) and not all(
            isinstance(v, str) for v in value)):
        what = "a list of strings (PEP 621/518)" if kind is list else "a table"
        raise UsageError(f"--editable: {pyproject}: {key} must be {what}, not "
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
    system = _typed(data.get("build-system", {}), dict, pyproject, "[build-system]")
    build = _typed(system.get("requires", DEFAULT_BUILD), list, pyproject,
                   "[build-system] requires")
    table = _typed(data.get("project", {}), dict, pyproject, "[project]")
    dynamic = _typed(table.get("dynamic", []), list, pyproject, "[project] dynamic")
    deps = _typed(table.get("dependencies", []), list, pyproject, "[project] dependencies")
    optional = _typed(table.get("optional-dependencies", {}), dict, pyproject,
                      "[project] optional-dependencies")
    for extra, listed in optional.items():
        _typed(listed, list, pyproject, f"[project.optional-dependencies] {extra}")
    return list(build), [] if "dependencies" in dynamic else list(deps)


@dataclass(frozen=True)
class Target:
    """The image's interpreter and platform: what pip resolves for and markers meet."""

    python: str  # major.minor
    full: str  # python_full_version
    glibc_minor: int  # the image's glibc is 2.glibc_minor

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def platforms(self) -> list[str]:
        """Every platform tag pip in the image installs, in pip's order of preference: pip
        given one --platform takes that tag alone, so a wheel tagged only for an older
        glibc (manylinux_2_17/manylinux2014, most compiled packages) would be refused."""
        tags = []
        for minor in range(self.glibc_minor, OLDEST_GLIBC_MINOR - 1, -1):
            tags.append(f"manylinux_2_{minor}_x86_64")
            if minor in _LEGACY_MANYLINUX:
                tags.append(f"{_LEGACY_MANYLINUX[minor]}_x86_64")
        return [*tags, "linux_x86_64"]

    def describe(self) -> str:
        return (f"CPython {self.python} on Linux x86_64, glibc 2.{self.glibc_minor}: "
                f"manylinux_2_{OLDEST_GLIBC_MINOR}..2_{self.glibc_minor} (manylinux1, 2010, "
                "2014) or linux wheels")

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker variables of the image (Linux x86_64, CPython)."""
        return {"implementation_name": "cpython", "implementation_version": self.full,
                "os_name": "posix", "platform_machine": "x86_64",
                "platform_python_implementation": "CPython", "platform_release": "",
                "platform_system": "Linux", "platform_version": "",
                "python_full_version": self.full, "python_version": self.python,
                "sys_platform": "linux", "extra": ""}


def image_target(base_image: str) -> Target:
    """The Python of an image built from base.def's BASE_IMAGE (Ubuntu's python3)."""
    match = re.search(r"ubuntu[-_]?(\d\d\.\d\d)", base_image)
    known = UBUNTU_PYTHON.get(match.group(1)) if match else None
    if known is None:
        releases = ", ".join(f"ubuntu{u} ({p})" for u, (p, *_) in UBUNTU_PYTHON.items())
        raise UsageError(f"image new: base.def's BASE_IMAGE {base_image[:120]!r}: the "
                         "Python it brings is not known, so requirements cannot be resolved "
                         f"for it (known: {releases})")
    return Target(*known)


def check_pip() -> None:
    """The pip that resolves (this Python's) too old or missing: exit 2."""
    upgrade = f"{sys.executable} -m pip install --upgrade pip"
    try:
        import pip
        version = str(pip.__version__)
    except (ImportError, AttributeError):
        raise UsageError(f"image new: needs pip in {sys.executable} (python -m ensurepip, "
                         f"then {upgrade})") from None
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match.group(1)), int(match.group(2))) < MIN_PIP:
        raise UsageError(f"image new: pip {version[:40]} of {sys.executable} is too old: "
                         f"resolving for the image needs pip >= {MIN_PIP[0]}.{MIN_PIP[1]} "
                         f"(`pip install --dry-run --report`); upgrade it: {upgrade}")


def pip_resolve(requirements: Sequence[str], constraints: Sequence[str], target: Target,
                index_args: Sequence[str]) -> list[dict[str, Any]]:
    """pip's dry-run report ("install" items) for the image's Python and platform, wheels
    only, every base pin (name==version) a constraint. pip's refusal is a usage error
    quoting pip."""
    check_pip()
    with tempfile.TemporaryDirectory(prefix="train-derive-") as name:
        tmp = Path(name)
        (tmp / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements),
                                              encoding="utf-8")
        (tmp / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints),
                                             encoding="utf-8")
        env = {**os.environ, "PIP_REQUIRE_VIRTUALENV": "0", "PIP_CONSTRAINT": "",
               "PIP_NO_INPUT": "1"}
        if "--no-index" in index_args:  # the folder given and nothing else: no pip config
            env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
            env["PIP_CONFIG_FILE"] = os.devnull
        argv = [sys.executable, "-m", "pip", "install", "--dry-run",
                "--disable-pip-version-check", "--ignore-installed", "--no-input",
                "--only-binary=:all:", "--python-version", target.python,
                "--implementation", "cp", "--abi", target.abi,
                *(arg for tag in target.platforms() for arg in ("--platform", tag)),
                "--target", str(tmp / "target"),  # never written: a dry run (pip < 23.3)
                "--report", str(tmp / "report.json"), "-c", str(tmp / "constraints.txt"),
                "-r", str(tmp / "requirements.txt"), *index_args]
        proc = _proc.run(argv, timeout=PIP_TIMEOUT_S, check=False, env=env)
        if proc.returncode != 0:
            req_file = tmp / "requirements.txt"
            text = re.sub(re.escape(f"-r {req_file}") + r" \(line (\d+)\)",
                          lambda m: repr(requirements[int(m.group(1)) - 1]),
                          proc.stderr[-20000:] + proc.stdout[-5000:])
            raise UsageError(pip_refusal(text, target))
        report = tmp / "report.json"
        if not report.is_file() or report.stat().st_size > MAX_REPORT_BYTES:
            raise UsageError("image new: pip wrote no usable report (--report): "
                             + proc.stderr[-300:])
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"image new: pip's report is not JSON: {exc}") from None
    items = data.get("install", []) if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise UsageError("image new: pip's report has no list of what it would install")
    return items


def pip_refusal(text: str, target: Target) -> str:
    """pip's failure as one message: no wheel, a conflict with the base's pins (pip's
    resolver says so), or pip's own error quoted."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = "; ".join(ln for ln in lines if ln.startswith("ERROR"))
    missing = [m.group(1) for ln in lines
               if (m := re.search(r"No matching distribution found for (\S+)", ln))]
    if missing:  # pip's list of the versions there are, whole: the one to pick is in it
        return (f"--requirements: {', '.join(missing)}: no wheel for the image's Python "
                f"({target.describe()}) that fits the base's pins; pick a version that "
                f"publishes one (pip: {errors})")
    conflict = [ln for ln in lines if ln.startswith("The user requested")
                or " depends on " in ln or "ResolutionImpossible" in ln
                or "conflicting dependencies" in ln]
    if conflict:
        return ("--requirements: pip cannot resolve them against the base image's pins "
                "(the base's versions are constraints): " + "; ".join(conflict)[:600])
    return "--requirements: pip refused them: " + (errors or "; ".join(lines[-5:]))[:600]


def sha256_of(item: dict[str, Any]) -> str:
    """The sha256 of the wheel pip chose, from its report item."""
    info = item.get("download_info", {})
    archive = info.get("archive_info", {}) if isinstance(info, dict) else {}
    hashes = archive.get("hashes", {}) if isinstance(archive, dict) else {}
    found = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not found and str(archive.get("hash", "")).startswith("sha256="):
        found = str(archive["hash"]).split("=", 1)[1]
    if found:
        return str(found)
    url = str(info.get("url", "")) if isinstance(info, dict) else ""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return file_sha256(Path(urllib.request.url2pathname(parsed.path)))
    raise UsageError(f"--requirements: the index gave no sha256 for {url[:120]}: it cannot "
                     "be hash-pinned")
