"""Dataclass fields as options: the one table a config class (the job spec, every workload's
config) is declared in with `opt`, and what is generated from it: checks, coercion, the YAML
loader, command-line flags and their help. Light: the login node imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from train.common import yamlio
from train.common.errors import ConfigError, UsageError
from train.common.yamlio import shown

_T = TypeVar("_T")


def opt(default: Any, doc: str, *, kind: type, choices: tuple[str, ...] | None = None,
        minimum: float | None = None, positive: bool = False, optional: bool = False,
        identity: bool = True, short: str | None = None) -> Any:
    """A config field; `identity` fields must match when a run resumes from a checkpoint;
    `short`: a one-letter flag too (sbatch's letters where sbatch has one)."""
    return field(default=default, metadata={
        "doc": doc, "kind": kind, "choices": choices, "minimum": minimum,
        "positive": positive, "optional": optional, "identity": identity, "short": short})


def _type_name(f: dataclasses.Field[Any]) -> str:
    kind = f.metadata["kind"]
    name = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            tuple: "a list of integers", list: "a list of strings"}[kind]
    return f"{name} or null" if f.metadata["optional"] else name


def check_value(f: dataclasses.Field[Any], value: Any) -> None:
    meta = f.metadata
    if value is None:
        if not meta["optional"]:
            raise ConfigError(f.name, f"must be {_type_name(f)}, got null")
        return
    kind = meta["kind"]
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, float),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        tuple: isinstance(value, tuple)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        list: isinstance(value, tuple) and all(isinstance(v, str) for v in value),
    }[kind]
    if not ok:
        raise ConfigError(f.name, f"must be {_type_name(f)}, got {shown(value)}")
    if meta["choices"] is not None and value not in meta["choices"]:
        allowed = ", ".join(meta["choices"])
        raise ConfigError(f.name, f"must be one of {allowed}; got {shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f.name, f"must be a finite number, got {value}")
    if isinstance(value, (int, float)):
        if meta["positive"] and value <= 0:
            raise ConfigError(f.name, f"must be greater than 0, got {value}")
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise ConfigError(f.name, f"must be at least {meta['minimum']}, got {value}")
    if kind is str and not value:
        raise ConfigError(f.name, "must not be empty")
    # no path, argument or environment value can hold one (the OS ends strings there)
    if any("\0" in v for v in ((value,) if kind is str else value if kind is list else ())):
        raise ConfigError(f.name, f"must not hold a NUL byte, got {shown(value)}")


_INT_RE = re.compile(r"^[+-]?\d+$")
_BOOL_WORDS = {"true": True, "yes": True, "1": True, "on": True,
               "false": False, "no": False, "0": False, "off": False}


def _coerce(f: dataclasses.Field[Any], value: Any, *, from_text: bool) -> Any:
    """`value` as its field's kind where it reads as one (a flag's text, a YAML integer
    for a number); any other value is returned as it is, for check_value to refuse."""
    kind = f.metadata["kind"]
    if value is None or (from_text and f.metadata["optional"] and value in ("", "none", "null")):
        return None
    if kind is tuple:
        return _coerce_ints(f.name, value)
    if kind is list and isinstance(value, (list, tuple)):
        return tuple(str(v) if isinstance(v, (int, float, str)) and not isinstance(v, bool)
                     else v for v in value)
    if from_text and kind is not list:
        text = str(value).strip()
        if kind is bool:
            if text.lower() not in _BOOL_WORDS:
                raise ConfigError(f.name, f"must be true or false, got {shown(value)}")
            return _BOOL_WORDS[text.lower()]
        if kind is int:
            if not _INT_RE.match(text):
                raise ConfigError(f.name, f"must be an integer, got {shown(value)}")
            return _int(f.name, text)
        if kind is float:
            try:
                return float(text)
            except ValueError:
                raise ConfigError(f.name, f"must be a number, got {shown(value)}") from None
        return text
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer past the largest float (about 1.8e308)
            raise ConfigError(f.name, f"must be a finite number, got {shown(value)}") from None
    return value


def _int(name: str, text: str) -> int:
    """int(text) for text that matched _INT_RE; beyond Python's limit on the digits it
    converts (4300) a ConfigError, not a ValueError."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(name, f"{len(text)} digits is too long for an integer") from None


def _coerce_ints(name: str, value: Any) -> Any:
    """One integer, a list of them, or their text ("4 6 8", "4,6"), as a tuple."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, str):
        parts = [p for p in re.split(r"[\s,]+", value.strip()) if p]
        if not parts or not all(_INT_RE.match(p) for p in parts):
            raise ConfigError(name, f'must be integers such as "4 6 8", got {shown(value)}')
        return tuple(_int(name, p) for p in parts)
    return tuple(value) if isinstance(value, list) else value


def load_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping; a missing file or a non-mapping is a usage error."""
    data = yamlio.load_file(path, "config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of keys to values")
    return data


def build(cls: type[_T], file_values: Mapping[str, Any] | None = None,
          flag_values: Mapping[str, Any] | None = None) -> _T:
    """Merge defaults < YAML values < flag values into a validated `cls`."""
    by_name = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    merged: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        name = str(key).replace("-", "_")
        if name not in by_name:
            valid = ", ".join(sorted(by_name))
            raise ConfigError(_key_name(key), f"unknown config key; valid keys are: {valid}")
        merged[name] = _coerce(by_name[name], value, from_text=False)
    for name, text in (flag_values or {}).items():
        merged[name] = _coerce(by_name[name], text, from_text=isinstance(text, str))
    return cls(**merged)


def _key_name(key: Any) -> str:
    """An unknown key as the error's field: as written when it reads as one (a short
    line of printable text), else quoted and cut (an empty key, a NUL, a line break)."""
    text = str(key)
    if text and len(text) <= 60 and text.isprintable() and text.strip() == text:
        return text
    return shown(key)


def check_writable_dir(path: Path, field_name: str) -> None:
    """A ConfigError unless `path` is, or can be created as, a writable directory (nothing
    is created: the check walks up to the nearest existing ancestor)."""
    probe = path.absolute()
    try:
        while not probe.exists():
            if probe.is_symlink():
                raise ConfigError(field_name, f"{path} is a dangling symlink")
            parent = probe.parent
            if parent == probe:
                break
            probe = parent
        is_dir = probe.is_dir()
    except OSError as exc:  # a name too long for the file system, a link loop
        raise ConfigError(field_name, f"cannot use {shown(str(path))}: "
                          f"{exc.strerror or exc}") from None
    if not is_dir:
        raise ConfigError(field_name, f"cannot create {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(field_name, f"cannot write to {path}: {probe} is not writable")
    # access() trusts permission bits (root passes them all); a real file settles it
    try:
        fd, name = tempfile.mkstemp(prefix=".train-probe-", dir=probe)
    except OSError as exc:
        raise ConfigError(field_name, f"cannot write to {path}: {probe}: "
                          f"{exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(name)
    if probe == path.absolute() and not os.access(probe, os.R_OK):
        raise ConfigError(field_name, f"cannot read {path}")


# -- command-line arguments -----------------------------------------------------------
# Flags are generated from the same field table, so every side (the CLI, the job's checks
# on the login node, a workload in the container) parses a config class's arguments alike.


class FlagParser(argparse.ArgumentParser):
    """argparse without its guesses: a flag is taken only when spelled out in full (no
    prefix matching: `--gpus 4` is not `--gpus-per-node 4`), and an unknown flag is
    refused with the nearest valid one suggested. Subcommand parsers inherit both."""

    unknown_hint: Callable[[argparse.Namespace, list[str]], str | None] | None = None  # own error

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = getattr(chosen := self._parser_for(parsed), "unknown_hint", None)
            chosen.error((hint and hint(parsed, extras)) or unknown_message(extras, chosen))
        return parsed

    def _parser_for(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The subcommand's parser where there is one (its flags are the ones to suggest)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest or "", None)
                chosen = action.choices.get(name) if name else None
                if isinstance(chosen, FlagParser):
                    return chosen._parser_for(parsed)
        return self


def unknown_message(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """'unrecognized arguments: ...' with the nearest valid flag for each unknown one."""
    import difflib

    known = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    hints = []
    for arg in extras:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        # a prefix is what argparse used to guess from: name what it was short for
        close = [k for k in known if k.startswith(flag)][:1] or \
            difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        hints.append(f"{flag}: did you mean {close[0]}?" if close else
                     f"{flag}: not a flag of {parser.prog} (see {parser.prog} --help)")
    if parser.prog.split()[-1] in ("render", "submit"):
        # `train render -g 1 sc2 --episodes 10`: the workload's options were meant
        hints.append(f"a workload and its own options go after `--`: {parser.prog} "
                     "[options] -- WORKLOAD [ARG ...]")
    elif parser.prog.split()[-1] == "run" and any(a.startswith("-") for a in extras):
        # `train render -- demo -g 1 -t 30`: the job's options were put after `--`
        hints.append("after `--` come the workload's own options (train run --help); those "
                     "of train render/submit go before `--`")
    text = "unrecognized arguments: " + " ".join(extras)
    return text + ("; " + "; ".join(hints) if hints else "")


class ArgumentParser(FlagParser):
    """Raises UsageError instead of exiting, for parsers used on nested argument lists."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def default_text(f: Any) -> str:
    """The help's one statement of a field's default, where the doc does not say it."""
    meta = f.metadata
    if re.search(r"\bdefault\b", meta["doc"], re.IGNORECASE):
        return ""
    flag = f.name.replace("_", "-")
    if meta["kind"] is bool:
        return f" (default: on; --no-{flag} turns it off)" if f.default else ""
    if f.default is None or f.default == ():
        return ""
    if isinstance(f.default, tuple):
        return f" (default: {' '.join(map(str, f.default))})"
    return f" (default: {f.default})"


