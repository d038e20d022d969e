"""`train image build --engine apptainer --base-sif SIF`: build a definition on a SIF of this
machine instead of the base its header names. The definition is built as written except
its header, which becomes `Bootstrap: localimage` / `From: SIF` (line numbers kept, so
Apptainer's messages point at the user's lines); Apptainer's own rules then apply to every
section (%files copied with `cp -fLr` onto the SIF's tree, the SIF's labels kept unless
the definition sets them)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from train.common.errors import UsageError
from train.images.defs import PLACEHOLDER_RE, DefFile

SIF_MAGIC = b"SIF_MAGIC"  # sylabs/sif: after the 32-byte launch line
_HEADER_BAD = ("#", "{{", "}}", "\\")  # a comment, a placeholder or a continuation there


def check_base_sif(value: Path) -> Path:
    """The --base-sif path, absolute, once checked (exit 2 otherwise)."""
    text = str(value)
    if not text or any(c in text for c in "\n\r\0") or any(b in text for b in _HEADER_BAD) \
            or text != text.strip():
        raise UsageError(f"--base-sif: {text[:80]!r} cannot be named in a definition's "
                         "header (no '#', '{{', '}}', '\\', control characters or edge "
                         "spaces): rename or link it")
    path = Path(os.path.abspath(value))
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a regular file"
        raise UsageError(f"--base-sif: {path} {what}: give a SIF file (e.g. one built by "
                         "`train image build base` or `apptainer build`)")
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise UsageError(f"--base-sif: {path} cannot be read: {exc.strerror or exc}") from None
    if head[32:41] != SIF_MAGIC:
        raise UsageError(f"--base-sif: {path} is not a SIF image (no SIF header: an "
                         "incomplete copy, or another file)")
    return path


def header_arguments(d: DefFile) -> set[str]:
    """The build arguments the header's From: names (replaced by --base-sif)."""
    return set(PLACEHOLDER_RE.findall(d.header["from"][1]))  # (parse requires From:)


def on_local_sif(d: DefFile, base: Path) -> str:
    """The definition's text with its header replaced by a localimage on `base`, the same
    number of lines before the first section."""
    first = min(n for s in d.sections.values() for n in (s.headers or [s.line]))
    header = ["Bootstrap: localimage", f"From: {base}"]
    header += [""] * max(0, first - 1 - len(header))
    return "\n".join(header + d.lines[first - 1:]) + "\n"


def used_arguments(text: str, build_args: Mapping[str, str]) -> dict[str, str]:
    """The build arguments the text still uses (Apptainer refuses an unused one)."""
    used = set(PLACEHOLDER_RE.findall(text))
    return {k: v for k, v in build_args.items() if k in used}
