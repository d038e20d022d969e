"""`train image lint`: rules every image definition must follow, each violation located by
file and line, with the rule's name; each rule's message says what it wants and why.

  size, parse, header, section   what Apptainer's parser refuses (defs.py), what our
                  translation refuses or ignores, header keys that need Apptainer >= 1.5
  pinned-base, pip-lock, alloc-env, runscript-args, section-NAME   our images' conventions
  arguments-empty, arguments-compat   %arguments defaults Apptainer 1.2.x mishandles
  placeholder     undeclared, or after a `#` (Apptainer >= 1.3 leaves it unfilled)
  test-exit       %test (or a %runscript not ending in exec) of several commands without
                  `set -e`
  files-source    a %files source outside the repository root (the parent of the folder
                  holding the .def), missing there, or read otherwise by Apptainer's
                  splitter or the Docker translation
  files-nesting   in a `Bootstrap: localimage` definition, a directory copied onto a path
                  the base image has (a %files destination of the base's .def, found from
                  the From: default, or a standard folder)
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from train.common.alloc_conf import ALLOC_CONF_VAR, TUNED_ALLOC_CONF
from train.common.errors import first_line
from train.images.defs import (
    APP_SECTIONS,
    HEADER_KEYS_1_5,
    PLACEHOLDER_RE,
    DefError,
    DefFile,
    parse,
    split_files_line,
    spython_check,
)
from train.images.dockerfile import UNSUPPORTED_SECTIONS, files_source_problem

# (section, the text it must hold ("": any), rule, message): our images' conventions
REQUIRED = (("environment", f"{ALLOC_CONF_VAR}={TUNED_ALLOC_CONF}", "alloc-env",
             f"%environment must export {ALLOC_CONF_VAR}={TUNED_ALLOC_CONF}"),
            ("runscript", '"$@"', "runscript-args",
             '%runscript must pass its arguments on with "$@"'),
            *((name, "", f"section-{name}", f"%{name} is missing or empty")
              for name in ("test", "labels", "help")))
_TAG_PINNED = re.compile(r"\d+\.\d+")


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


def _commands(d: DefFile, section: str) -> list[tuple[int, str]]:  # continuations joined
    out: list[tuple[int, str]] = []
    continued = False
    for line, body in d.body(section):
        # (a line continued: out's last, its backslash cut)
        number, text = (out[-1][0], f"{out.pop()[1]} {body}") if continued else (line, body)
        continued = text.endswith("\\")
        out.append((number, text[:-1].rstrip() if continued else text))
    return out


def lock_entries(lock: Path) -> list[tuple[str, list[str]]]:
    """(requirement, its `--hash=` values) of each entry of a hash-pinned lock file."""
    entries: list[tuple[str, list[str]]] = []
    for raw in lock.read_text(encoding="utf-8").splitlines():
        line = raw.strip().rstrip("\\").strip()
        if line.startswith("--hash="):
            if entries:
                entries[-1][1].append(line.removeprefix("--hash="))
        elif line and not line.startswith(("#", "-")):
            entries.append((line, []))
    return entries


def lock_problems(lock: Path) -> list[str]:  # requirements that carry no --hash
    return [requirement for requirement, hashes in lock_entries(lock) if not hashes]


def _pip_problem(words: list[str], requirements: Path) -> str | None:
    """What is wrong with one pip install command of %post (its words), or None."""
    if "--no-index" in words and "--no-deps" in words and "-r" not in words:
        return None  # a local source tree
    if "--require-hashes" not in words or "-r" not in words:
        return ("pip install must use --require-hashes -r <lock file> (or install a local "
                "tree with --no-index --no-deps)")
    at = words.index("-r") + 1
    if at == len(words):
        return "-r names no lock file"
    lock_name = Path(words[at]).name
    lock = requirements / lock_name
    try:
        found = lock.is_file()
    except OSError:  # a name too long for the file system
        found = False
    if not found:
        return f"lock file {lock_name[:60]} is not in {requirements}"
    try:
        missing = lock_problems(lock)
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read the lock file {lock_name}: {first_line(exc, 120)}"
    if missing:
        return f"{lock_name} has requirements without --hash: {', '.join(missing[:3])}"
    return None


def _check_pip(d: DefFile, requirements: Path) -> list[Violation]:
    out = []
    args = d.arguments()
    for number, command in _commands(d, "post"):
        if re.search(r"\bpip3?\b.*\binstall\b", command):
            problem = _pip_problem(d.substitute(command, args, number).split(), requirements)
            if problem is not None:
                out.append(_v(d, number, "pip-lock", problem))
    return out


def lint_def(path: Path, root: Path | None = None, reference: bool = True,
             given: Collection[str] = ()) -> list[Violation]:
    """Violations of one definition; `root` is where %files sources resolve (default: the
    parent of the folder holding the .def, the repository root); locks are read from
    requirements/ beside it. `reference=False` skips spython's parser (builds run the rules
    without the `images` extra); an empty default a build `given` overrides is no fault."""
    root = root or path.parent.parent
    try:
        d = parse(path)  # refuses files over MAX_BYTES before reading them
        args = d.arguments()
        if reference:
            spython_check(path)  # quadratic in the size: only on what parse accepted
    except DefError as exc:
        return [Violation(exc.path, exc.line, exc.rule, exc.message)]
    out = _check_header(d) + _check_sections(d) + _check_arguments(d, given)
    out += _check_placeholders(d, args)
    if any(v.rule == "placeholder" and "not declared" in v.message for v in out):
        return out  # the rules below substitute placeholders
    out += _check_exit(d) + _check_files(d, args, root)
    bootstrap = d.header["bootstrap"][1].lower()
    line, source = d.header["from"]
    image = d.substitute(source, args, line)
    if bootstrap == "docker":
        name, _, digest = image.partition("@")
        tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
        if not digest and (not tag or tag == "latest" or not _TAG_PINNED.search(tag)):
            out.append(_v(d, line, "pinned-base", f"base image {image!r} must be pinned to a "
                          "full version tag or a digest (not latest, not a bare major "
                          "version)"))
    out += _check_pip(d, path.parent / "requirements")
    for name, needed, rule, message in REQUIRED:
        sec = d.sections.get(name)
        if sec is None or needed not in sec.text or not sec.text.strip():
            out.append(_v(d, sec.line if sec else 1, rule, message))
    return sorted(out, key=lambda v: v.line)


_SET_E = re.compile(r"set\s+(-[A-Za-z]*e[A-Za-z]*\b|-o\s+errexit\b)")
_STANDARD_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/media", "/mnt",
    "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/usr", "/usr/bin",
    "/usr/include", "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/local/lib",
    "/usr/sbin", "/usr/share", "/var", "/var/lib",
    "/tmp", "/var/tmp"})  # noqa: S108 (paths inside the image, not used here)


def _v(d: DefFile, line: int, rule: str, message: str) -> Violation:
    return Violation(str(d.path), line, rule, message)


def _check_header(d: DefFile) -> list[Violation]:
    out = [_v(d, line, "header", f"{key.capitalize()}: repeated; Apptainer keeps the last "
              "value only") for line, key in d.header_repeats]
    out += [_v(d, line, "header", f"{key.capitalize()}: needs Apptainer >= 1.5 (earlier "
               "releases reject the key)")
            for key, (line, _) in d.header.items() if key in HEADER_KEYS_1_5]
    return out


def _check_sections(d: DefFile) -> list[Violation]:
    out = []
    for key, sec in d.sections.items():
        name = key.split(" ", 1)[0]
        why = UNSUPPORTED_SECTIONS.get("app" if name in APP_SECTIONS else name)
        if why:
            out.append(_v(d, sec.line, "section", f"%{key} {why}; our translation refuses it"))
        elif key.startswith("files "):
            stage = sec.args.split("#", 1)[0].split()
            why = ("copies from another build stage; multi-stage definitions are not "
                   "supported" if len(stage) == 2 and stage[0] == "from" else
                   "is ignored by Apptainer (only `%files from STAGE` takes arguments)")
            out.append(_v(d, sec.line, "section", f"%files {sec.args.strip()[:60]}: this "
                          f"section {why}"))
        elif sec.args.split("#", 1)[0].strip():
            out.append(_v(d, sec.line, "section", f"%{name} {sec.args.strip()[:60]}: "
                          "section arguments change how Apptainer runs it, and our "
                          "translation ignores them"))
    return out


def _check_arguments(d: DefFile, given: Collection[str]) -> list[Violation]:
    out = []
    for line, key, value in d.argument_lines():
        if not value and key not in given:
            out.append(_v(d, line, "arguments-empty", f"{key}= has an empty default: "
                          "Apptainer 1.2.0-1.2.3 skip it and then fail on {{ " + key
                          + " }}; give a non-empty default"))
        elif "=" in value:
            out.append(_v(d, line, "arguments-compat", f"{key}: a default holding '=' is "
                          "skipped by Apptainer 1.2.x"))
        elif '"' in value or "\\" in value:
            out.append(_v(d, line, "arguments-compat", f"{key}: a default holding '\"' "
                          "or '\\' breaks Apptainer 1.2.x, which substitutes inside JSON"))
    return out


def _check_placeholders(d: DefFile, args: dict[str, str]) -> list[Violation]:
    out = []
    for number, text in enumerate(d.lines, start=1):
        if "{{" not in text:
            continue
        for name in PLACEHOLDER_RE.findall(text):
            if name not in args:
                out.append(_v(d, number, "placeholder", f"{{{{ {name} }}}} is not declared "
                              "in %arguments"))
        if "#" in text and not text.strip().startswith("#") and _unfilled(text):
            out.append(_v(d, number, "placeholder", "a {{ placeholder }} after '#' on this "
                          "line is left unfilled by Apptainer >= 1.3 (args.NewReader takes "
                          "the line for a comment); 1.2 fills it"))
    return out


def _unfilled(text: str) -> bool:
    """Whether Apptainer >= 1.3 skips a placeholder of this line: one preceded, since the
    line start or the last placeholder it filled, by `#` and a character other than `!`."""
    start = 0
    for match in PLACEHOLDER_RE.finditer(text):
        if re.search(r"#[^!]", text[start:match.start()]):
            return True
        start = match.end()
    return False


def _check_exit(d: DefFile) -> list[Violation]:
    out = []
    for name in ("test", "runscript"):
        sec = d.sections.get(name)
        commands = [(n, c) for n, c in _commands(d, name) if not c.startswith("#!")]
        if sec is None or len(commands) < 2 or _SET_E.match(commands[0][1]):
            continue
        if name == "runscript" and commands[-1][1].startswith("exec "):
            continue
        out.append(_v(d, sec.line, "test-exit", f"%{name} has {len(commands)} commands and "
                      "no `set -e` first: Apptainer runs it with plain /bin/sh, so only the "
                      "last command's status counts"))
    return out


def _control(text: str) -> bool:
    return any((ord(c) < 32 and c != "\t") or 127 <= ord(c) < 160 or c in "\u2028\u2029"
               for c in text)


def _entry_problems(text: str, src: str, dst: str) -> tuple[list[str], bool]:
    """What is wrong with a %files line's text and its source's name, and whether the
    entry's checks end there."""
    if _control(src) or _control(dst) or _control(text):
        return ["a control character in a %files entry"], True
    found = []
    if len(split_files_line(text)) > 2:
        found.append(f"{text[:60]!r}: more than 'src dst'; Apptainer ignores the rest")
    if "'" in text:
        return [*found, "single quotes: Apptainer's %files splitter keeps them in the path "
                '(quote with ")'], True
    why = files_source_problem(src, lint=True)
    return ([*found, f"{src}: {why}" if src else why], True) if why else (found, False)


