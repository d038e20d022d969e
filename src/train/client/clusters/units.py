"""SLURM's time and memory formats, as sbatch reads them: parsed to whole minutes and
megabytes, and written back in the form a job script uses."""

from __future__ import annotations

import re

from train.common.errors import ConfigError
from train.common.yamlio import shown

# Every pattern here is used with fullmatch: `$` would let a trailing newline through.
# (at most 12 digits a number: int() refuses thousands, and no walltime or memory needs more)
_TIME_RE = re.compile(r"(?:([0-9]{1,12})-)?([0-9]{1,12})(?::([0-9]{1,12}))?(?::([0-9]{1,12}))?")
_TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_MEM_RE = re.compile(r"([0-9]{1,12})([KMGTkmgt]?)[Bb]?")  # ASCII units only (no Kelvin sign)


def parse_time(text: str | int, field_name: str = "time") -> int:
    """SLURM time formats -> whole minutes (seconds round up), as sbatch reads them."""
    value = str(text)
    match = _TIME_RE.fullmatch(value)
    if not match:
        raise ConfigError(field_name, f"{shown(value)} is not a SLURM time ({_TIME_FORMS})")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        d, h, m, sec = int(days), int(a), int(b or 0), int(c or 0)
        bounded = [("hours", h, 23), ("minutes", m, 59), ("seconds", sec, 59)]
    elif c is not None:  # HH:MM:SS
        d, h, m, sec = 0, int(a), int(b), int(c)
        bounded = [("minutes", m, 59), ("seconds", sec, 59)]
    else:  # MM[:SS]
        d, h, m, sec = 0, 0, int(a), int(b or 0)
        bounded = [("seconds", sec, 59)]
    # only the first number may run over its unit (90 minutes, 36:00:00): a later one past
    # it (1-99:99:99) is a slip that Slurm would silently carry into the next unit
    for what, number, top in bounded:
        if number > top:
            raise ConfigError(field_name, f"{shown(value)}: {number} {what} is more than "
                              f"{top}; a SLURM time is {_TIME_FORMS}, and only its first "
                              "number may exceed its unit")
    return d * 1440 + h * 60 + m + (1 if sec else 0)


def format_time(minutes: int) -> str:
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def format_limit(minutes: int | None) -> str | None:
    """format_time, where None (no limit) stays None."""
    return None if minutes is None else format_time(minutes)


def parse_mem(text: str | int, field_name: str = "mem", *, allow_zero: bool = False) -> int:
    """'50G', '8000M', '8000' (MB, as sbatch) -> megabytes. 0 only with allow_zero (for
    --mem, where Slurm reads it as all of the node's memory)."""
    value = str(text)
    match = _MEM_RE.fullmatch(value)
    if not match:
        raise ConfigError(field_name, f"{shown(value)} is not a memory size such as 50G or "
                          "8000M")
    number, unit = int(match.group(1)), match.group(2).upper()
    if number == 0:
        if allow_zero:
            return 0
        raise ConfigError(field_name, f"{shown(value)}: must be more than 0")
    factor = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return max(1, int(number * factor))


def format_mem(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"
