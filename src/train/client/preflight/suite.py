"""All preflight checks for a profile, in order (`run_preflight`), and the input they take."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from train.client.clusters.schema import NodeType, Profile
from train.client.preflight.account import _ACCOUNT_RE, _check_account
from train.client.preflight.container import RUNTIMES, _check_runtime, _pick_runtime
from train.client.preflight.gpu import _check_cuda, check_arch
from train.client.preflight.image import _check_image
from train.client.preflight.result import Check, Runner
from train.client.preflight.runs_root import MOUNTS, _check_runs_root, read_mounts
from train.common import _proc
from train.common.errors import ConfigError
from train.common.yamlio import shown


def run_preflight(profile: Profile, *, image: str | Path | None, account: str | None,
                  runs_root: Path, partition_or_constraint: str | None,
                  runtime: str = "auto", environ: Mapping[str, str] | None = None,
                  run: Runner = _proc.run, mounts: Path = MOUNTS,
                  python: str = "python3") -> list[Check]:
    """The checks for jobs of `profile`, in order. `python`: the interpreter jobs run in an
    image not of ours; `partition_or_constraint`: the job's partition (or constraint,
    alternatives joined by '|'); None: the default partition, else every node type."""
    env = os.environ if environ is None else environ
    if runtime not in RUNTIMES:
        raise ConfigError("runtime", f"must be one of {', '.join(RUNTIMES)}; got "
                          f"{shown(runtime)}")
    image_text = None if image is None else _plain_path("image", str(image))
    runs_text = _plain_path("runs", str(runs_root))
    if account is not None and not _ACCOUNT_RE.fullmatch(account):
        raise ConfigError("account", f"{shown(account)} is not an account name (letters, "
                          "digits, '_', '.', '@', '+' and '-', at most 128)")
    nodes, named = _node_types(profile, partition_or_constraint)
    table = read_mounts(mounts)
    chosen = _pick_runtime(runtime, image_text, profile, env)
    runtime_check, binary = _check_runtime(chosen, runtime, profile, env, run)
    image_check, facts = _check_image(chosen, image_text, binary, profile, table, run,
                                      python)
    return [runtime_check, image_check, _check_account(profile, account, env, run),
            _check_runs_root(Path(runs_text), profile, table),
            _check_cuda(profile, nodes, named, chosen, facts),
            check_arch(nodes, named, chosen, facts)]


def _plain_path(field_name: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(field_name, "is empty; give a path")
    if "\x00" in text:
        raise ConfigError(field_name, f"{shown(text)} holds a NUL character")
    return text


def _node_types(profile: Profile, name: str | None) -> tuple[list[NodeType], bool]:
    """The node types a job may land on, and whether the job named them (or the default)."""
    if not name:
        if profile.partitions_allowed and profile.default_partition:
            return [profile.partitions[profile.default_partition]], True
        return [*profile.partitions.values(), *profile.constraints.values()], False
    if profile.partitions_allowed and name in profile.partitions:
        return [profile.partitions[name]], True
    alternatives = name.split("|")
    if all(a in profile.constraints for a in alternatives):
        return [profile.constraints[a] for a in alternatives], True
    if profile.partitions_allowed:
        raise ConfigError("partition", f"unknown partition {shown(name)} on {profile.name}; "
                          f"known: {', '.join(profile.partitions)}")
    unknown = next(a for a in alternatives if a not in profile.constraints)
    raise ConfigError("constraint", f"unknown constraint {shown(unknown)} on {profile.name}; "
                      f"known: {', '.join(profile.constraints)} (alternatives with '|')")
