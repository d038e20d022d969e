"""Atomic JSON files with values converted to builtin types, and JSON objects read back
without trusting the file (bounded, as train.batch.saves.read_small reads a run's files);
no heavy imports, so the login-node commands (render, submit, status) start fast. The
standard library only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from train.batch.saves import read_small
from train.common.safewrite import write_atomic


def to_builtin(value: Any) -> Any:
    """Recursively convert NumPy/torch values to int, float, bool, str, list, dict."""
    if isinstance(value, dict):
        return {str(k): to_builtin(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_builtin(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "tolist"):  # NumPy arrays and scalars, torch tensors
        return to_builtin(value.tolist())
    if hasattr(value, "item"):
        return value.item()
    return value


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2,
                      sort_keys: bool = True, fsync: bool = True) -> None:
    """`data` (to_builtin, strict JSON: NaN is a ValueError) and a newline in place of
    `path` at once (safewrite.write_atomic). The folder is made where missing; on any
    failure the old file stays as it was."""
    text = json.dumps(to_builtin(data), indent=indent, sort_keys=sort_keys,
                      allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, fsync=fsync)


def parse_json_object(raw: bytes, *, parse_constant: Callable[[str], Any] | None = None
                      ) -> dict[str, Any]:
    """The JSON object in `raw` (UTF-8); {} for anything else: not UTF-8, not JSON, nested
    past the parser's depth, or JSON of another kind. `parse_constant` as json.loads'."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=parse_constant)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def read_json_object(path: Path, limit: int | None, *,
                     parse_constant: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """The JSON object in a regular file of at most `limit` bytes (None: of any size); {}
    where it is missing, not a regular file (never blocks on a FIFO), unreadable, over the
    limit or not a JSON object (parse_json_object)."""
    raw = read_small(str(path), 1 << 62 if limit is None else limit + 1)
    if raw is None or (limit is not None and len(raw) > limit):
        return {}
    return parse_json_object(raw, parse_constant=parse_constant)
