"""Apptainer definition files: where they are found (containers_dir), a parser that keeps
line numbers and follows Apptainer's own rules, and build arguments.

The rules are those of Apptainer's parser (pkg/build/types/parser/deffile.go, the same in
1.2.0 .. 1.5.3 except where noted), read from its source:

- Lines end at "\\n" only, a trailing "\\r" dropped (bufio.ScanLines); no other character
  ends a line.
- A line whose first word starts with `%` starts a section (scanDefinitionFile), wherever
  that word is, so `%` lines inside a script or %help end the section. The name is the
  text up to the first space, all leading `%` removed, lower-cased (getSectionName); an
  indented header keeps its indentation in the name, which is then invalid, so section
  headers are valid only at column 0. What follows the first space is the section's
  arguments (`%files from STAGE`, `%post -c /bin/bash`).
- Valid names (validSections, appSections): SECTIONS in any case, APP_SECTIONS in lower
  case with an app name; any other name is an error (populateDefinition).
- A repeated section is joined: its body is appended to the first one's (parseTokenSection
  `Script +=`; a later header's arguments replace earlier ones); %files entries of sections
  with the same arguments are appended to one list, in the order the lists first appear;
  %labels are joined, then read key by key, the last value of a key winning (GetLabels).
- Sections hold at most 64 KiB: the scanner is a bufio.Scanner with its default token limit
  (a section together with the next section's header line, or the last section up to the
  end of the file), beyond which Apptainer fails with "token too long".
- The header is everything before the first section (doHeader): blank lines and lines
  starting with `#` are skipped, everything from the first `#` of a line is a comment,
  `Key: value` is split at the first `:`, keys are lower-cased, a line ending in `\\`
  continues on the next one; a line without `:` is an error, an unknown key is an error
  (validHeaders, plus otherurlN), a repeated key keeps its last value; the Bootstrap value
  is case-sensitive (conveyorPacker). Every `bootstrap:` line starts a build stage.

`{{ NAME }}` placeholders are filled from `%arguments` defaults overridden by build
arguments, as `apptainer build --build-arg` does; an unknown or missing argument is an
error. Files over MAX_BYTES are refused before anything else reads them, and the parser
makes one pass over the lines, so its time is linear in the size of the file.
"""

from __future__ import annotations

import os
import re
import site
import stat
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from train.common.errors import DISTRIBUTION, UsageError, install_hint

MAX_BYTES = 256 * 1024  # refuse larger definitions (ours are a few KiB; spython, which
# lint also runs, is quadratic: about 1.3 s at this size, 12 s at 1 MiB)
SECTION_LIMIT = 64 * 1024  # bufio.MaxScanTokenSize: Apptainer's limit per section

SECTIONS = ("arguments", "environment", "files", "help", "labels", "post", "pre",
            "runscript", "setup", "startscript", "test")
APP_SECTIONS = ("appenv", "appfiles", "apphelp", "appinstall", "applabels", "apprun",
                "appstart", "apptest")
HEADER_KEYS = ("bootstrap", "from", "includecmd", "mirrorurl", "updateurl", "osversion",
               "include", "library", "registry", "namespace", "stage", "product", "user",
               "regcode", "productpgp", "registerurl", "modules", "fingerprints", "confurl",
               "setopt")
HEADER_KEYS_1_5 = ("target", "frontend", "filename", "buildargs")  # valid from 1.5.0
# Go's unicode.IsSpace for the characters bufio.ScanWords skips (Python's str.strip() also
# strips \x1c-\x1f, which Go does not).
_GO_SPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
             "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_STAGE_RE = re.compile(r"(?i)bootstrap:")
# Apptainer's `{{\s*(\w+)\s*}}` in Go's RE2: \s and \w are ASCII there.
PLACEHOLDER_RE = re.compile(r"{{[\t\n\f\r ]*([0-9A-Za-z_]+)[\t\n\f\r ]*}}")
# Apptainer's %files splitter (fileSplitter), ported with RE2's ASCII classes.
_S = r"\t\n\f\r "
_FILE_SPLIT = re.compile(
    rf"([^{_S}\"']*{{{{[{_S}]*[0-9A-Za-z_]+[{_S}]*}}*[^{_S}{{}}\"']*)+"
    rf"|([^{_S}\"']+|\"([^\"]*)\"|'([^']*))")


class DefError(UsageError):
    """A definition file problem, located by file and line; `rule` names the lint rule."""

    def __init__(self, path: Path | str, line: int, message: str, rule: str = "parse") -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = str(path)
        self.line = line
        self.message = message
        self.rule = rule


