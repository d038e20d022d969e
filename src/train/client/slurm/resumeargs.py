"""--resume-args placeholders: `{newest:GLOB}` in a word stands for the newest path that
matches GLOB when the chunk starts (relative to where the program runs), e.g.
`--resume_from_checkpoint {newest:out/checkpoint-*}` or `ckpt_path={newest:ckpt/*.ckpt}`.
The batch shell (job-lib-resume.sh) expands it; this module checks the syntax at submit so
that a malformed one is refused before anything is queued. Pure: no file is read."""

from __future__ import annotations

from train.common.errors import ConfigError

OPEN = "{newest:"
EXAMPLE = "'--resume_from_checkpoint {newest:out/checkpoint-*}'"


def patterns(words: tuple[str, ...] | list[str]) -> list[str]:
    """Every {newest:GLOB} pattern of the words, in order; ConfigError (resume_args) on a
    malformed one: unclosed, empty, holding a brace, a line break or NUL."""
    found: list[str] = []
    for word in words:
        rest = word
        while OPEN in rest:
            rest = rest[rest.index(OPEN) + len(OPEN):]
            if "}" not in rest:
                raise ConfigError("resume_args", f"{word!r}: a {OPEN}GLOB}} placeholder is "
                                  f"not closed with '}}', e.g. {EXAMPLE}")
            pattern, rest = rest.split("}", 1)
            if not pattern.strip():
                raise ConfigError("resume_args", f"{word!r}: the {OPEN}GLOB}} placeholder "
                                  f"names no path pattern, e.g. {EXAMPLE}")
            if "{" in pattern:
                raise ConfigError("resume_args", f"{word!r}: a {OPEN}GLOB}} placeholder "
                                  "cannot hold a brace (nor another placeholder)")
            found.append(pattern)
        # {newest}, {newest x}, {NEWEST:x}, {newest=x}: never a placeholder, passed as written
        if word.lower().count("{newest") != word.count(OPEN):
            raise ConfigError("resume_args", f"{word!r}: write the placeholder as "
                              f"{OPEN}GLOB}}, e.g. {EXAMPLE}")
    return found
