"""The user's defaults for jobs (cluster, account, runtime, image, binds, env, ...): one
YAML file, `~/.config/train/defaults.yaml` (or `$XDG_CONFIG_HOME/train/...`, or the file
`$TRAIN_DEFAULTS` names), holding job keys as a job YAML does; `train init` writes it. A
job is built from the field defaults < this file < the job file < the flags.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from train.client.slurm.jobitems import parse_bind
from train.client.slurm.jobspec import JobSpec
from train.common.errors import ConfigError, UsageError
from train.common.fields import build, load_yaml
from train.common.safewrite import keep_copy, write_atomic

PATH_VAR = "TRAIN_DEFAULTS"
# The keys `train init` asks about, in order; any job key may be set in the file by hand.
ASKED = ("cluster", "account", "partition", "runtime", "image", "python", "bind", "env")


def defaults_path() -> Path:
    if os.environ.get(PATH_VAR):
        return Path(os.environ[PATH_VAR]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "train" / "defaults.yaml"


def normalise(values: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in values.items()}


def load_defaults(path: Path | None = None) -> dict[str, Any]:
    """The file's keys (none when it does not exist); a bad file is an error naming it."""
    path = path or defaults_path()
    try:
        if not path.exists():
            return {}
    except OSError as exc:  # a folder on the way that this user cannot enter
        raise ConfigError("defaults", f"cannot read the defaults file {path}: "
                          f"{exc.strerror}; set {PATH_VAR} to a file of yours, or unset "
                          "it") from None
    values = normalise(load_yaml(path))
    known = set(JobSpec.__dataclass_fields__) - set(NOT_DEFAULTS)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(unknown[0], f"unknown key in the defaults file {path}; valid keys "
                          f"are: {', '.join(sorted(known))}")
    return values


# list keys add up (defaults, then the job file, then flags); other keys are replaced
LISTS = ("env", "bind", "sbatch_extra", "srun_extra")
# keys that name one run: a default would make every job share them
NOT_DEFAULTS = ("name", "out", "workload")


def joined(earlier: Any, later: Any) -> list[Any]:
    """A list key's values: the earlier layer's, then the later one's, each once (items
    that are not text or numbers are kept as they are, for the job's check to name)."""
    out: list[Any] = []
    for item in [*earlier, *later]:
        if item not in out:
            out.append(item)
    return out


