"""Apptainer definition files: a parser that keeps line numbers, and build arguments.

The header (`Bootstrap:`, `From:`) and each `%section` are kept with the line number
where they start, so lint and translation errors point at the file and line. `{{ NAME }}`
placeholders are filled from `%arguments` defaults overridden by build arguments, as
`apptainer build --build-arg` does; an unknown or missing argument is an error.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from train.errors import UsageError

KNOWN_SECTIONS = ("arguments", "setup", "files", "post", "environment", "runscript",
                  "startscript", "test", "labels", "help", "app")
_SECTION_RE = re.compile(r"^%([A-Za-z]+)\b(.*)$")
_PLACEHOLDER = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*}}")


class DefError(UsageError):
    """A definition file problem, located by file and line."""

    def __init__(self, path: Path | str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = str(path)
        self.line = line


@dataclass
class Section:
    name: str
    line: int  # line of the %name header
    lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, raw text)

    @property
    def text(self) -> str:
        """The body with the common indentation removed and blank edges trimmed."""
        return textwrap.dedent("\n".join(t for _, t in self.lines)).strip("\n")

    def body(self) -> list[tuple[int, str]]:
        """Non-blank, non-comment lines, stripped, with their numbers."""
        return [(n, t.strip()) for n, t in self.lines
                if t.strip() and not t.strip().startswith("#")]


@dataclass
class DefFile:
    path: Path
    header: dict[str, tuple[int, str]]  # key (lowercase) -> (line, value)
    sections: dict[str, Section]

    @property
    def name(self) -> str:
        return self.path.stem

    def arguments(self) -> dict[str, str]:
        args: dict[str, str] = {}
        section = self.sections.get("arguments")
        for number, text in section.body() if section else []:
            key, sep, value = text.partition("=")
            if not sep or not key.strip().isidentifier():
                raise DefError(self.path, number, f"%arguments line must be NAME=VALUE: "
                               f"{text!r}")
            args[key.strip()] = value.strip()
        return args

    def resolve_arguments(self, overrides: Mapping[str, str]) -> dict[str, str]:
        args = self.arguments()
        unknown = sorted(set(overrides) - set(args))
        if unknown:
            raise UsageError(f"build-arg {unknown[0]}: {self.path.name} has no such "
                             f"argument; its arguments: {', '.join(args) or 'none'}")
        return {**args, **overrides}

    def substitute(self, text: str, args: Mapping[str, str], line: int) -> str:
        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in args:
                raise DefError(self.path, line, f"{{{{ {name} }}}} is not declared in "
                               "%arguments")
            return args[name]

        return _PLACEHOLDER.sub(repl, text)


def parse(path: Path) -> DefFile:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    header: dict[str, tuple[int, str]] = {}
    sections: dict[str, Section] = {}
    current: Section | None = None
    for number, text in enumerate(raw.splitlines(), start=1):
        match = _SECTION_RE.match(text)
        if match:
            name = match.group(1).lower()
            if name not in KNOWN_SECTIONS:
                raise DefError(path, number, f"unknown section %{name}; known: "
                               + ", ".join(f"%{s}" for s in KNOWN_SECTIONS))
            if name in sections:
                raise DefError(path, number, f"%{name} appears twice")
            current = Section(name, number)
            sections[name] = current
            continue
        if current is not None:
            current.lines.append((number, text))
            continue
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            raise DefError(path, number, f"header lines are 'Key: value', got {stripped!r}")
        header[key.strip().lower()] = (number, value.strip())
    for key in ("bootstrap", "from"):
        if key not in header:
            raise DefError(path, 1, f"the header has no {key.capitalize()}: line")
    return DefFile(path, header, sections)


def spython_check(path: Path) -> None:
    """Parse with spython's SingularityParser (the reference reader of .def files).

    spython reads only `Bootstrap: docker`; derived images (`localimage`) are checked with
    the agent swapped, which exercises the same section grammar.
    """
    try:
        from spython.main.parse.parsers import SingularityParser
    except ImportError:
        raise UsageError("image lint needs spython: pip install 'train[images]'") from None

    text = path.read_text(encoding="utf-8")
    text = re.sub(r"(?im)^(\s*Bootstrap:\s*)\S+", r"\1docker", text, count=1)
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".def", delete=False) as fh:
        fh.write(text)
        tmp = Path(fh.name)
    try:
        SingularityParser(str(tmp))
    except Exception as exc:
        raise DefError(path, 1, f"spython cannot parse it: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
