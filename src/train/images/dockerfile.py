"""Translate an Apptainer definition into a Dockerfile plus the scripts it copies in.

Written here because spython's writer splits %post into one RUN per line (losing exports),
mangles %test and drops %help. Semantics kept:
  header       Bootstrap docker -> FROM; localimage -> FROM a docker tag given for it
  %arguments   {{ NAME }} filled in everywhere (defaults overridden by build arguments)
  %files       as Apptainer copies them: each source is staged by COPY, then moved with
               `cp -fLr SRC DST` after creating DST's parent (so a directory copied
               onto an existing directory nests inside it, as on the cluster; Docker's
               COPY would merge them); sources are relative to the repository root
  %post        one script run by /bin/sh -e, as Apptainer runs it (exports kept)
  %environment ENV for each `export NAME=VALUE` / `NAME=VALUE` line
  %labels      LABEL
  %runscript, %test, %help   /.train/NAME; the runscript is the ENTRYPOINT ("$@" its
               arguments), `train image test` runs the test
Anything else (UNSUPPORTED_SECTIONS) is an error, never dropped.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from train.common.errors import UsageError
from train.images.defs import DefError, DefFile

SCRIPT_DIR = "/.train"
BUILD_DIR = ".train-build"
_ENV_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
DOCKER_REF = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(?::[A-Za-z0-9_.-]+)?(?:@sha256:[0-9a-f]{64})?$")
# sections the translation refuses (lint names them too), and why
UNSUPPORTED_SECTIONS = {"setup": "runs as root on the build host, which Docker cannot do",
                        "pre": "runs on the build host before bootstrap, which Docker "
                               "cannot do",
                        "startscript": "is for Apptainer instances",
                        "app": "(SCIF apps) has no Docker equivalent"}


@dataclass
class Translation:
    dockerfile: str
    scripts: dict[str, str] = field(default_factory=dict)  # name in BUILD_DIR -> text
    env: list[tuple[str, str]] = field(default_factory=list)  # %environment, as written
    copies: list[tuple[str, str]] = field(default_factory=list)  # %files (src, dst)


def has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


# a %files source's rules, in order, the first it breaks reported: (broken, what lint says,
# what the translation says; "": not that reader's rule). Lint reads the source as Apptainer
# does; the translation refuses what it cannot stage (the build checks both).
_SOURCE_RULES: tuple[tuple[Callable[[str], bool], str, str], ...] = (
    (lambda src: not src, "an empty source", ""),
    (has_control, "", "holds a control character"),
    (lambda src: src.startswith("/"), "an absolute source reads the build host, not the "
     "repository", "is absolute: sources are relative to the repository root"),
    (lambda src: any(c in src for c in "$`") or src.startswith("~"),
     "Apptainer expands it as a shell word; name the path", ""),
    (lambda src: posixpath.normpath(src).split("/")[0] == "..", "escapes the repository", ""),
    (lambda src: ".." in PurePosixPath(src).parts, "",
     "uses '..': sources must stay inside the repository"),
    (lambda src: any(c in src for c in "*?["), "a glob; the Docker translation (CI's build) "
     "cannot expand it as Apptainer does, so name each path",
     "is a glob, which the Docker translation does not expand: name each file"),
    (lambda src: PurePosixPath(src).name in ("", "."), "",
     "names no file or folder by name (e.g. '.'): name the folder"),
)


def files_source_problem(src: str, lint: bool = False) -> str | None:
    """Why a %files source cannot be built from the repository root (by `train image
    lint`'s rules where `lint`), or None."""
    return next((why for broken, *whys in _SOURCE_RULES
                 if (why := whys[0 if lint else 1]) and broken(src)), None)


def files_destination_problem(dst: str) -> str | None:
    if has_control(dst):
        return "the destination holds a control character"
    clean = PurePosixPath("/" + dst.lstrip("/"))
    if ".." in clean.parts:
        return "the destination uses '..'"
    if clean == PurePosixPath(SCRIPT_DIR) or PurePosixPath(SCRIPT_DIR) in clean.parents:
        return f"{SCRIPT_DIR} is where the Docker translation stages its own files"
    return None


def quote_env(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./:,=@%+$-]*", value):
        return value
    return json.dumps(value)


def context_path(index: int, src: str) -> str:
    """Under files/: no source can land on the generated Dockerfile or scripts."""
    return f"files/{index}/{PurePosixPath(src).name}"


def environment_assignments(text: str, d: DefFile, number: int) -> list[tuple[str, str]]:
    """`export A="x y" B=2  # note` read as the shell reads it: [(A, "x y"), (B, "2")]."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as exc:
        raise DefError(d.path, number, f"%environment line cannot be read: {exc}") from None
    if words and words[0] == "export":
        words = words[1:]
    pairs = []
    for word in words:
        match = _ENV_RE.match(word)
        if not match:
            raise DefError(d.path, number, f"%environment line cannot become ENV: {text!r} "
                           "(use export NAME=VALUE)")
        pairs.append((match.group(1), match.group(2)))
    return pairs


def check_text(what: str, value: str) -> None:
    if has_control(value):
        raise UsageError(f"{what}: the value holds a control character (a newline would "
                         "inject an instruction into the build)")


# fills a build argument's {{ NAME }} in the text of a line: sub(text, line number)
_Sub = Callable[[str, int], str]


def translate(d: DefFile, build_args: Mapping[str, str] | None = None,
              localimages: Mapping[str, str] | None = None) -> Translation:
    for key, value in (build_args or {}).items():
        check_text(f"build-arg {key}", value)
    for key, value in (localimages or {}).items():
        check_text(f"localimage {key}", value)
        if not DOCKER_REF.match(value):
            raise UsageError(f"localimage {key}: {value[:80]!r} is not a docker image "
                             "reference (name[:tag] or name@sha256:...)")
    args = d.resolve_arguments(build_args or {})
    for name, section in d.sections.items():
        why = UNSUPPORTED_SECTIONS.get("app" if name.startswith("app") else name)
        if why:
            raise DefError(d.path, section.line, f"%{name} cannot be translated: it {why}")

    def sub(text: str, line: int) -> str:
        return d.substitute(text, args, line)

    lines = [f"# Generated from {d.path.name} by `train image translate`; do not edit.",
             "# build arguments: " + ", ".join(f"{k}={v}" for k, v in sorted(args.items())),
             _from_line(d, sub, localimages or {})]
    out = Translation(dockerfile="")
    for step in _STEPS:  # in the order of the Dockerfile's instructions
        lines += step(d, sub, out)
    out.dockerfile = "\n".join(lines) + "\n"
    return out


def _from_line(d: DefFile, sub: _Sub, localimages: Mapping[str, str]) -> str:
    bootstrap = d.header["bootstrap"][1].lower()
    from_line, from_value = d.header["from"]
    source = sub(from_value, from_line)
    if bootstrap == "docker":
        return f"FROM {source}"
    if bootstrap == "localimage":
        tag = localimages.get(source)
        if tag is None:
            raise DefError(d.path, from_line, f"localimage {source!r}: give the docker tag "
                           f"built from it (--localimage {source}=TAG)")
        return f"FROM {tag}"
    raise DefError(d.path, d.header["bootstrap"][0], f"Bootstrap: {bootstrap} cannot "
                   "be translated (docker and localimage can)")


def _copy_files(d: DefFile, sub: _Sub, out: Translation) -> list[str]:
    lines, moves = [], []
    for number, raw_src, raw_dst in d.files():
        src, dst = sub(raw_src, number), sub(raw_dst, number)
        dst = dst or "/" + src.lstrip("/")  # Apptainer: an empty destination is src's path
        problem = files_source_problem(src) or files_destination_problem(dst)
        if problem:
            raise DefError(d.path, number, f"%files {src} {dst}: {problem}")
        name = PurePosixPath(src).name
        staged = f"{SCRIPT_DIR}/files/{len(out.copies)}/{name}"
        out.copies.append((src, dst))
        lines.append(f"COPY {json.dumps([context_path(len(out.copies) - 1, src), staged])}")
        # makeParentDir: the whole path when DST ends in '/', else its parent
        parent = dst.rstrip("/") if dst.endswith("/") else str(PurePosixPath(dst).parent)
        moves.append(f"mkdir -p {shlex.quote(parent or '/')}\ncp -fLr {shlex.quote(staged)} "
                     f"{shlex.quote(dst)}")
    if moves:
        out.scripts["files"] = ("set -e\ncd /\n" + "\n".join(moves)
                                + f"\nrm -rf {SCRIPT_DIR}/files\n")
        lines += [f"COPY {BUILD_DIR}/files {SCRIPT_DIR}/build/files",
                  f'RUN ["/bin/sh", "-e", "{SCRIPT_DIR}/build/files"]']
    return lines


def _run_post(d: DefFile, sub: _Sub, out: Translation) -> list[str]:
    post = d.sections.get("post")
    if post is None or not post.text.strip():
        return []
    # Apptainer runs %post in / (Docker would use the base image's WORKDIR)
    out.scripts["post"] = "set -e\ncd /\n" + sub(post.text, post.line) + "\n"
    return [f"COPY {BUILD_DIR}/post {SCRIPT_DIR}/build/post",
            f"RUN [\"/bin/sh\", \"-e\", \"{SCRIPT_DIR}/build/post\"]"]


def _environment(d: DefFile, sub: _Sub, out: Translation) -> list[str]:
    """After %post: Apptainer applies %environment at run time only."""
    out.env += [pair for number, text in d.body("environment")
                for pair in environment_assignments(sub(text, number), d, number)]
    return [f"ENV {name}={quote_env(value)}" for name, value in out.env]


def _scripts(d: DefFile, sub: _Sub, out: Translation) -> list[str]:
    lines = []
    for name in ("runscript", "test", "help"):
        sec = d.sections.get(name)
        if sec is None:
            continue
        body = sub(sec.text, sec.line) + "\n"
        out.scripts[name] = body if name == "help" else "#!/bin/sh\n" + body
        lines.append(f"COPY {BUILD_DIR}/{name} {SCRIPT_DIR}/{name}")
    return lines


def _labels(d: DefFile, sub: _Sub, out: Translation) -> list[str]:
    return [f"LABEL {json.dumps(key)}={json.dumps(value.strip())}" for key, _, value in
            (sub(text, number).partition(" ") for number, text in d.body("labels"))]


def _entrypoint(d: DefFile, sub: _Sub, out: Translation) -> list[str]:
    return [f'ENTRYPOINT ["/bin/sh", "{SCRIPT_DIR}/runscript"]'] if "runscript" in out.scripts \
        else []


_STEPS: tuple[Callable[[DefFile, _Sub, Translation], list[str]], ...] = (
    _copy_files, _run_post, _environment, _scripts, _labels, _entrypoint)
