"""The placeholders of a job's words (what they stand for: --resume-args' and --sweep's
help), checked at submit so that a malformed one is refused before anything is queued;
the chain engine (train.batch.saves) expands `{newest:GLOB}`. A sweep's `{value}`,
`{index}` and `{task_dir}` (train.client.slurm.sweepargs puts them in) may stand inside
GLOB. A placeholder written with doubled braces (`{{value}}`, `{{newest:GLOB}}`) is its
letters with single braces, as plain text; every other brace is passed as written (a JSON
argument's `}}` too). Pure: no file is read."""

from __future__ import annotations

import itertools
import re

from train.common.errors import ConfigError

OPEN = "{newest:"
EXAMPLE = "'--resume_from_checkpoint {newest:out/checkpoint-*}'"
MARKER_NAMES = ("value", "index", "task_dir")
_NAMES = "|".join(MARKER_NAMES)
# text, an escaped placeholder ({{value}}), a marker ({value}), or {newest:GLOB} whose
# GLOB holds no brace but markers'
_PIECE = re.compile(r"\{\{((?:" + _NAMES + r")|newest:[^{}]*)\}\}"
                    r"|\{(" + _NAMES + r")\}"
                    r"|\{newest:((?:[^{}]|\{(?:" + _NAMES + r")\})*)\}")

TEXT, MARKER, NEWEST = "text", "marker", "newest"


def _split(word: str) -> list[tuple[str, str]]:
    """The word's pieces, an escaped placeholder as ("escaped", its letters)."""
    out: list[tuple[str, str]] = []
    at = 0
    for found in _PIECE.finditer(word):
        escaped, marker, glob = found.groups()
        if found.start() > at:
            out.append((TEXT, word[at:found.start()]))
        if escaped is not None:
            out.append(("escaped", "{" + escaped + "}"))
        else:
            out.append((MARKER, marker) if marker is not None else (NEWEST, glob))
        at = found.end()
    if at < len(word):
        out.append((TEXT, word[at:]))
    return out


def pieces(word: str) -> list[tuple[str, str]]:
    """The word as (kind, text) pieces, in order: TEXT (an escaped placeholder already
    its letters), MARKER (its name: value, index, task_dir) or NEWEST (its GLOB, markers
    and all)."""
    out: list[tuple[str, str]] = []
    for text, group in itertools.groupby(_split(word), lambda p: p[0] in ("escaped", TEXT)):
        found = list(group)
        out += [(TEXT, "".join(t for _, t in found))] if text else found
    return out


def patterns(words: tuple[str, ...] | list[str]) -> list[str]:
    """Every {newest:GLOB} pattern of the words, in order; ConfigError (resume_args) on a
    malformed one: unclosed, empty, or holding a brace (other than a sweep's markers)."""
    found: list[str] = []
    for word in words:
        for kind, text in _split(word):
            if kind == NEWEST:
                if not text.strip():
                    raise ConfigError("resume_args", f"{word!r}: the {OPEN}GLOB}} "
                                      f"placeholder names no path pattern, e.g. {EXAMPLE}")
                found.append(text)
            elif kind == TEXT and OPEN in text:
                if "}" not in text[text.index(OPEN):]:
                    raise ConfigError("resume_args", f"{word!r}: a {OPEN}GLOB}} placeholder "
                                      f"is not closed with '}}', e.g. {EXAMPLE}")
                raise ConfigError("resume_args", f"{word!r}: a {OPEN}GLOB}} placeholder "
                                  "cannot hold a brace (nor a placeholder other than a "
                                  "sweep's {value}, {index} or {task_dir})")
            elif kind == TEXT and "{newest" in text.lower():
                # {newest}, {newest x}, {NEWEST:x}, {newest=x}: never a placeholder
                raise ConfigError("resume_args", f"{word!r}: write the placeholder as "
                                  f"{OPEN}GLOB}}, e.g. {EXAMPLE}")
    return found
