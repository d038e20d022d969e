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
  %runscript   /.train/runscript, the ENTRYPOINT (arguments reach it as "$@")
  %test        /.train/test (run by `train image test`)
  %labels      LABEL
  %help        /.train/help
Anything else (%setup and %pre run on the host, %startscript, the %app* sections) is an
error, never dropped.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from train.images.defs import DefError, DefFile

SCRIPT_DIR = "/.train"
BUILD_DIR = ".train-build"
_ENV_RE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_UNSUPPORTED = {"setup": "runs on the build host, which Docker cannot do",
                "pre": "runs on the build host before bootstrap, which Docker cannot do",
                "startscript": "is for Apptainer instances",
                "app": "(SCIF apps) has no Docker equivalent"}


@dataclass
class Translation:
    dockerfile: str
    scripts: dict[str, str] = field(default_factory=dict)  # name in BUILD_DIR -> text
    copies: list[tuple[str, str]] = field(default_factory=list)  # %files (src, dst)


def files_source_problem(src: str) -> str | None:
    """Why a %files source cannot be built from the repository, or None. Sources resolve
    from the repository root (where `apptainer build` must run); the translation refuses
    what would read outside it, globs (Docker's COPY expands them differently) and control
    characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in src):
        return "holds a control character"
    if src.startswith("/"):
        return "is absolute: sources are relative to the repository root"
    if ".." in PurePosixPath(src).parts:
        return "uses '..': sources must stay inside the repository"
    if any(c in src for c in "*?["):
        return "is a glob, which the Docker translation does not expand: name each file"
    return None


def _quote_env(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./:,=@%+$-]*", value):
        return value
    return json.dumps(value)


def translate(d: DefFile, build_args: Mapping[str, str] | None = None,
              localimages: Mapping[str, str] | None = None) -> Translation:
    args = d.resolve_arguments(build_args or {})
    for name, section in d.sections.items():
        why = _UNSUPPORTED.get("app" if name.startswith("app") else name)
        if why:
            raise DefError(d.path, section.line, f"%{name} cannot be translated: it {why}")

    def sub(text: str, line: int) -> str:
        return d.substitute(text, args, line)

    lines = [f"# Generated from {d.path.name} by `train image translate`; do not edit.",
             "# build arguments: " + ", ".join(f"{k}={v}" for k, v in sorted(args.items()))]
    bootstrap = d.header["bootstrap"][1].lower()
    from_line, from_value = d.header["from"]
    source = sub(from_value, from_line)
    if bootstrap == "docker":
        lines.append(f"FROM {source}")
    elif bootstrap == "localimage":
        tag = (localimages or {}).get(source)
        if tag is None:
            raise DefError(d.path, from_line, f"localimage {source!r}: give the docker tag "
                           f"built from it (--localimage {source}=TAG)")
        lines.append(f"FROM {tag}")
    else:
        raise DefError(d.path, d.header["bootstrap"][0], f"Bootstrap: {bootstrap} cannot "
                       "be translated (docker and localimage can)")
    out = Translation(dockerfile="")
    files = d.sections.get("files")
    moves = []
    for number, text in files.body() if files else []:
        parts = sub(text, number).split()
        if len(parts) not in (1, 2):
            raise DefError(d.path, number, f"%files lines are 'src [dst]', got {text!r}")
        src = parts[0]
        dst = parts[1] if len(parts) == 2 else "/" + src.lstrip("/")  # Apptainer: same path
        problem = files_source_problem(src)
        if problem:
            raise DefError(d.path, number, f"%files source {src!r} {problem}")
        staged = f"{SCRIPT_DIR}/files/{len(out.copies)}/{PurePosixPath(src).name}"
        out.copies.append((src, dst))
        lines.append(f"COPY {json.dumps([src, staged])}")
        # makeParentDir: the whole path when DST ends in '/', else its parent
        parent = dst.rstrip("/") if dst.endswith("/") else str(PurePosixPath(dst).parent)
        moves.append(f"mkdir -p {shlex.quote(parent)}\ncp -fLr {shlex.quote(staged)} "
                     f"{shlex.quote(dst)}")
    if moves:
        out.scripts["files"] = "set -e\n" + "\n".join(moves) + f"\nrm -rf {SCRIPT_DIR}/files\n"
        lines += [f"COPY {BUILD_DIR}/files {SCRIPT_DIR}/build/files",
                  f'RUN ["/bin/sh", "-e", "{SCRIPT_DIR}/build/files"]']
    post = d.sections.get("post")
    if post is not None and post.text.strip():
        out.scripts["post"] = "set -e\n" + sub(post.text, post.line) + "\n"
        lines += [f"COPY {BUILD_DIR}/post {SCRIPT_DIR}/build/post",
                  f"RUN [\"/bin/sh\", \"-e\", \"{SCRIPT_DIR}/build/post\"]"]
    # after %post: Apptainer applies %environment at run time only
    env = d.sections.get("environment")
    for number, text in env.body() if env else []:
        match = _ENV_RE.match(sub(text, number))
        if not match:
            raise DefError(d.path, number, f"%environment line cannot become ENV: {text!r} "
                           "(use export NAME=VALUE)")
        lines.append(f"ENV {match.group(1)}={_quote_env(match.group(2))}")
    for name in ("runscript", "test", "help"):
        sec = d.sections.get(name)
        if sec is None:
            continue
        body = sub(sec.text, sec.line) + "\n"
        out.scripts[name] = body if name == "help" else "#!/bin/sh\n" + body
        lines.append(f"COPY {BUILD_DIR}/{name} {SCRIPT_DIR}/{name}")
    labels = d.sections.get("labels")
    for number, text in labels.body() if labels else []:
        key, _, value = sub(text, number).partition(" ")
        lines.append(f"LABEL {json.dumps(key)}={json.dumps(value.strip())}")
    if "runscript" in out.scripts:
        lines.append(f'ENTRYPOINT ["/bin/sh", "{SCRIPT_DIR}/runscript"]')
    out.dockerfile = "\n".join(lines) + "\n"
    return out
