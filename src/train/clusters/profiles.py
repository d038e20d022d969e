"""Cluster profiles: what each site requires and allows, loaded from YAML.

Search order (later wins, by profile name): the profiles shipped in this package, then
every `*.yaml` in `~/.config/train/clusters/`, then in each directory of
`$TRAIN_CLUSTERS_PATH` (colon-separated), then files given with `--profile FILE`. A profile
with `extends: NAME` starts from that profile and overrides only the keys it sets (nested
mappings merge), so a site change is a three-line file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from train import yamlio
from train.errors import ConfigError, UsageError
from train.yamlio import shown

# How GPUs are counted: --gres=gpu:N or --gpus-per-node=N.
GPU_REQUEST_STYLES = ("gres", "gpus_per_node")
# How a GPU type is selected: typed in that count (gpu:TYPE:N), as a node feature in
# --constraint, or not at all (the partition or constraint must imply it).
GPU_TYPE_REQUESTS = ("gres", "constraint", "none")
USER_DIR = Path("~/.config/train/clusters")
PATH_VAR = "TRAIN_CLUSTERS_PATH"

_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM_RE = re.compile(r"^(\d+)([KMGT]?)B?$", re.I)
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


def parse_time(text: str | int, field_name: str = "time") -> int:
    """SLURM time formats -> whole minutes (seconds round up), as sbatch reads them."""
    value = str(text).strip()
    match = _TIME_RE.match(value)
    if not match:
        raise ConfigError(field_name, f"{value!r} is not a SLURM time (MM, MM:SS, HH:MM:SS, "
                          "D-HH, D-HH:MM or D-HH:MM:SS)")
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
    value = str(text).strip()
    match = _MEM_RE.match(value)
    if not match:
        raise ConfigError(field_name, f"{value!r} is not a memory size such as 50G or 8000M")
    number, unit = int(match.group(1)), match.group(2).upper()
    if number == 0:
        if allow_zero:
            return 0
        raise ConfigError(field_name, f"{value!r}: must be more than 0")
    factor = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return max(1, int(number * factor))


def format_mem(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


@dataclass(frozen=True)
class NodeType:
    """A partition, or on sites without partitions a node constraint."""

    name: str
    gpus_per_node: int
    gpu_types: tuple[str, ...]
    cpus_per_node: int
    mem_mb: int
    max_minutes: int | None
    max_nodes: int | None = None
    max_gpus: int | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    account_required: bool
    account_hint: str
    partition_required: bool
    partitions_allowed: bool
    default_partition: str | None
    qos_required: bool
    default_qos: str | None
    qos_limits: Mapping[str, int | None]
    gpu_request: str
    backfill_minutes: int | None
    default_minutes: int
    modules: tuple[str, ...]
    binds: tuple[str, ...]
    scratch_root: str
    nccl_env: Mapping[str, str]
    preempt_flags: tuple[str, ...]
    partitions: Mapping[str, NodeType] = field(default_factory=dict)
    constraints: Mapping[str, NodeType] = field(default_factory=dict)
    gpu_type_request: str = "none"
    gpu_features: Mapping[str, str] = field(default_factory=dict)
    # names passed into containers from the job's environment (NAME or PREFIX_*)
    env: tuple[str, ...] = ()

    def gpu_feature(self, gpu_type: str) -> str:
        """The node feature that selects `gpu_type` (gpu_type_request: constraint)."""
        return self.gpu_features.get(gpu_type, gpu_type)


_TOP_KEYS = {"name", "description", "extends", "account", "partition", "qos", "gpu_request",
             "gpu_type_request", "gpu_features", "backfill_threshold", "default_time",
             "modules", "binds", "env", "scratch_root", "nccl_env", "preempt_flags", "partitions",
             "constraints"}
_SECTION_KEYS = {"account": {"required", "hint"},
                 "partition": {"required", "allowed", "default"},
                 "qos": {"required", "default", "limits"}}
_NODE_KEYS = {"gpus_per_node", "gpu_types", "cpus_per_node", "mem_per_node", "max_time",
              "max_nodes", "max_gpus"}


_ENV_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")


def _env_names(items: Any) -> tuple[str, ...]:
    if not isinstance(items, (list, tuple)):
        raise ConfigError("env", "must be a list of variable names (NAME or PREFIX_*)")
    for item in items:
        if not isinstance(item, str) or not _ENV_PATTERN.match(item):
            raise ConfigError("env", f"{item!r} is not a variable name or PREFIX_* pattern")
    return tuple(items)


def _check_keys(where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "unknown profile key; valid keys are: "
                          + ", ".join(sorted(allowed)))


def _int(where: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(where, f"must be a non-negative integer, got {value!r}")
    return value


def _node(where: str, name: str, data: Any) -> NodeType:
    if not isinstance(data, dict):
        raise ConfigError(where, "must be a mapping")
    _check_keys(where, data, _NODE_KEYS)
    missing = sorted({"gpus_per_node", "cpus_per_node", "mem_per_node", "max_time"}
                     - set(data))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}", "is required")
    max_time = data["max_time"]
    return NodeType(
        name=name,
        gpus_per_node=_int(f"{where}.gpus_per_node", data["gpus_per_node"]) or 0,
        gpu_types=tuple(str(t) for t in data.get("gpu_types") or ()),
        cpus_per_node=_int(f"{where}.cpus_per_node", data["cpus_per_node"]) or 0,
        mem_mb=parse_mem(data["mem_per_node"], f"{where}.mem_per_node"),
        max_minutes=None if max_time is None else parse_time(max_time, f"{where}.max_time"),
        max_nodes=_int(f"{where}.max_nodes", data.get("max_nodes"), optional=True),
        max_gpus=_int(f"{where}.max_gpus", data.get("max_gpus"), optional=True),
    )


def profile_from_dict(data: Mapping[str, Any], source: str) -> Profile:
    """Validate a merged profile mapping; errors name the key path."""
    name = str(data.get("name") or "")
    where = f"profile {name or source}"
    _check_keys(where, data, _TOP_KEYS)
    for section, keys in _SECTION_KEYS.items():
        _check_keys(f"{where}.{section}", data.get(section) or {}, keys)
    if not name:
        raise ConfigError(f"{where}.name", "is required")
    account = data.get("account") or {}
    partition = data.get("partition") or {}
    qos = data.get("qos") or {}
    style = data.get("gpu_request", "gres")
    if style == "gres_typed":
        raise ConfigError(f"{where}.gpu_request", "gres_typed is now two keys: "
                          "gpu_request: gres and gpu_type_request: gres")
    if style not in GPU_REQUEST_STYLES:
        raise ConfigError(f"{where}.gpu_request", f"must be one of "
                          f"{', '.join(GPU_REQUEST_STYLES)}; got {style!r}")
    type_request = data.get("gpu_type_request", "none")
    if type_request not in GPU_TYPE_REQUESTS:
        raise ConfigError(f"{where}.gpu_type_request", f"must be one of "
                          f"{', '.join(GPU_TYPE_REQUESTS)}; got {type_request!r}")
    features = data.get("gpu_features") or {}
    if not isinstance(features, dict):
        raise ConfigError(f"{where}.gpu_features", "must be a mapping of GPU type to node "
                          "feature")
    for gpu, feature in features.items():
        if not isinstance(feature, str) or not _FEATURE_RE.match(feature):
            raise ConfigError(f"{where}.gpu_features.{gpu}", f"must be one node feature "
                              f"name (no operators such as & | [ ]); got {feature!r}")
    partitions = {str(k): _node(f"{where}.partitions.{k}", str(k), v)
                  for k, v in _mapping(f"{where}.partitions", data.get("partitions")).items()}
    constraints = {str(k): _node(f"{where}.constraints.{k}", str(k), v)
                   for k, v in _mapping(f"{where}.constraints",
                                        data.get("constraints")).items()}
    allowed = bool(partition.get("allowed", True))
    if not partitions and not constraints:
        raise ConfigError(f"{where}.partitions", "a profile needs partitions or constraints")
    if allowed and not partitions:
        raise ConfigError(f"{where}.partitions", "needed when partition.allowed is true")
    default_partition = partition.get("default")
    if default_partition is not None and default_partition not in partitions:
        raise ConfigError(f"{where}.partition.default", f"{default_partition!r} is not one "
                          f"of the partitions: {', '.join(partitions)}")
    backfill = data.get("backfill_threshold")
    return Profile(
        name=name,
        description=str(data.get("description", "")),
        source=source,
        account_required=bool(account.get("required", False)),
        account_hint=str(account.get("hint", "")),
        partition_required=bool(partition.get("required", False)),
        partitions_allowed=allowed,
        default_partition=default_partition,
        qos_required=bool(qos.get("required", False)),
        default_qos=qos.get("default"),
        qos_limits={str(k): None if v is None else parse_time(v, f"{where}.qos.limits.{k}")
                    for k, v in (qos.get("limits") or {}).items()},
        gpu_request=style,
        backfill_minutes=None if backfill is None else parse_time(backfill,
                                                                  f"{where}.backfill"),
        default_minutes=parse_time(data.get("default_time", "1:00:00"),
                                   f"{where}.default_time"),
        modules=tuple(str(m) for m in data.get("modules") or ()),
        binds=tuple(str(b) for b in data.get("binds") or ()),
        env=_env_names(data.get("env") or ()),
        scratch_root=str(data.get("scratch_root", "")),
        nccl_env=_nccl_env(f"{where}.nccl_env", data.get("nccl_env")),
        preempt_flags=tuple(str(f) for f in data.get("preempt_flags") or ()),
        partitions=partitions,
        constraints=constraints,
        gpu_type_request=type_request,
        gpu_features={str(k): v for k, v in features.items()},
    )


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) \
                and key not in ("partitions", "constraints"):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _mapping(where: str, value: Any) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a mapping of names to settings, got "
                          f"{type(value).__name__}")
    return value


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _nccl_env(where: str, value: Any) -> dict[str, str]:
    """NAME: value pairs every job exports: names must be variable names (they go into
    `export NAME=...` in the job script), values plain scalars without control characters."""
    out = {}
    for key, item in _mapping(where, value).items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise ConfigError(f"{where}", f"{shown(key)} is not an environment variable name "
                              "(letters, digits and _, not starting with a digit)")
        if isinstance(item, (dict, list)) or item is None:
            raise ConfigError(f"{where}.{key}", f"must be a plain value, got {shown(item)}")
        text = str(item).lower() if isinstance(item, bool) else str(item)
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise ConfigError(f"{where}.{key}", "must not hold control characters")
        out[key] = text
    return out


def _read(path: Path) -> dict[str, Any]:
    data = yamlio.load_file(path, "profile")
    if not isinstance(data, dict):
        raise ConfigError("profile", f"{path} must hold a mapping")
    return data


def _shipped() -> list[tuple[str, dict[str, Any]]]:
    folder = resources.files("train.clusters") / "data"
    found = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yamlio.load_text(entry.read_text(encoding="utf-8"), entry.name, "profile")
            found.append((f"package:{entry.name}", data))
    return found


def _search_dirs(environ: Mapping[str, str]) -> list[Path]:
    dirs = [USER_DIR.expanduser()]
    dirs += [Path(p) for p in environ.get(PATH_VAR, "").split(":") if p]
    return dirs


class Registry:
    """All profiles visible from here, by name."""

    def __init__(self, extra_files: Iterable[Path] = (),
                 environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw: dict[str, tuple[str, dict[str, Any]]] = {}
        sources = _shipped()
        for folder in _search_dirs(env):
            if folder.is_dir():
                sources += [(str(p), _read(p)) for p in sorted(folder.glob("*.yaml"))]
        sources += [(str(p), _read(Path(p))) for p in extra_files]
        for source, loaded in sources:
            data = loaded
            name = data.get("name")
            if not isinstance(name, str) or not name:
                raise ConfigError("profile.name", f"{source} has no name")
            parent = data.get("extends")
            if parent is not None:
                base = raw.get(parent) or raw.get(str(parent))
                if base is None:
                    raise ConfigError(f"profile {name}.extends", f"unknown profile "
                                      f"{parent!r}; known: {', '.join(sorted(raw))}")
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


def describe(profile: Profile) -> dict[str, Any]:
    """A plain mapping of the profile, for `train clusters show`."""

    def node(n: NodeType) -> dict[str, Any]:
        return {"gpus_per_node": n.gpus_per_node, "gpu_types": list(n.gpu_types),
                "cpus_per_node": n.cpus_per_node, "mem_per_node": format_mem(n.mem_mb),
                "max_time": None if n.max_minutes is None else format_time(n.max_minutes),
                "max_nodes": n.max_nodes, "max_gpus": n.max_gpus}

    return {
        "name": profile.name, "description": profile.description, "source": profile.source,
        "account": {"required": profile.account_required, "hint": profile.account_hint},
        "partition": {"required": profile.partition_required,
                      "allowed": profile.partitions_allowed,
                      "default": profile.default_partition},
        "qos": {"required": profile.qos_required, "default": profile.default_qos,
                "limits": {k: None if v is None else format_time(v)
                           for k, v in profile.qos_limits.items()}},
        "gpu_request": profile.gpu_request,
        "gpu_type_request": profile.gpu_type_request,
        "gpu_features": dict(profile.gpu_features),
        "backfill_threshold": None if profile.backfill_minutes is None
        else format_time(profile.backfill_minutes),
        "default_time": format_time(profile.default_minutes),
        "modules": list(profile.modules), "binds": list(profile.binds),
        "env": list(profile.env),
        "scratch_root": profile.scratch_root, "nccl_env": dict(profile.nccl_env),
        "preempt_flags": list(profile.preempt_flags),
        "partitions": {k: node(v) for k, v in profile.partitions.items()},
        "constraints": {k: node(v) for k, v in profile.constraints.items()},
    }