def add_fields(p: argparse.ArgumentParser, cls: type[Any], skip: Sequence[str],
               group: Callable[[str], Any] | None = None) -> None:
    """One flag per config field; `group(name)`: the argument group of a field's flag."""
    for f in fields(cls):
        if f.name in skip:
            continue
        meta = f.metadata
        help_text = meta["doc"]
        if meta["choices"] and not all(c in help_text for c in meta["choices"]):
            help_text += f" Choices: {', '.join(meta['choices'])}."
        help_text += default_text(f)
        flag = "--" + f.name.replace("_", "-")
        flags = [meta["short"], flag] if meta.get("short") else [flag]
        target = group(f.name) if group is not None else p
        # a number is N; a name says what the value is
        metavar = "N" if meta["kind"] in (int, float) else f.name.upper()
        if meta["kind"] is bool:
            target.add_argument(*flags, dest=f.name, action="store_const", const="true",
                                default=None, help=help_text)
            target.add_argument("--no-" + flag[2:], dest=f.name, action="store_const",
                                const="false", default=None, help=argparse.SUPPRESS)
        else:  # a list's flag may repeat: --env A --env B=1
            target.add_argument(*flags, dest=f.name, default=None, metavar=metavar,
                                action="append" if meta["kind"] is list else "store",
                                help=help_text)


def flags_from(args: argparse.Namespace, cls: type[Any], skip: Sequence[str]
               ) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in fields(cls)
            if f.name not in skip and getattr(args, f.name, None) is not None}
