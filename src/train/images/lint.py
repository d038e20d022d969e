"""`train image lint`: rules every image definition must follow, each violation located by
file and line.

Rules: parse (our parser and spython's), pinned-base (no `latest`, no bare major tag),
pip-lock (every pip install comes from a hash-pinned lock file, or is a local source tree
installed with --no-index --no-deps), alloc-env (the tuned allocator settings in
%environment), runscript-args (%runscript passes "$@"), and the %test, %labels and %help
sections.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from train.images.defs import DefError, DefFile, parse, spython_check
from train.runtime.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF

REQUIRED_SECTIONS = ("test", "labels", "help")
_TAG_PINNED = re.compile(r"\d+\.\d+")


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


def _commands(d: DefFile, section: str) -> list[tuple[int, str]]:
    """Shell commands of a section with backslash continuations joined."""
    sec = d.sections.get(section)
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, text in sec.body() if sec else []:
        pending = (number, text) if pending is None else (pending[0], f"{pending[1]} {text}")
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip())
            continue
        out.append(pending)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def lock_problems(lock: Path) -> list[str]:
    """Requirements in a lock file that carry no --hash."""
    problems = []
    current: str | None = None
    hashed = False
    for raw in [*lock.read_text(encoding="utf-8").splitlines(), ""]:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("--hash="):
            hashed = True
            continue
        if line.startswith("-"):
            continue
        if current is not None and not hashed:
            problems.append(current)
        current, hashed = line.rstrip("\\").strip(), False
    if current is not None and not hashed:
        problems.append(current)
    return problems


def _check_pip(d: DefFile, requirements: Path) -> list[Violation]:
    out = []
    args = d.arguments()
    for number, command in _commands(d, "post"):
        if not re.search(r"\bpip3?\b.*\binstall\b", command):
            continue
        words = d.substitute(command, args, number).split()
        local = "--no-index" in words and "--no-deps" in words and "-r" not in words
        if local:
            continue
        if "--require-hashes" not in words or "-r" not in words:
            out.append(Violation(str(d.path), number, "pip-lock", "pip install must use "
                                 "--require-hashes -r <lock file> (or install a local tree "
                                 "with --no-index --no-deps)"))
            continue
        lock_name = Path(words[words.index("-r") + 1]).name
        lock = requirements / lock_name
        if not lock.is_file():
            out.append(Violation(str(d.path), number, "pip-lock", f"lock file {lock_name} "
                                 f"is not in {requirements}"))
            continue
        missing = lock_problems(lock)
        if missing:
            out.append(Violation(str(d.path), number, "pip-lock", f"{lock_name} has "
                                 f"requirements without --hash: {', '.join(missing[:3])}"))
    return out


def lint_def(path: Path, requirements: Path | None = None) -> list[Violation]:
    requirements = requirements or path.parent / "requirements"
    try:
        d = parse(path)
        spython_check(path)
    except DefError as exc:
        return [Violation(exc.path, exc.line, "parse", str(exc).split(": ", 2)[-1])]
    out: list[Violation] = []
    args = d.arguments()
    bootstrap = d.header["bootstrap"][1].lower()
    line, source = d.header["from"]
    image = d.substitute(source, args, line)
    if bootstrap == "docker":
        name, _, digest = image.partition("@")
        tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
        if not digest and (not tag or tag == "latest" or not _TAG_PINNED.search(tag)):
            out.append(Violation(str(d.path), line, "pinned-base", f"base image {image!r} "
                                 "must be pinned to a full version tag or a digest (not "
                                 "latest, not a bare major version)"))
    out += _check_pip(d, requirements)
    env = d.sections.get("environment")
    if env is None or f"{ALLOC_CONF_VAR}={TUNED_ALLOC_CONF}" not in env.text:
        out.append(Violation(str(d.path), env.line if env else 1, "alloc-env",
                             f"%environment must export {ALLOC_CONF_VAR}={TUNED_ALLOC_CONF}"))
    run = d.sections.get("runscript")
    if run is None or '"$@"' not in run.text:
        out.append(Violation(str(d.path), run.line if run else 1, "runscript-args",
                             '%runscript must pass its arguments on with "$@"'))
    for name in REQUIRED_SECTIONS:
        sec = d.sections.get(name)
        if sec is None or not sec.text.strip():
            out.append(Violation(str(d.path), sec.line if sec else 1, f"section-{name}",
                                 f"%{name} is missing or empty"))
    return out


def lint_all(paths: list[Path]) -> list[Violation]:
    return [v for p in paths for v in lint_def(p)]