def merged(defaults: Mapping[str, Any], job_file: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults < the job file, key by key; the list keys are concatenated."""
    out: dict[str, Any] = {}
    for layer in (normalise(defaults), normalise(job_file)):
        for key, value in layer.items():
            if key in LISTS and isinstance(value, (list, tuple)) and \
                    isinstance(out.get(key), (list, tuple)):
                out[key] = joined(out[key], value)
            else:
                out[key] = value
    return out


def ask(profiles: list[str], current: Mapping[str, Any],
        read: Callable[[str], str] = input) -> dict[str, Any]:
    """Questions on a terminal; an empty answer keeps the current value, '-' clears it."""
    answers: dict[str, Any] = dict(current)
    hints = {"cluster": f"one of {', '.join(profiles)}", "runtime": "none, apptainer or docker",
             "bind": "SRC[:DST[:ro]], comma-separated", "env": "NAME or NAME=VALUE, "
             "comma-separated", "image": "SIF path or docker tag",
             "python": "Python on the nodes or in the image"}
    for key in ASKED:
        now = current.get(key)
        shown = ", ".join(now) if isinstance(now, list) else ("" if now is None else now)
        try:
            text = read(f"{key} ({hints.get(key, 'empty to skip')}) [{shown}]: ").strip()
        except EOFError:  # Ctrl-D, or a terminal's input closed
            raise UsageError("init: the input ended before the questions did: nothing was "
                             "written") from None
        if text == "-":
            answers.pop(key, None)
        elif text:
            answers[key] = [t.strip() for t in text.split(",") if t.strip()] \
                if key in ("bind", "env") else text
    return answers


def write_defaults(values: Mapping[str, Any], profiles: list[str], path: Path
                   ) -> tuple[Path, Path | None]:
    """Validate, then write atomically (nothing is written when a value is bad), changing
    only the lines of the keys it sets (`edited`); the earlier file is kept first as a
    numbered copy. Returns the file written (a link's target) and the copy, if any."""
    clean = {k: v for k, v in normalise(values).items() if v is not None and v != []}
    if not clean:
        raise UsageError("init: nothing to write: give flags (e.g. --cluster NAME), or run "
                         "it on a terminal to be asked")
    for key in NOT_DEFAULTS:
        if key in clean:
            raise ConfigError(key, "names one run: it cannot be a default for every job")
    if "bind" in clean:  # a default bind means the same path from any directory
        binds = [parse_bind(str(b)) for b in clean["bind"]]
        for bind in binds:
            if not os.path.exists(bind.src):
                raise ConfigError("bind", f"{bind.src} does not exist")
        clean["bind"] = [b.spec for b in binds]
    # the same for a relative image file (not a docker tag) or Python path named here
    image, python = str(clean.get("image", "")), str(clean.get("python", ""))
    if image and not os.path.isabs(image) and (image.endswith(".sif") or
                                                os.path.exists(image)):
        clean["image"] = os.path.abspath(image)
    if "/" in python and not os.path.isabs(python):
        clean["python"] = os.path.abspath(python)
    # validated as a job would be: every key and value, and the cluster's name
    build(JobSpec, {**clean, "workload": ["demo"]}, None)
    if clean.get("cluster") is not None and clean["cluster"] not in profiles:
        raise ConfigError("cluster", f"unknown cluster {clean['cluster']!r}; known: "
                          f"{', '.join(profiles)}")
    # a dotfiles link stays a link: the file it names is the one rewritten
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if path.is_symlink() and not target.exists():
        raise UsageError(f"init: the defaults file {path} is a link to {target}, which does "
                         "not exist: create that file (it may be empty) or remove the link, "
                         "then run init again")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        old = target.read_text(encoding="utf-8") if target.exists() else ""
        text = edited(old, clean)
        if text == old:
            return target, None
        kept = keep_copy(target) if old else None
        write_atomic(target, text)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"init: cannot write {target}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    return target, kept


_HEADER = "# train defaults (`train init`); any job key may be set here\n"
# a key at the line's start (a top-level key of the file's mapping)
_KEY_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)[ \t]*:(?=[ \t\r\n]|$)")


def edited(old: str, values: Mapping[str, Any]) -> str:
    """The defaults file's text `old` with exactly `values` set: a key's lines replaced
    where they stand (unless they hold that value already), a key no longer set removed, a
    new key added at the end; comments and blank lines stay. A file this cannot edit line
    by line (one that does not load, or would then load otherwise) is written anew (the
    caller keeps a copy of the old one)."""
    lines = old.splitlines(keepends=True)
    out: list[str] = []
    done: set[str] = set()
    i = 0
    while i < len(lines):
        found = _KEY_LINE.match(lines[i])
        end = i + 1
        if found is None:
            out.append(lines[i])
            i = end
            continue
        # its value's lines: indented, or a block list's items at the line's start
        while end < len(lines) and lines[end][:1] in (" ", "\t", "-") \
                and not lines[end].startswith("---"):
            end += 1
        key = found.group(1).replace("-", "_")
        block = "".join(lines[i:end])
        if key in values and key not in done:
            try:
                same = normalise(yaml.safe_load(block) or {}).get(key) == values[key]
            except yaml.YAMLError:
                same = False
            out.append(block if same else yaml.safe_dump({found.group(1): values[key]},
                                                          sort_keys=False))
        done.add(key)
        i = end
    added = {k: v for k, v in values.items() if k not in done}
    if added:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(yaml.safe_dump(added, sort_keys=False))
    text = "".join(out)
    try:
        loaded = normalise(yaml.safe_load(text) or {})
    except (yaml.YAMLError, AttributeError):
        loaded = None
    if loaded != dict(values) or not old.strip():
        return _HEADER + yaml.safe_dump(dict(values), sort_keys=False)
    return text