@dataclass
class Section:
    name: str  # as Apptainer keys it: "post", "files", "appinstall NAME"
    line: int  # line of the (first) %name header
    lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, raw text)
    args: str = ""  # what follows the name on the header line (the last one that had any)
    headers: list[int] = field(default_factory=list)  # every header line, repeats included

    @property
    def text(self) -> str:
        return textwrap.dedent("\n".join(t for _, t in self.lines)).strip("\n")

    def body(self) -> list[tuple[int, str]]:  # non-blank, non-comment lines, stripped
        return [(n, t.strip()) for n, t in self.lines
                if t.strip() and not t.strip().startswith("#")]


@dataclass
class DefFile:
    path: Path
    header: dict[str, tuple[int, str]]  # key (lowercase) -> (line, value); last one wins
    sections: dict[str, Section]
    header_repeats: list[tuple[int, str]] = field(default_factory=list)  # (line, key)
    lines: list[str] = field(default_factory=list)  # every line, \r dropped (line n: [n-1])

    @property
    def name(self) -> str:
        return self.path.stem

    def body(self, name: str) -> list[tuple[int, str]]:  # Section.body; [] when it is absent
        section = self.sections.get(name)
        return section.body() if section else []

    def arguments(self) -> dict[str, str]:
        return {key: value for _, key, value in self.argument_lines()}

    def argument_lines(self) -> list[tuple[int, str, str]]:
        """(line, NAME, default) of each %arguments line, as Apptainer's ReadDefaults reads
        them (split at the first `=`, both sides stripped); a later NAME wins."""
        out = []
        for number, text in self.body("arguments"):
            key, sep, value = text.partition("=")
            if not sep or not key.strip().isidentifier():
                raise DefError(self.path, number, f"%arguments line must be NAME=VALUE: "
                               f"{text!r}")
            out.append((number, key.strip(), value.strip()))
        return out

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
                               "%arguments", rule="placeholder")
            return args[name]

        return PLACEHOLDER_RE.sub(repl, text)

    def files(self) -> list[tuple[int, str, str]]:
        """(line, src, dst) of each %files entry as Apptainer splits it (fileSplitter:
        whitespace outside double quotes, a `{{ NAME }}` kept whole, then `"` trimmed);
        an empty dst means the same path as src. Extra words are ignored, as Apptainer
        ignores them."""
        out = []
        for number, text in self.body("files"):
            words = [w.strip().strip('"') for w in split_files_line(text)]
            out.append((number, words[0] if words else "", words[1] if len(words) > 1 else ""))
        return out


def split_files_line(text: str) -> list[str]:
    return [m.group(0) for m in _FILE_SPLIT.finditer(text)]


def _classify(text: str) -> str:
    """What a line is to Apptainer's scanner: "section" (its first word starts with `%`),
    or "text". Called once per line (tests count the calls to show one pass)."""
    return "section" if text.lstrip(_GO_SPACE).startswith("%") else "text"