def source_problem(root: Path, src: str) -> str | None:
    """Why a %files source (a glob was refused before) is no path of the repository at
    `root` (lint's check, and the build's of the value its build arguments give), or None."""
    try:
        if not (root / src).exists():
            return f"does not exist under {root}"
        if not (root / src).resolve().is_relative_to(root.resolve()):
            return "resolves outside the repository (a symbolic link)"
    except (OSError, RuntimeError) as exc:  # a name too long, a symbolic link loop
        return f"cannot be read under {root}: {first_line(exc, 80)}"
    return None


def _check_files(d: DefFile, args: dict[str, str], root: Path) -> list[Violation]:
    out = []
    source_tree = (root / "pyproject.toml").is_file() or (root / ".git").exists()
    existing = _base_paths(d, args) if d.header["bootstrap"][1] == "localimage" else None
    for line, raw_src, raw_dst in d.files():
        text = d.lines[line - 1].strip()
        src, dst = d.substitute(raw_src, args, line), d.substitute(raw_dst, args, line)
        messages, stop = _entry_problems(text, src, dst)
        out += [_v(d, line, "files-source", m) for m in messages]
        if stop or not source_tree:
            continue  # an installed copy: sources exist only in the clone images build from
        problem = source_problem(root, src)
        if problem is not None:
            out.append(_v(d, line, "files-source", f"{src}: {problem}"))
        elif existing is not None and (root / src).is_dir():
            normal = posixpath.normpath(src)
            target = dst or "/" + normal
            clean = posixpath.normpath("/" + target.lstrip("/"))
            if target.endswith("/") or clean in existing:
                out.append(_v(d, line, "files-nesting", f"{src} -> {target}: the destination "
                              "already exists in the base image (or ends in '/'), and "
                              "Apptainer's `cp -fLr` puts the directory inside it "
                              f"({clean.rstrip('/')}/{posixpath.basename(normal)}); copy to "
                              "a new path or copy the files one by one"))
    return out


def _base_paths(d: DefFile, args: dict[str, str], depth: int = 0) -> set[str]:
    """Paths that exist in a localimage's base (see files-nesting), recursively."""
    paths = set(_STANDARD_DIRS)
    line, source = d.header["from"]
    try:
        name = Path(d.substitute(source, args, line)).name
        base = d.path.parent / (name.removesuffix(".sif") + ".def")
        if depth > 4 or not base.is_file() or base.resolve() == d.path.resolve():
            return paths
        b = parse(base)
        b_args = b.arguments()
        found = {posixpath.normpath("/" + b.substitute(dst or "/" + src, b_args, line).lstrip("/"))
                 for line, src, dst in b.files()}  # the base's %files destinations
        if b.header["bootstrap"][1] == "localimage":
            paths |= _base_paths(b, b_args, depth + 1)
    except (DefError, OSError, RuntimeError):  # (a name too long, a link loop)
        return paths
    for dest in found:
        path = dest
        while path not in paths:
            paths.add(path)
            path = posixpath.dirname(path)
    return paths


def lint_all(paths: list[Path]) -> list[Violation]:
    return [v for p in paths for v in lint_def(p)]
