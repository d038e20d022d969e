"""The checks a build makes on this machine before any engine starts (exit 2): the source
tree, build argument values, lint's blocking rules, every %files source and the links
inside it, and every `file://` build argument."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path

from train.common.errors import UsageError
from train.images.defs import PLACEHOLDER_RE, DefFile
from train.images.dockerfile import check_text, files_source_problem

# lint rules that stop a build before any engine starts (the others are our images' own
# conventions: a user's definition need not follow them to build)
BUILD_BLOCKING = frozenset({"parse", "size", "section", "header", "placeholder",
                            "files-source", "arguments-empty", "pip-lock"})


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


def _check_unused(d: DefFile, build_args: Mapping[str, str]) -> None:
    """A build argument given that no `{{ NAME }}` outside %arguments uses is refused, as
    `apptainer build` refuses it ("unused build args")."""
    section = d.sections.get("arguments")
    skip = {n for n, _ in section.lines} if section is not None else set()
    used = {name for number, line in enumerate(d.lines, 1) if number not in skip
            for name in PLACEHOLDER_RE.findall(line)}
    unused = [key for key in build_args if key not in used]
    if unused:
        raise UsageError(f"build-arg {unused[0]}: {d.path.name} declares it but uses it "
                         "nowhere ({{ " + unused[0] + " }}), and Apptainer refuses a build "
                         "argument the definition does not use: leave it out")


def check_inputs(d: DefFile, build_args: Mapping[str, str], root: Path) -> list[Path]:
    """Everything a build needs from this machine, checked before any engine starts (exit 2):
    a source tree to build from, build argument values, lint's blocking rules, every %files
    source (and every link inside it) in the repository, and every `file://` build argument
    (an offline stand-in for a download) staged by a %files entry. Returns the sources."""
    if not ((root / "pyproject.toml").is_file() or (root / ".git").exists()):
        raise UsageError(f"image build: {root} is not a source tree (no pyproject.toml or "
                         ".git there): %files sources resolve from the repository root, so "
                         "build from inside a clone (or --defs the containers/ folder of "
                         "one)")
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
    _check_unused(d, build_args)
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