def _read(path: Path) -> str:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise DefError(path, 1, "not a regular file", rule="parse")
        if info.st_size > MAX_BYTES:
            raise DefError(path, 1, f"{info.st_size} bytes: definitions over {MAX_BYTES} bytes "
                           "are refused", rule="size")
        raw = path.read_bytes()
    except OSError as exc:
        raise DefError(path, 1, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:  # grew since stat
        raise DefError(path, 1, f"definitions over {MAX_BYTES} bytes are refused",
                       rule="size")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DefError(path, line, f"not UTF-8 (byte {raw[exc.start]:#04x} at offset "
                       f"{exc.start})") from None


def _header(path: Path, rows: list[tuple[int, str]],
            repeats: list[tuple[int, str]]) -> dict[str, tuple[int, str]]:
    header: dict[str, tuple[int, str]] = {}
    key_cont, val_cont, cont_line = "", "", 0
    for number, text in rows:
        line = text.strip(_GO_SPACE)
        if not line or line.startswith("#"):
            if key_cont:  # doHeader stores into d.Header, still a nil map: a Go panic
                raise DefError(path, cont_line, "a header line continued with '\\' and "
                               "then a blank or comment line crashes Apptainer",
                               rule="header")
            continue
        trimmed = line.split("#", 1)[0]
        if not val_cont:
            key, sep, value = trimmed.partition(":")
            if not sep:
                raise DefError(path, number, f"header lines are 'Key: value', got "
                               f"{key.strip()[:60]!r} (Apptainer: header key had no val)",
                               rule="header")
            start, key, value = number, key.strip(_GO_SPACE).lower(), value.strip(_GO_SPACE)
        else:
            start, key, value = cont_line, key_cont, val_cont + trimmed.strip(_GO_SPACE)
            key_cont, val_cont = "", ""
        if value.endswith("\\"):
            key_cont, val_cont, cont_line = key, value[:-1], start
            if val_cont.endswith("\\n"):
                val_cont = val_cont[:-2] + "\n"
            continue
        if key not in HEADER_KEYS + HEADER_KEYS_1_5 and not re.fullmatch(r"otherurl\d+", key):
            raise DefError(path, start, f"unknown header key {key[:60]!r} (Apptainer: "
                           "invalid header keyword)", rule="header")
        if key in header:
            repeats.append((start, key))
        header[key] = (start, value)
    # a continuation still open at the end of the header is dropped, as doHeader drops it
    for key in ("bootstrap", "from"):
        if key not in header:
            raise DefError(path, 1, f"the header has no {key.capitalize()}: line",
                           rule="header")
    at, agent = header["bootstrap"]
    if agent != agent.lower():
        raise DefError(path, at, f"Bootstrap: {agent}: Apptainer's bootstrap agents are "
                       f"case-sensitive ({agent.lower()}); this is an invalid build source",
                       rule="header")
    return header


def parse(path: Path) -> DefFile:
    raw = _read(path)
    header_rows, all_lines, sections = _scan(path, raw)
    repeats: list[tuple[int, str]] = []
    header = _header(path, header_rows, repeats)
    return DefFile(path, header, sections, repeats, all_lines)


def _scan(path: Path, raw: str) -> tuple[list[tuple[int, str]], list[str], dict[str, Section]]:
    """One pass over the lines as Apptainer's scanner reads them: the header rows, every
    line, the sections (the %files groups by their arguments, parseTokenSection)."""
    header_rows: list[tuple[int, str]] = []
    all_lines: list[str] = []
    sections: dict[str, Section] = {}
    files_groups: dict[str, Section] = {}  # %files arguments -> entries (parseTokenSection)
    current: Section | None = None
    # the scanner's current token: where it starts (bytes) and what it is, for its limit
    token_start, token_line, token_name = 0, 1, "the header"
    offset = 0
    header_content = False  # a header line other than blank or comment
    seen_bootstrap = False
    pieces = raw.split("\n")
    ends_with_newline = pieces[-1] == ""
    if ends_with_newline:
        pieces.pop()
    for number, piece in enumerate(pieces, start=1):
        size = len(piece.encode("utf-8")) + (1 if number < len(pieces)
                                             or ends_with_newline else 0)
        text = piece[:-1] if piece.endswith("\r") else piece  # bufio.ScanLines drops \r
        all_lines.append(text)
        if _STAGE_RE.match(text):
            if seen_bootstrap or current is not None or header_content:
                raise DefError(path, number, "a line starting with 'Bootstrap:' starts a "
                               "build stage in Apptainer (parser.All): the lines above it "
                               "become a stage of their own. Put Bootstrap: first, once; "
                               "multi-stage definitions are not supported", rule="section")
            seen_bootstrap = True
        if _classify(text) == "section":
            # the scanner ends a token only once this whole line is in its 64 KiB buffer
            if offset + size - token_start > SECTION_LIMIT:
                _too_long(path, token_line, token_name)
            token_start, token_line = offset, number
            current = _start_section(path, number, text, sections, files_groups)
            token_name = f"section %{current.name}"
        elif current is not None:
            current.lines.append((number, text))
        else:
            header_rows.append((number, text))
            stripped = text.strip()
            header_content = header_content or bool(stripped and stripped[0] != "#")
        offset += size
    if offset - token_start >= SECTION_LIMIT:  # the last token must leave room for EOF
        _too_long(path, token_line, token_name)
    # groups whose arguments are blank after a comment are copied from the host, in the
    # order the groups first appeared (stage.copyFiles); others are kept apart
    host = [g for a, g in files_groups.items() if not a.split("#", 1)[0]]
    if host:
        sections["files"] = Section("files", host[0].line, [x for g in host for x in g.lines],
                                    "", sorted(n for g in host for n in g.headers))
    for args, group in files_groups.items():
        if args.split("#", 1)[0]:
            sections[f"files {args}"] = group
    return header_rows, all_lines, sections


def _too_long(path: Path, line: int, what: str) -> None:
    raise DefError(path, line, f"{what} is {SECTION_LIMIT // 1024} KiB or more (with the "
                   "next header line): Apptainer's scanner refuses it (token too long)",
                   rule="size")


def _start_section(path: Path, number: int, text: str, sections: dict[str, Section],
                   files_groups: dict[str, Section]) -> Section:
    """parseTokenSection for one header line: the Section its body lines go to."""
    if text[:1] != "%":
        raise DefError(path, number, f"section header {text.strip()!r} is indented: "
                       "Apptainer reads it as an invalid section (headers start at column "
                       "0; a `%` word starting a line inside a script ends the section)",
                       rule="section")
    bare = text.lstrip("%")
    name, _, args = bare.partition(" ")
    key = name.lower()
    if key == "files":
        group = files_groups.setdefault(args, Section("files", number, [], args))
        group.headers.append(number)
        return group
    if key in APP_SECTIONS:
        if name != key:
            raise DefError(path, number, f"%{name}: app sections must be lower case "
                           f"(Apptainer rejects %{name} as an invalid section)",
                           rule="section")
        app = bare.split(" ", 2)
        if len(app) < 2:
            raise DefError(path, number, f"%{name} needs an app name (%{key} NAME)",
                           rule="section")
        key, args = f"{key} {app[1]}", ""
    elif key not in SECTIONS:
        raise DefError(path, number, f"unknown section {'%' + name[:40]!r}: Apptainer "
                       "accepts " + ", ".join(f"%{s}" for s in SECTIONS) + " and "
                       + ", ".join(f"%{s}" for s in APP_SECTIONS) + " NAME",
                       rule="section")
    section = sections.setdefault(key, Section(key, number))
    if args:
        section.args = args
    section.headers.append(number)
    return section


def spython_check(path: Path) -> None:
    """Parse with spython's SingularityParser (a second reader of .def files), the agent
    swapped to docker (all it reads). Quadratic in the size: only on files `parse` took."""
    try:
        from spython.main.parse.parsers import SingularityParser
    except ImportError:
        raise UsageError(f"image lint needs spython: {install_hint('images')}") from None

    text = re.sub(r"(?im)^(\s*Bootstrap:\s*)\S+", r"\1docker", _read(path), count=1)
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


DEFS_VAR = "TRAIN_DEFS"


def _working_clone() -> list[Path]:
    """containers/ of the clone of this project that holds the working directory, if any."""
    try:
        here = Path.cwd()
        for folder in (here, *here.parents):
            project = folder / "pyproject.toml"
            if (folder / "containers").is_dir() and project.is_file() \
                    and project.stat().st_size < 1 << 20 \
                    and re.search(rf'(?m)^name\s*=\s*"{DISTRIBUTION}"',
                                  project.read_text(encoding="utf-8", errors="replace")):
                return [folder / "containers"]
    except OSError:  # a working directory removed or unreadable: no clone there
        pass
    return []


def containers_dir(defs: str | Path | None = None) -> Path:
    """The folder holding the .def files (and requirements/ with the locks): `--defs DIR`
    (or TRAIN_DEFS), the `containers/` folder of a source tree this package runs from (an
    editable install), that of the clone the working directory is in (`pip install ./` runs
    the package from site-packages, and `train image build` needs the clone's %files
    sources), then the copy installed with the package (`<prefix>/share/train/containers`,
    from pyproject.toml's data-files). Finding none is a usage error, never "0
    definitions"."""
    chosen = defs or os.environ.get(DEFS_VAR)
    if chosen:
        source = "--defs" if defs else DEFS_VAR
        try:
            path = Path(chosen).expanduser().resolve()
            found = any(p.is_file() for p in path.glob("*.def"))
        except (OSError, RuntimeError) as exc:
            raise UsageError(f"{source}: {str(chosen)[:80]!r} cannot be used: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        if not found:
            raise UsageError(f"{source}: {path} holds no .def files")
        return path
    tree = Path(__file__).resolve().parents[3] / "containers"
    installed = [p / "share" / "train" / "containers"
                 for p in (Path(sys.prefix), Path(site.getuserbase()))]
    candidates = [tree, *_working_clone(), *installed]
    for candidate in candidates:
        if any(candidate.glob("*.def")):
            return candidate
    raise UsageError("image: no image definitions found (looked in "
                     f"{', '.join(str(p) for p in candidates)}); "
                     "name a folder of .def files with --defs DIR")


def find_def(image: str, defs: str | Path | None = None) -> Path:
    path = Path(image)
    if path.suffix == ".def":
        if path.is_file():
            return path.resolve()
        raise UsageError(f"image: {image} does not exist")
    candidate = containers_dir(defs) / f"{image}.def"
    if candidate.is_file():
        return candidate
    known = sorted(p.stem for p in containers_dir(defs).glob("*.def") if p.is_file())
    raise UsageError(f"image: unknown image {image!r}; known: {', '.join(known)}")
