"""SLURM's time and memory formats, as sbatch reads them: parsed to whole minutes and
megabytes, and written back in the form a job script uses."""

from __future__ import annotations

import re

from train.common.errors import ConfigError
from train.common.yamlio import shown

# Every pattern here is used with fullmatch: `$` would let a trailing newline through.
# (at most 12 digits a number: int() refuses thousands, and no walltime or memory needs more)
_TIME_RE = re.compile(r"(?:([0-9]{1,12})-)?([0-9]{1,12})(?::([0-9]{1,12}))?(?::([0-9]{1,12}))?")
_MEM_RE = re.compile(r"([0-9]{1,12})([KMGTkmgt]?)[Bb]?")  # ASCII units only (no Kelvin sign)


def parse_time(text: str | int, field_name: str = "time") -> int:
    """SLURM time formats -> whole minutes (seconds round up), as sbatch reads them."""
    value = str(text)
    match = _TIME_RE.fullmatch(value)
    if not match:
        raise ConfigError(field_name, f"{shown(value)} is not a SLURM time (MM, MM:SS, "
                          "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    days, a, b, c = match.groups()
    if days is None:
        if b is None:  # minutes
            minutes, seconds = int(a), 0
        elif c is None:  # minutes:seconds
            minutes, seconds = int(a), int(b)
        else:  # hours:minutes:seconds
            minutes, seconds = int(a) * 60 + int(b), int(c)
        return minutes + (1 if seconds else 0)
    hours = int(a)
    minutes = int(b) if b is not None else 0
    seconds = int(c) if c is not None else 0
    return int(days) * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def format_time(minutes: int) -> str:
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


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
