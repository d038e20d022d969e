"""Cluster profiles: what each site requires and allows, loaded from YAML.

Search order (later wins, by profile name): the profiles shipped in this package, then
every `*.yaml` in `~/.config/train/clusters/`, then in each directory of
`$TRAIN_CLUSTERS_PATH` (colon-separated), then files given with `--profile FILE`. A profile
with `extends: NAME` starts from that profile and overrides only the keys it sets (nested
mappings merge), so a site change is a three-line file.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from train.client.clusters.schema import NodeType, Profile
from train.client.clusters.units import format_limit, format_mem, format_time
from train.client.clusters.validate import extends_name, profile_from_dict, profile_name
from train.common import yamlio
from train.common.errors import ConfigError, UsageError
from train.common.yamlio import shown

USER_DIR = Path("~/.config/train/clusters")
PATH_VAR = "TRAIN_CLUSTERS_PATH"


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) \
                and key not in ("partitions", "constraints"):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read(path: Path) -> dict[str, Any]:
    data = yamlio.load_file(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError("profile", f"{path} must hold a mapping")
    return data


def _shipped() -> list[tuple[str, dict[str, Any]]]:
    """The profiles shipped in the package, a fresh copy each call."""
    return copy.deepcopy(_parsed_shipped())


@functools.cache
def _parsed_shipped() -> list[tuple[str, dict[str, Any]]]:
    """Parsed once a process (a submit resolves its job twice where Slurm starts a floor
    short; pure-Python YAML, about 50 ms a look)."""
    folder = resources.files("train.client.clusters") / "data"
    found = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yamlio.load_text(entry.read_text(encoding="utf-8"), entry.name, "profile")
            found.append((f"package:{entry.name}", data))
    return found


def folders(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The user's folder, then each of $TRAIN_CLUSTERS_PATH's (later wins)."""
    env = os.environ if environ is None else environ
    return [USER_DIR.expanduser(), *(Path(p) for p in env.get(PATH_VAR, "").split(":") if p)]


class Registry:
    """All profiles visible from here, by name."""

    def __init__(self, extra_files: Iterable[Path] = (),
                 environ: Mapping[str, str] | None = None) -> None:
        raw: dict[str, tuple[str, dict[str, Any]]] = {}
        sources = _shipped()
        for folder in folders(environ):
            if folder.is_dir():
                sources += [(str(p), _read(p)) for p in sorted(folder.glob("*.yaml"))]
        sources += [(str(p), _read(Path(p))) for p in extra_files]
        for source, loaded in sources:
            data = loaded
            name = profile_name(source, data.get("name"))
            parent = data.get("extends")
            if parent is not None:
                parent = extends_name(name, parent)
                base = raw.get(parent)
                if base is None:
                    raise ConfigError(f"profile {name}.extends", f"unknown profile "
                                      f"{shown(parent)}; known: {', '.join(sorted(raw))}")
                data = _merge(base[1], {k: v for k, v in data.items() if k != "extends"})
            raw[name] = (source, data)
        self.profiles = {name: profile_from_dict(data, source)
                         for name, (source, data) in raw.items()}

    def names(self) -> list[str]:
        return sorted(self.profiles)

    def get(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            raise UsageError(f"cluster: unknown cluster {name!r}; known clusters: "
                             f"{', '.join(self.names())} (add your own with --profile FILE "
                             f"or in {USER_DIR})") from None


def node_values(n: NodeType) -> dict[str, Any]:
    """A node type's values as a profile's YAML holds them."""
    return {"gpus_per_node": n.gpus_per_node, "gpu_types": list(n.gpu_types),
            "cpus_per_node": n.cpus_per_node, "mem_per_node": format_mem(n.mem_mb),
            "max_time": format_limit(n.max_minutes), "max_nodes": n.max_nodes,
            "max_gpus": n.max_gpus, "driver_version": n.driver_version,
            "cpu_jobs": n.cpu_jobs, "multi_node_whole": n.multi_node_whole}


def describe(profile: Profile) -> dict[str, Any]:
    """A plain mapping of the profile, for `train clusters show`."""
    return {
        "name": profile.name, "description": profile.description, "source": profile.source,
        "account": {"required": profile.account_required, "hint": profile.account_hint,
                    "list_command": list(profile.account_list_command)},
        "single_host": profile.single_host,
        "max_array_size": profile.max_array_size,
        "partition": {"required": profile.partition_required,
                      "allowed": profile.partitions_allowed,
                      "default": profile.default_partition},
        "qos": {"required": profile.qos_required, "default": profile.default_qos,
                "limits": {k: format_limit(v) for k, v in profile.qos_limits.items()}},
        "gpu_request": profile.gpu_request,
        "gpu_type_request": profile.gpu_type_request,
        "gpu_features": dict(profile.gpu_features),
        "backfill_threshold": format_limit(profile.backfill_minutes),
        "default_time": format_time(profile.default_minutes),
        "modules": list(profile.modules), "binds": list(profile.binds),
        "env": list(profile.env),
        "scratch_root": profile.scratch_root, "nccl_env": dict(profile.nccl_env),
        "preempt_flags": list(profile.preempt_flags),
        "gpu_watch": dataclasses.asdict(profile.gpu_watch),
        "partitions": {k: node_values(v) for k, v in profile.partitions.items()},
        "constraints": {k: node_values(v) for k, v in profile.constraints.items()},
    }
