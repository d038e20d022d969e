"""Slurm's compressed node lists (`gpu[01-03,07],login5`) expanded with the standard
library alone: `train launch` uses python-hostlist where it is installed, and this in an
image that has neither it nor `train` (the bound launcher, train.node.nodeentry)."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")


def _split_top(text: str) -> list[str]:  # on the commas outside brackets
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth != 0:
        raise ValueError(f"unbalanced '[' in {text!r}")
    parts.append(current)
    return [p for p in parts if p]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    out: list[str] = []
    for item in match.group(1).split(","):
        found = _RANGE.match(item.strip())
        if found is None:
            raise ValueError(f"bad range {item!r} in {name!r}")
        low, high = found.group(1), found.group(2) or found.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} goes down in {name!r}")
        width = len(low)
        for number in range(int(low), int(high) + 1):
            for rest in _expand_one(tail):  # a second bracket later in the name
                out.append(f"{head}{number:0{width}d}{rest}")
    return out


def expand(text: str) -> list[str]:
    """Every node name of a list, in order; ValueError for a malformed one."""
    names: list[str] = []
    for part in _split_top(text.strip()):
        names += _expand_one(part)
    return names


def expand_nodes(raw: str) -> list[str]:
    """python-hostlist where it is installed; either raises for a malformed list."""
    try:
        import hostlist
    except ImportError:
        return expand(raw)
    return list(hostlist.expand_hostlist(raw))
